//! SQLite migrations that rebuild a table so a commit dirties fewer pages:
//! a database of an older release keeps its rows, and the code goes on
//! writing after them.

use ai_orchestrator::store::Store;

/// SQLite's 0005 rebuilds `usage_reservations` (WITHOUT ROWID, no age
/// index) and `usage_records` (no AUTOINCREMENT) so each metered call dirties
/// fewer pages. An upgraded file keeps its records with their IDs, a call in
/// flight at the upgrade is still swept, and new records continue the IDs.
#[tokio::test]
async fn the_slim_ledger_migration_keeps_records_and_reservations() {
    let dir = tempfile::tempdir().unwrap();
    let store = crate::common::sqlite_migrated_before(dir.path(), "0005").await;
    let Store::Sqlite(pool) = &store else {
        unreachable!("a sqlite: URL")
    };
    for (id, trace) in [(7, "old-1"), (9, "old-2")] {
        sqlx::query(
            "INSERT INTO usage_records (id, created_at_ms, team_id, task, trace_id, outcome) \
             VALUES ($1, 1, 't', 'meeting_brief', $2, 'ok')",
        )
        .bind(id)
        .bind(trace)
        .execute(pool)
        .await
        .unwrap();
    }
    sqlx::query(
        "INSERT INTO usage_ledger (team_id, month_start_ms, reserved_requests) VALUES ('t', 0, 1)",
    )
    .execute(pool)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO usage_reservations VALUES \
         ('r-1', 't', 0, 10, 20, 1, 30, 'meeting_brief', '', 'in-flight', '', '', 5)",
    )
    .execute(pool)
    .await
    .unwrap();

    store.migrate().await.unwrap();

    let schema = |table: &'static str| async move {
        sqlx::query_scalar::<_, String>("SELECT sql FROM sqlite_master WHERE name = $1")
            .bind(table)
            .fetch_one(pool)
            .await
            .unwrap()
    };
    assert!(schema("usage_reservations").await.contains("WITHOUT ROWID"));
    assert!(!schema("usage_records").await.contains("AUTOINCREMENT"));
    let indexes: Vec<String> =
        sqlx::query_scalar("SELECT name FROM sqlite_master WHERE type = 'index' ORDER BY name")
            .fetch_all(pool)
            .await
            .unwrap();
    assert!(indexes.iter().any(|i| i == "usage_records_team_time"));
    assert!(indexes.iter().any(|i| i == "usage_records_trace"));
    assert!(!indexes.iter().any(|i| i == "usage_reservations_created"));

    let ids: Vec<(i64, String)> =
        sqlx::query_as("SELECT id, trace_id FROM usage_records ORDER BY id")
            .fetch_all(pool)
            .await
            .unwrap();
    assert_eq!(ids, [(7, "old-1".into()), (9, "old-2".into())]);
    // The reservation of a call in flight during the upgrade is swept as
    // any orphan, with a record that continues the IDs.
    let swept = ai_orchestrator::usage::sweeper::sweep(&store, i64::MAX)
        .await
        .unwrap();
    assert_eq!(swept, 1);
    let orphan: (i64, i64, i64, String) = sqlx::query_as(
        "SELECT id, input_tokens, output_tokens, outcome FROM usage_records WHERE trace_id = 'in-flight'",
    )
    .fetch_one(pool)
    .await
    .unwrap();
    assert_eq!(orphan, (10, 10, 20, "ORPHANED".into()));
    store.close().await;
}
