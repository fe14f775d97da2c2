//! Active provider probes (SPEC §18) against fake providers speaking each
//! kind's real wire format: what each kind sends, a provider that hangs,
//! `GetProviderHealth`, `/health/providers`, and that probes are neither
//! metered nor counted by the breaker, nor touch readiness.

use crate::common::{TestApp, wait_for};
use ai_orchestrator::api::pb;
use serde_json::{Value, json};
use std::time::Duration;
use tonic_health::pb::{HealthCheckRequest, health_check_response::ServingStatus};
use wiremock::{
    Mock, MockServer, ResponseTemplate,
    matchers::{body_partial_json, header, method, path, query_param},
};

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn toml(db: &str, metrics_port: u16, uris: &Uris) -> String {
    let Uris {
        openai,
        anthropic,
        gemini,
        perplexity,
        hanging,
    } = uris;
    let probe = "probe = { interval = \"1s\", timeout = \"300ms\" }";
    format!(
        r#"
[server]
listen = "127.0.0.1:0"
metrics_listen = "127.0.0.1:{metrics_port}"
health_probe_interval = "100ms"
[database]
url = "sqlite://{db}"
[providers.probed_openai]
kind = "openai"
base_url = "{openai}/v1"
api_key_env = "TEST_KEY"
{probe}
[providers.probed_anthropic]
kind = "anthropic"
base_url = "{anthropic}/v1"
api_key_env = "TEST_KEY"
{probe}
[providers.probed_gemini]
kind = "gemini"
base_url = "{gemini}/v1beta"
api_key_env = "TEST_KEY"
{probe}
[providers.probed_perplexity]
kind = "perplexity"
base_url = "{perplexity}"
api_key_env = "TEST_KEY"
{probe}
[providers.probed_hanging]
kind = "openai_compatible"
base_url = "{hanging}/v1"
{probe}
# One counted failure would open it: probes must never count.
breaker = {{ failure_threshold = 1 }}
[providers.probed_unprobed]
kind = "mock"
[tasks.served]
chain = [{{ provider = "probed_hanging", model = "llama3" }}, {{ provider = "probed_openai", model = "gpt-4o-mini" }}]
[tasks.stranded]
chain = [{{ provider = "probed_hanging", model = "llama3" }}]
[tasks.research]
chain = [{{ provider = "probed_perplexity", model = "sonar" }}, {{ provider = "probed_anthropic", model = "claude-3-haiku" }}, {{ provider = "probed_gemini", model = "gemini-2.0-flash" }}, {{ provider = "probed_unprobed", model = "m" }}]
[pricing."gpt-4o-mini"]
price = "unknown"
[pricing."llama3"]
price = "unknown"
[pricing."sonar"]
price = "unknown"
[pricing."claude-3-haiku"]
price = "unknown"
[pricing."gemini-2.0-flash"]
price = "unknown"
[pricing."m"]
price = "unknown"
"#
    )
}

struct Uris {
    openai: String,
    anthropic: String,
    gemini: String,
    perplexity: String,
    hanging: String,
}

async fn health_providers(port: u16) -> (u16, Value) {
    let response = reqwest::get(format!("http://127.0.0.1:{port}/health/providers"))
        .await
        .unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap())
}

fn probe_of(health: &pb::ProviderHealth) -> Option<&pb::ProbeResult> {
    health.last_probe.as_ref()
}

#[tokio::test]
async fn each_kind_is_probed_with_its_cheapest_request_and_a_hanging_one_fails() {
    let servers: Vec<MockServer> =
        futures::future::join_all((0..5).map(|_| MockServer::start())).await;
    let [openai, anthropic, gemini, perplexity, hanging] = &servers[..] else {
        unreachable!()
    };
    Mock::given(method("GET"))
        .and(path("/v1/models"))
        .and(header("authorization", "Bearer k-test"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({
            "object": "list",
            "data": [{"id": "gpt-4o-mini", "object": "model", "created": 1_721_172_741, "owned_by": "system"}]
        })))
        .mount(openai)
        .await;
    Mock::given(method("GET"))
        .and(path("/v1/models"))
        .and(query_param("limit", "1"))
        .and(header("x-api-key", "k-test"))
        .and(header("anthropic-version", "2023-06-01"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({
            "data": [{"type": "model", "id": "claude-3-haiku-20240307", "display_name": "Claude 3 Haiku", "created_at": "2024-03-07T00:00:00Z"}],
            "has_more": true, "first_id": "claude-3-haiku-20240307", "last_id": "claude-3-haiku-20240307"
        })))
        .mount(anthropic)
        .await;
    Mock::given(method("GET"))
        .and(path("/v1beta/models"))
        .and(query_param("pageSize", "1"))
        .and(header("x-goog-api-key", "k-test"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({
            "models": [{"name": "models/gemini-2.0-flash", "displayName": "Gemini 2.0 Flash"}],
            "nextPageToken": "abc"
        })))
        .mount(gemini)
        .await;
    // Perplexity has no model list: one token of the model routed to it.
    Mock::given(method("POST"))
        .and(path("/chat/completions"))
        .and(body_partial_json(json!({"model": "sonar", "max_tokens": 1})))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({
            "id": "p1", "model": "sonar", "object": "chat.completion", "created": 1_732_000_000,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "Po"}, "finish_reason": "length"}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
            "citations": []
        })))
        .mount(perplexity)
        .await;
    Mock::given(method("GET"))
        .and(path("/v1/models"))
        .respond_with(ResponseTemplate::new(200).set_delay(Duration::from_secs(30)))
        .mount(hanging)
        .await;

    let uris = Uris {
        openai: openai.uri(),
        anthropic: anthropic.uri(),
        gemini: gemini.uri(),
        perplexity: perplexity.uri(),
        hanging: hanging.uri(),
    };
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("probes.db");
    let port = free_port();
    let mut app = TestApp::spawn_toml_env(&toml(&db.display().to_string(), port, &uris), |n| {
        (n == "TEST_KEY").then(|| "k-test".to_owned())
    })
    .await;
    app.keep(dir);

    // Two probes of the hanging provider have failed by their timeout.
    wait_for(|| async { hanging.received_requests().await.unwrap_or_default().len() >= 2 }).await;
    wait_for(|| async {
        probe_of(&app.provider_health("probed_hanging").await).is_some_and(|p| !p.ok)
    })
    .await;
    let hung = app.provider_health("probed_hanging").await;
    let probe = probe_of(&hung).unwrap();
    assert_eq!(probe.error_code, "TIMEOUT");
    assert!((250..2_000).contains(&probe.latency_ms), "{probe:?}");
    // Never counted: one counted failure would have opened this breaker.
    assert_eq!(hung.state, pb::BreakerState::Closed as i32);
    assert_eq!((hung.consecutive_failures, hung.recent_calls), (0, 0));

    for name in [
        "probed_openai",
        "probed_anthropic",
        "probed_gemini",
        "probed_perplexity",
    ] {
        wait_for(|| async { probe_of(&app.provider_health(name).await).is_some() }).await;
        let health = app.provider_health(name).await;
        let probe = probe_of(&health).unwrap();
        assert!(probe.ok, "{name}: {probe:?}");
        assert_eq!(probe.error_code, "");
        assert!(probe.at.is_some());
        assert_eq!(health.recent_calls, 0, "{name}: a probe is not a call");
    }
    assert!(probe_of(&app.provider_health("probed_unprobed").await).is_none());

    // `stranded` has no healthy target left; `served` still has one.
    let (status, body) = health_providers(port).await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["status"], "degraded");
    assert_eq!(body["chains_without_healthy_target"], json!(["stranded"]));
    assert_eq!(
        body["chains"]["served"]["healthy_targets"],
        json!(["probed_openai/gpt-4o-mini"])
    );
    assert_eq!(
        body["providers"]["probed_hanging"]["probe"]["error_code"],
        "TIMEOUT"
    );
    assert_eq!(body["providers"]["probed_hanging"]["breaker"], "closed");

    // Readiness never depends on providers.
    let ready = reqwest::get(format!("http://127.0.0.1:{port}/readyz"))
        .await
        .unwrap();
    assert_eq!(ready.status(), 200);
    let mut grpc_health = tonic_health::pb::health_client::HealthClient::new(app.channel.clone());
    let serving = grpc_health
        .check(HealthCheckRequest {
            service: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(serving.status, ServingStatus::Serving as i32);

    // Never metered: no usage record, no provider call counted.
    let ai_orchestrator::store::Store::Sqlite(pool) = app.store().await else {
        unreachable!("a SQLite test database")
    };
    let (records,): (i64,) = sqlx::query_as("SELECT count(*) FROM usage_records")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(records, 0);
    let metrics = reqwest::get(format!("http://127.0.0.1:{port}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    // (The recorder is the test process's: other tests' calls are there.)
    assert!(
        !metrics
            .lines()
            .any(|l| l.starts_with("llm_requests_total") && l.contains("probed_")),
        "{metrics}"
    );
    assert!(
        metrics.contains("provider_probe_up{provider=\"probed_hanging\"} 0"),
        "{metrics}"
    );
    assert!(
        metrics.contains("provider_probe_up{provider=\"probed_openai\"} 1"),
        "{metrics}"
    );

    // The provider answers again: the next probe says so, and every chain
    // has a healthy target.
    hanging.reset().await;
    Mock::given(method("GET"))
        .and(path("/v1/models"))
        .respond_with(
            ResponseTemplate::new(200).set_body_json(json!({"object": "list", "data": []})),
        )
        .mount(hanging)
        .await;
    wait_for(|| async { health_providers(port).await.0 == 200 }).await;
    let (_, body) = health_providers(port).await;
    assert_eq!(body["status"], "ok");
    assert!(
        probe_of(&app.provider_health("probed_hanging").await)
            .unwrap()
            .ok
    );
    app.stop().await;
}
