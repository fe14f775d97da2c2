//! Migrations on fresh databases (SQLite file and PostgreSQL), and config
//! validation errors that name the key.

use crate::common::TestPostgres;
use ai_orchestrator::{
    config::{Config, DatabaseConfig},
    store::Store,
};

mod upgrades;

const TABLES: [&str; 4] = ["ai_prompts", "api_keys", "tenant_limits", "usage_records"];

async fn migrate_twice_and_list(url: &str) -> Vec<String> {
    let config = DatabaseConfig {
        url: url.into(),
        ..DatabaseConfig::default()
    };
    let store = Store::connect(&config).await.expect("connect");
    store.migrate().await.expect("migrate");
    store.migrate().await.expect("migrating again is a no-op");
    let tables = store.tables().await.expect("tables");
    store.close().await;
    tables
}

#[tokio::test]
async fn migrations_apply_on_a_fresh_sqlite_file() {
    let dir = tempfile::tempdir().unwrap();
    // A folder that does not exist yet: created on first start.
    let path = dir.path().join("nested/dir/aio.db");
    let tables = migrate_twice_and_list(&format!("sqlite://{}", path.display())).await;
    assert!(path.exists());
    for t in TABLES {
        assert!(tables.iter().any(|x| x == t), "{t} missing from {tables:?}");
    }
}

#[tokio::test]
async fn migrations_apply_on_a_fresh_postgres_database() {
    let db = TestPostgres::create().await;
    let tables = migrate_twice_and_list(&db.url).await;
    for t in TABLES {
        assert!(tables.iter().any(|x| x == t), "{t} missing from {tables:?}");
    }
    db.drop_now().await;
}

#[tokio::test]
async fn one_active_prompt_version_is_enforced_by_both_databases() {
    crate::common::on_both_databases(|store| async move {
        let insert = "INSERT INTO ai_prompts (team_id, prompt_key, version, system_prompt, user_prompt_template, is_active, created_at_ms) \
                      VALUES ('t1', 'sms_classify', $1, 's', 'u', 1, 0)";
        let second = ai_orchestrator::on_store!(&store, |pool| {
            sqlx::query(insert).bind(1_i64).execute(pool).await.unwrap();
            sqlx::query(insert)
                .bind(2_i64)
                .execute(pool)
                .await
                .map(drop)
        });
        assert!(
            second.is_err(),
            "{}: a second active version must be refused",
            store.backend()
        );
    })
    .await;
}

fn invalid_paths(toml: &str) -> Vec<String> {
    Config::from_toml_str(toml, |_| None)
        .expect_err("config must be refused")
        .paths()
}

#[test]
fn config_errors_name_the_key() {
    let base = r#"
[providers.p]
kind = "mock"
[tasks.t]
chain = [{ provider = "p", model = "m" }]
[pricing.m]
input_per_mtok = 1.0
output_per_mtok = 2.0
"#;
    assert!(Config::from_toml_str(base, |_| None).is_ok());

    assert_eq!(
        invalid_paths(&format!("{base}\n[server]\nlisten_addr = \"x\"")),
        ["server.listen_addr"]
    );
    assert_eq!(
        invalid_paths(&format!("{base}\n[server]\nmax_input_bytes = \"big\"")),
        ["server.max_input_bytes"]
    );
    assert_eq!(
        invalid_paths(&base.replace("kind = \"mock\"", "kind = \"mock\"\ntimeout = \"soon\"")),
        ["providers.p.timeout"]
    );
    assert_eq!(
        invalid_paths(&base.replace("kind = \"mock\"", "kind = \"mystery\"")),
        ["providers.p.kind"]
    );
    assert_eq!(
        invalid_paths(&base.replace(
            "kind = \"mock\"",
            "kind = \"mock\"\nmax_concurrency = 0\nstreams_per_connection = 0"
        )),
        [
            "providers.p.max_concurrency",
            "providers.p.streams_per_connection"
        ]
    );
    assert_eq!(
        invalid_paths(&format!(
            "{base}\n[server]\nmax_concurrent_streams = 0\nhttp2_keepalive_interval = \"0s\"\nhttp2_keepalive_timeout = \"0s\""
        )),
        [
            "server.max_concurrent_streams",
            "server.http2_keepalive_interval",
            "server.http2_keepalive_timeout"
        ]
    );
    assert_eq!(
        invalid_paths(&format!(
            "{base}\n[auth]\nenabled = true\n[[auth.keys]]\nname = \"a\"\nsha256 = \"not-hex\"\nteams = []\n[[auth.keys]]\nname = \"a\"\nsha256 = \"{}\"\nteams = [\"*\"]\nrole = \"admin\"",
            "ab".repeat(32)
        )),
        [
            "auth.keys[0].sha256",
            "auth.keys[0].teams",
            "auth.keys[1].name"
        ]
    );
    assert_eq!(
        invalid_paths(&format!(
            "{base}\n[[auth.keys]]\nname = \"a\"\nsha256 = \"{}\"\nteams = [\"t\"]\nrole = \"root\"",
            "ab".repeat(32)
        )),
        ["auth.keys[0].role"]
    );
    assert_eq!(
        invalid_paths(&format!("{base}\n[telemetry]\nsample_ratio = 2.0")),
        ["telemetry.sample_ratio"]
    );
    assert_eq!(
        invalid_paths(&base.replace("provider = \"p\"", "provider = \"nope\"")),
        ["tasks.t.chain[0].provider"]
    );
    assert_eq!(
        invalid_paths(&base.replace(
            "chain = [{ provider = \"p\", model = \"m\" }]",
            "chain = []"
        )),
        ["tasks.t.chain"]
    );
    assert_eq!(
        invalid_paths(&base.replace(
            "kind = \"mock\"",
            "kind = \"openai\"\napi_key_env = \"NO_SUCH_KEY_VAR\""
        )),
        ["providers.p.api_key_env"]
    );
    assert_eq!(
        invalid_paths(&base.replace("kind = \"mock\"", "kind = \"openai_compatible\"")),
        ["providers.p.base_url"]
    );
    assert_eq!(
        invalid_paths(&format!("{base}\n[database]\nurl = \"mysql://x\"")),
        ["database.url"]
    );
    assert_eq!(
        invalid_paths(&format!(
            "{base}\n[providers.p.breaker]\nfailure_threshold = 0"
        )),
        ["providers.p.breaker.failure_threshold"]
    );
    // Every chain model needs a price (or an explicit "unknown").
    let unpriced = base.replace(
        "[pricing.m]\ninput_per_mtok = 1.0\noutput_per_mtok = 2.0\n",
        "",
    );
    assert_eq!(invalid_paths(&unpriced), ["tasks.t.chain[0].model"]);
    assert_eq!(
        invalid_paths(&base.replace("output_per_mtok = 2.0", "")),
        ["pricing.\"m\".output_per_mtok"]
    );
    assert_eq!(
        invalid_paths(&base.replace(
            "input_per_mtok = 1.0",
            "input_per_mtok = 1.0\nprice = \"unknown\""
        )),
        ["pricing.\"m\".price"]
    );
    assert_eq!(
        invalid_paths(&format!("{base}\n[metering]\nsweep_after = \"1s\"")),
        ["metering.sweep_after"]
    );
}

#[test]
fn api_keys_come_from_the_environment_and_never_print() {
    let toml = r#"
[providers.openai]
kind = "openai"
api_key_env = "MY_OPENAI_KEY"
[tasks.t]
chain = [{ provider = "openai", model = "gpt-4o-mini" }]
[pricing."gpt-4o-mini"]
price = "unknown"
"#;
    let config = Config::from_toml_str(toml, |name| {
        (name == "MY_OPENAI_KEY").then(|| "sk-canary-123".to_owned())
    })
    .unwrap();
    let key = config.providers["openai"].api_key.as_ref().unwrap();
    assert_eq!(key.expose(), "sk-canary-123");
    assert!(!format!("{config:?}").contains("sk-canary-123"));
    // A key in the file is an unknown field, not a way in.
    let with_key = toml.replace(
        "api_key_env = \"MY_OPENAI_KEY\"",
        "api_key = \"sk-in-file\"",
    );
    assert_eq!(invalid_paths(&with_key), ["providers.openai.api_key"]);
}

#[test]
fn shipped_configs_are_valid() {
    let root = env!("CARGO_MANIFEST_DIR");
    Config::load_with_env(
        std::path::Path::new(&format!("{root}/config/local.toml")),
        |_| None,
    )
    .expect("local.toml");
    Config::load_with_env(
        std::path::Path::new(&format!("{root}/config/example.toml")),
        |name| name.ends_with("_API_KEY").then(|| "key".into()),
    )
    .expect("example.toml with keys set");
    Config::load_with_env(
        std::path::Path::new(&format!("{root}/config/openai.toml")),
        |name| (name == "OPENAI_API_KEY").then(|| "key".into()),
    )
    .expect("openai.toml with only OPENAI_API_KEY set");
}

/// The CLI's own `AIO_*` variables share the config prefix; only `__` paths
/// are config keys, so a deployment can set both.
#[test]
fn cli_env_vars_and_config_overrides_coexist() {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_ai-orchestrator"))
        .arg("check-config")
        .env("AIO_CONFIG", "config/local.toml")
        .env("AIO_LOG_FORMAT", "json")
        .env("AIO_ADDR", "http://127.0.0.1:1")
        .env("AIO_SERVER__LISTEN", "127.0.0.1:50999")
        .env("AIO_SERVER__MAX_CONCURRENT_REQUESTS", "77")
        .output()
        .expect("run check-config");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "stdout: {stdout}\nstderr: {stderr}"
    );
    assert!(
        stdout.contains("127.0.0.1:50999"),
        "override applied: {stdout}"
    );

    let bad = std::process::Command::new(env!("CARGO_BIN_EXE_ai-orchestrator"))
        .arg("check-config")
        .env("AIO_CONFIG", "config/local.toml")
        .env("AIO_SERVER__LISTEN_TYPO", "x")
        .output()
        .expect("run check-config");
    assert!(!bad.status.success());
    let stderr = String::from_utf8_lossy(&bad.stderr);
    assert!(stderr.contains("listen_typo"), "names the key: {stderr}");
}

/// A rollback: the database was migrated by a newer release (a migration
/// this binary does not know); start-up must still succeed.
#[tokio::test]
async fn a_schema_from_a_newer_release_is_accepted() {
    let dir = tempfile::tempdir().unwrap();
    let db = TestPostgres::create().await;
    for url in [
        format!("sqlite://{}", dir.path().join("newer.db").display()),
        db.url.clone(),
    ] {
        let store = Store::connect(&DatabaseConfig {
            url,
            ..DatabaseConfig::default()
        })
        .await
        .unwrap();
        store.migrate().await.unwrap();
        ai_orchestrator::on_store!(&store, |pool| {
            sqlx::query(
                "INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time) \
                 VALUES (9999, 'from a newer release', TRUE, $1, 1)",
            )
            .bind(vec![0_u8; 48])
            .execute(pool)
            .await
            .unwrap();
        });
        store
            .migrate()
            .await
            .unwrap_or_else(|e| panic!("{}: {e}", store.backend()));
        store.close().await;
    }
    db.drop_now().await;
}

/// `migrate` (e.g. a Kubernetes Job) runs on the production config without
/// the provider keys it never uses; `check-config` still demands them.
#[test]
fn migrate_needs_no_provider_keys_but_check_config_does() {
    let dir = tempfile::tempdir().unwrap();
    let run = |cmd: &str| {
        std::process::Command::new(env!("CARGO_BIN_EXE_ai-orchestrator"))
            .args(["--config", "config/example.toml", cmd])
            .env(
                "DATABASE_URL",
                format!("sqlite://{}", dir.path().join("m.db").display()),
            )
            .env_remove("OPENAI_API_KEY")
            .env_remove("ANTHROPIC_API_KEY")
            .env_remove("PERPLEXITY_API_KEY")
            .output()
            .unwrap()
    };
    let migrated = run("migrate");
    assert!(
        migrated.status.success(),
        "{}",
        String::from_utf8_lossy(&migrated.stderr)
    );
    let checked = run("check-config");
    assert!(!checked.status.success());
    assert!(String::from_utf8_lossy(&checked.stderr).contains("api_key_env"));
}

/// The ledger is committed on the writer's own connection, not the pool's:
/// there `synchronous` is NORMAL in both modes, and with `"full"` the
/// writer fsyncs the WAL before it answers each settlement (a commit's
/// fsync covers every commit before it). So `"full"` shows as syncs that
/// answered settlements, and `"normal"` as none. The pool's connections
/// (prompts, keys, the sweeper) get the level itself.
#[tokio::test]
async fn sqlite_durability_is_the_configured_synchronous_level() {
    use ai_orchestrator::{
        config::SqliteDurability,
        usage::{
            UsageRecord,
            ledger::{Done, LedgerWriter, Op, Reservation, Reserve, Settle, sqlite},
        },
    };
    let dir = tempfile::tempdir().unwrap();
    for (durability, syncs) in [
        (SqliteDurability::Full, Some(1)),
        (SqliteDurability::Normal, None),
    ] {
        let config = DatabaseConfig {
            url: format!(
                "sqlite://{}",
                dir.path().join(format!("{durability:?}.db")).display()
            ),
            sqlite_synchronous: durability,
            ..DatabaseConfig::default()
        };
        let store = Store::connect(&config).await.expect("connect");
        store.migrate().await.expect("migrate");
        let path = sqlite::file_of(&config.url).unwrap();
        let ledger = sqlite::open(&path, &config).unwrap();
        let level: i64 = ledger
            .query_row("PRAGMA synchronous", [], |r| r.get(0))
            .unwrap();
        assert_eq!(level, 1, "the ledger's connection syncs the WAL itself");
        drop(ledger);
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let (writer, done) = LedgerWriter::spawn(
            store.clone(),
            &config,
            64,
            1,
            std::time::Duration::from_secs(60),
            stopped,
        )
        .unwrap();
        let reserve = Reserve {
            id: "r1".into(),
            team_id: "t".into(),
            requests: 1,
            input_tokens: 10,
            ..Reserve::default()
        };
        assert_eq!(
            writer.submit(Op::Reserve(reserve.clone())).await.unwrap(),
            Done::Admitted
        );
        assert_eq!(
            writer.wal_syncs(),
            syncs.map(|_| 0),
            "a reservation waits for nothing"
        );
        let settle = Settle {
            reservations: vec![Reservation::from(&reserve)],
            charge: true,
            recorded: true,
            record: UsageRecord {
                team_id: "t".into(),
                trace_id: "r1".into(),
                outcome: "ok".into(),
                ..UsageRecord::default()
            },
            month_start_ms: 0,
            day_start_ms: 0,
            user_id: String::new(),
            prompt_owner: None,
            audit: Vec::new(),
            outbox: Vec::new(),
            triggers: None,
        };
        assert_eq!(
            writer.submit(Op::Settle(settle)).await.unwrap(),
            Done::Settled
        );
        assert_eq!(writer.wal_syncs(), syncs, "{durability:?}");
        let _ = stop.send(true);
        drop(writer);
        done.await.unwrap();
        store.close().await;
    }
    // SQLite's codes: 1 = NORMAL, 2 = FULL.
    for (durability, code) in [(SqliteDurability::Full, 2), (SqliteDurability::Normal, 1)] {
        let config = DatabaseConfig {
            url: format!("sqlite://{}", dir.path().join("d.db").display()),
            sqlite_synchronous: durability,
            ..DatabaseConfig::default()
        };
        let store = Store::connect(&config).await.expect("connect");
        let Store::Sqlite(pool) = &store else {
            panic!("expected SQLite")
        };
        // Every pooled connection gets the setting, not only the first.
        let mut held = Vec::new();
        for _ in 0..3 {
            let mut conn = pool.acquire().await.expect("connection");
            let level: i64 = sqlx::query_scalar("PRAGMA synchronous")
                .fetch_one(&mut *conn)
                .await
                .expect("pragma");
            assert_eq!(level, code, "{durability:?}");
            held.push(conn);
        }
        drop(held);
        store.close().await;
    }

    let base = r#"
[providers.p]
kind = "mock"
[tasks.t]
chain = [{ provider = "p", model = "m" }]
[pricing.m]
input_per_mtok = 1.0
output_per_mtok = 2.0
[database]
"#;
    let normal = Config::from_toml_str(&format!("{base}sqlite_synchronous = \"normal\""), |_| None)
        .expect("normal is accepted");
    assert_eq!(normal.database.sqlite_synchronous, SqliteDurability::Normal);
    let default = Config::from_toml_str(base, |_| None).expect("default");
    assert_eq!(default.database.sqlite_synchronous, SqliteDurability::Full);
    assert_eq!(
        invalid_paths(&format!("{base}sqlite_synchronous = \"off\"")),
        ["database.sqlite_synchronous"]
    );
}

/// SPEC §4's seed defaults are what `config/example.toml` ships: the task
/// chains, the provider timeouts, the breaker's numbers (the anthropic and
/// perplexity providers take the defaults) and the retry schedule.
#[test]
fn the_example_config_ships_the_seed_defaults() {
    use std::time::Duration;
    let root = env!("CARGO_MANIFEST_DIR");
    let config = Config::load_with_env(
        std::path::Path::new(&format!("{root}/config/example.toml")),
        |name| name.ends_with("_API_KEY").then(|| "key".into()),
    )
    .expect("example.toml with keys set");
    let chain = |task: &str| -> Vec<(String, String)> {
        config.tasks[task]
            .chain
            .iter()
            .map(|t| (t.provider.clone(), t.model.clone()))
            .collect()
    };
    let pair = |p: &str, m: &str| (p.to_owned(), m.to_owned());
    let haiku = "claude-3-haiku-20240307";
    for task in ["sms_classify", "sms_generate"] {
        assert_eq!(
            chain(task),
            [pair("openai", "gpt-4o-mini"), pair("anthropic", haiku)],
            "{task}"
        );
    }
    for task in ["research_verify", "research_deep"] {
        assert_eq!(
            chain(task),
            [
                pair("perplexity", "llama-3.1-sonar-small-128k-online"),
                pair("openai", "gpt-4o")
            ],
            "{task}"
        );
    }
    assert_eq!(
        chain("meeting_brief"),
        [pair("anthropic", haiku), pair("openai", "gpt-4o-mini")]
    );
    let secs = Duration::from_secs;
    for (provider, timeout) in [("openai", 30), ("anthropic", 30), ("perplexity", 45)] {
        let p = &config.providers[provider];
        assert_eq!(p.timeout, secs(timeout), "{provider}");
        let b = &p.breaker;
        assert_eq!(
            (
                b.failure_threshold,
                b.open_for,
                b.success_threshold,
                b.half_open_max_probes
            ),
            (5, secs(30), 2, 1),
            "{provider}"
        );
    }
    let r = &config.retry;
    assert_eq!((r.max_attempts, r.base_backoff), (3, secs(1)));
    assert!(r.max_backoff >= secs(4), "1 s, 2 s, 4 s: {r:?}");
}
