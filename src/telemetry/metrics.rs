//! Prometheus metrics: the names we export, helpers that record them, and
//! the HTTP endpoint (`/metrics`, `/healthz`, `/readyz`) on its own port.
//!
//! Label values are low-cardinality by construction: provider and model
//! names come from the config, statuses are stable codes, and teams appear
//! only as one of [`TEAM_BUCKETS`] hash buckets. Never a message, never a key.

use metrics::{counter, gauge, histogram};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use std::{
    hash::{Hash, Hasher},
    sync::OnceLock,
    time::Duration,
};
use tokio::{net::TcpListener, sync::watch};

/// Teams are reported as one of this many buckets (bounded cardinality).
pub const TEAM_BUCKETS: u64 = 16;

/// Upstream latency buckets, seconds: LLM calls take 0.1 s to a minute.
const LLM_BUCKETS: &[f64] = &[0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0];
/// Our own overhead, seconds: should be well under a millisecond.
const OVERHEAD_BUCKETS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
];
/// gRPC handling time, seconds.
const GRPC_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

/// Ledger writer times, seconds: a commit or a WAL sync takes 0.1–2 ms on
/// a healthy disk; a caller's wait grows with the queue under overload.
const LEDGER_BUCKETS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
];
/// Operations per group commit (`metering.batch_max` caps it).
const BATCH_BUCKETS: &[f64] = &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0];

static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();

/// The process-wide recorder, installed on first use. Several servers in one
/// process (tests) share it.
pub fn handle() -> &'static PrometheusHandle {
    HANDLE.get_or_init(|| {
        let builder = PrometheusBuilder::new()
            .set_buckets_for_metric(
                Matcher::Full("llm_response_time_seconds".into()),
                LLM_BUCKETS,
            )
            .and_then(|b| {
                b.set_buckets_for_metric(
                    Matcher::Full("orchestrator_overhead_seconds".into()),
                    OVERHEAD_BUCKETS,
                )
            })
            .and_then(|b| {
                b.set_buckets_for_metric(
                    Matcher::Full("grpc_server_handling_seconds".into()),
                    GRPC_BUCKETS,
                )
            })
            .and_then(|b| {
                [
                    "usage_ledger_wait_seconds",
                    "usage_ledger_commit_seconds",
                    "usage_ledger_sync_seconds",
                ]
                .into_iter()
                .try_fold(b, |b, name| {
                    b.set_buckets_for_metric(Matcher::Full(name.into()), LEDGER_BUCKETS)
                })
            })
            .and_then(|b| {
                b.set_buckets_for_metric(
                    Matcher::Full("usage_ledger_batch_operations".into()),
                    BATCH_BUCKETS,
                )
            });
        let builder = match builder {
            Ok(b) => b,
            Err(e) => {
                tracing::error!(error = %e, "metric buckets rejected; using summaries");
                PrometheusBuilder::new()
            }
        };
        let recorder = builder.build_recorder();
        let handle = recorder.handle();
        if metrics::set_global_recorder(recorder).is_err() {
            tracing::warn!(
                "a metrics recorder was already installed; /metrics shows only this recorder"
            );
        }
        handle
    })
}

/// One provider call that ended, by its status: `ok` or the attempt's
/// error code (skipped targets are not calls and are not recorded).
pub fn attempt(provider: &str, model: &str, status: &str, latency: Duration) {
    counter!("llm_requests_total", "provider" => provider.to_owned(), "model" => model.to_owned(), "status" => status.to_owned())
        .increment(1);
    histogram!("llm_response_time_seconds", "provider" => provider.to_owned(), "model" => model.to_owned())
        .record(latency.as_secs_f64());
}

/// A call resent at once within its attempt because it never reached the
/// provider (`cause`: the transport's error kind, a fixed set).
pub fn resend(provider: &str, cause: &'static str) {
    counter!("llm_resends_total", "provider" => provider.to_owned(), "cause" => cause).increment(1);
}

/// Tokens and cost of one attempt.
pub fn usage(provider: &str, model: &str, input: u64, output: u64, cost_usd: Option<f64>) {
    if input > 0 {
        counter!("llm_tokens_total", "provider" => provider.to_owned(), "model" => model.to_owned(), "type" => "input")
            .increment(input);
    }
    if output > 0 {
        counter!("llm_tokens_total", "provider" => provider.to_owned(), "model" => model.to_owned(), "type" => "output")
            .increment(output);
    }
    if let Some(cost) = cost_usd.filter(|c| *c > 0.0) {
        // `metrics` counters are integers; a monotonically increased gauge
        // keeps cents exact (exported with TYPE gauge).
        gauge!("llm_cost_usd_total", "provider" => provider.to_owned(), "model" => model.to_owned()).increment(cost);
    }
}

/// A provider's breaker state (0 closed, 1 half-open, 2 open).
pub fn breaker_state(provider: &str, value: u8) {
    gauge!("circuit_breaker_state", "provider" => provider.to_owned()).set(f64::from(value));
}

/// A call served by a fallback.
pub fn fallback(task: &str, from: &str, to: &str) {
    counter!("orchestrator_fallbacks_total", "task" => task.to_owned(), "from" => from.to_owned(), "to" => to.to_owned())
        .increment(1);
}

/// Request time outside provider attempts. It includes the router's waits
/// between attempts (retry backoff, `Retry-After`, rate-limiter waits), which
/// attempts do not time: alert on its median (docs/operations.md §10).
pub fn overhead(d: Duration) {
    histogram!("orchestrator_overhead_seconds").record(d.as_secs_f64());
}

/// A ledger operation answered (`op`: `reserve` or `settle`): how long its
/// caller waited on the ledger writer, queue included. With SQLite's
/// default durability a settlement's wait includes the WAL sync.
pub fn ledger_wait(op: &'static str, d: Duration) {
    histogram!("usage_ledger_wait_seconds", "op" => op).record(d.as_secs_f64());
}

/// One group commit: how many operations it carried and how long its
/// transaction took (not counting the WAL sync, see [`ledger_sync`]).
pub fn ledger_commit(ops: usize, d: Duration) {
    histogram!("usage_ledger_batch_operations").record(ops as f64);
    histogram!("usage_ledger_commit_seconds").record(d.as_secs_f64());
}

/// One `fdatasync` of the SQLite WAL after a commit (`"full"` durability),
/// which every settlement of the batch waits for.
pub fn ledger_sync(d: Duration) {
    histogram!("usage_ledger_sync_seconds").record(d.as_secs_f64());
}

/// The `team_bucket` label of a team: `b00` … `b15`, a hash of its ID.
pub fn team_bucket(team: &str) -> String {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    team.hash(&mut h);
    format!("b{:02}", h.finish() % TEAM_BUCKETS)
}

/// A call refused by a monthly cap.
pub fn quota_rejection(team: &str) {
    counter!("usage_quota_rejections_total", "team_bucket" => team_bucket(team)).increment(1);
}

/// An error returned to a caller, by its stable `ErrorInfo.reason` (a
/// fixed set, so bounded cardinality): tells `ALL_PROVIDERS_FAILED` from
/// `STORAGE_UNAVAILABLE`, `OVERLOADED` from `QUOTA_EXCEEDED`, which the
/// gRPC code alone cannot.
pub fn error_reason(reason: &'static str) {
    counter!("orchestrator_errors_total", "reason" => reason).increment(1);
}

/// One gRPC call handled, by method and final status code (both from fixed
/// sets, see [`crate::api::metrics_layer`]).
pub fn grpc(method: &'static str, code: &'static str, took: Duration) {
    counter!("grpc_server_requests_total", "method" => method, "code" => code).increment(1);
    histogram!("grpc_server_handling_seconds", "method" => method, "code" => code)
        .record(took.as_secs_f64());
}

/// Serves `/metrics`, `/healthz` (the process is up) and `/readyz` (health
/// is SERVING) on `listener` until `shutdown` turns true.
pub async fn serve_http(
    listener: TcpListener,
    ready: watch::Receiver<bool>,
    mut shutdown: watch::Receiver<bool>,
) {
    use axum::{Router, http::StatusCode, routing::get};
    let upkeep = tokio::spawn(async {
        loop {
            tokio::time::sleep(Duration::from_secs(5)).await;
            handle().run_upkeep();
        }
    });
    let app = Router::new()
        .route(
            "/metrics",
            get(|| async {
                (
                    [("content-type", "text/plain; version=0.0.4")],
                    handle().render(),
                )
            }),
        )
        .route("/healthz", get(|| async { "ok" }))
        .route(
            "/readyz",
            get(move || {
                let ready = *ready.borrow();
                async move {
                    if ready {
                        (StatusCode::OK, "ready")
                    } else {
                        (StatusCode::SERVICE_UNAVAILABLE, "not ready")
                    }
                }
            }),
        );
    let stop = async move {
        let _ = shutdown.wait_for(|s| *s).await;
    };
    if let Err(e) = axum::serve(listener, app)
        .with_graceful_shutdown(stop)
        .await
    {
        tracing::error!(error = %e, "metrics endpoint failed");
    }
    upkeep.abort();
}
