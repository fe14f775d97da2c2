//! The orchestrator under test, as a child process (so its CPU time, RSS and
//! start-up are its own): its start (timed to the first SERVING health
//! answer), its `/proc` numbers, `/metrics`, and a graceful stop. The config
//! it runs with is in [`config`], the per-server PostgreSQL database in
//! [`postgres`].

mod config;
mod postgres;

pub use config::{
    AGENT, AuditCalls, BREAKER_ONLY_TASK, BREAKER_TASK, BROKEN_PROVIDER, HEALTHY_TASK, KEY_ENV,
    Metering, config_toml, free_ports,
};
pub use postgres::PgDatabase;

use crate::{prom, sys};
use anyhow::Context;
use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    process::Stdio,
    time::{Duration, Instant},
};
use tokio::process::{Child, Command};
use tonic_health::pb::{
    HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient,
};

/// A running orchestrator.
pub struct Server {
    child: Child,
    pid: i32,
    /// gRPC address.
    pub grpc: SocketAddr,
    metrics: SocketAddr,
    log: PathBuf,
    /// Process start → first SERVING health answer.
    pub cold_start: Duration,
}

impl Server {
    /// Starts `bin` with `config` (logging at warn, JSON, to `log`) and waits
    /// until gRPC health answers SERVING.
    pub async fn start(
        bin: &Path,
        config: &Path,
        grpc: SocketAddr,
        metrics: SocketAddr,
        log: &Path,
    ) -> anyhow::Result<Server> {
        let out = std::fs::File::create(log).context("creating the server log")?;
        let mut command = Command::new(bin);
        command
            .arg("--config")
            .arg(config)
            .args(["--log-format", "json", "serve"])
            // Warn level keeps logging out of the measurement.
            .env("RUST_LOG", "warn")
            .env(KEY_ENV, "bench-dummy-key")
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .kill_on_drop(true);
        // Nothing from the caller's environment may change the config.
        for (name, _) in std::env::vars_os() {
            let name = name.to_string_lossy().into_owned();
            let proxy = name.to_ascii_lowercase().ends_with("_proxy");
            if name == "DATABASE_URL" || (name.starts_with("AIO_") && name.contains("__")) || proxy
            {
                command.env_remove(&name);
            }
        }
        let started = Instant::now();
        let mut child = command
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        let pid = child
            .id()
            .and_then(|p| i32::try_from(p).ok())
            .ok_or_else(|| anyhow::anyhow!("the server exited at once"))?;
        loop {
            if let Some(status) = child.try_wait()? {
                anyhow::bail!(
                    "the server exited during start-up ({status}):\n{}",
                    log_tail(log)
                );
            }
            if started.elapsed() > Duration::from_secs(60) {
                anyhow::bail!("the server was not SERVING after 60 s:\n{}", log_tail(log));
            }
            if serving(grpc).await {
                break;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let cold_start = started.elapsed();
        Ok(Server {
            child,
            pid,
            grpc,
            metrics,
            log: log.to_owned(),
            cold_start,
        })
    }

    /// CPU seconds the server has used.
    pub fn cpu_seconds(&self) -> anyhow::Result<f64> {
        sys::cpu_seconds(self.pid)
    }

    /// `(rss, peak rss)` in MiB.
    pub fn memory_mb(&self) -> anyhow::Result<(f64, f64)> {
        sys::memory_mb(self.pid)
    }

    /// What a step reads from `/metrics` (overhead, provider time), now.
    pub async fn scrape(&self, http: &reqwest::Client) -> anyhow::Result<prom::Scrape> {
        let text = http
            .get(format!("http://{}/metrics", self.metrics))
            .timeout(Duration::from_secs(5))
            .send()
            .await?
            .error_for_status()?
            .text()
            .await?;
        prom::Scrape::parse(&text)
    }

    /// SIGTERM, then waits for the drain; true when it exited 0.
    pub async fn stop(mut self) -> bool {
        let _ = std::process::Command::new("kill")
            .args(["-TERM", &self.pid.to_string()])
            .status();
        match tokio::time::timeout(Duration::from_secs(15), self.child.wait()).await {
            Ok(Ok(status)) if status.success() => true,
            Ok(Ok(status)) => {
                tracing::warn!(%status, log = %log_tail(&self.log), "server exited with an error");
                false
            }
            _ => {
                let _ = self.child.start_kill();
                false
            }
        }
    }
}

/// True when gRPC health answers SERVING.
async fn serving(addr: SocketAddr) -> bool {
    let check = async {
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))?
            .connect_timeout(Duration::from_secs(1))
            .connect()
            .await?;
        let answer = HealthClient::new(channel)
            .check(HealthCheckRequest {
                service: String::new(),
            })
            .await?;
        anyhow::Ok(answer.into_inner().status == ServingStatus::Serving as i32)
    };
    matches!(
        tokio::time::timeout(Duration::from_secs(2), check).await,
        Ok(Ok(true))
    )
}

/// The last lines of a server log, for error messages.
pub fn log_tail(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}
