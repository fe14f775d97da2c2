//! A call its client abandons before its response (the client resets the
//! stream while the server waits on a provider) is counted once as
//! CANCELLED, timed, and access-logged.

use super::{counter, free_port, histogram_count, scrape};
use crate::common::{TestApp, ctx};
use ai_orchestrator::api::pb;

/// GenerateSms's gRPC labels: no other test abandons a GenerateSms call.
const GENERATE: [(&str, &str); 3] = [
    ("grpc_type", "unary"),
    ("grpc_service", "ai.orchestrator.v1.Orchestrator"),
    ("grpc_method", "GenerateSms"),
];

/// GenerateSms's labels with a final code.
fn generate_ended(code: &'static str) -> Vec<(&'static str, &'static str)> {
    let mut labels = GENERATE.to_vec();
    labels.push(("grpc_code", code));
    labels
}

/// An OpenAI upstream that takes every request and answers none in time.
async fn hanging_upstream() -> wiremock::MockServer {
    use wiremock::{Mock, MockServer, ResponseTemplate, matchers::method};
    let upstream = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(200).set_delay(std::time::Duration::from_secs(60)))
        .mount(&upstream)
        .await;
    upstream
}

/// A config whose `sms_generate` task calls `upstream` (key in `K`);
/// `server` holds the `[server]` table's lines.
fn generate_config(server: &str, db: &std::path::Path, upstream: &str) -> String {
    format!(
        r#"
[server]
{server}
[database]
url = "sqlite://{}"
[providers.openai]
kind = "openai"
base_url = "{upstream}/v1"
api_key_env = "K"
[tasks.sms_generate]
chain = [{{ provider = "openai", model = "gpt-4o-mini" }}]
[pricing."gpt-4o-mini"]
input_per_mtok = 0.15
output_per_mtok = 0.6
"#,
        db.display()
    )
}

/// Starts a GenerateSms call with `trace_id`, waits until the server is
/// waiting on `upstream` for it, and abandons it (the client resets the
/// stream while the handler is still working).
async fn abandon_generate_sms(
    mut client: pb::orchestrator_client::OrchestratorClient<tonic::transport::Channel>,
    upstream: &wiremock::MockServer,
    trace_id: &'static str,
) {
    let mut request = tonic::Request::new(pb::GenerateSmsRequest {
        context: ctx(),
        inbound_message: "When can we talk?".into(),
        ..Default::default()
    });
    request
        .metadata_mut()
        .insert("x-trace-id", trace_id.parse().unwrap());
    let call = tokio::spawn(async move { client.generate_sms(request).await });
    crate::common::wait_for(|| async { crate::routing::calls(upstream).await > 0 }).await;
    call.abort();
}

/// A unary call whose client goes away while its provider is still
/// answering is counted as handled with CANCELLED, and timed: otherwise
/// `grpc_server_started_total` would grow with no `handled` to match.
#[tokio::test]
async fn a_call_the_client_abandons_is_counted_as_cancelled() {
    let upstream = hanging_upstream().await;
    let port = free_port();
    let dir = tempfile::tempdir().unwrap();
    let toml = generate_config(
        &format!("listen = \"127.0.0.1:0\"\nmetrics_listen = \"127.0.0.1:{port}\""),
        &dir.path().join("abandoned.db"),
        &upstream.uri(),
    );
    let app = TestApp::spawn_toml_env(&toml, |n| (n == "K").then(|| "sk-test".to_owned())).await;
    let cancelled = generate_ended("CANCELLED");
    let before = scrape(port).await;
    abandon_generate_sms(app.client.clone(), &upstream, "trace-abandoned-1").await;
    // Recorded when the server drops the call, once it sees the reset.
    crate::common::wait_for(|| async {
        counter(&scrape(port).await, "grpc_server_handled_total", &cancelled)
            >= counter(&before, "grpc_server_handled_total", &cancelled) + 1.0
    })
    .await;
    let after = scrape(port).await;
    assert!(
        histogram_count(&after, "grpc_server_handling_seconds", &GENERATE)
            >= histogram_count(&before, "grpc_server_handling_seconds", &GENERATE) + 1.0
    );
    app.stop().await;
}

/// The real binary (a process of its own: its counts are exact): a call its
/// client abandons gets one access line, CANCELLED, naming its trace and
/// team, and is counted once.
#[tokio::test]
async fn an_abandoned_call_is_access_logged_and_counted_once() {
    let upstream = hanging_upstream().await;
    let dir = tempfile::tempdir().unwrap();
    let addr = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let metrics_port = free_port();
    let config = dir.path().join("config.toml");
    let toml = generate_config(
        &format!("listen = \"{addr}\"\nmetrics_listen = \"127.0.0.1:{metrics_port}\""),
        &dir.path().join("abandoned.db"),
        &upstream.uri(),
    );
    std::fs::write(&config, toml).unwrap();
    let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_ai-orchestrator"))
        .args([
            "--config",
            config.to_str().unwrap(),
            "--log-format",
            "json",
            "serve",
        ])
        .env("K", "sk-test")
        .env("RUST_LOG", "info")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let channel = crate::common::connect(addr).await;
    let client = pb::orchestrator_client::OrchestratorClient::new(channel);
    abandon_generate_sms(client, &upstream, "trace-abandoned-2").await;
    crate::common::wait_for(|| async {
        counter(
            &scrape(metrics_port).await,
            "grpc_server_handled_total",
            &GENERATE,
        ) > 0.0
    })
    .await;
    let scraped = scrape(metrics_port).await;
    assert_eq!(
        counter(&scraped, "grpc_server_started_total", &GENERATE),
        1.0
    );
    assert_eq!(
        counter(&scraped, "grpc_server_handled_total", &GENERATE),
        1.0,
        "counted once"
    );
    assert_eq!(
        counter(
            &scraped,
            "grpc_server_handled_total",
            &generate_ended("CANCELLED")
        ),
        1.0
    );

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
    let access: Vec<serde_json::Value> = logs
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| {
            v["target"] == "ai_orchestrator::access"
                && v["rpc"] == "ai.orchestrator.v1.Orchestrator/GenerateSms"
        })
        .collect();
    assert_eq!(access.len(), 1, "one access line for the call:\n{logs}");
    let line = &access[0];
    assert_eq!(line["code"], "CANCELLED", "{line}");
    assert_eq!(line["trace_id"], "trace-abandoned-2", "{line}");
    assert_eq!(line["team_id"], "t1", "{line}");
    assert!(
        line["latency_ms"].as_f64().is_some_and(|ms| ms > 0.0),
        "{line}"
    );
}
