//! `serve`: the server until SIGTERM or SIGINT, exporting traces when configured.

use crate::{config::Config, telemetry};

/// Binds the listener, serves until a shutdown signal, flushes the traces.
pub async fn serve(
    config: Config,
    log_format: telemetry::LogFormat,
    listen: Option<std::net::SocketAddr>,
) -> anyhow::Result<String> {
    let otel = telemetry::otel::init(&config.telemetry)
        .map_err(|e| anyhow::anyhow!("starting OpenTelemetry export: {e}"))?;
    telemetry::init_logging(log_format, otel.as_ref().map(|o| o.tracer()));
    if let Some(endpoint) = telemetry::otel::endpoint(&config.telemetry) {
        tracing::info!(%endpoint, "exporting traces over OTLP");
    }
    for note in &config.notes {
        tracing::warn!(%note, "config");
    }
    let addr = listen.unwrap_or(config.server.listen);
    let served = match tokio::net::TcpListener::bind(addr).await {
        Ok(listener) => crate::serve(listener, config, shutdown_signal()).await,
        Err(e) => Err(anyhow::anyhow!("binding {addr}: {e}")),
    };
    if let Some(otel) = otel {
        // Flushing blocks on the exporter thread; keep it off the workers.
        let _ = tokio::task::spawn_blocking(move || otel.shutdown()).await;
    }
    served?;
    Ok(String::new())
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
