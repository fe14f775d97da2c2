//! The metrics endpoint: real scrape, exposition parsed, every metric the
//! operations guide promises present with its labels; plain HTTP probes.

use crate::common::{TestApp, config_toml_with, ctx};
use ai_orchestrator::api::pb;
use std::collections::BTreeSet;

fn free_port() -> u16 {
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
    assert!(
        names.contains("llm_response_time_seconds_bucket")
            || names.contains("llm_response_time_seconds"),
        "{names:?}"
    );
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
    assert!(scrape.samples.iter().any(|s| {
        s.metric == "usage_quota_rejections_total"
            && s.labels
                .get("team_bucket")
                .is_some_and(|b| b.starts_with('b'))
    }));
    assert!(has(
        "grpc_server_requests_total",
        &[
            ("method", "ai.orchestrator.v1.Orchestrator/ClassifySms"),
            ("code", "OK")
        ]
    ));
    assert!(has(
        "grpc_server_requests_total",
        &[
            ("method", "ai.orchestrator.v1.Orchestrator/ClassifySms"),
            ("code", "INVALID_ARGUMENT")
        ]
    ));
    assert!(has(
        "grpc_server_requests_total",
        &[("code", "RESOURCE_EXHAUSTED")]
    ));
    assert!(
        !body.contains("Any discount"),
        "message contents never reach metrics"
    );
    app.stop().await;
}

/// (span name, parent span name) of every span created.
type SpanLog = std::sync::Arc<std::sync::Mutex<Vec<(String, Option<String>)>>>;

/// Captures JSON log lines and the spans created.
#[derive(Clone, Default)]
struct Capture {
    logs: std::sync::Arc<std::sync::Mutex<Vec<u8>>>,
    spans: SpanLog,
}

impl std::io::Write for Capture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.logs.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Capture {
    type Writer = Capture;
    fn make_writer(&'a self) -> Self::Writer {
        self.clone()
    }
}

impl<S> tracing_subscriber::Layer<S> for Capture
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    fn on_new_span(
        &self,
        attrs: &tracing::span::Attributes<'_>,
        id: &tracing::span::Id,
        ctx: tracing_subscriber::layer::Context<'_, S>,
    ) {
        let parent = ctx
            .span(id)
            .and_then(|s| s.parent())
            .map(|p| p.name().to_owned());
        self.spans
            .lock()
            .unwrap()
            .push((attrs.metadata().name().to_owned(), parent));
    }
}

#[tokio::test]
async fn logs_carry_the_trace_id_and_never_contents_or_keys() {
    use tracing_subscriber::prelude::*;
    use wiremock::{Mock, MockServer, ResponseTemplate, matchers::method};
    let capture = Capture::default();
    let subscriber = tracing_subscriber::registry()
        .with(tracing_subscriber::EnvFilter::new("info"))
        .with(ai_orchestrator::telemetry::json_layer(capture.clone()))
        .with(capture.clone());
    // Thread-local: this test's current-thread runtime runs the whole server.
    let _guard = tracing::subscriber::set_default(subscriber);

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
    let toml = format!(
        r#"
[database]
url = "sqlite://{}"
[providers.openai]
kind = "openai"
base_url = "{}/v1"
api_key_env = "K"
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
    let app = TestApp::spawn_toml_env(&toml, |n| (n == "K").then(|| KEY.to_owned())).await;
    let mut request = tonic::Request::new(pb::ClassifySmsRequest {
        context: ctx(),
        message: MESSAGE.into(),
        ..Default::default()
    });
    request
        .metadata_mut()
        .insert("x-trace-id", "trace-canary-1".parse().unwrap());
    let status = app.client.clone().classify_sms(request).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unavailable);
    app.stop().await;

    let logs = String::from_utf8(capture.logs.lock().unwrap().clone()).unwrap();
    for canary in [KEY, "CANARY-MESSAGE", "4111", "CANARY-UPSTREAM"] {
        assert!(!logs.contains(canary), "{canary} leaked into logs:\n{logs}");
    }
    let failures: Vec<serde_json::Value> = logs
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .filter(|v: &serde_json::Value| v["message"] == "provider attempt failed")
        .collect();
    assert_eq!(failures.len(), 2, "one line per failed attempt:\n{logs}");
    for line in &failures {
        assert_eq!(line["span"]["trace_id"], "trace-canary-1", "{line}");
    }
    let spans = capture.spans.lock().unwrap().clone();
    let attempts: Vec<_> = spans
        .iter()
        .filter(|(name, _)| name == "provider_attempt")
        .collect();
    assert_eq!(attempts.len(), 2);
    assert!(
        attempts
            .iter()
            .all(|(_, parent)| parent.as_deref() == Some("request")),
        "{spans:?}"
    );
}
