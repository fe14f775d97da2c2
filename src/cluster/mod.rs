//! The fleet's shared store (SPEC §12, ADR 0025): limits, tool quotas and MCP sessions as atomic
//! Lua scripts on the store's clock. Never a dependency of serving: while it is down each call
//! gets [`Unavailable`] at once and falls back as `on_unavailable` says. Imports no router.

pub mod limits;
pub mod quotas;
mod scripts;
pub mod sessions;

use crate::{
    config::cluster::{ClusterConfig, OnUnavailable},
    telemetry::metrics,
};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::Duration,
};
use tokio::sync::{Notify, watch};

/// The store could not answer, in time or sensibly: the caller uses its fallback.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("cluster store unavailable")]
pub struct Unavailable;

/// The store's URL could not be used.
#[derive(Debug, thiserror::Error)]
#[error("cluster.redis_url: {0}")]
pub struct BadUrl(String);

/// A handle on the shared store; clones share the connection and its up/down state.
#[derive(Clone)]
pub struct Cluster {
    inner: Arc<Inner>,
}

struct Inner {
    conn: ConnectionManager,
    prefix: String,
    on_unavailable: OnUnavailable,
    fallback_share: f64,
    answer_within: Duration,
    command_timeout: Duration,
    recheck_interval: Duration,
    lease_slack: Duration,
    up: AtomicBool,
    down: Notify,
    replica: String,
    leases: AtomicU64,
    last_refusal_log: AtomicU64,
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster")
            .field("prefix", &self.inner.prefix)
            .field("up", &self.is_up())
            .finish_non_exhaustive()
    }
}

impl Cluster {
    /// Connects on first use, so a store down at start-up does not stop the service.
    pub fn new(config: &ClusterConfig) -> Result<Self, BadUrl> {
        // Never the client's error text: it may quote the URL's password.
        let client = redis::Client::open(config.redis_url.expose())
            .map_err(|_| BadUrl("not a usable redis:// URL".into()))?;
        // No retries: every call would wait out the whole backoff while the store is down.
        let manager = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(config.connect_timeout))
            .set_response_timeout(Some(config.command_timeout))
            .set_number_of_retries(0);
        let conn = ConnectionManager::new_lazy_with_config(client, manager)
            .map_err(|e| BadUrl(format!("{:?}", e.kind())))?;
        Ok(Self {
            inner: Arc::new(Inner {
                conn,
                prefix: config.key_prefix.clone(),
                on_unavailable: config.on_unavailable,
                fallback_share: config.fallback_share,
                answer_within: config.connect_timeout + config.command_timeout,
                command_timeout: config.command_timeout,
                recheck_interval: config.recheck_interval,
                lease_slack: config.lease_slack,
                up: AtomicBool::new(true),
                down: Notify::new(),
                replica: uuid::Uuid::now_v7().simple().to_string(),
                leases: AtomicU64::new(0),
                last_refusal_log: AtomicU64::new(0),
            }),
        })
    }

    /// Whether the store answered last time it was asked.
    pub fn is_up(&self) -> bool {
        self.inner.up.load(Ordering::Acquire)
    }

    /// What calls needing a shared limit do while the store is down.
    pub fn on_unavailable(&self) -> OnUnavailable {
        self.inner.on_unavailable
    }

    /// The share of a limit one replica keeps while the store is down.
    pub fn fallback_share(&self) -> f64 {
        self.inner.fallback_share
    }

    /// Added to a call's timeout to make its concurrency lease.
    pub fn lease_slack(&self) -> Duration {
        self.inner.lease_slack
    }

    /// How long a caller should wait before trying a refused call again.
    pub fn retry_after(&self) -> Duration {
        self.inner.recheck_interval.max(Duration::from_secs(1))
    }

    /// `prefix{scope}:name`: the braces hash a script's keys to one Redis Cluster slot.
    fn key(&self, scope: &str, name: &str) -> String {
        format!("{}{{{scope}}}:{name}", self.inner.prefix)
    }

    fn lease_id(&self) -> String {
        let n = self.inner.leases.fetch_add(1, Ordering::Relaxed);
        format!("{}:{n}", self.inner.replica)
    }

    async fn invoke<T: redis::FromRedisValue>(
        &self,
        invocation: &redis::ScriptInvocation<'_>,
    ) -> Result<T, Unavailable> {
        if !self.is_up() {
            return Err(Unavailable);
        }
        let mut conn = self.inner.conn.clone();
        self.bounded(invocation.invoke_async::<T>(&mut conn)).await
    }

    async fn query<T: redis::FromRedisValue>(&self, cmd: &redis::Cmd) -> Result<T, Unavailable> {
        if !self.is_up() {
            return Err(Unavailable);
        }
        let mut conn = self.inner.conn.clone();
        self.bounded(cmd.query_async::<T>(&mut conn)).await
    }

    /// An error the store answered with (script error, READONLY, OOM) leaves it up: a PING
    /// would find it back at once and the next call would flap it down again.
    async fn bounded<T>(
        &self,
        answer: impl std::future::Future<Output = redis::RedisResult<T>>,
    ) -> Result<T, Unavailable> {
        match tokio::time::timeout(self.inner.answer_within, answer).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(e)) if e.is_io_error() || e.is_unrecoverable_error() => {
                self.lost(&format!("{:?}", e.kind()));
                Err(Unavailable)
            }
            Ok(Err(e)) => {
                metrics::cluster_store_error();
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_secs());
                let last = self.inner.last_refusal_log.load(Ordering::Relaxed);
                if now >= last + 10
                    && self
                        .inner
                        .last_refusal_log
                        .compare_exchange(last, now, Ordering::AcqRel, Ordering::Relaxed)
                        .is_ok()
                {
                    tracing::warn!(error = ?e.kind(), "the cluster store refused a command; calls fall back (cluster_store_errors_total counts them)");
                }
                Err(Unavailable)
            }
            Err(_) => {
                self.lost("timed out");
                Err(Unavailable)
            }
        }
    }

    fn lost(&self, why: &str) {
        if self.inner.up.swap(false, Ordering::AcqRel) {
            metrics::cluster_store_up(false);
            tracing::warn!(
                error = why,
                on_unavailable = self.inner.on_unavailable.as_str(),
                "cluster store unreachable: shared limits fall back until it answers"
            );
        }
        self.inner.down.notify_one();
    }

    async fn ping(&self) -> bool {
        let mut conn = self.inner.conn.clone();
        let cmd = redis::cmd("PING");
        let ping = cmd.query_async::<String>(&mut conn);
        matches!(
            tokio::time::timeout(self.inner.command_timeout, ping).await,
            Ok(Ok(_))
        )
    }

    /// Watches the store until `stopped`, pinging every `recheck_interval` while it is down.
    pub async fn watch(self, mut stopped: watch::Receiver<bool>) {
        if self.ping().await {
            metrics::cluster_store_up(true);
        } else {
            self.lost("no answer at start-up");
        }
        loop {
            if self.is_up() {
                tokio::select! {
                    () = self.inner.down.notified() => continue,
                    _ = stopped.wait_for(|s| *s) => return,
                }
            }
            tokio::select! {
                () = tokio::time::sleep(self.inner.recheck_interval) => {}
                _ = stopped.wait_for(|s| *s) => return,
            }
            if self.ping().await {
                self.inner.up.store(true, Ordering::Release);
                metrics::cluster_store_up(true);
                tracing::info!("cluster store answers again: shared limits resume");
            }
        }
    }
}
