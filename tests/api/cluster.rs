//! The fleet's shared limits (SPEC §12) against a real Redis: each test
//! starts its own `redis-server` on a free port (so it can stop it), and
//! two servers share it as two replicas would.

use crate::{
    common::{TestApp, wait_for},
    routing::{calls, classification},
};
use ai_orchestrator::{
    api::pb,
    cluster::{
        Cluster,
        limits::{Admission, ProviderQuota},
    },
    config::{
        Secret,
        cluster::{ClusterConfig, OnUnavailable},
    },
};
use std::{
    process::{Child, Command, Stdio},
    time::Duration,
};
use tonic::Code;
use tonic_types::StatusExt;
use wiremock::{
    Mock, MockServer,
    matchers::{method, path},
};

/// A `redis-server` of the test's own, on a free port.
pub struct TestRedis {
    port: u16,
    child: Option<Child>,
    _dir: tempfile::TempDir,
}

impl TestRedis {
    pub async fn start() -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut redis = Self {
            port,
            child: None,
            _dir: tempfile::tempdir().unwrap(),
        };
        redis.spawn().await;
        redis
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }

    async fn spawn(&mut self) {
        let child = Command::new("redis-server")
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(self._dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server on the PATH (Debian's redis-server package)");
        self.child = Some(child);
        let client = redis::Client::open(self.url()).unwrap();
        wait_for(|| async {
            match client.get_multiplexed_async_connection().await {
                Ok(mut conn) => redis::cmd("PING")
                    .query_async::<String>(&mut conn)
                    .await
                    .is_ok(),
                Err(_) => false,
            }
        })
        .await;
    }

    /// Kills the server (as an outage would).
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts it again on the same port, empty.
    pub async fn restart(&mut self) {
        self.stop();
        self.spawn().await;
    }

    /// A hash field as a number, if set.
    pub async fn hash_number(&self, key: &str, field: &str) -> Option<f64> {
        let client = redis::Client::open(self.url()).unwrap();
        let mut conn = client.get_multiplexed_async_connection().await.unwrap();
        redis::cmd("HGET")
            .arg(key)
            .arg(field)
            .query_async::<Option<f64>>(&mut conn)
            .await
            .unwrap()
    }

    /// Whether `key` exists.
    pub async fn exists(&self, key: &str) -> bool {
        let client = redis::Client::open(self.url()).unwrap();
        let mut conn = client.get_multiplexed_async_connection().await.unwrap();
        redis::cmd("EXISTS")
            .arg(key)
            .query_async::<i64>(&mut conn)
            .await
            .unwrap()
            == 1
    }
}

impl Drop for TestRedis {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A server whose `primary` (openai, at `upstream`) has `limits`, with a
/// mock `spare` behind it, sharing `redis` with the `[cluster]` lines of
/// `cluster`.
async fn replica(upstream: &str, limits: &str, redis: &TestRedis, cluster: &str) -> TestApp {
    let cluster = format!(
        "[cluster]\nredis_url = \"{}\"\nrecheck_interval = \"100ms\"\n{cluster}",
        redis.url()
    );
    server(upstream, limits, &cluster).await
}

/// A server as [`replica`] describes, with `extra` TOML at the end.
async fn server(upstream: &str, limits: &str, extra: &str) -> TestApp {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("replica.db");
    let toml = format!(
        r#"
[server]
default_timeout = "10s"
[database]
url = "sqlite://{db}"
[providers.primary]
kind = "openai"
base_url = "{upstream}/v1"
api_key_env = "TEST_OPENAI_KEY"
timeout = "5s"
{limits}
[providers.spare]
kind = "mock"
max_concurrency = 1000
[tasks.sms_classify]
chain = [{{ provider = "primary", model = "gpt-4o-mini" }}, {{ provider = "spare", model = "m" }}]
max_tokens = 4000
[pricing."gpt-4o-mini"]
input_per_mtok = 0.15
output_per_mtok = 0.60
[pricing.m]
price = "unknown"
{extra}
"#,
        db = db.display(),
    );
    let mut app = TestApp::spawn_toml_env(&toml, |name| {
        (name == "TEST_OPENAI_KEY").then(|| "sk-test".to_owned())
    })
    .await;
    app.keep(dir);
    app
}

fn unique_prefix() -> String {
    format!("key_prefix = \"t{}:\"", uuid::Uuid::now_v7().simple())
}

async fn classify(app: &TestApp) -> Result<pb::ResponseMeta, tonic::Status> {
    app.client
        .clone()
        .classify_sms(crate::routing::classify(pb::Priority::Interactive))
        .await
        .map(|r| r.into_inner().meta.unwrap())
}

/// `n` calls at once, spread over `replicas`: how many the primary served.
async fn served_by_primary(replicas: &[&TestApp], n: usize) -> usize {
    let calls = (0..n).map(|i| classify(replicas[i % replicas.len()]));
    futures::future::join_all(calls)
        .await
        .into_iter()
        .filter(|m| m.as_ref().unwrap().provider == "primary")
        .count()
}

async fn upstream(delay: Duration) -> MockServer {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/v1/chat/completions"))
        .respond_with(classification().set_delay(delay))
        .mount(&server)
        .await;
    server
}

#[tokio::test]
async fn rpm_is_the_accounts_across_two_replicas() {
    let redis = TestRedis::start().await;
    let provider = upstream(Duration::ZERO).await;
    let prefix = unique_prefix();
    let a = replica(&provider.uri(), "rpm = 4", &redis, &prefix).await;
    let b = replica(&provider.uri(), "rpm = 4", &redis, &prefix).await;
    let mut degraded = 0;
    for i in 0..10 {
        let meta = classify(if i % 2 == 0 { &a } else { &b }).await.unwrap();
        degraded += usize::from(meta.degraded);
    }
    // Each replica alone would have let 4 through: 8 in all.
    assert_eq!(calls(&provider).await, 4);
    assert_eq!(degraded, 6);
    assert_eq!(a.provider_health("primary").await.limits, "shared");
    a.stop().await;
    b.stop().await;
}

#[tokio::test]
async fn max_concurrency_is_the_accounts_across_two_replicas() {
    let redis = TestRedis::start().await;
    let provider = upstream(Duration::from_millis(500)).await;
    let prefix = unique_prefix();
    let a = replica(&provider.uri(), "max_concurrency = 2", &redis, &prefix).await;
    let b = replica(&provider.uri(), "max_concurrency = 2", &redis, &prefix).await;
    assert_eq!(served_by_primary(&[&a, &b], 6).await, 2);
    assert_eq!(calls(&provider).await, 2);
    // The slots came back: the next two go to the primary again.
    wait_for(|| async { served_by_primary(&[&a, &b], 2).await == 2 }).await;
    a.stop().await;
    b.stop().await;
}

/// A call takes its estimate (input / 4 + max_tokens 4,000: 4,000 to 4,800
/// with the prompt) when it is sent, and gives back what the provider did
/// not report (it reports 138).
#[tokio::test]
async fn tpm_takes_the_estimate_then_the_reported_tokens() {
    let redis = TestRedis::start().await;
    let provider = upstream(Duration::from_millis(300)).await;
    let prefix = format!("t{}:", uuid::Uuid::now_v7().simple());
    let cluster = format!("key_prefix = \"{prefix}\"");
    let a = replica(&provider.uri(), "tpm = 10000", &redis, &cluster).await;
    let b = replica(&provider.uri(), "tpm = 10000", &redis, &cluster).await;
    // Two estimates fit in 10,000 tokens, a third does not.
    assert_eq!(served_by_primary(&[&a, &b], 5).await, 2);
    // Settled at 2 x 138: two estimates fit again. Without the correction
    // the bucket would still hold two estimates, and none would.
    // The settlements are sent after the replies: wait for them.
    let tokens = format!("{prefix}{{primary}}:tokens");
    wait_for(|| async {
        redis
            .hash_number(&tokens, "level")
            .await
            .is_some_and(|level| level <= 2.0 * 138.0)
    })
    .await;
    assert_eq!(served_by_primary(&[&a, &b], 3).await, 2);
    a.stop().await;
    b.stop().await;
}

/// A provider that reports no usage (many OpenAI-compatible servers in a
/// stream): each call's estimate stands, so `tpm` still bounds a minute.
#[tokio::test]
async fn tpm_keeps_the_estimate_when_the_provider_reports_no_usage() {
    let provider = MockServer::start().await;
    let no_usage = wiremock::ResponseTemplate::new(200).set_body_json(serde_json::json!({
        "id": "chatcmpl-1", "object": "chat.completion", "created": 1_732_000_000, "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant",
            "content": "{\"intent\":\"QUESTION\",\"confidence\":0.9,\"reason\":\"asks\"}"},
            "finish_reason": "stop"}]
    }));
    Mock::given(method("POST"))
        .and(path("/v1/chat/completions"))
        .respond_with(no_usage)
        .mount(&provider)
        .await;
    let app = server(&provider.uri(), "tpm = 10000", "").await;
    // One after another: two estimates fit in the minute, the third not,
    // although each call ended before the next was sent.
    let mut served = Vec::new();
    for _ in 0..3 {
        served.push(classify(&app).await.unwrap().provider);
    }
    assert_eq!(served, ["primary", "primary", "spare"]);
    app.stop().await;
}

/// `tpm` without a cluster: the same estimate and correction, counted
/// by this replica alone.
#[tokio::test]
async fn tpm_holds_on_one_replica_without_a_cluster() {
    let provider = upstream(Duration::from_millis(300)).await;
    let app = server(&provider.uri(), "tpm = 10000", "").await;
    assert_eq!(served_by_primary(&[&app], 5).await, 2);
    // Settled as each call ends: two estimates fit again.
    assert_eq!(served_by_primary(&[&app], 3).await, 2);
    assert_eq!(app.provider_health("primary").await.limits, "local");
    app.stop().await;
}

fn cluster_config(redis: &TestRedis, on_unavailable: OnUnavailable) -> ClusterConfig {
    ClusterConfig {
        redis_url: Secret::new(redis.url()),
        key_prefix: format!("t{}:", uuid::Uuid::now_v7().simple()),
        on_unavailable,
        fallback_share: 0.25,
        connect_timeout: Duration::from_millis(250),
        command_timeout: Duration::from_millis(100),
        recheck_interval: Duration::from_millis(100),
        lease_slack: Duration::ZERO,
    }
}

/// A replica killed with its slot leased gives it back within the lease:
/// here a call that never settles, holding a 300 ms lease.
#[tokio::test]
async fn a_lease_never_given_back_expires() {
    let redis = TestRedis::start().await;
    let cluster = Cluster::new(&cluster_config(&redis, OnUnavailable::Local)).unwrap();
    let quota = ProviderQuota {
        rpm: None,
        tpm: None,
        max_concurrency: Some(1),
    };
    let hold = Duration::from_millis(300);
    let first = cluster.admit("p", &quota, 1, hold).await.unwrap();
    assert!(matches!(first, Admission::Admitted(_)), "{first:?}");
    let started = std::time::Instant::now();
    let second = cluster.admit("p", &quota, 1, hold).await.unwrap();
    let Admission::Saturated { retry_in } = second else {
        panic!("{second:?}");
    };
    assert!(retry_in <= hold, "{retry_in:?}");
    wait_for(|| async {
        matches!(
            cluster.admit("p", &quota, 1, hold).await,
            Ok(Admission::Admitted(_))
        )
    })
    .await;
    assert!(started.elapsed() >= Duration::from_millis(250));
}

#[tokio::test]
async fn a_store_outage_falls_back_to_the_local_share_and_counting_resumes() {
    let mut redis = TestRedis::start().await;
    let provider = upstream(Duration::ZERO).await;
    let prefix = format!("t{}:", uuid::Uuid::now_v7().simple());
    let app = replica(
        &provider.uri(),
        "rpm = 8",
        &redis,
        &format!("key_prefix = \"{prefix}\"\nfallback_share = 0.25"),
    )
    .await;
    classify(&app).await.unwrap();
    assert!(redis.exists(&format!("{prefix}{{primary}}:rate")).await);

    redis.stop();
    // No call fails: the store's loss is found by a call, which falls back.
    for _ in 0..6 {
        classify(&app).await.unwrap();
    }
    assert_eq!(app.provider_health("primary").await.limits, "fallback");
    // 8 x 0.25 = 2 calls a minute on this replica's own, besides the one
    // sent while the store answered.
    assert_eq!(calls(&provider).await, 1 + 2);

    redis.restart().await;
    wait_for(|| async { app.provider_health("primary").await.limits == "shared" }).await;
    assert!(!redis.exists(&format!("{prefix}{{primary}}:rate")).await);
    let meta = classify(&app).await.unwrap();
    assert_eq!(meta.provider, "primary");
    assert!(redis.exists(&format!("{prefix}{{primary}}:rate")).await);
    app.stop().await;
}

/// The store stopped and started again under concurrent calls on two
/// replicas (`local`): no call fails, and both count in the store again.
#[tokio::test]
async fn stopping_the_store_under_load_fails_no_call() {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    let mut redis = TestRedis::start().await;
    let provider = upstream(Duration::from_millis(5)).await;
    let prefix = unique_prefix();
    let a = replica(&provider.uri(), "rpm = 600", &redis, &prefix).await;
    let b = replica(&provider.uri(), "rpm = 600", &redis, &prefix).await;
    let (ok, failed, stop) = (
        AtomicUsize::new(0),
        AtomicUsize::new(0),
        AtomicBool::new(false),
    );
    let callers = (0..8).map(|i| {
        let (app, ok, failed, stop) = (if i % 2 == 0 { &a } else { &b }, &ok, &failed, &stop);
        async move {
            while !stop.load(Ordering::Relaxed) {
                match classify(app).await {
                    Ok(_) => ok.fetch_add(1, Ordering::Relaxed),
                    Err(_) => failed.fetch_add(1, Ordering::Relaxed),
                };
            }
        }
    });
    let outage = async {
        let served = |n: usize| {
            let ok = &ok;
            move || async move { ok.load(Ordering::Relaxed) >= n }
        };
        wait_for(served(20)).await;
        redis.stop();
        for app in [&a, &b] {
            wait_for(|| async { app.provider_health("primary").await.limits == "fallback" }).await;
        }
        // The primary still serves, on each replica's share of its rpm.
        let (before, sent) = (ok.load(Ordering::Relaxed), calls(&provider).await);
        wait_for(served(before + 20)).await;
        wait_for(|| async { calls(&provider).await > sent }).await;
        redis.restart().await;
        for app in [&a, &b] {
            wait_for(|| async { app.provider_health("primary").await.limits == "shared" }).await;
        }
        let before = ok.load(Ordering::Relaxed);
        wait_for(served(before + 20)).await;
        stop.store(true, Ordering::Relaxed);
    };
    tokio::join!(futures::future::join_all(callers), outage);
    assert_eq!(failed.load(Ordering::Relaxed), 0);
    assert!(ok.load(Ordering::Relaxed) >= 60);
    a.stop().await;
    b.stop().await;
}

#[tokio::test]
async fn refuse_answers_unavailable_while_the_store_is_down() {
    let mut redis = TestRedis::start().await;
    let provider = upstream(Duration::ZERO).await;
    let app = replica(
        &provider.uri(),
        "rpm = 100",
        &redis,
        &format!("{}\non_unavailable = \"refuse\"", unique_prefix()),
    )
    .await;
    classify(&app).await.unwrap();
    redis.stop();
    let status = classify(&app).await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    let info = status.get_details_error_info().unwrap();
    assert_eq!(info.reason, "CLUSTER_STORE_UNAVAILABLE");
    assert!(status.get_details_retry_info().is_some());
    assert_eq!(app.provider_health("primary").await.limits, "refusing");
    assert_eq!(calls(&provider).await, 1);
    redis.restart().await;
    wait_for(|| async { classify(&app).await.is_ok() }).await;
    app.stop().await;
}

/// A webhook whose `POST /slow` answers after 500 ms: a tool invocation
/// that holds its `max_concurrent` slot that long.
pub(crate) async fn slow_webhook() -> MockServer {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/slow"))
        .respond_with(
            wiremock::ResponseTemplate::new(200)
                .set_body_json(serde_json::json!({"ok": true}))
                .set_delay(Duration::from_millis(500)),
        )
        .mount(&server)
        .await;
    server
}

/// Tools' per-team quotas are the team's across replicas: `system.health`
/// has `max_per_hour = 2`, and a slow webhook `max_concurrent = 1`.
#[tokio::test]
async fn tool_quotas_are_the_teams_across_two_replicas() {
    use crate::tools::{CALLER, invoke, tools, with_key};
    use serde_json::json;
    let redis = TestRedis::start().await;
    let webhook = slow_webhook().await;
    let extra = format!(
        "[tools.\"crm.slow\"]\nkind = \"http\"\nurl = \"{}/slow\"\n\
         input_schema = {{ type = \"object\" }}\nquota = {{ max_concurrent = 1 }}\n\
         [cluster]\nredis_url = \"{}\"\n{}\n",
        webhook.uri(),
        redis.url(),
        unique_prefix()
    );
    let mut replicas = Vec::new();
    for _ in 0..2 {
        let dir = tempfile::tempdir().unwrap();
        let db = format!("sqlite://{}", dir.path().join("tools.db").display());
        let mut app = crate::tools::spawn_on(&db, &webhook.uri(), &extra).await;
        app.keep(dir);
        replicas.push(app);
    }
    let call = |app: &TestApp, trace: &str, tool: &str| {
        let mut client = tools(app);
        let request = with_key(CALLER, trace, invoke(tool, json!({})));
        async move { client.invoke_tool(request).await }
    };
    call(&replicas[0], "q-1", "system.health").await.unwrap();
    call(&replicas[1], "q-2", "system.health").await.unwrap();
    let refused = call(&replicas[0], "q-3", "system.health")
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    let quota = refused.get_details_quota_failure().unwrap();
    assert_eq!(quota.violations[0].subject, "max_per_hour");

    let (one, other) = tokio::join!(
        call(&replicas[0], "slow-1", "crm.slow"),
        call(&replicas[1], "slow-2", "crm.slow")
    );
    let refusals: Vec<tonic::Status> = [one, other].into_iter().filter_map(Result::err).collect();
    assert_eq!(refusals.len(), 1, "{refusals:?}");
    let quota = refusals[0].get_details_quota_failure().unwrap();
    assert_eq!(quota.violations[0].subject, "max_concurrent");
    // Its slot is back once it ends (the release is sent after the reply).
    wait_for(|| async { call(&replicas[1], "slow-3", "crm.slow").await.is_ok() }).await;
    for app in replicas {
        app.stop().await;
    }
}

/// An MCP session opened on one replica is served by another, as a
/// Kubernetes Service spreads a client's requests: the second replica
/// restores it from the cluster store.
#[tokio::test]
async fn an_mcp_session_opened_on_one_replica_is_served_by_another() {
    use crate::tools::CALLER;
    let redis = TestRedis::start().await;
    let prefix = unique_prefix();
    let mut urls = Vec::new();
    let mut replicas = Vec::new();
    for _ in 0..2 {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let extra = format!(
            "[mcp_endpoint]\nlisten = \"127.0.0.1:{port}\"\n[cluster]\nredis_url = \"{}\"\n{prefix}\n",
            redis.url()
        );
        let dir = tempfile::tempdir().unwrap();
        let db = format!("sqlite://{}", dir.path().join("mcp.db").display());
        let mut app = crate::tools::spawn_on(&db, "http://127.0.0.1:9", &extra).await;
        app.keep(dir);
        wait_for(|| async {
            tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .is_ok()
        })
        .await;
        urls.push(format!("http://127.0.0.1:{port}/mcp"));
        replicas.push(app);
    }
    crate::fleet::mcp_session_moves(&urls[0], &urls[1], Some(CALLER)).await;
    for app in replicas {
        app.stop().await;
    }
}
