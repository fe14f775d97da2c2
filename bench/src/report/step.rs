//! One step of load as `results.json` records it: what was offered, what
//! came back, client-side latency, and the server's own figures over the
//! step.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Latency quantiles, microseconds.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq)]
pub struct Quantiles {
    /// Median.
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 99th percentile.
    pub p99: f64,
    /// 99.9th percentile.
    pub p999: f64,
    /// Largest.
    pub max: f64,
    /// Mean.
    pub mean: f64,
}

impl Quantiles {
    /// Quantiles of a histogram of microseconds.
    pub fn of(h: &hdrhistogram::Histogram<u64>) -> Self {
        if h.is_empty() {
            return Self::default();
        }
        Self {
            p50: h.value_at_quantile(0.5) as f64,
            p90: h.value_at_quantile(0.9) as f64,
            p99: h.value_at_quantile(0.99) as f64,
            p999: h.value_at_quantile(0.999) as f64,
            max: h.max() as f64,
            mean: h.mean(),
        }
    }

    /// `self - base`, quantile by quantile (the added latency).
    pub fn minus(&self, base: &Quantiles) -> Quantiles {
        Quantiles {
            p50: self.p50 - base.p50,
            p90: self.p90 - base.p90,
            p99: self.p99 - base.p99,
            p999: self.p999 - base.p999,
            max: self.max - base.max,
            mean: self.mean - base.mean,
        }
    }
}

/// A server-side histogram over one step, microseconds.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq)]
pub struct ServerHistogram {
    /// Observations.
    pub count: f64,
    /// Exact mean (`_sum / _count`).
    pub mean: f64,
    /// Estimated from buckets.
    pub p50: f64,
    /// Estimated from buckets.
    pub p99: f64,
}

/// The metering ledger's writer over one step, as the server measures it
/// (`usage_ledger_*`), microseconds; `None` parts had no observation.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq)]
pub struct LedgerView {
    /// How long a reservation's caller waited (before the provider call):
    /// on the writer, queue included; on a SQLite file, its admission in
    /// memory.
    pub reserve_wait_us: Option<ServerHistogram>,
    /// How long a settlement's caller waited (before the response), the
    /// WAL sync included with SQLite's full durability.
    pub settle_wait_us: Option<ServerHistogram>,
    /// One group commit's transaction.
    pub commit_us: Option<ServerHistogram>,
    /// One WAL `fdatasync` after a commit.
    pub sync_us: Option<ServerHistogram>,
    /// Mean operations per group commit.
    pub ops_per_commit: Option<f64>,
}

/// One step of load.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Step {
    /// `load`, `paired`, `saturation`, `breaker`, `refused` or `in flight`.
    pub kind: String,
    /// `Execute` or `ClassifySms` (for `direct`, the body it replays).
    pub rpc: String,
    /// `orchestrator` or `direct` (straight to the fake upstream).
    pub via: String,
    /// `sqlite`, `sqlite-normal`, `postgres`, `off`; `none` for direct.
    pub metering: String,
    /// Task called (Execute).
    pub task: String,
    /// Fake upstream latency, ms.
    pub upstream_latency_ms: u64,
    /// Requests per second offered (open loop); 0 for a closed loop.
    pub offered_rps: f64,
    /// Callers with one call in flight each (closed loop); 0 for an open
    /// loop.
    pub callers: u64,
    /// Seconds of sending.
    pub duration_s: f64,
    /// Requests sent.
    pub sent: u64,
    /// Requests that got the answer the step expects.
    pub ok: u64,
    /// Other requests.
    pub errors: u64,
    /// Those by code.
    pub errors_by_code: BTreeMap<String, u64>,
    /// `ok` answers per second.
    pub achieved_rps: f64,
    /// Latency of `ok` requests from their scheduled send time, µs.
    pub latency_us: Quantiles,
    /// Orchestrator minus direct, per quantile, same rate and upstream
    /// latency, µs.
    pub added_latency_us: Option<Quantiles>,
    /// The server's `orchestrator_overhead_seconds` over the step, µs.
    pub server_overhead_us: Option<ServerHistogram>,
    /// The metering ledger's writer over the step (metered servers).
    pub ledger: Option<LedgerView>,
    /// Server CPU seconds per 1,000 requests sent.
    pub server_cpu_s_per_1k: Option<f64>,
    /// PostgreSQL backends' CPU seconds per 1,000 requests (postgres runs).
    pub db_cpu_s_per_1k: Option<f64>,
    /// Server resident memory after the step, MiB.
    pub server_rss_mb: Option<f64>,
    /// Server peak resident memory so far (VmHWM), MiB.
    pub server_peak_rss_mb: Option<f64>,
    /// Saturation steps: whether it met the pass criteria.
    pub passed: Option<bool>,
}
