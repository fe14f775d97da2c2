//! [`App::run`]: the gRPC services and the background work, until a
//! shutdown signal; then the drain.

use super::{App, Health, background};
use crate::{
    api::{metrics_layer::GrpcMetricsLayer, pb},
    auth::{Authenticator, keys::KeyStore},
    call::Pipeline,
    cluster::Cluster,
    config::{Config, ServerConfig},
    store::Store,
    telemetry::metrics,
};
use anyhow::Context;
use std::{future::Future, sync::Arc};
use tokio::{net::TcpListener, sync::watch, task::JoinHandle};
use tonic::{
    service::Routes,
    transport::{Server, ServerTlsConfig, server::TcpIncoming},
};
use tonic_health::{ServingStatus, pb::health_server::HealthServer, server::HealthService};

impl App {
    /// Serves until `shutdown`, then drains: health NOT_SERVING, in-flight calls
    /// finish (up to `server.shutdown_grace`), usage flushed, database closed.
    pub async fn run(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> anyhow::Result<()> {
        let App {
            config,
            store,
            _claim,
            auth,
            services,
            pipeline,
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
        } = self;
        // Read first: a missing certificate fails the start with nothing running.
        // (`check-config` skips them: it runs where the secrets are not.)
        let tls = config.server.tls.as_ref().map(super::build::server_tls);
        let tls = tls.transpose()?;
        let (stop_tasks, tasks_stopped) = watch::channel(false);
        let probe = tokio::spawn(background::probe_database(
            store.clone(),
            health.clone(),
            config.server.health_probe_interval,
            tasks_stopped.clone(),
        ));
        let tasks = Background::spawn(
            &tasks_stopped,
            &config,
            &store,
            &auth,
            key_store,
            &pipeline,
            cluster.as_ref(),
        );
        // Turns true when shutdown starts: gRPC, MCP and HTTP edges drain.
        let (draining_tx, draining) = watch::channel(false);
        let mcp_endpoint = spawn_mcp_endpoint(
            mcp_listener,
            &config,
            &pipeline,
            &auth,
            cluster.as_ref(),
            &draining,
        );
        let http_edge = spawn_http_edge(http_listener, &config, &pipeline, &auth, &draining);
        let console = config
            .console
            .enabled
            .then(|| crate::console::Console::new(pipeline.clone(), auth.clone()))
            .transpose()?;
        let metrics_task = spawn_metrics(
            metrics_listener,
            &pipeline,
            console,
            ready,
            tasks_stopped,
            on_scrape,
        );
        let routes = grpc_routes(health_service, services, &auth, &config.server)?;
        if let Ok(addr) = listener.local_addr() {
            tracing::info!(%addr, backend = store.backend(), "serving");
        }
        let signal = shutdown_signal(shutdown, probe, health.clone(), draining_tx);
        serve_grpc(listener, tls, routes, &config.server, signal, draining).await?;

        tasks
            .stop(&stop_tasks, metrics_task, [mcp_endpoint, http_edge])
            .await;
        // Calls running past the grace can no longer be recorded; everything
        // queued (settlements of cancelled calls too) is committed.
        let _ = stop_writer.send(true);
        if let Some(done) = writer_done {
            let _ = done.await;
        }
        store.close().await;
        tracing::info!("stopped");
        Ok(())
    }
}

/// The background tasks but the database probe, stopped after the drain.
struct Background {
    key_refresher: Option<JoinHandle<()>>,
    sweeper: Option<JoinHandle<()>>,
    conversation_sweeper: Option<JoinHandle<()>>,
    worker: JoinHandle<()>,
    approval_sweeper: JoinHandle<()>,
    tool_refresher: JoinHandle<()>,
    breaker_openings: JoinHandle<()>,
    trigger_relay: Option<JoinHandle<()>>,
    mcp_clients: Vec<JoinHandle<()>>,
    probes: Vec<JoinHandle<()>>,
    cluster_watch: Option<JoinHandle<()>>,
}

impl Background {
    /// Starts every task, each stopping when `stopped` turns true.
    fn spawn(
        stopped: &watch::Receiver<bool>,
        config: &Arc<Config>,
        store: &Store,
        auth: &Authenticator,
        key_store: KeyStore,
        pipeline: &Pipeline,
        cluster: Option<&Cluster>,
    ) -> Self {
        let key_refresher = auth.enabled().then(|| {
            tokio::spawn(background::refresh_keys_periodically(
                auth.clone(),
                key_store,
                config.auth.refresh_interval,
                stopped.clone(),
            ))
        });
        let sweeper = config.metering.enabled.then(|| {
            tokio::spawn(background::sweep_periodically(
                store.clone(),
                config.clone(),
                stopped.clone(),
            ))
        });
        // Always: conversations of an agent since removed still expire.
        let conversation_sweeper = Some(tokio::spawn(
            background::sweep_conversations_periodically(store.clone(), stopped.clone()),
        ));
        let worker = tokio::spawn(crate::call::worker::run_worker(
            pipeline.clone(),
            stopped.clone(),
        ));
        let approval_sweeper = tokio::spawn(crate::call::approvals::run_sweeper(
            pipeline.clone(),
            stopped.clone(),
        ));
        // Only with triggers: otherwise nothing fills the outbox.
        let trigger_relay = (!config.triggers.is_empty()).then(|| {
            tokio::spawn(crate::call::triggers::run_relay(
                pipeline.clone(),
                stopped.clone(),
            ))
        });
        let breaker_openings = tokio::spawn(crate::call::openings::run(
            pipeline.clone(),
            stopped.clone(),
        ));
        let tool_refresher = tokio::spawn(crate::call::tool::admin::run_refresher(
            pipeline.clone(),
            stopped.clone(),
        ));
        let env: crate::tools::mcp::Env = Arc::new(|name| std::env::var(name).ok());
        let mcp_clients = config
            .mcp_servers
            .iter()
            .map(|(name, server)| {
                let toolbox = pipeline.toolbox();
                tokio::spawn(crate::tools::mcp::maintain(
                    name.clone(),
                    server.clone(),
                    env.clone(),
                    toolbox.registry.clone(),
                    toolbox.servers.clone(),
                    stopped.clone(),
                ))
            })
            .collect();
        let probes = pipeline.router().spawn_probes(stopped);
        let cluster_watch = cluster
            .cloned()
            .map(|cluster| tokio::spawn(cluster.watch(stopped.clone())));
        Self {
            key_refresher,
            sweeper,
            conversation_sweeper,
            worker,
            approval_sweeper,
            tool_refresher,
            breaker_openings,
            trigger_relay,
            mcp_clients,
            probes,
            cluster_watch,
        }
    }

    /// Sends `stop` and waits for every task, and for the endpoints.
    async fn stop(
        self,
        stop: &watch::Sender<bool>,
        metrics_task: Option<JoinHandle<()>>,
        edges: [Option<JoinHandle<()>>; 2],
    ) {
        let _ = stop.send(true);
        // A running ASYNC invocation is taken again, under its idempotency key,
        // when its lease expires (at the next start, or by another replica).
        self.worker.abort();
        let _ = self.worker.await;
        for task in [
            self.sweeper,
            self.conversation_sweeper,
            Some(self.approval_sweeper),
            Some(self.tool_refresher),
            Some(self.breaker_openings),
            self.trigger_relay,
            self.key_refresher,
            metrics_task,
        ]
        .into_iter()
        .chain(edges)
        .flatten()
        .chain(self.mcp_clients)
        .chain(self.probes)
        .chain(self.cluster_watch)
        {
            let _ = task.await;
        }
    }
}

/// The MCP endpoint, if configured, draining when `draining` turns true.
fn spawn_mcp_endpoint(
    listener: Option<TcpListener>,
    config: &Config,
    pipeline: &Pipeline,
    auth: &Authenticator,
    cluster: Option<&Cluster>,
    draining: &watch::Receiver<bool>,
) -> Option<JoinHandle<()>> {
    let (Some(listener), Some(endpoint)) = (listener, &config.mcp_endpoint) else {
        return None;
    };
    if let Ok(addr) = listener.local_addr() {
        tracing::info!(%addr, path = %endpoint.path, "MCP endpoint");
    }
    Some(tokio::spawn(crate::api::mcp::serve(
        listener,
        endpoint.clone(),
        pipeline.clone(),
        auth.clone(),
        cluster.cloned(),
        draining.clone(),
    )))
}

/// The HTTP edge, if configured, draining when `draining` turns true.
fn spawn_http_edge(
    listener: Option<TcpListener>,
    config: &Config,
    pipeline: &Pipeline,
    auth: &Authenticator,
    draining: &watch::Receiver<bool>,
) -> Option<JoinHandle<()>> {
    let (Some(listener), Some(http)) = (listener, &config.http) else {
        return None;
    };
    if let Ok(addr) = listener.local_addr() {
        tracing::info!(%addr, "HTTP edge");
    }
    Some(tokio::spawn(crate::web::serve(
        listener,
        http.clone(),
        pipeline.clone(),
        auth.clone(),
        draining.clone(),
    )))
}

/// `/metrics`, `/healthz` and `/readyz`, if a listener was bound for them,
/// and the ops console when enabled.
fn spawn_metrics(
    listener: Option<TcpListener>,
    pipeline: &Pipeline,
    console: Option<crate::console::Console>,
    ready: watch::Receiver<bool>,
    stopped: watch::Receiver<bool>,
    on_scrape: metrics::OnScrape,
) -> Option<JoinHandle<()>> {
    let listener = listener?;
    if let Ok(addr) = listener.local_addr() {
        tracing::info!(%addr, "metrics endpoint");
    }
    let router = pipeline.router().clone();
    let providers: metrics::ProvidersHealth = Arc::new(move || {
        let report = router.providers_report();
        (report.healthy, report.body.to_string())
    });
    if console.is_some() {
        tracing::info!("ops console at /console on the metrics endpoint");
    }
    let pages = console.map(crate::console::Console::router);
    Some(tokio::spawn(metrics::serve_http(
        listener, ready, stopped, on_scrape, providers, pages,
    )))
}

/// Health and reflection, then every service that needs a key.
fn grpc_routes(
    health_service: HealthServer<HealthService>,
    services: super::routes::Authenticated,
    auth: &Authenticator,
    server: &ServerConfig,
) -> anyhow::Result<Routes> {
    let reflection_v1 = reflection()
        .build_v1()
        .context("building the reflection service")?;
    let reflection_alpha = reflection()
        .build_v1alpha()
        .context("building the reflection service")?;
    // Health and reflection stay open: probes and tooling carry no key.
    let open = Routes::new(health_service)
        .add_service(reflection_v1)
        .add_service(reflection_alpha);
    Ok(super::routes::add_authenticated(
        open, services, auth, server,
    ))
}

/// Completes once `shutdown` has, health says NOT_SERVING and endpoints drain.
async fn shutdown_signal(
    shutdown: impl Future<Output = ()>,
    probe: JoinHandle<()>,
    health: Health,
    draining: watch::Sender<bool>,
) {
    shutdown.await;
    tracing::info!("shutdown requested: draining in-flight calls");
    // The probe goes first (cancelled mid-ping if need be): a database back
    // during the drain must not flip health to SERVING as the balancer drains us.
    probe.abort();
    let _ = probe.await;
    background::set_health(&health, ServingStatus::NotServing).await;
    let _ = draining.send(true);
}

/// Serves gRPC until `signal`, then until calls end or the grace runs out.
async fn serve_grpc(
    listener: TcpListener,
    tls: Option<ServerTlsConfig>,
    routes: Routes,
    server: &ServerConfig,
    signal: impl Future<Output = ()>,
    mut draining: watch::Receiver<bool>,
) -> anyhow::Result<()> {
    // Nagle off on accepted sockets: with it on, small gRPC frames on
    // kept-alive connections wait ~40 ms for delayed ACKs.
    let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
    let mut builder = Server::builder();
    if let Some(tls) = tls {
        builder = builder
            .tls_config(tls)
            .context("configuring TLS for the gRPC port")?;
    }
    let serving = builder
        .http2_keepalive_interval(Some(server.http2_keepalive_interval))
        .http2_keepalive_timeout(Some(server.http2_keepalive_timeout))
        .max_concurrent_streams(server.max_concurrent_streams)
        .layer(GrpcMetricsLayer)
        .add_routes(routes)
        .serve_with_incoming_shutdown(incoming, signal);
    let grace = server.shutdown_grace;
    let deadline = async move {
        let _ = draining.wait_for(|d| *d).await;
        tokio::time::sleep(grace).await;
    };
    tokio::select! {
        result = serving => result.context("gRPC server failed")?,
        () = deadline => tracing::warn!(?grace, "shutdown grace elapsed with calls still in flight"),
    }
    Ok(())
}

/// What server reflection serves: ours, gRPC health and the richer-error
/// types in our statuses' details, so grpcurl decodes them with no `-proto`.
pub fn reflected_descriptor_sets() -> [&'static [u8]; 3] {
    [
        pb::FILE_DESCRIPTOR_SET,
        tonic_health::pb::FILE_DESCRIPTOR_SET,
        tonic_types::pb::FILE_DESCRIPTOR_SET,
    ]
}

fn reflection() -> tonic_reflection::server::Builder<'static> {
    reflected_descriptor_sets().into_iter().fold(
        tonic_reflection::server::Builder::configure(),
        |builder, set| builder.register_encoded_file_descriptor_set(set),
    )
}
