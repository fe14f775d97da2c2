//! [`App::run`]: the gRPC services and the background work, until a
//! shutdown signal; then the drain.

use super::{App, background};
use crate::{
    api::{metrics_layer::GrpcMetricsLayer, pb},
    telemetry::metrics,
};
use anyhow::Context;
use std::{future::Future, sync::Arc};
use tokio::sync::watch;
use tonic::transport::{Server, server::TcpIncoming};
use tonic_health::ServingStatus;

impl App {
    /// Serves until `shutdown` completes, then marks health NOT_SERVING,
    /// stops accepting, lets in-flight calls finish (up to
    /// `server.shutdown_grace`), flushes usage and closes the database.
    pub async fn run(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> anyhow::Result<()> {
        let App {
            config,
            store,
            _claim,
            auth,
            api,
            prompt_admin,
            tools,
            agents,
            audit,
            pipeline,
            mcp_listener,
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
        // Read before anything starts: a missing certificate fails the
        // start with nothing left running. (`check-config` does not read
        // them: a rendered config is checked where the secrets are not.)
        let server_tls = config
            .server
            .tls
            .as_ref()
            .map(super::build::server_tls)
            .transpose()?;
        let (stop_background, background_stopped) = watch::channel(false);
        let probe = tokio::spawn(background::probe_database(
            store.clone(),
            health.clone(),
            config.server.health_probe_interval,
            background_stopped.clone(),
        ));
        let key_refresher = auth.enabled().then(|| {
            tokio::spawn(background::refresh_keys_periodically(
                auth.clone(),
                key_store,
                config.auth.refresh_interval,
                background_stopped.clone(),
            ))
        });
        let sweeper = config.metering.enabled.then(|| {
            tokio::spawn(background::sweep_periodically(
                store.clone(),
                config.clone(),
                background_stopped.clone(),
            ))
        });
        // Always: conversations stored under an agent since removed from
        // the config still expire.
        let conversation_sweeper = Some(tokio::spawn(
            background::sweep_conversations_periodically(store.clone(), background_stopped.clone()),
        ));
        // Tools: the ASYNC worker, each MCP server's client, the endpoint.
        let worker = tokio::spawn(crate::call::worker::run_worker(
            pipeline.clone(),
            background_stopped.clone(),
        ));
        let env: crate::tools::mcp::Env = Arc::new(|name| std::env::var(name).ok());
        let mcp_clients: Vec<_> = config
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
                    background_stopped.clone(),
                ))
            })
            .collect();
        let probes = pipeline.router().spawn_probes(&background_stopped);
        let cluster_watch = cluster
            .clone()
            .map(|cluster| tokio::spawn(cluster.watch(background_stopped.clone())));
        // Turns true when shutdown starts: gRPC and the MCP endpoint stop
        // taking calls and drain those in flight.
        let (draining_tx, mut draining) = watch::channel(false);
        let mcp_endpoint = match (mcp_listener, &config.mcp_endpoint) {
            (Some(listener), Some(endpoint)) => {
                if let Ok(addr) = listener.local_addr() {
                    tracing::info!(%addr, path = %endpoint.path, "MCP endpoint");
                }
                Some(tokio::spawn(crate::api::mcp::serve(
                    listener,
                    endpoint.clone(),
                    pipeline.clone(),
                    auth.clone(),
                    cluster.clone(),
                    draining.clone(),
                )))
            }
            _ => None,
        };
        let metrics_task = metrics_listener.map(|listener| {
            if let Ok(addr) = listener.local_addr() {
                tracing::info!(%addr, "metrics endpoint");
            }
            let router = pipeline.router().clone();
            let providers: metrics::ProvidersHealth = Arc::new(move || {
                let report = router.providers_report();
                (report.healthy, report.body.to_string())
            });
            tokio::spawn(metrics::serve_http(
                listener,
                ready,
                background_stopped,
                on_scrape,
                providers,
            ))
        });
        let reflection_v1 = reflection()
            .build_v1()
            .context("building the reflection service")?;
        let reflection_alpha = reflection()
            .build_v1alpha()
            .context("building the reflection service")?;

        if let Ok(addr) = listener.local_addr() {
            tracing::info!(%addr, backend = store.backend(), "serving");
        }

        // Nagle off on accepted sockets: with it on, small gRPC frames on
        // kept-alive connections wait ~40 ms for delayed ACKs.
        let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
        let signal_health = health.clone();
        let signal = async move {
            shutdown.await;
            tracing::info!("shutdown requested: draining in-flight calls");
            // The database probe goes first (cancelled mid-ping if need be):
            // a database recovering during the drain must not flip health
            // back to SERVING while the load balancer is taking this
            // replica out.
            probe.abort();
            let _ = probe.await;
            background::set_health(&signal_health, ServingStatus::NotServing).await;
            let _ = draining_tx.send(true);
        };
        let mut builder = Server::builder();
        if let Some(tls) = server_tls {
            builder = builder
                .tls_config(tls)
                .context("configuring TLS for the gRPC port")?;
        }
        let open = tonic::service::Routes::new(health_service)
            .add_service(reflection_v1)
            .add_service(reflection_alpha);
        // Health and reflection stay open: probes and tooling carry no key.
        let services = super::routes::Authenticated {
            api,
            prompt_admin,
            tools,
            agents,
            audit,
        };
        let routes = super::routes::add_authenticated(open, services, &auth, &config.server);
        let server = builder
            .http2_keepalive_interval(Some(config.server.http2_keepalive_interval))
            .http2_keepalive_timeout(Some(config.server.http2_keepalive_timeout))
            .max_concurrent_streams(config.server.max_concurrent_streams)
            .layer(GrpcMetricsLayer)
            .add_routes(routes)
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
        // An ASYNC invocation still running is taken again, under the same
        // idempotency key, once its lease expires (by this process's next
        // start, or another replica).
        worker.abort();
        let _ = worker.await;
        for task in [
            sweeper,
            conversation_sweeper,
            key_refresher,
            metrics_task,
            mcp_endpoint,
        ]
        .into_iter()
        .flatten()
        .chain(mcp_clients)
        .chain(probes)
        .chain(cluster_watch)
        {
            let _ = task.await;
        }
        // Calls still running past the grace period can no longer be
        // recorded; everything queued (incl. settlements of cancelled calls)
        // is committed.
        let _ = stop_writer.send(true);
        if let Some(done) = writer_done {
            let _ = done.await;
        }
        store.close().await;
        tracing::info!("stopped");
        Ok(())
    }
}

/// Every descriptor server reflection serves: our services, gRPC health,
/// and the richer-error-model types our statuses carry in their details
/// (`google.rpc.ErrorInfo`, `BadRequest`, `QuotaFailure`, `RetryInfo`,
/// `google.rpc.Status`), so grpcurl decodes them with no `-proto`.
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
