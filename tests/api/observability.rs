//! The metrics endpoint: real scrape, exposition parsed, every metric the
//! operations guide promises present with its labels; plain HTTP probes.

mod abandoned;

use crate::common::{TestApp, config_toml_with, ctx};
use ai_orchestrator::api::pb;
use std::collections::BTreeSet;

pub(crate) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[tokio::test]
async fn metrics_are_scraped_and_parse() {
    let port = free_port();
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("m.db").display());
    let toml = config_toml_with(
        &url,
        "failure_rate = 1.0",
        "latency = \"1ms\"",
        "[metering.default_limits]\nmax_requests = 2\n",
    )
    .replace(
        "listen = \"127.0.0.1:0\"",
        &format!("listen = \"127.0.0.1:0\"\nmetrics_listen = \"127.0.0.1:{port}\""),
    );
    let app = TestApp::spawn_toml(&toml).await;
    let mut c = app.client.clone();
    for _ in 0..3 {
        // Two served by the fallback (primary always fails), the third refused by the cap.
        let _ = c
            .classify_sms(pb::ClassifySmsRequest {
                context: ctx(),
                message: "Any discount?".into(),
                ..Default::default()
            })
            .await;
    }
    let _ = c
        .classify_sms(pb::ClassifySmsRequest {
            context: ctx(),
            message: String::new(),
            ..Default::default()
        })
        .await;
    // A scanner's made-up method (the metrics layer runs before auth).
    let mut raw = tonic::client::Grpc::new(app.channel.clone());
    raw.ready().await.unwrap();
    let made_up = raw
        .unary::<(), (), _>(
            tonic::Request::new(()),
            "/ai.orchestrator.v1.Xq8Zr1/Random77".parse().unwrap(),
            tonic_prost::ProstCodec::default(),
        )
        .await
        .unwrap_err();
    assert_eq!(made_up.code(), tonic::Code::Unimplemented);

    let base = format!("http://127.0.0.1:{port}");
    let http = reqwest::Client::new();
    assert_eq!(
        http.get(format!("{base}/healthz"))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    assert_eq!(
        http.get(format!("{base}/readyz"))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    let body = http
        .get(format!("{base}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let lines = body.lines().map(|l| Ok(l.to_owned()));
    let scrape = prometheus_parse::Scrape::parse(lines).expect("exposition parses");

    let names: BTreeSet<&str> = scrape.samples.iter().map(|s| s.metric.as_str()).collect();
    let has = |metric: &str, labels: &[(&str, &str)]| {
        scrape
            .samples
            .iter()
            .any(|s| s.metric == metric && labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
    };
    assert!(
        has(
            "llm_requests_total",
            &[
                ("provider", "primary"),
                ("model", "gpt-4o-mini"),
                ("status", "HTTP_503")
            ]
        ),
        "{names:?}"
    );
    assert!(
        has(
            "llm_requests_total",
            &[("provider", "fallback"), ("status", "ok")]
        ),
        "{}",
        body.lines()
            .filter(|l| l.starts_with("llm_req"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    // Histograms parse as one sample without `le` (or as `_bucket` lines).
    let has_histogram = |metric: &str, labels: &[(&str, &str)]| {
        has(metric, labels) || has(&format!("{metric}_bucket"), labels)
    };
    for (provider, model) in [("primary", "gpt-4o-mini"), ("fallback", "claude-3-haiku")] {
        assert!(
            has_histogram(
                "llm_response_time_seconds",
                &[("provider", provider), ("model", model)]
            ),
            "{names:?}"
        );
    }
    // The grpc-ecosystem convention (docs/operations.md).
    const CLASSIFY: [(&str, &str); 3] = [
        ("grpc_type", "unary"),
        ("grpc_service", "ai.orchestrator.v1.Orchestrator"),
        ("grpc_method", "ClassifySms"),
    ];
    assert!(
        has_histogram("grpc_server_handling_seconds", &CLASSIFY),
        "{}",
        body.lines()
            .filter(|l| l.starts_with("grpc_server_handling"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert!(has("grpc_server_started_total", &CLASSIFY));
    for code in ["OK", "INVALID_ARGUMENT", "RESOURCE_EXHAUSTED"] {
        let mut labels = CLASSIFY.to_vec();
        labels.push(("grpc_code", code));
        assert!(has("grpc_server_handled_total", &labels), "{code}");
    }
    // Unknown methods share one label; nothing a caller sent becomes a label.
    assert!(has(
        "grpc_server_handled_total",
        &[
            ("grpc_service", "other"),
            ("grpc_method", "other"),
            ("grpc_code", "UNIMPLEMENTED")
        ]
    ));
    assert!(has_histogram(
        "grpc_server_handling_seconds",
        &[("grpc_service", "other"), ("grpc_method", "other")]
    ));
    assert!(!body.contains("Xq8Zr1") && !body.contains("Random77"));
    assert!(has(
        "llm_tokens_total",
        &[("provider", "fallback"), ("type", "input")]
    ));
    assert!(has(
        "llm_tokens_total",
        &[("provider", "fallback"), ("type", "output")]
    ));
    assert!(has(
        "llm_cost_usd_total",
        &[("provider", "fallback"), ("model", "claude-3-haiku")]
    ));
    assert!(has("circuit_breaker_state", &[("provider", "primary")]));
    assert!(has(
        "orchestrator_fallbacks_total",
        &[
            ("task", "sms_classify"),
            ("from", "primary"),
            ("to", "fallback")
        ]
    ));
    assert!(
        names
            .iter()
            .any(|n| n.starts_with("orchestrator_overhead_seconds")),
        "{names:?}"
    );
    // The ledger writer (a SQLite file, default durability): callers' waits
    // by operation, group commits and the WAL syncs.
    assert!(has_histogram(
        "usage_ledger_wait_seconds",
        &[("op", "reserve")]
    ));
    assert!(has_histogram(
        "usage_ledger_wait_seconds",
        &[("op", "settle")]
    ));
    for name in [
        "usage_ledger_commit_seconds",
        "usage_ledger_sync_seconds",
        "usage_ledger_batch_operations",
    ] {
        assert!(has_histogram(name, &[]), "{name}: {names:?}");
    }
    assert!(scrape.samples.iter().any(|s| {
        s.metric == "usage_quota_rejections_total"
            && s.labels
                .get("team_bucket")
                .is_some_and(|b| b.starts_with('b'))
    }));
    assert!(has(
        "orchestrator_errors_total",
        &[("reason", "QUOTA_EXCEEDED")]
    ));
    assert!(has(
        "orchestrator_errors_total",
        &[("reason", "INVALID_INPUT")]
    ));
    assert!(has(
        "grpc_server_handled_total",
        &[("grpc_code", "RESOURCE_EXHAUSTED")]
    ));
    assert!(
        !body.contains("Any discount"),
        "message contents never reach metrics"
    );
    app.stop().await;
}

/// The metrics endpoint of an app, parsed.
pub(crate) async fn scrape(port: u16) -> prometheus_parse::Scrape {
    // Bounded: a wedged server fails the test instead of hanging the suite.
    let client = reqwest::Client::builder()
        .timeout(std::time::Duration::from_secs(10))
        .build()
        .unwrap();
    let body = client
        .get(format!("http://127.0.0.1:{port}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    prometheus_parse::Scrape::parse(body.lines().map(|l| Ok(l.to_owned()))).unwrap()
}

/// A counter's value (0 when the series does not exist yet). The recorder
/// is process-wide: tests compare before and after, on labels only they use.
pub(crate) fn counter(
    scrape: &prometheus_parse::Scrape,
    metric: &str,
    labels: &[(&str, &str)],
) -> f64 {
    scrape
        .samples
        .iter()
        .filter(|s| s.metric == metric && labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
        .map(|s| match s.value {
            prometheus_parse::Value::Counter(v) | prometheus_parse::Value::Untyped(v) => v,
            _ => 0.0,
        })
        .sum()
}

/// The number of observations in a histogram series (0 when absent).
pub(crate) fn histogram_count(
    scrape: &prometheus_parse::Scrape,
    metric: &str,
    labels: &[(&str, &str)],
) -> f64 {
    scrape
        .samples
        .iter()
        .filter(|s| s.metric == metric && labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
        .map(|s| match &s.value {
            prometheus_parse::Value::Histogram(buckets) => {
                buckets.iter().map(|b| b.count).fold(0.0, f64::max)
            }
            _ => 0.0,
        })
        .sum()
}

/// The labels of ExecuteStream's gRPC metrics.
const EXECUTE_STREAM: [(&str, &str); 3] = [
    ("grpc_type", "server_stream"),
    ("grpc_service", "ai.orchestrator.v1.Orchestrator"),
    ("grpc_method", "ExecuteStream"),
];

/// ExecuteStream's labels with a final code.
fn stream_ended(code: &'static str) -> Vec<(&'static str, &'static str)> {
    let mut labels = EXECUTE_STREAM.to_vec();
    labels.push(("grpc_code", code));
    labels
}

/// ExecuteStream refused by a team's cap counts in
/// `usage_quota_rejections_total` (it is refused before `finish`), and in
/// the gRPC metrics as RESOURCE_EXHAUSTED.
#[tokio::test]
async fn execute_stream_quota_refusals_are_counted() {
    use ai_orchestrator::telemetry::metrics::team_bucket;
    const TEAM: &str = "stream-quota-team";
    let port = free_port();
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("q.db").display());
    let toml = config_toml_with(
        &url,
        "latency = \"1ms\"",
        "latency = \"1ms\"",
        "[metering.default_limits]\nmax_requests = 1\n",
    )
    .replace(
        "listen = \"127.0.0.1:0\"",
        &format!("listen = \"127.0.0.1:0\"\nmetrics_listen = \"127.0.0.1:{port}\""),
    );
    let app = TestApp::spawn_toml(&toml).await;
    let request = || pb::ExecuteRequest {
        context: Some(pb::RequestContext {
            team_id: TEAM.into(),
            ..Default::default()
        }),
        task: "meeting_brief".into(),
        ..Default::default()
    };
    let mut first = app
        .client
        .clone()
        .execute_stream(request())
        .await
        .unwrap()
        .into_inner();
    while first.message().await.unwrap().is_some() {}

    let bucket = team_bucket(TEAM);
    let rejections = [("team_bucket", bucket.as_str())];
    let refused_stream = stream_ended("RESOURCE_EXHAUSTED");
    let before = scrape(port).await;
    let status = app
        .client
        .clone()
        .execute_stream(request())
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
    let after = scrape(port).await;
    assert!(
        counter(&after, "usage_quota_rejections_total", &rejections)
            >= counter(&before, "usage_quota_rejections_total", &rejections) + 1.0
    );
    assert!(
        counter(&after, "grpc_server_handled_total", &refused_stream)
            >= counter(&before, "grpc_server_handled_total", &refused_stream) + 1.0
    );
    app.stop().await;
}

/// A stream that fails after output has been sent ends with UNAVAILABLE in
/// its trailers; the gRPC metrics record that code (not the OK of its
/// headers), in the counter and the latency histogram.
#[tokio::test]
async fn a_stream_failing_midway_is_counted_with_its_final_code() {
    use wiremock::{Mock, MockServer, ResponseTemplate, matchers::method};
    let upstream = MockServer::start().await;
    let chunk = serde_json::json!({"id": "chatcmpl-3", "object": "chat.completion.chunk",
        "created": 1_732_000_000, "model": "gpt-4o-mini",
        "choices": [{"index": 0, "delta": {"role": "assistant", "content": "Half an "}, "finish_reason": null}]});
    let sse = format!(
        "data: {chunk}\n\ndata: {}\n\n",
        serde_json::json!({"error": {"message": "upstream broke", "type": "server_error"}})
    );
    Mock::given(method("POST"))
        .respond_with(
            ResponseTemplate::new(200)
                .insert_header("content-type", "text/event-stream")
                .set_body_string(sse),
        )
        .mount(&upstream)
        .await;
    let port = free_port();
    let dir = tempfile::tempdir().unwrap();
    let toml = format!(
        r#"
[server]
listen = "127.0.0.1:0"
metrics_listen = "127.0.0.1:{port}"
[database]
url = "sqlite://{}"
[providers.openai]
kind = "openai"
base_url = "{}/v1"
api_key_env = "K"
[tasks.meeting_brief]
chain = [{{ provider = "openai", model = "gpt-4o-mini" }}]
[pricing."gpt-4o-mini"]
input_per_mtok = 0.15
output_per_mtok = 0.6
"#,
        dir.path().join("mid.db").display(),
        upstream.uri()
    );
    let app = TestApp::spawn_toml_env(&toml, |n| (n == "K").then(|| "sk-test".to_owned())).await;
    let failed = stream_ended("UNAVAILABLE");
    let before = scrape(port).await;
    let mut stream = app
        .client
        .clone()
        .execute_stream(pb::ExecuteRequest {
            context: ctx(),
            task: "meeting_brief".into(),
            ..Default::default()
        })
        .await
        .expect("the stream starts (headers say OK)")
        .into_inner();
    let mut deltas = 0;
    let status = loop {
        match stream.message().await {
            Ok(Some(e)) => {
                if matches!(e.event, Some(pb::execute_event::Event::Delta(_))) {
                    deltas += 1;
                }
            }
            Ok(None) => panic!("the stream must fail"),
            Err(status) => break status,
        }
    };
    assert_eq!(deltas, 1);
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    // Recorded when the final status was decided, before the trailers left.
    let after = scrape(port).await;
    assert!(
        counter(&after, "grpc_server_handled_total", &failed)
            >= counter(&before, "grpc_server_handled_total", &failed) + 1.0
    );
    assert!(
        histogram_count(&after, "grpc_server_handling_seconds", &EXECUTE_STREAM)
            >= histogram_count(&before, "grpc_server_handling_seconds", &EXECUTE_STREAM) + 1.0
    );
    app.stop().await;
}

/// The real binary's JSON logs (stdout, `RUST_LOG=info`) while a provider
/// fails: every line of the request carries its trace ID, and neither the
/// API key, the message, nor the upstream's error text ever appears.
/// (A separate process: a thread-local capture would race with the other
/// tests' subscribers over tracing's process-wide callsite cache.)
#[tokio::test]
async fn logs_carry_the_trace_id_and_never_contents_or_keys() {
    use wiremock::{Mock, MockServer, ResponseTemplate, matchers::method};

    const KEY: &str = "sk-CANARY-KEY-4242";
    const MESSAGE: &str = "CANARY-MESSAGE my card is 4111";
    let upstream = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(
            ResponseTemplate::new(500).set_body_string(
                r#"{"error":{"message":"CANARY-UPSTREAM","type":"server_error"}}"#,
            ),
        )
        .mount(&upstream)
        .await;
    let dir = tempfile::tempdir().unwrap();
    let addr = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let toml = format!(
        r#"
[server]
listen = "{addr}"
[database]
url = "sqlite://{}"
[providers.openai]
kind = "openai"
base_url = "{}/v1"
api_key_env = "CANARY_OPENAI_KEY"
[tasks.sms_classify]
chain = [{{ provider = "openai", model = "gpt-4o-mini" }}]
[pricing."gpt-4o-mini"]
input_per_mtok = 0.15
output_per_mtok = 0.6
[retry]
max_attempts = 2
base_backoff = "5ms"
max_backoff = "5ms"
"#,
        dir.path().join("l.db").display(),
        upstream.uri()
    );
    let config = dir.path().join("config.toml");
    std::fs::write(&config, toml).unwrap();
    let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_ai-orchestrator"))
        .args([
            "--config",
            config.to_str().unwrap(),
            "--log-format",
            "json",
            "serve",
        ])
        .env("CANARY_OPENAI_KEY", KEY)
        .env("RUST_LOG", "info")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let channel = crate::common::connect(addr).await;
    let mut request = tonic::Request::new(pb::ClassifySmsRequest {
        context: ctx(),
        message: MESSAGE.into(),
        ..Default::default()
    });
    request
        .metadata_mut()
        .insert("x-trace-id", "trace-canary-1".parse().unwrap());
    let status = pb::orchestrator_client::OrchestratorClient::new(channel)
        .classify_sms(request)
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unavailable);
    let pid = child.id().unwrap().to_string();
    assert!(
        std::process::Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success()
    );
    let output = tokio::time::timeout(std::time::Duration::from_secs(15), child.wait_with_output())
        .await
        .expect("exits after SIGTERM")
        .unwrap();
    let logs = String::from_utf8_lossy(&output.stdout).into_owned()
        + &String::from_utf8_lossy(&output.stderr);

    for canary in [KEY, "CANARY-MESSAGE", "4111", "CANARY-UPSTREAM"] {
        assert!(!logs.contains(canary), "{canary} leaked into logs:\n{logs}");
    }
    let lines: Vec<serde_json::Value> = logs
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    let failures: Vec<_> = lines
        .iter()
        .filter(|v| v["message"] == "provider attempt failed")
        .collect();
    assert_eq!(failures.len(), 2, "one line per failed attempt:\n{logs}");
    for line in &failures {
        assert_eq!(line["span"]["trace_id"], "trace-canary-1", "{line}");
        // At the top level too, for log pipelines that do not nest.
        assert_eq!(line["trace_id"], "trace-canary-1", "{line}");
        // The exported-only attributes stay out of log lines.
        assert!(line["span"].get("otel.kind").is_none(), "{line}");
        assert!(
            line["span"].get("gen_ai.operation.name").is_none(),
            "{line}"
        );
    }
    // Every line logged inside the request names it.
    for line in lines.iter().filter(|v| v.get("span").is_some()) {
        assert_eq!(line["span"]["trace_id"], "trace-canary-1", "{line}");
    }
    // One access line for the RPC, with its outcome and nothing of its content.
    let access: Vec<_> = lines
        .iter()
        .filter(|v| v["target"] == "ai_orchestrator::access")
        .collect();
    assert_eq!(access.len(), 1, "one access line per RPC:\n{logs}");
    let line = access[0];
    assert_eq!(line["level"], "INFO");
    assert_eq!(line["rpc"], "ai.orchestrator.v1.Orchestrator/ClassifySms");
    assert_eq!(line["code"], "UNAVAILABLE");
    assert_eq!(line["reason"], "ALL_PROVIDERS_FAILED");
    assert_eq!(line["attempts"], 2);
    assert_eq!(line["trace_id"], "trace-canary-1");
    assert_eq!(line["team_id"], "t1");
    assert!(
        line["latency_ms"].as_f64().is_some_and(|ms| ms > 0.0),
        "{line}"
    );
    // The start-up lines name addresses plainly, not as Rust `Option`s.
    let serving = lines
        .iter()
        .find(|v| v["message"] == "serving")
        .expect("a serving line");
    assert_eq!(serving["addr"], addr.to_string(), "{serving}");
    // Piped, not a terminal: no colour codes anywhere.
    assert!(!logs.contains('\u{1b}'), "ANSI escapes in piped logs");
}

/// A fake OTLP/gRPC collector that keeps what it receives.
#[derive(Clone, Default)]
struct Collector {
    spans: std::sync::Arc<std::sync::Mutex<Vec<(String, String)>>>,
}

#[tonic::async_trait]
impl opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::TraceService
    for Collector
{
    async fn export(
        &self,
        request: tonic::Request<
            opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest,
        >,
    ) -> Result<
        tonic::Response<
            opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceResponse,
        >,
        tonic::Status,
    > {
        use opentelemetry_proto::tonic::common::v1::any_value::Value;
        for rs in request.into_inner().resource_spans {
            let service = rs
                .resource
                .iter()
                .flat_map(|r| &r.attributes)
                .find(|kv| kv.key == "service.name")
                .and_then(|kv| kv.value.as_ref())
                .and_then(|v| match &v.value {
                    Some(Value::StringValue(s)) => Some(s.clone()),
                    _ => None,
                })
                .unwrap_or_default();
            for ss in rs.scope_spans {
                for span in ss.spans {
                    self.spans
                        .lock()
                        .unwrap()
                        .push((service.clone(), span.name));
                }
            }
        }
        Ok(tonic::Response::new(Default::default()))
    }
}

/// The real binary, with `OTEL_EXPORTER_OTLP_ENDPOINT` set, exports its spans
/// to a collector over OTLP/gRPC (and flushes them at SIGTERM).
#[tokio::test]
async fn the_binary_exports_spans_over_otlp() {
    use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::TraceServiceServer;
    let collector = Collector::default();
    let otlp = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let otlp_addr = otlp.local_addr().unwrap();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(TraceServiceServer::new(collector.clone()))
            .serve_with_incoming(tonic::transport::server::TcpIncoming::from(otlp)),
    );

    let dir = tempfile::tempdir().unwrap();
    let addr = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let toml = config_toml_with(
        &format!("sqlite://{}", dir.path().join("otlp.db").display()),
        "latency = \"1ms\"",
        "latency = \"1ms\"",
        "",
    )
    .replace("listen = \"127.0.0.1:0\"", &format!("listen = \"{addr}\""));
    let config = dir.path().join("config.toml");
    std::fs::write(&config, toml).unwrap();
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_ai-orchestrator"))
        .args(["--config", config.to_str().unwrap(), "serve"])
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", format!("http://{otlp_addr}"))
        .env("OTEL_SERVICE_NAME", "aio-under-test")
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let channel = crate::common::connect(addr).await;
    let mut client = pb::orchestrator_client::OrchestratorClient::new(channel);
    for _ in 0..3 {
        client
            .classify_sms(pb::ClassifySmsRequest {
                context: ctx(),
                message: "Is the offer still on?".into(),
                ..Default::default()
            })
            .await
            .unwrap();
    }
    let pid = child.id().unwrap().to_string();
    let killed = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap();
    assert!(killed.success());
    let status = tokio::time::timeout(std::time::Duration::from_secs(15), child.wait())
        .await
        .expect("exits after SIGTERM")
        .unwrap();
    assert!(status.success(), "{status:?}");

    let spans = collector.spans.lock().unwrap().clone();
    let count = |name: &str| {
        spans
            .iter()
            .filter(|(svc, n)| n == name && svc == "aio-under-test")
            .count()
    };
    // Named by the OpenTelemetry conventions: RPC server spans, GenAI
    // client spans.
    assert_eq!(
        count("ai.orchestrator.v1.Orchestrator/ClassifySms"),
        3,
        "{spans:?}"
    );
    assert_eq!(count("chat gpt-4o-mini"), 3, "{spans:?}");
}

/// A fresh process (as a new pod) already exposes every breaker's state,
/// before any call: dashboards and alerts must not start from nothing.
#[tokio::test]
async fn a_fresh_process_exposes_every_breaker_state() {
    let dir = tempfile::tempdir().unwrap();
    let addr = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let metrics_port = free_port();
    let toml = config_toml_with(
        &format!("sqlite://{}", dir.path().join("fresh.db").display()),
        "latency = \"1ms\"",
        "latency = \"1ms\"",
        "",
    )
    .replace(
        "listen = \"127.0.0.1:0\"",
        &format!("listen = \"{addr}\"\nmetrics_listen = \"127.0.0.1:{metrics_port}\""),
    );
    let config = dir.path().join("config.toml");
    std::fs::write(&config, toml).unwrap();
    let _child = tokio::process::Command::new(env!("CARGO_BIN_EXE_ai-orchestrator"))
        .args(["--config", config.to_str().unwrap(), "serve"])
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    crate::common::connect(addr).await;
    let body = reqwest::get(format!("http://127.0.0.1:{metrics_port}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for provider in ["primary", "fallback"] {
        assert!(
            body.contains(&format!(
                "circuit_breaker_state{{provider=\"{provider}\"}} 0"
            )),
            "{provider} missing:\n{body}"
        );
    }
}

/// Text logs written to a pipe or a file carry no colour codes (a
/// terminal still gets colours).
#[tokio::test]
async fn text_logs_to_a_pipe_have_no_colour_codes() {
    use tokio::io::AsyncBufReadExt;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.toml");
    let url = format!("sqlite://{}", dir.path().join("t.db").display());
    std::fs::write(&config, crate::common::config_toml(&url, "", "")).unwrap();
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_ai-orchestrator"))
        .args([
            "--config",
            config.to_str().unwrap(),
            "--log-format",
            "text",
            "serve",
        ])
        .env("RUST_LOG", "info")
        .env_remove("AIO_SERVER__LISTEN")
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let serving = tokio::time::timeout(std::time::Duration::from_secs(30), async {
        while let Some(line) = lines.next_line().await.unwrap() {
            if line.contains("serving") {
                return line;
            }
        }
        panic!("the server exited before serving");
    })
    .await
    .expect("a serving line");
    assert!(!serving.contains('\u{1b}'), "ANSI escapes: {serving:?}");
    assert!(serving.contains("addr=127.0.0.1:"), "{serving}");
    child.kill().await.unwrap();
}
