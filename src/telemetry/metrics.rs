//! Prometheus metrics: the names we export, recording helpers, and the HTTP
//! endpoint (`/metrics`, `/healthz`, `/readyz`) on its own port. Labels are
//! low-cardinality by construction: config names, stable codes, teams as one
//! of [`TEAM_BUCKETS`] hash buckets; never a message, never a key.

use metrics::{
    Unit, counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram,
};
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
/// Model calls per agent turn (`max_iterations` is at most 100).
const ITERATION_BUCKETS: &[f64] = &[1.0, 2.0, 3.0, 4.0, 5.0, 7.0, 10.0, 15.0, 20.0, 50.0, 100.0];
/// Operations per group commit (`metering.batch_max` caps it).
const BATCH_BUCKETS: &[f64] = &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0];

static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();

/// The process-wide recorder, installed on first use; tests' servers share it.
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
                b.set_buckets_for_metric(
                    Matcher::Full("http_server_request_duration_seconds".into()),
                    GRPC_BUCKETS,
                )
            })
            .and_then(|b| {
                b.set_buckets_for_metric(
                    Matcher::Full("tool_duration_seconds".into()),
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
            })
            .and_then(|b| {
                b.set_buckets_for_metric(
                    Matcher::Full("agent_iterations".into()),
                    ITERATION_BUCKETS,
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
        describe();
        handle
    })
}

/// USD families, gauges because the recorder's counters are integers. They
/// only increase, so `render` types them `counter`, as their `_total` names
/// promise and `rate()` expects.
const FLOAT_COUNTERS: &[&str] = &["llm_cost_usd_total", "usage_team_cost_usd_total"];

/// The Prometheus text of every metric, as `/metrics` serves it.
pub fn render() -> String {
    let mut text = handle().render();
    for name in FLOAT_COUNTERS {
        text = text.replace(
            &format!("# TYPE {name} gauge\n"),
            &format!("# TYPE {name} counter\n"),
        );
    }
    text
}

/// HELP text of every family (a scrape shows it beside the `TYPE`).
fn describe() {
    describe_providers();
    describe_usage();
    describe_tools_and_agents();
    describe_grpc();
}

fn describe_providers() {
    describe_counter!(
        "llm_requests_total",
        "Provider calls made, by provider, model and status (ok or the attempt's error code)."
    );
    describe_histogram!(
        "llm_response_time_seconds",
        Unit::Seconds,
        "Provider latency per call."
    );
    describe_counter!(
        "llm_resends_total",
        "Calls resent within their attempt because they never reached the provider, by transport cause."
    );
    describe_counter!(
        "llm_tokens_total",
        "Tokens billed by providers, by type (input/output)."
    );
    describe_gauge!(
        "llm_cost_usd_total",
        "USD spent on providers, from the pricing table (a counter)."
    );
    describe_gauge!(
        "circuit_breaker_state",
        "Breaker state per provider: 0 closed, 1 half-open, 2 open."
    );
    describe_gauge!(
        "cluster_store_up",
        "1 while the cluster store (Redis/Valkey) answers, 0 while shared limits fall back."
    );
    describe_counter!(
        "cluster_store_errors_total",
        "Commands the cluster store answered with an error (script, READONLY, OOM): each call fell back."
    );
    describe_gauge!(
        "provider_probe_up",
        "1 when the provider's last active probe was answered, else 0 (only providers with `probe`)."
    );
    describe_histogram!(
        "provider_probe_seconds",
        Unit::Seconds,
        "Time an active probe took, answered or not."
    );
    describe_counter!(
        "orchestrator_fallbacks_total",
        "Calls served by a target other than the chain's primary."
    );
    describe_histogram!(
        "orchestrator_overhead_seconds",
        Unit::Seconds,
        "Request time outside provider calls and their waits: our own work."
    );
}

fn describe_usage() {
    describe_histogram!(
        "usage_ledger_wait_seconds",
        Unit::Seconds,
        "How long a call waited on the ledger writer per operation, queue included."
    );
    describe_histogram!(
        "usage_ledger_commit_seconds",
        Unit::Seconds,
        "One group commit's transaction, without the WAL sync."
    );
    describe_histogram!(
        "usage_ledger_sync_seconds",
        Unit::Seconds,
        "One fdatasync of the SQLite WAL that settlements wait for."
    );
    describe_histogram!(
        "usage_ledger_batch_operations",
        "Ledger operations per group commit."
    );
    describe_counter!(
        "usage_quota_rejections_total",
        "Calls refused by a monthly cap, by team hash bucket."
    );
    describe_gauge!(
        "usage_team_cost_usd_total",
        "USD spent per team, from the pricing table (a counter). team: a team of telemetry.team_labels, every other team as other (one series per tenant would grow without bound); team_bucket: a stable hash bucket of the team ID."
    );
    describe_counter!(
        "usage_team_calls_total",
        "Metered calls per team. team: a team of telemetry.team_labels, every other team as other (one series per tenant would grow without bound); team_bucket: a stable hash bucket of the team ID."
    );
}

fn describe_tools_and_agents() {
    describe_counter!(
        "tool_invocations_total",
        "Tool invocations, by tool and status (PENDING when an ASYNC one is accepted)."
    );
    describe_histogram!(
        "tool_duration_seconds",
        Unit::Seconds,
        "How long a tool invocation ran."
    );
    describe_counter!(
        "tool_denials_total",
        "Tool invocations refused by the entry point, by stable reason."
    );
    describe_counter!(
        "workflow_retries_total",
        "Workflow webhook POSTs retried, by tool."
    );
    describe_counter!(
        "agent_turns_total",
        "Agent turns completed, by agent and stop reason."
    );
    describe_histogram!(
        "agent_iterations",
        "Model calls per completed agent turn, by agent."
    );
    describe_counter!(
        "agent_tool_calls_total",
        "Tool calls asked for by agents' models, by agent, tool and status (DENIED included)."
    );
    describe_counter!(
        "agent_history_truncated_total",
        "Agent turns whose history outgrew its budget, by agent and what became of the overflow (drop, summarize)."
    );
    describe_counter!(
        "guardrail_decisions_total",
        "Guardrail detections, by guardrail and action (block, flag, redact, fail_open, fail_closed)."
    );
}

fn describe_grpc() {
    describe_counter!(
        "orchestrator_errors_total",
        "Errors returned to callers, by stable ErrorInfo reason."
    );
    describe_counter!(
        "grpc_server_started_total",
        "gRPC calls started, by type, service and method."
    );
    describe_counter!(
        "grpc_server_handled_total",
        "gRPC calls completed, by type, service, method and final status code."
    );
    describe_histogram!(
        "grpc_server_handling_seconds",
        Unit::Seconds,
        "Time to handle a gRPC call: until the reply, or the stream's end."
    );
    describe_counter!(
        "http_server_requests_total",
        "HTTP edge requests completed, by route, method and status code."
    );
    describe_histogram!(
        "http_server_request_duration_seconds",
        Unit::Seconds,
        "Time to handle an HTTP edge request: until the body's end (a stream's last event)."
    );
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
        // `metrics` counters are integers; a gauge that only increases keeps
        // fractions of a cent, and is exported as a counter (`render`).
        gauge!("llm_cost_usd_total", "provider" => provider.to_owned(), "model" => model.to_owned()).increment(cost);
    }
}

/// Whether the cluster store answers (1) or shared limits fall back (0).
pub fn cluster_store_up(up: bool) {
    gauge!("cluster_store_up").set(if up { 1.0 } else { 0.0 });
}

/// The cluster store answered a command with an error (not an outage).
pub fn cluster_store_error() {
    counter!("cluster_store_errors_total").increment(1);
}

/// One active probe of a provider ended (never counted as a call).
pub fn probe(provider: &str, ok: bool, took: Duration) {
    gauge!("provider_probe_up", "provider" => provider.to_owned()).set(if ok { 1.0 } else { 0.0 });
    histogram!("provider_probe_seconds", "provider" => provider.to_owned())
        .record(took.as_secs_f64());
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

/// Request time outside provider attempts, the router's waits included
/// (backoff, `Retry-After`, rate limits): alert on its median (docs/operations.md §10).
pub fn overhead(d: Duration) {
    histogram!("orchestrator_overhead_seconds").record(d.as_secs_f64());
}

/// How long a ledger operation (`reserve` or `settle`) waited on the writer,
/// queue included; with SQLite's default durability, a settlement's WAL sync too.
pub fn ledger_wait(op: &'static str, d: Duration) {
    histogram!("usage_ledger_wait_seconds", "op" => op).record(d.as_secs_f64());
}

/// One group commit: how many operations it carried and how long its
/// transaction took (not counting the WAL sync, see [`ledger_sync`]).
pub fn ledger_commit(ops: usize, d: Duration) {
    histogram!("usage_ledger_batch_operations").record(ops as f64);
    histogram!("usage_ledger_commit_seconds").record(d.as_secs_f64());
}

/// One `fdatasync` of the SQLite WAL (`"full"`), which the batch's settlements await.
pub fn ledger_sync(d: Duration) {
    histogram!("usage_ledger_sync_seconds").record(d.as_secs_f64());
}

/// The `team_bucket` label of a team: `b00` … `b15`, a hash of its ID.
pub fn team_bucket(team: &str) -> String {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    team.hash(&mut h);
    format!("b{:02}", h.finish() % TEAM_BUCKETS)
}

/// A team's `team` label: its ID when in `telemetry.team_labels`, else `other`.
fn team_label(team: &str, listed: &std::collections::BTreeSet<String>) -> String {
    if listed.contains(team) {
        team.to_owned()
    } else {
        "other".to_owned()
    }
}

/// One metered call of `team`, and its cost when every model it used is priced.
pub fn team_usage(team: &str, listed: &std::collections::BTreeSet<String>, cost_usd: Option<f64>) {
    let (label, bucket) = (team_label(team, listed), team_bucket(team));
    counter!("usage_team_calls_total", "team" => label.clone(), "team_bucket" => bucket.clone())
        .increment(1);
    if let Some(cost) = cost_usd.filter(|c| *c > 0.0) {
        gauge!("usage_team_cost_usd_total", "team" => label, "team_bucket" => bucket)
            .increment(cost);
    }
}

/// A call refused by a monthly cap.
pub fn quota_rejection(team: &str) {
    counter!("usage_quota_rejections_total", "team_bucket" => team_bucket(team)).increment(1);
}

/// An error returned, by its stable `ErrorInfo.reason` (a fixed set): tells
/// apart what one gRPC code covers (`OVERLOADED` from `QUOTA_EXCEEDED`).
pub fn error_reason(reason: &'static str) {
    counter!("orchestrator_errors_total", "reason" => reason).increment(1);
}

/// A guardrail detected something and acted (`block`, `flag`, `redact`).
pub fn guardrail_decision(guardrail: &str, action: &'static str) {
    counter!("guardrail_decisions_total", "guardrail" => guardrail.to_owned(), "action" => action)
        .increment(1);
}

/// One tool invocation ended (or, ASYNC, was accepted: `PENDING`).
pub fn tool_invocation(tool: &str, status: &'static str, took: Duration) {
    counter!("tool_invocations_total", "tool" => tool.to_owned(), "status" => status).increment(1);
    if status != "PENDING" {
        histogram!("tool_duration_seconds", "tool" => tool.to_owned()).record(took.as_secs_f64());
    }
}

/// A tool invocation refused by the entry point, by its stable reason (the
/// tool is not a label: a caller names it, and a refused name may be any).
pub fn tool_denial(reason: &'static str) {
    counter!("tool_denials_total", "reason" => reason).increment(1);
}

/// An agent turn completed.
pub fn agent_turn(agent: &str, stop_reason: &'static str, iterations: u32) {
    counter!("agent_turns_total", "agent" => agent.to_owned(), "stop_reason" => stop_reason)
        .increment(1);
    histogram!("agent_iterations", "agent" => agent.to_owned()).record(f64::from(iterations));
}

/// A turn whose history did not fit: `mode` is what became of the
/// overflow (`drop`, or `summarize` when a summary replaced it).
pub fn agent_history_truncated(agent: &str, mode: &'static str) {
    counter!("agent_history_truncated_total", "agent" => agent.to_owned(), "mode" => mode)
        .increment(1);
}

/// A tool call an agent's model asked for, by how it ended. `tool` is one
/// of the agent's offered tools or `other` (a model may name anything).
pub fn agent_tool_call(agent: &str, tool: &str, status: &'static str) {
    counter!("agent_tool_calls_total", "agent" => agent.to_owned(), "tool" => tool.to_owned(), "status" => status)
        .increment(1);
}

/// A workflow webhook's POST retried.
pub fn workflow_retry(tool: &str) {
    counter!("workflow_retries_total", "tool" => tool.to_owned()).increment(1);
}

/// `service/method` as grpc-ecosystem's `(grpc_service, grpc_method)`.
fn service_and_method(method: &'static str) -> (&'static str, &'static str) {
    method.split_once('/').unwrap_or((method, method))
}

/// One gRPC call started (`kind`: `unary`, `server_stream`, ...; `method`:
/// `service/method`, from a fixed set, see [`crate::api::metrics_layer`]).
pub fn grpc_started(kind: &'static str, method: &'static str) {
    let (service, method) = service_and_method(method);
    counter!("grpc_server_started_total", "grpc_type" => kind, "grpc_service" => service, "grpc_method" => method)
        .increment(1);
}

/// One gRPC call handled, with its final status code.
pub fn grpc_handled(kind: &'static str, method: &'static str, code: &'static str, took: Duration) {
    let (service, method) = service_and_method(method);
    counter!("grpc_server_handled_total", "grpc_type" => kind, "grpc_service" => service, "grpc_method" => method, "grpc_code" => code)
        .increment(1);
    histogram!("grpc_server_handling_seconds", "grpc_type" => kind, "grpc_service" => service, "grpc_method" => method)
        .record(took.as_secs_f64());
}

/// One HTTP edge request handled (`route`: a fixed template, see
/// `crate::web`), with its status code.
pub fn http_handled(route: &'static str, method: &'static str, status: u16, took: Duration) {
    counter!("http_server_requests_total", "route" => route, "method" => method, "status" => status.to_string())
        .increment(1);
    histogram!("http_server_request_duration_seconds", "route" => route, "method" => method)
        .record(took.as_secs_f64());
}

/// Refreshes state-derived gauges (breakers, process figures) before a scrape.
pub type OnScrape = std::sync::Arc<dyn Fn() + Send + Sync>;

/// What `/health/providers` answers: whether every chain is healthy, and the JSON report.
pub type ProvidersHealth = std::sync::Arc<dyn Fn() -> (bool, String) + Send + Sync>;

/// Serves `/metrics`, `/healthz` (up), `/readyz` (SERVING) and
/// `/health/providers` (503 when a chain has no healthy target) until `shutdown`.
pub async fn serve_http(
    listener: TcpListener,
    ready: watch::Receiver<bool>,
    mut shutdown: watch::Receiver<bool>,
    on_scrape: OnScrape,
    providers: ProvidersHealth,
    pages: Option<axum::Router>,
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
            get(move || {
                on_scrape();
                async { ([("content-type", "text/plain; version=0.0.4")], render()) }
            }),
        )
        .route("/healthz", get(|| async { "ok" }))
        .route(
            "/health/providers",
            get(move || {
                let (healthy, body) = providers();
                let status = if healthy {
                    StatusCode::OK
                } else {
                    StatusCode::SERVICE_UNAVAILABLE
                };
                async move { (status, [("content-type", "application/json")], body) }
            }),
        )
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
    // More pages on this listener (the ops console), which read the peer's address.
    let app = match pages {
        Some(pages) => app.merge(pages),
        None => app,
    };
    let stop = async move {
        let _ = shutdown.wait_for(|s| *s).await;
    };
    let app = app.into_make_service_with_connect_info::<std::net::SocketAddr>();
    if let Err(e) = axum::serve(listener, app)
        .with_graceful_shutdown(stop)
        .await
    {
        tracing::error!(error = %e, "metrics endpoint failed");
    }
    upkeep.abort();
}
