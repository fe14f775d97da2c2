//! Wiring: storage, providers, router, tasks and the gRPC services, served
//! on a listener until a shutdown signal, then drained.

use crate::{api::metrics_layer::GrpcMetricsLayer, telemetry::metrics};
use crate::{
    api::{OrchestratorApi, admin::PromptAdminApi, auth::AuthInterceptor, pb},
    auth::{Authenticator, keys::KeyStore},
    call::Pipeline,
    config::Config,
    prompts::store::PromptStore,
    providers::Providers,
    router::Router,
    store::Store,
    usage::{
        Meter,
        ledger::{LedgerWriter, sqlite},
        pricing::Pricing,
        sweeper,
    },
};
use anyhow::Context;
use std::{future::Future, sync::Arc, time::Duration};
use tokio::{net::TcpListener, sync::watch};
use tonic::{
    service::interceptor::InterceptedService,
    transport::{Certificate, Identity, Server, ServerTlsConfig, server::TcpIncoming},
};
use tonic_health::{ServingStatus, server::HealthReporter};

/// Fully-qualified name of the main service, as reported by health checks.
pub const SERVICE_NAME: &str = "ai.orchestrator.v1.Orchestrator";

/// Serves the orchestrator on `listener` until `shutdown` completes, then
/// marks health NOT_SERVING, stops accepting, lets in-flight calls finish
/// (up to `server.shutdown_grace`) and closes the database.
pub async fn serve(
    listener: TcpListener,
    config: Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let config = Arc::new(config);
    let store = Store::connect(&config.database)
        .await
        .context("connecting to the database")?;
    store.migrate().await.context("migrating the database")?;
    // Held until the server has stopped: the file is this process's alone.
    let _claim = match (&store, sqlite::file_of(&config.database.url)) {
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
    let router = Router::new(config.clone(), providers);
    let resilience = router.resilience().clone();
    let prompts = PromptStore::new(store.clone());
    let metering = &config.metering;
    let (stop_writer, writer_stopped) = watch::channel(false);
    let (writer, writer_done) = if metering.enabled {
        let swept = sweep_orphans(&store, &config, true)
            .await
            .context("sweeping orphaned reservations")?;
        if swept > 0 {
            tracing::warn!(
                swept,
                "charged reservations orphaned by an earlier crash at their estimate"
            );
        }
        let (writer, done) = LedgerWriter::spawn(
            store.clone(),
            &config.database,
            metering.batch_max,
            // Each writer holds a pooled connection while it commits; half
            // the pool stays for reads (GetUsage, health, prompts).
            metering
                .ledger_writers
                .min((config.database.max_connections as usize / 2).max(1)),
            metering.limits_refresh,
            writer_stopped,
        )
        .context("opening the ledger writer")?;
        (Some(writer), Some(done))
    } else {
        tracing::warn!("usage metering is OFF: no caps, no usage records");
        (None, None)
    };
    let meter = Meter::new(writer, Pricing::from_config(&config.pricing), metering);
    let pipeline = Pipeline::new(config.clone(), router, prompts.clone(), meter);
    let api = OrchestratorApi::new(config.clone(), pipeline, store.clone(), auth.clone());

    let (health, health_service) = tonic_health::server::health_reporter();
    let (ready_tx, ready_rx) = watch::channel(true);
    let health = Health {
        reporter: health,
        ready: Arc::new(ready_tx),
    };
    set_health(&health, ServingStatus::Serving).await;
    if config.server.metrics_listen.is_some() {
        // Install the recorder first: gauges set before it would be lost,
        // and a fresh pod must already show every breaker as closed.
        metrics::handle();
    }
    for (name, guards) in resilience.iter() {
        metrics::breaker_state(name, guards.breaker.state().metric_value());
    }
    let (stop_background, background_stopped) = watch::channel(false);
    let probe = tokio::spawn(probe_database(
        store.clone(),
        health.clone(),
        config.server.health_probe_interval,
        background_stopped.clone(),
    ));
    let background_stopped_for_metrics = background_stopped.clone();
    let key_refresher = auth.enabled().then(|| {
        tokio::spawn(refresh_keys_periodically(
            auth.clone(),
            key_store,
            config.auth.refresh_interval,
            background_stopped.clone(),
        ))
    });
    let sweeper = metering.enabled.then(|| {
        tokio::spawn(sweep_periodically(
            store.clone(),
            config.clone(),
            background_stopped,
        ))
    });

    let metrics_task = match config.server.metrics_listen {
        Some(addr) => {
            let listener = TcpListener::bind(addr)
                .await
                .with_context(|| format!("binding the metrics endpoint {addr}"))?;
            tracing::info!(addr = ?listener.local_addr().ok(), "metrics endpoint");
            metrics::handle();
            Some(tokio::spawn(metrics::serve_http(
                listener,
                ready_rx,
                background_stopped_for_metrics,
            )))
        }
        None => None,
    };
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(pb::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()
        .context("building the reflection service")?;
    let reflection_alpha = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(pb::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1alpha()
        .context("building the reflection service")?;

    let addr = listener.local_addr().ok();
    tracing::info!(?addr, backend = store.backend(), "serving");

    // Nagle off on accepted sockets: with it on, small gRPC frames on
    // kept-alive connections wait ~40 ms for delayed ACKs.
    let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
    let (draining_tx, mut draining) = watch::channel(false);
    let signal_health = health.clone();
    let signal = async move {
        shutdown.await;
        tracing::info!("shutdown requested: draining in-flight calls");
        // The database probe goes first (cancelled mid-ping if need be): a
        // database recovering during the drain must not flip health back to
        // SERVING while the load balancer is taking this replica out.
        probe.abort();
        let _ = probe.await;
        set_health(&signal_health, ServingStatus::NotServing).await;
        let _ = draining_tx.send(true);
    };
    let mut builder = Server::builder();
    if let Some(tls) = &config.server.tls {
        builder = builder
            .tls_config(server_tls(tls)?)
            .context("configuring TLS for the gRPC port")?;
    }
    let server = builder
        .http2_keepalive_interval(Some(config.server.http2_keepalive_interval))
        .http2_keepalive_timeout(Some(config.server.http2_keepalive_timeout))
        .max_concurrent_streams(config.server.max_concurrent_streams)
        .layer(GrpcMetricsLayer)
        .add_service(health_service)
        .add_service(reflection)
        .add_service(reflection_alpha)
        // Health and reflection stay open: probes and tooling carry no key.
        .add_service(InterceptedService::new(
            pb::orchestrator_server::OrchestratorServer::new(api)
                .max_decoding_message_size(config.server.max_message_bytes),
            AuthInterceptor::new(auth.clone()),
        ))
        .add_service(InterceptedService::new(
            pb::prompt_admin_server::PromptAdminServer::new(PromptAdminApi::new(
                prompts,
                auth.clone(),
            ))
            .max_decoding_message_size(config.server.max_message_bytes),
            AuthInterceptor::new(auth),
        ))
        .serve_with_incoming_shutdown(incoming, signal);

    let grace = config.server.shutdown_grace;
    let deadline = async move {
        let _ = draining.wait_for(|d| *d).await;
        tokio::time::sleep(grace).await;
    };
    tokio::select! {
        result = server => result.context("gRPC server failed")?,
        () = deadline => tracing::warn!(?grace, "shutdown grace elapsed with calls still in flight"),
    }

    let _ = stop_background.send(true);
    if let Some(sweeper) = sweeper {
        let _ = sweeper.await;
    }
    if let Some(task) = key_refresher {
        let _ = task.await;
    }
    if let Some(task) = metrics_task {
        let _ = task.await;
    }
    // Calls still running past the grace period can no longer be recorded;
    // everything queued (incl. settlements of cancelled calls) is committed.
    let _ = stop_writer.send(true);
    if let Some(done) = writer_done {
        let _ = done.await;
    }
    store.close().await;
    tracing::info!("stopped");
    Ok(())
}

/// Charges orphaned reservations. On SQLite at start-up every open
/// reservation is an orphan (the file has one owner); otherwise only those
/// older than `metering.sweep_after`.
async fn sweep_orphans(
    store: &Store,
    config: &Config,
    at_startup: bool,
) -> Result<u64, crate::store::StoreError> {
    let now = chrono::Utc::now().timestamp_millis();
    let cutoff = if at_startup && matches!(store, Store::Sqlite(_)) {
        i64::MAX
    } else {
        now - i64::try_from(config.metering.sweep_after.as_millis()).unwrap_or(i64::MAX)
    };
    sweeper::sweep(store, cutoff).await
}

async fn sweep_periodically(store: Store, config: Arc<Config>, mut stop: watch::Receiver<bool>) {
    loop {
        tokio::select! {
            _ = stop.wait_for(|s| *s) => return,
            () = tokio::time::sleep(config.metering.sweep_interval) => {}
        }
        match sweep_orphans(&store, &config, false).await {
            Ok(0) => {}
            Ok(swept) => tracing::warn!(swept, "charged orphaned reservations at their estimate"),
            Err(e) => tracing::error!(error = %e, "sweeping orphaned reservations failed"),
        }
    }
}

/// Reads the PEM files of `[server.tls]`; errors name the file.
fn server_tls(tls: &crate::config::TlsConfig) -> anyhow::Result<ServerTlsConfig> {
    let read = |path: &std::path::Path, key: &str| {
        std::fs::read(path).with_context(|| format!("server.tls.{key}: reading {}", path.display()))
    };
    let mut out = ServerTlsConfig::new().identity(Identity::from_pem(
        read(&tls.cert, "cert")?,
        read(&tls.key, "key")?,
    ));
    if let Some(ca) = &tls.client_ca {
        // Clients without a certificate signed by this CA are refused in
        // the handshake (mTLS).
        out = out.client_ca_root(Certificate::from_pem(read(ca, "client_ca")?));
    }
    Ok(out)
}

/// Reloads the database's API keys, so created and revoked keys take effect
/// on every replica without a restart.
async fn refresh_keys_periodically(
    auth: Authenticator,
    keys: KeyStore,
    interval: Duration,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        tokio::select! {
            _ = stop.wait_for(|s| *s) => return,
            () = tokio::time::sleep(interval) => {}
        }
        // On failure the last loaded keys stay in force.
        if let Err(e) = auth.refresh(&keys).await {
            tracing::error!(error = %e, "reloading API keys failed");
        }
    }
}

/// The gRPC health reporter plus the readiness flag `/readyz` serves.
#[derive(Clone)]
struct Health {
    reporter: HealthReporter,
    ready: Arc<watch::Sender<bool>>,
}

async fn set_health(health: &Health, status: ServingStatus) {
    health.reporter.set_service_status("", status).await;
    health
        .reporter
        .set_service_status(SERVICE_NAME, status)
        .await;
    let _ = health.ready.send(status == ServingStatus::Serving);
}

/// Keeps the health status in step with the database: NOT_SERVING while it
/// cannot be reached, SERVING again when it can.
async fn probe_database(
    store: Store,
    health: Health,
    interval: Duration,
    mut stop: watch::Receiver<bool>,
) {
    let mut serving = true;
    loop {
        tokio::select! {
            _ = stop.wait_for(|s| *s) => return,
            () = tokio::time::sleep(interval) => {}
        }
        let ok = store.ping(interval.max(Duration::from_millis(500))).await;
        if ok != serving && !*stop.borrow() {
            serving = ok;
            if ok {
                tracing::info!("database reachable again: SERVING");
                set_health(&health, ServingStatus::Serving).await;
            } else {
                tracing::error!("database unreachable: NOT_SERVING");
                set_health(&health, ServingStatus::NotServing).await;
            }
        }
    }
}
