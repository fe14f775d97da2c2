//! [`App::build`]: the database connected and migrated, the providers,
//! router, meter and call pipeline built, the listeners bound.

use super::{App, Health, background};
use crate::{
    api::{
        OrchestratorApi, admin::PromptAdminApi, agent::AgentApi, audit::AuditApi,
        tools::ToolServiceApi,
    },
    auth::{Authenticator, keys::KeyStore},
    call::{Pipeline, Services},
    config::Config,
    guardrails::Guardrails,
    providers::Providers,
    router::Router,
    store::Store,
    telemetry::metrics,
    tools::Toolbox,
    usage::{
        Meter,
        ledger::{LedgerWriter, sqlite},
        pricing::Pricing,
    },
};
use anyhow::Context;
use std::{net::SocketAddr, sync::Arc};
use tokio::{net::TcpListener, sync::watch};
use tonic::transport::{Certificate, Identity, ServerTlsConfig};
use tonic_health::ServingStatus;

impl App {
    /// Connects, migrates and claims the database, builds the pipeline and
    /// services and binds the listeners; nothing is served until [`App::run`].
    pub async fn build(listener: TcpListener, config: Config) -> anyhow::Result<App> {
        let config = Arc::new(config);
        let store = Store::connect(&config.database)
            .await
            .context("connecting to the database")?;
        store.migrate().await.context("migrating the database")?;
        // Held until the server has stopped: the file is this process's alone.
        let claim = match (&store, sqlite::file_of(&config.database.url)) {
            (Store::Sqlite(_), Some(path)) => Some(sqlite::claim(&path)?),
            _ => None,
        };
        let auth = Authenticator::new(&config.auth);
        let key_store = KeyStore::new(store.clone());
        if auth.enabled() {
            // Config keys work even if this fails; stored keys follow at the
            // next refresh.
            if let Err(e) = auth.refresh(&key_store).await {
                tracing::error!(error = %e, "loading API keys from the database failed");
            }
        }
        let providers = Providers::from_config(&config).context("building providers")?;
        let cluster = config
            .cluster
            .as_ref()
            .map(crate::cluster::Cluster::new)
            .transpose()?;
        let router = Router::new(config.clone(), providers, cluster.as_ref());
        let prompts = super::prompt_store(store.clone(), &config);
        let (stop_writer, writer_stopped) = watch::channel(false);
        let (writer, writer_done) = ledger_writer(&store, &config, writer_stopped).await?;
        let meter = Meter::new(
            config.metering.enabled.then(|| writer.clone()),
            Pricing::from_config(&config.pricing),
            &config.metering,
        );
        let writer_done = Some(writer_done);

        if config.server.metrics_listen.is_some() {
            // Install the recorder first: gauges set before it would be
            // lost, and a fresh pod must already show every breaker closed.
            metrics::handle();
        }
        for (name, guards) in router.resilience().iter() {
            metrics::breaker_state(name, guards.breaker.state().metric_value());
        }
        let metrics_listener = bind(config.server.metrics_listen, "the metrics endpoint").await?;

        let toolbox = Toolbox::new(&config, cluster.as_ref()).map_err(anyhow::Error::msg)?;
        let pipeline = Pipeline::new(
            config.clone(),
            Services {
                router,
                prompts: prompts.clone(),
                meter,
                ledger: writer,
                store: store.clone(),
                toolbox,
                guardrails: Guardrails::from_config(&config).map_err(anyhow::Error::msg)?,
            },
        );
        let on_scrape = scrape_hook(pipeline.clone());
        let tools = ToolServiceApi::new(config.clone(), pipeline.clone(), auth.clone());
        let agents = AgentApi::new(config.clone(), pipeline.clone(), auth.clone());
        let approvals =
            crate::api::approvals::ApprovalApi::new(config.clone(), pipeline.clone(), auth.clone());
        let tool_admin = crate::api::tool_admin::ToolAdminApi::new(
            config.clone(),
            pipeline.clone(),
            auth.clone(),
        );
        // Registered tools are callable from the first request, not the first refresh.
        if let Err(e) = pipeline.refresh_tools().await {
            tracing::error!(error = %e, "loading the registered tools failed; the next refresh tries again");
        }
        let mcp_addr = config.mcp_endpoint.as_ref().map(|e| e.listen);
        let mcp_listener = bind(mcp_addr, "the MCP endpoint").await?;
        let http_listener = bind(config.http.as_ref().map(|h| h.listen), "the HTTP edge").await?;
        let background_pipeline = pipeline.clone();
        let audit = AuditApi::new(store.clone(), auth.clone());
        let api = OrchestratorApi::new(config.clone(), pipeline, store.clone(), auth.clone());
        let prompt_admin = PromptAdminApi::new(prompts, auth.clone());
        let reporter = tonic_health::server::HealthReporter::new();
        let health_service = tonic_health::pb::health_server::HealthServer::new(
            tonic_health::server::HealthService::from_health_reporter(reporter.clone()),
        );
        let (ready_tx, ready) = watch::channel(true);
        let health = Health {
            reporter,
            ready: Arc::new(ready_tx),
        };
        background::set_health(&health, ServingStatus::Serving).await;
        Ok(App {
            config,
            store,
            _claim: claim,
            auth,
            services: super::routes::Authenticated {
                api,
                prompt_admin,
                tools,
                agents,
                audit,
                approvals,
                tool_admin,
            },
            pipeline: background_pipeline,
            mcp_listener,
            http_listener,
            health,
            health_service,
            listener,
            metrics_listener,
            on_scrape,
            ready,
            stop_writer,
            writer_done,
            key_store,
            cluster,
        })
    }
}

/// A listener on `addr` when one is configured; an error names `what`.
async fn bind(addr: Option<SocketAddr>, what: &str) -> anyhow::Result<Option<TcpListener>> {
    let Some(addr) = addr else { return Ok(None) };
    let listener = TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding {what} {addr}"))?;
    Ok(Some(listener))
}

/// What a scrape refreshes: breaker states (an open breaker turns half-open
/// with time, not traffic) and the process's CPU, memory and descriptors.
fn scrape_hook(pipeline: Pipeline) -> metrics::OnScrape {
    let process = metrics_process::Collector::default();
    process.describe();
    Arc::new(move || {
        for (name, guards) in pipeline.router().resilience().iter() {
            metrics::breaker_state(name, guards.breaker.state().metric_value());
        }
        process.collect();
    })
}

/// Sweeps the reservations an earlier crash left (when metering is on),
/// then starts the ledger writers. They run with metering off too: the
/// audit log is written in their group commit.
async fn ledger_writer(
    store: &Store,
    config: &Config,
    stopped: watch::Receiver<bool>,
) -> anyhow::Result<(LedgerWriter, tokio::task::JoinHandle<()>)> {
    let metering = &config.metering;
    if metering.enabled {
        let swept = background::sweep_orphans(store, config, true)
            .await
            .context("sweeping orphaned reservations")?;
        if swept > 0 {
            tracing::warn!(
                swept,
                "charged reservations orphaned by an earlier crash at their estimate"
            );
        }
    } else {
        tracing::warn!("usage metering is OFF: no caps, no usage records");
    }
    let (mut writer, done) = LedgerWriter::spawn(
        store.clone(),
        &config.database,
        metering.batch_max,
        // Each writer holds a pooled connection while it commits; half the
        // pool stays for reads (GetUsage, health, prompts).
        metering
            .ledger_writers
            .min((config.database.max_connections as usize / 2).max(1)),
        metering.limits_refresh,
        stopped,
    )
    .context("opening the ledger writer")?;
    writer.set_outbox(
        crate::audit::outbox::Outbox::from_config(config),
        crate::usage::session::default_limits(&config.metering),
    );
    Ok((writer, done))
}

/// Reads the PEM files of `[server.tls]`; errors name the file.
pub(super) fn server_tls(tls: &crate::config::TlsConfig) -> anyhow::Result<ServerTlsConfig> {
    let read = |path: &std::path::Path, key: &str| {
        std::fs::read(path).with_context(|| format!("server.tls.{key}: reading {}", path.display()))
    };
    let mut out = ServerTlsConfig::new().identity(Identity::from_pem(
        read(&tls.cert, "cert")?,
        read(&tls.key, "key")?,
    ));
    if let Some(ca) = &tls.client_ca {
        // mTLS: a client without a certificate signed by this CA fails the handshake.
        out = out.client_ca_root(Certificate::from_pem(read(ca, "client_ca")?));
    }
    Ok(out)
}
