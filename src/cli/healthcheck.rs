//! `healthcheck`: is a running server SERVING? For health checks in images without a shell.

use super::call::ClientTls;
use crate::config::Config;
use anyhow::Context;
use std::time::Duration;
use tonic_health::pb::{
    HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient,
};

/// How long a health check may take, connection included.
const TIMEOUT: Duration = Duration::from_secs(3);

/// Where to check without `--addr`: loopback on the port of `server.listen` (a server
/// bound to all interfaces answers there), over TLS when the server serves TLS.
pub fn default_addr(config: &Config) -> String {
    let port = config.server.listen.port();
    let scheme = if config.server.tls.is_some() {
        "https"
    } else {
        "http"
    };
    format!("{scheme}://127.0.0.1:{port}")
}

/// Checks `service` (`""`: the server as a whole) at `addr`.
pub async fn healthcheck(addr: &str, tls: &ClientTls, service: &str) -> anyhow::Result<String> {
    let check = async {
        let mut endpoint = super::connect::endpoint(addr)?.connect_timeout(TIMEOUT);
        if addr.starts_with("https://") {
            endpoint = endpoint
                .tls_config(tls.config()?)
                .context("configuring TLS")?;
        }
        let channel = endpoint
            .connect()
            .await
            .map_err(|e| super::connect::failed(addr, &e))?;
        let reply = HealthClient::new(channel)
            .check(HealthCheckRequest {
                service: service.to_owned(),
            })
            .await
            .with_context(|| format!("health check at {addr}"))?;
        anyhow::Ok(reply.into_inner().status())
    };
    let status = tokio::time::timeout(TIMEOUT, check)
        .await
        .with_context(|| format!("no health answer from {addr} within {TIMEOUT:?}"))??;
    match status {
        ServingStatus::Serving => Ok("SERVING\n".to_owned()),
        other => anyhow::bail!("{addr} is {}", other.as_str_name()),
    }
}
