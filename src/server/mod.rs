//! Wiring: storage, providers, router, the call pipeline and the gRPC
//! services. [`App::build`] builds and binds, [`App::run`] serves then
//! drains, and [`serve`] does both (the CLI and the tests call it).

mod background;
mod build;
mod prompts;
mod routes;
mod run;

pub use prompts::prompt_store;
pub use run::reflected_descriptor_sets;

use crate::{auth::Authenticator, config::Config, store::Store};
use std::{future::Future, net::SocketAddr, sync::Arc};
use tokio::{net::TcpListener, sync::watch, task::JoinHandle};
use tonic_health::server::HealthReporter;

/// Fully-qualified name of the main service, as reported by health checks.
pub const SERVICE_NAME: &str = "ai.orchestrator.v1.Orchestrator";

/// Every service we answer, by full name: each has its own health status.
pub const SERVICE_NAMES: [&str; 5] = [
    SERVICE_NAME,
    crate::api::pb::tool_service_server::SERVICE_NAME,
    crate::api::pb::agent_service_server::SERVICE_NAME,
    crate::api::pb::audit_service_server::SERVICE_NAME,
    crate::api::pb::prompt_admin_server::SERVICE_NAME,
];

/// [`App::build`] then [`App::run`]: serves until `shutdown`, then drains.
pub async fn serve(
    listener: TcpListener,
    config: Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    App::build(listener, config).await?.run(shutdown).await
}

/// The application, built and bound, not yet serving.
pub struct App {
    config: Arc<Config>,
    store: Store,
    /// The SQLite file's claim, held until the server has stopped.
    _claim: Option<std::fs::File>,
    auth: Authenticator,
    services: routes::Authenticated,
    /// For the ASYNC tool worker, the MCP clients and the MCP endpoint.
    pipeline: crate::call::Pipeline,
    mcp_listener: Option<TcpListener>,
    /// The HTTP edge's, when `[http]` is configured.
    http_listener: Option<TcpListener>,
    health: Health,
    health_service:
        tonic_health::pb::health_server::HealthServer<tonic_health::server::HealthService>,
    listener: TcpListener,
    metrics_listener: Option<TcpListener>,
    /// Refreshes state-derived gauges before each scrape.
    on_scrape: crate::telemetry::metrics::OnScrape,
    ready: watch::Receiver<bool>,
    /// Stops the ledger writers (after the drain), and their end.
    stop_writer: watch::Sender<bool>,
    writer_done: Option<JoinHandle<()>>,
    key_store: crate::auth::keys::KeyStore,
    cluster: Option<crate::cluster::Cluster>,
}

impl App {
    /// Where gRPC is served.
    pub fn grpc_addr(&self) -> Option<SocketAddr> {
        self.listener.local_addr().ok()
    }

    /// Where the MCP endpoint is served, if configured.
    pub fn mcp_addr(&self) -> Option<SocketAddr> {
        self.mcp_listener.as_ref().and_then(|l| l.local_addr().ok())
    }

    /// Where the HTTP edge is served, if configured.
    pub fn http_addr(&self) -> Option<SocketAddr> {
        self.http_listener
            .as_ref()
            .and_then(|l| l.local_addr().ok())
    }

    /// Where `/metrics`, `/healthz` and `/readyz` are served, if anywhere.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics_listener
            .as_ref()
            .and_then(|l| l.local_addr().ok())
    }
}

/// The gRPC health reporter plus the readiness flag `/readyz` serves.
#[derive(Clone)]
struct Health {
    reporter: HealthReporter,
    ready: Arc<watch::Sender<bool>>,
}
