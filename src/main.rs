//! Thin entry point: parse the CLI, load config, start logging, dispatch.

use ai_orchestrator::{
    cli::{self, Cli, Command},
    config::Config,
    telemetry,
};
use clap::Parser;
use std::{io::Write, process::ExitCode};

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli).await {
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

async fn run(cli: Cli) -> anyhow::Result<String> {
    if !matches!(cli.command, Command::Serve { .. }) {
        telemetry::init_logging(cli.log_format, None);
    }
    if let Command::Call {
        addr,
        api_key,
        tls,
        team,
        trace_id,
        rpc,
    } = cli.command
    {
        return cli::call(addr, api_key, tls, team, trace_id, rpc).await;
    }
    let offline = matches!(
        cli.command,
        Command::Migrate | Command::Limits { .. } | Command::Prompts { .. } | Command::Keys { .. }
    );
    let config = if offline {
        Config::load_without_provider_keys(&cli.config)
    } else {
        Config::load(&cli.config)
    }
    .map_err(|e| anyhow::anyhow!("{}: {e}", cli.config.display()))?;
    match cli.command {
        Command::CheckConfig => Ok(cli::check_config(&config)),
        Command::Migrate => cli::migrate(&config).await,
        Command::Limits { action } => cli::limits(&config, action).await,
        Command::Keys { action } => cli::keys(&config, action).await,
        Command::Prompts { action, actor } => cli::prompts(&config, action, &actor).await,
        Command::Serve { listen } => {
            let otel = telemetry::otel::init(&config.telemetry)
                .map_err(|e| anyhow::anyhow!("starting OpenTelemetry export: {e}"))?;
            telemetry::init_logging(cli.log_format, otel.as_ref().map(|o| o.tracer()));
            if let Some(endpoint) = telemetry::otel::endpoint(&config.telemetry) {
                tracing::info!(%endpoint, "exporting traces over OTLP");
            }
            let addr = listen.unwrap_or(config.server.listen);
            let served = match tokio::net::TcpListener::bind(addr).await {
                Ok(listener) => ai_orchestrator::serve(listener, config, shutdown_signal()).await,
                Err(e) => Err(anyhow::anyhow!("binding {addr}: {e}")),
            };
            if let Some(otel) = otel {
                // Flushing blocks on the exporter thread; keep it off the workers.
                let _ = tokio::task::spawn_blocking(move || otel.shutdown()).await;
            }
            served?;
            Ok(String::new())
        }
        Command::Call { .. } => unreachable!("handled above"),
    }
}

/// Completes on SIGTERM (Kubernetes) or SIGINT (Ctrl-C).
async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = term => {}
    }
}
