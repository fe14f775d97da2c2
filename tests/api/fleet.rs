//! The fleet as the chart runs it: three replicas of the real binary on one
//! PostgreSQL and one Redis (SPEC §12). rpm, tpm, max_concurrency and a
//! tool's max_per_hour and max_concurrent are the account's or the team's;
//! a replica killed with -9 gives its slots back within the lease; an MCP
//! session opened on one replica is served by another; the store stopped
//! under calls fails none of them, and counting resumes when it is back.

use crate::{
    cluster::TestRedis,
    common::{connect, wait_for},
    metering::Db,
    routing::{calls, classification, completion},
};
use ai_orchestrator::api::pb::{self, orchestrator_client::OrchestratorClient};
use serde_json::{Value, json};
use std::{net::SocketAddr, process::Stdio, time::Duration};
use tokio::process::{Child, Command};
use tonic::transport::Channel;
use wiremock::{
    Mock, MockServer,
    matchers::{method, path},
};

fn free_addr() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

struct Replica {
    child: Child,
    client: OrchestratorClient<Channel>,
    channel: Channel,
    mcp: String,
}

impl Replica {
    async fn start(config: &str, dir: &std::path::Path, n: usize) -> Self {
        let (addr, mcp) = (free_addr(), free_addr());
        let config = config
            .replace("{addr}", &addr.to_string())
            .replace("{mcp}", &mcp.to_string());
        let path = dir.join(format!("replica-{n}.toml"));
        std::fs::write(&path, config).unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_ai-orchestrator"))
            .args(["--config", path.to_str().unwrap(), "serve"])
            .env("TEST_OPENAI_KEY", "sk-test")
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("start the server binary");
        let channel = connect(addr).await;
        Self {
            child,
            client: OrchestratorClient::new(channel.clone()),
            channel,
            mcp: format!("http://{mcp}/mcp"),
        }
    }

    /// One INTERACTIVE call of `task` (`sms_classify` through ClassifySms,
    /// else Execute): the target that served it.
    async fn serve(&self, task: &str) -> String {
        let mut client = self.client.clone();
        let meta = if task == "sms_classify" {
            let request = crate::routing::classify(pb::Priority::Interactive);
            client
                .classify_sms(request)
                .await
                .unwrap()
                .into_inner()
                .meta
        } else {
            let request = pb::ExecuteRequest {
                context: crate::common::ctx(),
                task: task.into(),
                ..Default::default()
            };
            client.execute(request).await.unwrap().into_inner().meta
        };
        meta.unwrap().provider
    }

    async fn limits(&self, provider: &str) -> String {
        let health = self
            .client
            .clone()
            .get_provider_health(pb::GetProviderHealthRequest {})
            .await
            .unwrap()
            .into_inner();
        let found = health
            .providers
            .into_iter()
            .find(|p| p.provider == provider);
        found.map(|p| p.limits).unwrap_or_default()
    }
}

fn config(pg: &str, redis: &str, primary: &str, slow: &str, tokens: &str, hook: &str) -> String {
    let prefix = uuid::Uuid::now_v7().simple();
    format!(
        r#"
[server]
listen = "{{addr}}"
default_timeout = "10s"
health_probe_interval = "200ms"
[database]
url = "{pg}"
max_connections = 4
[providers.primary]
kind = "openai"
base_url = "{primary}/v1"
api_key_env = "TEST_OPENAI_KEY"
timeout = "5s"
rpm = 6
[providers.slow]
kind = "openai"
base_url = "{slow}/v1"
api_key_env = "TEST_OPENAI_KEY"
timeout = "2s"
max_concurrency = 2
[providers.tokens]
kind = "openai"
base_url = "{tokens}/v1"
api_key_env = "TEST_OPENAI_KEY"
timeout = "5s"
tpm = 10000
[providers.spare]
kind = "mock"
max_concurrency = 1000
[tasks.sms_classify]
chain = [{{ provider = "primary", model = "gpt-4o-mini" }}, {{ provider = "spare", model = "m" }}]
[tasks.meeting_brief]
chain = [{{ provider = "slow", model = "gpt-4o-mini" }}, {{ provider = "spare", model = "m" }}]
[tasks.big_brief]
chain = [{{ provider = "tokens", model = "gpt-4o-mini" }}, {{ provider = "spare", model = "m" }}]
max_tokens = 4000
[pricing."gpt-4o-mini"]
input_per_mtok = 0.15
output_per_mtok = 0.60
[pricing.m]
price = "unknown"
[tools."system.health"]
kind = "builtin"
quota = {{ max_per_hour = 3 }}
[tools."crm.slow"]
kind = "http"
url = "{hook}/slow"
input_schema = {{ type = "object" }}
quota = {{ max_concurrent = 1 }}
[mcp_endpoint]
listen = "{{mcp}}"
[cluster]
redis_url = "{redis}"
key_prefix = "t{prefix}:"
recheck_interval = "100ms"
lease_slack = "1s"
"#
    )
}

async fn upstream(answer: wiremock::ResponseTemplate) -> MockServer {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/v1/chat/completions"))
        .respond_with(answer)
        .mount(&server)
        .await;
    server
}

#[tokio::test]
async fn three_replicas_of_the_binary_share_limits_quotas_and_sessions() {
    let db = Db::new(true).await;
    let mut redis = TestRedis::start().await;
    let primary = upstream(classification()).await;
    let slow = upstream(completion("A brief.").set_delay(Duration::from_secs(30))).await;
    let tokens = upstream(completion("A brief.").set_delay(Duration::from_millis(300))).await;
    let hook = crate::cluster::slow_webhook().await;
    let dir = tempfile::tempdir().unwrap();
    let toml = config(
        &db.url(),
        &redis.url(),
        &primary.uri(),
        &slow.uri(),
        &tokens.uri(),
        &hook.uri(),
    );
    let mut replicas = Vec::new();
    for n in 0..3 {
        replicas.push(Replica::start(&toml, dir.path(), n).await);
    }

    // rpm = 6 for the account: 12 calls over three replicas, 6 reach it.
    for i in 0..12 {
        replicas[i % 3].serve("sms_classify").await;
    }
    assert_eq!(calls(&primary).await, 6);

    // tpm = 10,000: two estimates of ~4,000+ tokens at once, not three.
    let burst = (0..6).map(|i| replicas[i % 3].serve("big_brief"));
    let served = futures::future::join_all(burst).await;
    assert_eq!(served.iter().filter(|p| *p == "tokens").count(), 2);

    // max_per_hour = 3 for the team, across replicas.
    let mut tool_results = Vec::new();
    for (i, replica) in replicas.iter().cycle().take(5).enumerate() {
        let mut tools = pb::tool_service_client::ToolServiceClient::new(replica.channel.clone());
        let request = pb::InvokeToolRequest {
            context: crate::common::ctx(),
            tool: "system.health".into(),
            input: Some(Default::default()),
            mode: pb::InvocationMode::Sync as i32,
            idempotency_key: format!("health-{i}"),
            ..Default::default()
        };
        tool_results.push(tools.invoke_tool(request).await.map(drop));
    }
    let refused: Vec<_> = tool_results
        .iter()
        .filter_map(|r| r.as_ref().err())
        .collect();
    assert_eq!(refused.len(), 2, "{tool_results:?}");
    assert!(
        refused
            .iter()
            .all(|s| s.code() == tonic::Code::ResourceExhausted)
    );

    // max_concurrent = 1 for the team: two replicas at once, one runs.
    let slow_tool = |replica: &Replica, key: &str| {
        let mut tools = pb::tool_service_client::ToolServiceClient::new(replica.channel.clone());
        let request = pb::InvokeToolRequest {
            context: crate::common::ctx(),
            tool: "crm.slow".into(),
            input: Some(Default::default()),
            mode: pb::InvocationMode::Sync as i32,
            idempotency_key: key.into(),
            ..Default::default()
        };
        async move { tools.invoke_tool(request).await.map(drop) }
    };
    let (one, other) = tokio::join!(
        slow_tool(&replicas[0], "slow-a"),
        slow_tool(&replicas[2], "slow-b")
    );
    let refusals: Vec<_> = [one, other].into_iter().filter_map(Result::err).collect();
    assert_eq!(refusals.len(), 1, "{refusals:?}");
    assert_eq!(refusals[0].code(), tonic::Code::ResourceExhausted);

    mcp_session_moves(&replicas[0].mcp, &replicas[1].mcp, None).await;

    // max_concurrency = 2: the third replica takes both slots on a provider
    // that never answers, and is killed with -9 holding them.
    let mut doomed = replicas.pop().unwrap();
    // Two calls hold both slots (the provider never answers them).
    let mut held = Vec::new();
    for _ in 0..2 {
        let mut client = doomed.client.clone();
        held.push(tokio::spawn(async move {
            client
                .execute(pb::ExecuteRequest {
                    context: crate::common::ctx(),
                    task: "meeting_brief".into(),
                    ..Default::default()
                })
                .await
        }));
    }
    wait_for(|| async { calls(&slow).await == 2 }).await;
    doomed.child.start_kill().unwrap();
    let _ = doomed.child.wait().await;
    for call in held {
        let _ = call.await;
    }
    // Both slots are leased to a dead replica: the others skip the
    // provider (it is never called)...
    assert_eq!(replicas[0].serve("meeting_brief").await, "spare");
    assert_eq!(calls(&slow).await, 2);
    // ...until the leases end (timeout 2 s + lease_slack 1 s): then a call
    // reaches it again (and, unanswered, falls back after its timeout).
    let killed = std::time::Instant::now();
    let reached = async {
        loop {
            if calls(&slow).await > 2 {
                return killed.elapsed();
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    let keep_calling = async {
        loop {
            replicas[1].serve("meeting_brief").await;
        }
    };
    let took = tokio::time::timeout(Duration::from_secs(10), async {
        tokio::select! {
            took = reached => took,
            () = keep_calling => unreachable!("calls go on until one reaches it"),
        }
    })
    .await
    .expect("a call reaches the provider once the leases end");
    assert!(took < Duration::from_secs(5), "{took:?}");

    // The store stops under calls: none fails, each replica keeps its
    // share (rpm 6 x 0.25, rounded up: 2 each).
    redis.stop();
    let sent = calls(&primary).await;
    for i in 0..6 {
        replicas[i % 2].serve("sms_classify").await;
    }
    assert_eq!(replicas[0].limits("primary").await, "fallback");
    assert_eq!(calls(&primary).await, sent + 4);
    redis.restart().await;
    for replica in &replicas {
        wait_for(|| async { replica.limits("primary").await == "shared" }).await;
    }
    db.cleanup().await;
}

/// An MCP session opened at `first` and called at `second` (as `key`,
/// when the servers want one); then an ID nobody opened is unknown there.
pub(crate) async fn mcp_session_moves(first: &str, second: &str, key: Option<&str>) {
    let http = reqwest::Client::new();
    let post = |url: &str, session: Option<&str>, body: Value| {
        let mut request = http
            .post(url)
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", "2025-06-18")
            .json(&body);
        if let Some(key) = key {
            request = request.header("authorization", format!("Bearer {key}"));
        }
        if let Some(id) = session {
            request = request.header("mcp-session-id", id);
        }
        request.send()
    };
    let opened = post(
        first,
        None,
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "fleet", "version": "0"}}}),
    )
    .await
    .unwrap();
    assert!(opened.status().is_success(), "{}", opened.status());
    let session = opened.headers()["mcp-session-id"]
        .to_str()
        .unwrap()
        .to_owned();
    let _ = opened.text().await;
    let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    let done = post(first, Some(&session), initialized).await.unwrap();
    assert!(done.status().is_success());
    let call = post(
        second,
        Some(&session),
        json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
               "params": {"name": "system.echo", "arguments": {"text": "across"}}}),
    )
    .await
    .unwrap();
    assert_eq!(call.status(), 200);
    let body = call.text().await.unwrap();
    assert!(
        body.contains("across") && !body.contains("\"error\""),
        "{body}"
    );
    let unknown = post(
        second,
        Some("not-a-session"),
        json!({"jsonrpc": "2.0", "id": 3, "method": "tools/list"}),
    )
    .await
    .unwrap();
    assert_eq!(unknown.status(), 404);
}
