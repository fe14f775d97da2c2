//! A call refused before any provider was called (breaker open, cooldown,
//! saturated) is written without its reply waiting for the disk; a call
//! that reached a provider is still recorded durably before its reply.
//! Shown with the ledger writer stalled behind another connection's write
//! lock on the SQLite file; and the queued records written at shutdown.

use super::Db;
use crate::common::wait_for;
use crate::common::{TestApp, config_toml_with, ctx};
use ai_orchestrator::{api::pb, usage::record};
use sqlx::Connection;
use tonic::Code;
use tonic_types::StatusExt;

fn execute(task: &str) -> pb::ExecuteRequest {
    pb::ExecuteRequest {
        context: ctx(),
        task: task.into(),
        ..Default::default()
    }
}

/// A server on `db` whose task `solo` has one target, which always fails
/// and opens its breaker on the first failure.
async fn solo_app(db: &Db) -> TestApp {
    let extra = r#"
[tasks.solo]
chain = [{ provider = "primary", model = "gpt-4o-mini" }]
[providers.primary.breaker]
failure_threshold = 1
"#;
    TestApp::spawn_toml(&config_toml_with(
        &db.url(),
        "failure_rate = 1.0",
        "latency = \"1ms\"",
        extra,
    ))
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_calls_do_not_wait_for_the_disk_but_served_calls_do() {
    let db = Db::new(false).await;
    let app = solo_app(&db).await;
    let mut client = app.client.clone();
    let first = client.execute(execute("solo")).await.unwrap_err();
    assert_eq!(first.code(), Code::Unavailable);

    // Stall the ledger writer: another connection holds the write lock.
    let mut lock = sqlx::SqliteConnection::connect(&db.url()).await.unwrap();
    sqlx::query("BEGIN IMMEDIATE")
        .execute(&mut lock)
        .await
        .unwrap();

    // A served call waits for its record, so it cannot finish meanwhile.
    let mut served_client = app.client.clone();
    let served = tokio::spawn(async move { served_client.execute(execute("meeting_brief")).await });
    // The breaker is open: refused with no provider call, answered at once.
    let refused = client.execute(execute("solo")).await.unwrap_err();
    let info = refused.get_details_error_info().unwrap();
    assert_eq!(
        info.metadata["attempts"],
        "primary/gpt-4o-mini:CIRCUIT_OPEN"
    );
    assert!(
        !served.is_finished(),
        "a call that reached a provider was answered before its record was written"
    );

    sqlx::query("ROLLBACK").execute(&mut lock).await.unwrap();
    let meta = served.await.unwrap().unwrap().into_inner().meta.unwrap();
    let store = db.store().await;
    assert_eq!(
        record::by_trace(&store, &meta.trace_id)
            .await
            .unwrap()
            .len(),
        1
    );
    // The refused call's record follows, without anybody waiting for it.
    let trace = info.metadata["trace_id"].clone();
    wait_for(|| {
        let (store, trace) = (store.clone(), trace.clone());
        async move { record::by_trace(&store, &trace).await.unwrap().len() == 1 }
    })
    .await;
    store.close().await;
    app.stop().await;
    db.cleanup().await;
}

/// SPEC §7: shutdown flushes usage. Records queued for calls refused at
/// once (their replies never waited for the disk) are on disk when serve
/// returns, though the disk could take none of them before the stop began.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_writes_the_records_of_refused_calls_still_queued() {
    let db = Db::new(false).await;
    let mut app = solo_app(&db).await;
    let mut client = app.client.clone();
    client.execute(execute("solo")).await.unwrap_err();

    // Nothing can be written meanwhile: another connection holds the lock.
    let mut lock = sqlx::SqliteConnection::connect(&db.url()).await.unwrap();
    sqlx::query("BEGIN IMMEDIATE")
        .execute(&mut lock)
        .await
        .unwrap();
    let mut traces = Vec::new();
    for _ in 0..5 {
        let refused = client.execute(execute("solo")).await.unwrap_err();
        let info = refused.get_details_error_info().unwrap();
        assert!(
            info.metadata["attempts"].ends_with("CIRCUIT_OPEN"),
            "{info:?}"
        );
        traces.push(info.metadata["trace_id"].clone());
    }
    // The stop begins with all five still queued; the disk frees up after.
    app.trigger_shutdown();
    let stopping = tokio::spawn(app.stop());
    sqlx::query("ROLLBACK").execute(&mut lock).await.unwrap();
    drop(lock);
    stopping.await.unwrap();

    let store = db.store().await;
    for trace in &traces {
        let records = record::by_trace(&store, trace).await.unwrap();
        assert_eq!(records.len(), 1, "{trace}");
    }
    store.close().await;
    db.cleanup().await;
}
