//! The audit log (SPEC §10): tampering with any stored row, or deleting
//! one, is found at that row by the RPC and by `audit verify` (non-zero
//! exit), and a chain verified while it grows holds; admin changes made from the CLI are audited; a canary in a tool
//! input never reaches logs, audit rows or metrics.

use super::{
    CALLER, events, invoke, spawn_on, tools, verify,
    webhook::{Answer, Webhook},
    with_key,
};
use crate::{
    cli::run_env,
    common::{TestApp, connect},
    metering::Db,
    observability::{counter, free_port, histogram_count, scrape},
};
use ai_orchestrator::{api::pb, store::Store};
use serde_json::json;
use std::{process::Stdio, time::Duration};
use tonic::Code;

/// Every stored column of an audit event, and an edit of it.
const COLUMNS: &[(&str, &str)] = &[
    ("id", "id || 'x'"),
    ("team_id", "team_id || 'x'"),
    ("seq", "seq + 1000"),
    ("at_ms", "at_ms + 1"),
    ("trace_id", "trace_id || 'x'"),
    ("principal", "principal || 'x'"),
    ("category", "category || 'x'"),
    ("action", "action || 'x'"),
    ("subject", "subject || 'x'"),
    ("decision", "decision || 'x'"),
    ("reason", "reason || 'x'"),
    ("input_sha256", "COALESCE(input_sha256, '') || 'x'"),
    ("output_sha256", "COALESCE(output_sha256, '') || 'x'"),
    ("input_bytes", "COALESCE(input_bytes, 0) + 1"),
    ("output_bytes", "COALESCE(output_bytes, 0) + 1"),
    ("duration_ms", "COALESCE(duration_ms, 0) + 1"),
    (
        "estimated_cost_micros",
        "COALESCE(estimated_cost_micros, 0) + 1",
    ),
    ("actual_cost_micros", "COALESCE(actual_cost_micros, 0) + 1"),
    ("idempotency_key", "COALESCE(idempotency_key, '') || 'x'"),
    ("prev_hash", "prev_hash || 'x'"),
    ("hash", "hash || 'x'"),
];

async fn exec(store: &Store, sql: &str) {
    let sql = sqlx::AssertSqlSafe(sql.to_owned());
    match store {
        Store::Sqlite(pool) => sqlx::raw_sql(sql).execute(pool).await.map(drop),
        Store::Postgres(pool) => sqlx::raw_sql(sql).execute(pool).await.map(drop),
    }
    .unwrap_or_else(|e| panic!("{e}"));
}

/// `audit verify` of the CLI on `config`: (success, stdout + stderr).
async fn verify_cli(config: &std::path::Path) -> (bool, String) {
    let (ok, out, err) = run_env(
        &["--config", config.to_str().unwrap(), "audit", "verify"],
        &[],
    )
    .await;
    (ok, format!("{out}{err}"))
}

async fn tampering_is_found_at_the_row(postgres: bool) {
    let db = Db::new(postgres).await;
    let hook = Webhook::start().await;
    let app = spawn_on(&db.url(), &hook.url(), "").await;
    for i in 0..3 {
        tools(&app)
            .invoke_tool(with_key(
                CALLER,
                &format!("tamper-{i}"),
                invoke("system.echo", json!({"text": format!("hello {i}")})),
            ))
            .await
            .unwrap();
    }
    let before = events(&app, "t1").await;
    assert_eq!(before.len(), 6);
    assert!(verify(&app, "t1").await.ok);
    let config = tempfile::tempdir().unwrap();
    let config_file = config.path().join("aio.toml");
    std::fs::write(&config_file, super::toml(&db.url(), &hook.url(), "")).unwrap();
    let (ok, out) = verify_cli(&config_file).await;
    assert!(ok, "{out}");
    assert!(out.contains("team t1: ok, 6 events"), "{out}");

    let store = app.store().await;
    exec(
        &store,
        "CREATE TABLE audit_copy AS SELECT * FROM audit_events",
    )
    .await;
    let restore = "DELETE FROM audit_events; INSERT INTO audit_events SELECT * FROM audit_copy";
    let third = &before[2];
    for (column, edit) in COLUMNS {
        exec(
            &store,
            &format!("UPDATE audit_events SET {column} = {edit} WHERE team_id = 't1' AND seq = 3"),
        )
        .await;
        let v = verify(&app, "t1").await;
        assert!(!v.ok, "editing {column} is found");
        assert_eq!(v.first_broken_seq, 3, "editing {column}: {v:?}");
        if !["id", "team_id", "seq"].contains(column) {
            assert_eq!(v.first_broken_event_id, third.id, "editing {column}: {v:?}");
        }
        exec(&store, restore).await;
        assert!(verify(&app, "t1").await.ok, "restored after {column}");
    }

    // A deleted row: the chain has a gap where it was.
    exec(
        &store,
        "DELETE FROM audit_events WHERE team_id = 't1' AND seq = 3",
    )
    .await;
    let v = verify(&app, "t1").await;
    assert_eq!(
        (v.ok, v.first_broken_seq, v.reason.as_str()),
        (false, 3, "gap")
    );
    assert_eq!(
        v.first_broken_event_id, before[3].id,
        "the row after the gap"
    );
    let (ok, out) = verify_cli(&config_file).await;
    assert!(!ok, "audit verify exits non-zero: {out}");
    assert!(out.contains("team t1: BROKEN at seq 3 (gap"), "{out}");
    exec(&store, restore).await;

    // The last row deleted: the head still knows the chain was longer.
    exec(
        &store,
        "DELETE FROM audit_events WHERE team_id = 't1' AND seq = 6",
    )
    .await;
    let v = verify(&app, "t1").await;
    assert_eq!(
        (v.ok, v.first_broken_seq, v.reason.as_str()),
        (false, 6, "truncated")
    );
    exec(&store, restore).await;
    assert!(verify(&app, "t1").await.ok);
    exec(&store, "DROP TABLE audit_copy").await;
    app.stop().await;
    db.cleanup().await;
}

#[tokio::test]
async fn tampering_with_any_row_is_found_at_that_row_on_sqlite() {
    tampering_is_found_at_the_row(false).await;
}

#[tokio::test]
async fn tampering_with_any_row_is_found_at_that_row_on_postgres() {
    tampering_is_found_at_the_row(true).await;
}

/// A chain being written while it is verified holds: an event appended
/// between the verifier's reads is not a break.
#[tokio::test]
async fn a_chain_verified_while_it_grows_holds() {
    let hook = Webhook::start().await;
    let app = super::spawn(&hook.url(), "").await;
    let writer = {
        let app_channel = app.channel.clone();
        tokio::spawn(async move {
            let mut client = pb::tool_service_client::ToolServiceClient::new(app_channel);
            for i in 0..300 {
                client
                    .invoke_tool(with_key(
                        CALLER,
                        &format!("grow-{i}"),
                        invoke("system.echo", json!({"text": "x"})),
                    ))
                    .await
                    .unwrap();
            }
        })
    };
    let mut verified = 0;
    while !writer.is_finished() {
        let v = verify(&app, "t1").await;
        assert!(v.ok, "after {verified} good verifications: {v:?}");
        verified += 1;
    }
    writer.await.unwrap();
    let v = verify(&app, "t1").await;
    assert!(v.ok, "{v:?}");
    assert_eq!(v.events_checked, 600, "a call and a result per invocation");
    assert!(verified > 0);
}

#[tokio::test]
async fn the_audit_service_is_for_admins_only() {
    let hook = Webhook::start().await;
    let app = super::spawn(&hook.url(), "").await;
    let err = super::audit(&app)
        .verify_audit_chain(with_key(
            CALLER,
            "not-admin",
            pb::VerifyAuditChainRequest {
                team_id: "t1".into(),
            },
        ))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied);
    let err = super::audit(&app)
        .list_audit_events(with_key(
            CALLER,
            "not-admin",
            pb::ListAuditEventsRequest {
                team_id: "t1".into(),
                ..Default::default()
            },
        ))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied);
    app.stop().await;
}

#[tokio::test]
async fn admin_changes_from_the_cli_are_audited() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("admin.db").display());
    let hook = Webhook::start().await;
    let config = dir.path().join("aio.toml");
    std::fs::write(&config, super::toml(&url, &hook.url(), "")).unwrap();
    let config = config.to_str().unwrap();
    let steps: &[&[&str]] = &[
        &["keys", "create", "--name", "billing-svc", "--teams", "t1"],
        &["keys", "revoke", "--name", "billing-svc"],
        &["limits", "set", "--team", "t1", "--max-requests", "100"],
        &["limits", "clear", "--team", "t1"],
        &[
            "prompts",
            "add",
            "--key",
            "sms_classify",
            "--team",
            "t1",
            "--system",
            "s",
            "--template",
            "{{message}}",
            "--actor",
            "alice",
            "--activate",
        ],
    ];
    for args in steps {
        let mut all = vec!["--config", config];
        all.extend_from_slice(args);
        let (ok, _, err) = run_env(&all, &[]).await;
        assert!(ok, "{args:?}: {err}");
    }
    let app = TestApp::spawn_toml_env(&super::toml(&url, &hook.url(), ""), super::env).await;
    let t1: Vec<(String, String, String)> = events(&app, "t1")
        .await
        .into_iter()
        .map(|e| (e.category, e.action, e.subject))
        .collect();
    let owned = |c: &str, a: &str, s: &str| (c.to_owned(), a.to_owned(), s.to_owned());
    assert_eq!(
        t1,
        [
            owned("admin", "limits.changed", "t1"),
            owned("admin", "limits.changed", "t1"),
            owned("prompt", "prompt.activated", "sms_classify/1"),
        ]
    );
    // Keys belong to no team: the '' chain.
    let keys: Vec<String> = events(&app, "")
        .await
        .into_iter()
        .map(|e| e.action)
        .collect();
    assert_eq!(keys, ["key.created", "key.revoked"]);
    assert!(verify(&app, "t1").await.ok && verify(&app, "").await.ok);
    app.stop().await;
}

const CANARY: &str = "CANARY-7f3a-never-stored";

/// Runs the binary with debug logs and metrics, calls tools with a canary
/// in their inputs (a success, a workflow, a denial), then searches every
/// log line, every audit column and the metrics for it.
#[tokio::test]
async fn a_canary_in_a_tool_input_never_reaches_logs_audit_rows_or_metrics() {
    let hook = Webhook::start().await;
    let dir = tempfile::tempdir().unwrap();
    let db_path = dir.path().join("canary.db");
    let url = format!("sqlite://{}", db_path.display());
    let addr = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let metrics_port = free_port();
    let toml = super::toml(&url, &hook.url(), "").replace(
        "listen = \"127.0.0.1:0\"",
        &format!("listen = \"{addr}\"\nmetrics_listen = \"127.0.0.1:{metrics_port}\""),
    );
    let config = dir.path().join("aio.toml");
    std::fs::write(&config, toml).unwrap();
    let mut server = tokio::process::Command::new(env!("CARGO_BIN_EXE_ai-orchestrator"))
        .args([
            "--config",
            config.to_str().unwrap(),
            "--log-format",
            "json",
            "serve",
        ])
        .env("RUST_LOG", "debug")
        .env("N8N_API_KEY", super::WEBHOOK_SECRET)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    // Read its output as it comes: a full pipe would block its logging.
    let drain = |pipe: Option<Box<dyn tokio::io::AsyncRead + Unpin + Send>>| {
        tokio::spawn(async move {
            let mut out = Vec::new();
            if let Some(mut pipe) = pipe {
                let _ = tokio::io::AsyncReadExt::read_to_end(&mut pipe, &mut out).await;
            }
            out
        })
    };
    let stdout = drain(server.stdout.take().map(|p| Box::new(p) as _));
    let stderr = drain(server.stderr.take().map(|p| Box::new(p) as _));
    let channel = connect(addr).await;
    let mut client = pb::tool_service_client::ToolServiceClient::new(channel);
    let echo = client
        .invoke_tool(with_key(
            CALLER,
            "canary-echo",
            invoke("system.echo", json!({"text": CANARY})),
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        echo.invocation.unwrap().status(),
        pb::InvocationStatus::Succeeded
    );
    client
        .invoke_tool(with_key(
            CALLER,
            "canary-note",
            invoke(
                "crm.add_note",
                json!({"lead_id": "L-1", "note": CANARY, "api_key": CANARY}),
            ),
        ))
        .await
        .unwrap();
    let denied = client
        .invoke_tool(with_key(
            CALLER,
            "canary-denied",
            invoke("crm.add_note", json!({"lead_id": 7, "note": CANARY})),
        ))
        .await
        .unwrap_err();
    assert!(!format!("{denied:?}").contains(CANARY), "nor in the error");
    // The canary did go through (so its absence below means something).
    assert_eq!(hook.received()[0].body["note"], CANARY);

    // A webhook that fails once: one retry.
    hook.script([Answer::status(503)]);
    let retried = client
        .invoke_tool(with_key(
            CALLER,
            "canary-retried",
            invoke("crm.add_note", json!({"lead_id": "L-2", "note": CANARY})),
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(retried.invocation.unwrap().attempts, 2);

    // This process's own registry: exact counts.
    let metrics = scrape(metrics_port).await;
    let count = |name: &str, labels: &[(&str, &str)]| counter(&metrics, name, labels);
    let echo_ok = [("tool", "system.echo"), ("status", "SUCCEEDED")];
    let note_ok = [("tool", "crm.add_note"), ("status", "SUCCEEDED")];
    assert_eq!(count("tool_invocations_total", &echo_ok), 1.0);
    assert_eq!(count("tool_invocations_total", &note_ok), 2.0);
    assert_eq!(
        count("tool_denials_total", &[("reason", "TOOL_INPUT_INVALID")]),
        1.0
    );
    assert_eq!(
        count("workflow_retries_total", &[("tool", "crm.add_note")]),
        1.0
    );
    let durations = histogram_count(
        &metrics,
        "tool_duration_seconds",
        &[("tool", "crm.add_note")],
    );
    assert_eq!(durations, 2.0);
    let text = tokio::time::timeout(Duration::from_secs(10), async {
        reqwest::get(format!("http://127.0.0.1:{metrics_port}/metrics"))
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    })
    .await
    .expect("the metrics endpoint answers");
    assert!(!text.contains(CANARY), "metrics");

    // Stop it, then read everything it logged.
    let pid = server.id().unwrap();
    let _ = std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status();
    tokio::time::timeout(Duration::from_secs(15), server.wait())
        .await
        .expect("stops on SIGTERM")
        .unwrap();
    let logs = format!(
        "{}{}",
        String::from_utf8_lossy(&stdout.await.unwrap()),
        String::from_utf8_lossy(&stderr.await.unwrap())
    );
    assert!(
        logs.contains("canary-echo"),
        "the calls were logged: {logs}"
    );
    assert!(!logs.contains(CANARY), "logs");

    let conn = rusqlite::Connection::open(&db_path).unwrap();
    let mut stmt = conn.prepare("SELECT * FROM audit_events").unwrap();
    let columns = stmt.column_count();
    let mut rows = stmt.query([]).unwrap();
    let mut dump = String::new();
    let mut n = 0;
    while let Some(row) = rows.next().unwrap() {
        n += 1;
        for i in 0..columns {
            dump.push_str(&format!("{:?}|", row.get_ref(i).unwrap()));
        }
    }
    assert!(n >= 5, "{dump}");
    assert!(
        !dump.contains(CANARY) && !dump.contains("CANARY"),
        "audit rows"
    );
}
