//! Test harness: the real server on 127.0.0.1:0 with its own database, and a
//! generated client connected to it.

use ai_orchestrator::{api::pb::orchestrator_client::OrchestratorClient, config::Config};
use std::{net::SocketAddr, time::Duration};
use tokio::{net::TcpListener, sync::oneshot, task::JoinHandle};
use tonic::transport::Channel;

/// Admin URL of the local PostgreSQL used to create per-test databases.
pub fn postgres_admin_url() -> String {
    std::env::var("AIO_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into())
}

/// A fresh, empty PostgreSQL database for one test. Fails the test (never
/// skips) when PostgreSQL is unreachable.
pub struct TestPostgres {
    pub name: String,
    pub url: String,
}

/// Runs `check` on a migrated store over a fresh SQLite file, then over a
/// fresh PostgreSQL database: what must hold on both backends.
pub async fn on_both_databases<F, Fut>(check: F)
where
    F: Fn(ai_orchestrator::store::Store) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let dir = tempfile::tempdir().unwrap();
    let db = TestPostgres::create().await;
    for url in [
        format!("sqlite://{}", dir.path().join("both.db").display()),
        db.url.clone(),
    ] {
        let store =
            ai_orchestrator::store::Store::connect(&ai_orchestrator::config::DatabaseConfig {
                url,
                ..Default::default()
            })
            .await
            .unwrap();
        store.migrate().await.unwrap();
        check(store.clone()).await;
        store.close().await;
    }
    db.drop_now().await;
}

impl TestPostgres {
    pub async fn create() -> Self {
        use sqlx::Connection;
        let admin = postgres_admin_url();
        let mut conn = sqlx::PgConnection::connect(&admin)
            .await
            .unwrap_or_else(|e| {
                panic!("PostgreSQL must be running for these tests ({admin}): {e}")
            });
        let name = format!("aio_test_{}", uuid::Uuid::now_v7().simple());
        sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
            .execute(&mut conn)
            .await
            .expect("create test database");
        let base = admin.rsplit_once('/').map(|(b, _)| b).unwrap_or(&admin);
        Self {
            url: format!("{base}/{name}"),
            name,
        }
    }

    /// Drops the database even while the server holds connections to it.
    pub async fn drop_now(&self) {
        use sqlx::Connection;
        let mut conn = sqlx::PgConnection::connect(&postgres_admin_url())
            .await
            .expect("admin connection");
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "DROP DATABASE IF EXISTS {} WITH (FORCE)",
            self.name
        )))
        .execute(&mut conn)
        .await
        .expect("drop test database");
    }
}

/// Config TOML for tests: two mock providers and the seed tasks, database URL
/// and mock behaviour substituted in.
pub fn config_toml(database_url: &str, primary: &str, fallback: &str) -> String {
    config_toml_with(database_url, primary, fallback, "")
}

/// Like [`config_toml`], with extra TOML appended (e.g. `[metering]` settings).
pub fn config_toml_with(database_url: &str, primary: &str, fallback: &str, extra: &str) -> String {
    format!(
        r#"
[server]
listen = "127.0.0.1:0"
max_input_bytes = 2048
default_timeout = "10s"
health_probe_interval = "100ms"
shutdown_grace = "5s"

[database]
url = "{database_url}"
max_connections = 4

[providers.primary]
kind = "mock"
timeout = "5s"
[providers.primary.mock]
{primary}

[providers.fallback]
kind = "mock"
timeout = "5s"
[providers.fallback.mock]
{fallback}

[tasks.sms_classify]
chain = [{{ provider = "primary", model = "gpt-4o-mini" }}, {{ provider = "fallback", model = "claude-3-haiku" }}]
[tasks.sms_generate]
chain = [{{ provider = "primary", model = "gpt-4o-mini" }}, {{ provider = "fallback", model = "claude-3-haiku" }}]
[tasks.research_verify]
chain = [{{ provider = "primary", model = "sonar" }}, {{ provider = "fallback", model = "gpt-4o" }}]
[tasks.research_deep]
chain = [{{ provider = "primary", model = "sonar" }}, {{ provider = "fallback", model = "gpt-4o" }}]
[tasks.meeting_brief]
chain = [{{ provider = "primary", model = "claude-3-haiku" }}, {{ provider = "fallback", model = "gpt-4o-mini" }}]

[pricing."gpt-4o-mini"]
input_per_mtok = 0.15
output_per_mtok = 0.60
[pricing."gpt-4o"]
input_per_mtok = 2.50
output_per_mtok = 10.00
[pricing."claude-3-haiku"]
input_per_mtok = 0.25
output_per_mtok = 1.25
[pricing."sonar"]
price = "unknown"
{extra}
"#
    )
}

/// A running server.
pub struct TestApp {
    pub addr: SocketAddr,
    /// The server's `database.url`.
    pub database_url: String,
    pub client: OrchestratorClient<Channel>,
    pub channel: Channel,
    shutdown: Option<oneshot::Sender<()>>,
    pub handle: JoinHandle<anyhow::Result<()>>,
    _dir: Option<tempfile::TempDir>,
}

impl TestApp {
    /// Server on a fresh temp SQLite file with healthy mocks.
    pub async fn spawn() -> Self {
        Self::spawn_with_mocks("latency = \"1ms\"", "latency = \"1ms\"").await
    }

    /// Server on a fresh temp SQLite file with the given mock settings.
    pub async fn spawn_with_mocks(primary: &str, fallback: &str) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let url = format!("sqlite://{}", dir.path().join("test.db").display());
        let mut app = Self::spawn_toml(&config_toml(&url, primary, fallback)).await;
        app._dir = Some(dir);
        app
    }

    /// Server with a full config.
    pub async fn spawn_toml(toml: &str) -> Self {
        Self::spawn_toml_env(toml, |_| None).await
    }

    /// Server with a full config and an injected environment (API keys).
    pub async fn spawn_toml_env(toml: &str, env: impl Fn(&str) -> Option<String>) -> Self {
        let config = Config::from_toml_str(toml, env).expect("valid test config");
        let database_url = config.database.url.clone();
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (tx, rx) = oneshot::channel::<()>();
        let handle = tokio::spawn(ai_orchestrator::serve(listener, config, async {
            let _ = rx.await;
        }));
        let channel = connect(addr).await;
        Self {
            addr,
            database_url,
            client: OrchestratorClient::new(channel.clone()),
            channel,
            shutdown: Some(tx),
            handle,
            _dir: None,
        }
    }

    /// A store on the server's database (reads beside the running server).
    pub async fn store(&self) -> ai_orchestrator::store::Store {
        ai_orchestrator::store::Store::connect(&ai_orchestrator::config::DatabaseConfig {
            url: self.database_url.clone(),
            ..Default::default()
        })
        .await
        .expect("connect to the test database")
    }

    /// Keeps `dir` (the test's database folder) until the app is dropped.
    pub fn keep(&mut self, dir: tempfile::TempDir) {
        self._dir = Some(dir);
    }

    /// Sends the shutdown signal (like SIGTERM).
    pub fn trigger_shutdown(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
    }

    /// Provider `name`'s health as GetProviderHealth reports it.
    pub async fn provider_health(&self, name: &str) -> ai_orchestrator::api::pb::ProviderHealth {
        let providers = self
            .client
            .clone()
            .get_provider_health(ai_orchestrator::api::pb::GetProviderHealthRequest {})
            .await
            .unwrap()
            .into_inner()
            .providers;
        providers
            .into_iter()
            .find(|p| p.provider == name)
            .unwrap_or_else(|| panic!("no provider {name}"))
    }

    /// Shuts down and waits for `serve` to return.
    pub async fn stop(mut self) {
        self.trigger_shutdown();
        let result = tokio::time::timeout(Duration::from_secs(10), &mut self.handle)
            .await
            .expect("serve returns after shutdown");
        result.expect("serve task").expect("serve ok");
    }
}

/// Connects, retrying while the server finishes starting (migrations).
pub async fn connect(addr: SocketAddr) -> Channel {
    let endpoint =
        tonic::transport::Endpoint::from_shared(format!("http://{addr}")).expect("endpoint");
    for _ in 0..100 {
        if let Ok(ch) = endpoint.connect().await {
            // The listener accepts before serve() wires the services; wait for health.
            let mut health = tonic_health::pb::health_client::HealthClient::new(ch.clone());
            if health
                .check(tonic_health::pb::HealthCheckRequest {
                    service: String::new(),
                })
                .await
                .is_ok()
            {
                return ch;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("server at {addr} did not come up");
}

/// A request context for team `t1`.
pub fn ctx() -> Option<ai_orchestrator::api::pb::RequestContext> {
    Some(ai_orchestrator::api::pb::RequestContext {
        team_id: "t1".into(),
        ..Default::default()
    })
}

/// Every event of an `ExecuteStream` of `meeting_brief` under `context`.
pub async fn brief_events(
    app: &TestApp,
    context: ai_orchestrator::api::pb::RequestContext,
) -> Vec<ai_orchestrator::api::pb::execute_event::Event> {
    let mut stream = app
        .client
        .clone()
        .execute_stream(ai_orchestrator::api::pb::ExecuteRequest {
            context: Some(context),
            task: "meeting_brief".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let mut events = Vec::new();
    while let Some(e) = stream.message().await.unwrap() {
        events.push(e.event.unwrap());
    }
    events
}

/// Polls `check` until it holds (10 s at most): for effects of another task.
pub async fn wait_for<F, Fut>(check: F)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    for _ in 0..500 {
        if check().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("condition not reached within 10 s");
}

/// A SQLite store in `dir` migrated with the SQLite migrations before
/// `first_left_out` only: a database of an older release, to upgrade.
pub async fn sqlite_migrated_before(
    dir: &std::path::Path,
    first_left_out: &str,
) -> ai_orchestrator::store::Store {
    use ai_orchestrator::{config::DatabaseConfig, store::Store};
    let before = dir.join("migrations");
    std::fs::create_dir(&before).unwrap();
    for entry in std::fs::read_dir("migrations/sqlite").unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if name.as_str() < first_left_out {
            std::fs::copy(&path, before.join(name)).unwrap();
        }
    }
    let url = format!("sqlite://{}", dir.join("upgraded.db").display());
    let store = Store::connect(&DatabaseConfig {
        url,
        ..DatabaseConfig::default()
    })
    .await
    .unwrap();
    let Store::Sqlite(pool) = &store else {
        unreachable!("a sqlite: URL")
    };
    sqlx::migrate::Migrator::new(before.as_path())
        .await
        .unwrap()
        .run(pool)
        .await
        .unwrap();
    store
}
