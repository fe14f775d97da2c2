//! `bench`: the load benchmark of issue #6 (docs/benchmarks.md).
//!
//! In one run it starts a fake OpenAI-format upstream (in this process, on
//! its own threads) and the orchestrator binary as a child process per
//! server, then drives open-loop gRPC load at fixed rates and up to
//! saturation, the same requests straight at the fake upstream (the
//! baseline the added latency is measured against), a breaker fast-fail
//! scenario, long calls (memory per call in flight) and cold starts, with
//! SQLite, PostgreSQL and no metering. It writes `results.json` and
//! `results.md` to `--out`, reads the JSON back to validate it, and never
//! fails on timing: only on a broken run or malformed results.
//!
//! `--smoke` is the CI mode: seconds long, low rates, any build.
//! `--compare-bin` makes it an A/B run of two builds in alternated rounds.

mod ab;
mod bench;
mod breaker;
mod cli;
mod cluster;
mod coldstart;
mod disk;
mod fixed;
mod inflight;
mod loadgen;
mod paired;
mod prom;
mod quiet;
mod report;
mod run;
mod saturation;
mod server;
mod settings;
mod sys;
mod target;
mod upstream;
mod usage;

use clap::Parser;
use std::process::ExitCode;

fn main() -> ExitCode {
    let args = cli::Args::parse();
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(args.client_threads.max(1))
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(ab::run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
