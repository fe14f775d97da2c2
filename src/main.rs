//! Thin entry point: parse the command line, run it, print what it returns.

use ai_orchestrator::cli::{self, Cli};
use clap::Parser;
use std::{io::Write, process::ExitCode};

#[tokio::main]
async fn main() -> ExitCode {
    match cli::run(Cli::parse()).await {
        Ok(output) => {
            let _ = std::io::stdout().lock().write_all(output.as_bytes());
            ExitCode::SUCCESS
        }
        Err(err) => {
            let _ = writeln!(std::io::stderr().lock(), "error: {err:#}");
            ExitCode::FAILURE
        }
    }
}
