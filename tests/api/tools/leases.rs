//! The `tool_invocations` leases on both databases, at the store: a runner
//! whose lease ran out cannot write its end over the run that took the row
//! again; a SYNC row the sweeper marked INTERRUPTED takes its runner's late
//! end; the worker passes over busy tools in the same statement.

use crate::common::on_both_databases as on_both;
use ai_orchestrator::{
    store::Store,
    tools::{
        Failure, Status,
        invocations::{self, Invocation, Mode, Outcome},
    },
};
use serde_json::json;
use std::time::Duration;

/// A one-second invocation of `tool` with its own key.
fn invocation(tool: &str, mode: Mode) -> Invocation {
    Invocation::new(
        "team-leases",
        tool,
        "1.0.0",
        mode,
        &uuid::Uuid::now_v7().simple().to_string(),
        0,
        "0af7651916cd43dd8448eb211c80319c",
        "svc",
        json!({"n": 1}),
        10,
        Duration::from_secs(1),
    )
}

fn ended(status: Status, tag: &str) -> Outcome {
    let failed = status != Status::Succeeded;
    Outcome {
        status,
        output: (!failed).then(|| json!({ "run": tag })),
        error: failed.then(|| Failure::new("WEBHOOK_FAILED", tag)),
        cost_micros: 10,
        duration_ms: 5,
        execution_id: Some(tag.to_owned()),
        attempts: 1,
        callback_until_ms: None,
    }
}

async fn stored(store: &Store, id: &str) -> Invocation {
    invocations::get(store, "team-leases", id)
        .await
        .unwrap()
        .expect("the row")
}

#[tokio::test]
async fn a_runner_whose_lease_ran_out_does_not_write_over_the_run_that_took_the_row() {
    on_both(|store| async move {
        let backend = store.backend();
        let inv = invocation("crm.note", Mode::Async);
        invocations::claim(&store, &inv, None).await.unwrap();

        // Taken at t = 1 s: leased for its 1 s timeout and 0.5 s of slack.
        let first = invocations::take_work(&store, 1_000, 500, 10, &[])
            .await
            .unwrap();
        assert_eq!(first.len(), 1, "{backend}");
        assert_eq!(first[0].invocation.id, inv.id);
        assert_eq!(first[0].invocation.status, Status::Running);
        assert_eq!(first[0].lease_until_ms, 2_500, "{backend}");
        let still_leased = invocations::take_work(&store, 2_000, 500, 10, &[])
            .await
            .unwrap();
        assert!(still_leased.is_empty(), "{backend}: {still_leased:?}");

        // The first runner is taken for dead; a second run takes the row.
        let second = invocations::take_work(&store, 3_000, 500, 10, &[])
            .await
            .unwrap();
        assert_eq!(second.len(), 1, "{backend}");
        assert_eq!(second[0].lease_until_ms, 4_500, "{backend}");

        // The first runner was alive after all and ends while the second
        // still runs: the row stays the second's.
        let late = ended(Status::Succeeded, "first");
        assert!(
            !invocations::finish(&store, &inv.id, 2_500, &late)
                .await
                .unwrap(),
            "{backend}"
        );
        assert_eq!(stored(&store, &inv.id).await.status, Status::Running);
        // Nor can it put the row back in the queue.
        invocations::release(&store, &inv.id, 2_500).await.unwrap();
        assert_eq!(stored(&store, &inv.id).await.status, Status::Running);

        let owner = ended(Status::Failed, "second");
        assert!(
            invocations::finish(&store, &inv.id, 4_500, &owner)
                .await
                .unwrap(),
            "{backend}"
        );
        // Ended: nobody writes over it, the late runner nor the owner again.
        for lease in [2_500, 4_500] {
            assert!(
                !invocations::finish(&store, &inv.id, lease, &late)
                    .await
                    .unwrap(),
                "{backend}: lease {lease}"
            );
        }
        let row = stored(&store, &inv.id).await;
        assert_eq!(row.status, Status::Failed, "{backend}");
        assert_eq!(row.execution_id.as_deref(), Some("second"), "{backend}");
        assert_eq!(row.output, None, "{backend}");
        let none = invocations::take_work(&store, 10_000, 500, 10, &[])
            .await
            .unwrap();
        assert!(none.is_empty(), "{backend}: an ended row is never taken");
    })
    .await;
}

#[tokio::test]
async fn a_sync_row_marked_interrupted_takes_its_runners_late_end() {
    on_both(|store| async move {
        let backend = store.backend();
        let inv = invocation("crm.sync_note", Mode::Sync);
        invocations::claim(&store, &inv, Some(1_500)).await.unwrap();
        // ASYNC work only: a SYNC row is never taken by the worker.
        let taken = invocations::take_work(&store, 5_000, 500, 10, &[])
            .await
            .unwrap();
        assert!(taken.is_empty(), "{backend}: {taken:?}");

        let swept = invocations::fail_interrupted(&store, 2_000).await.unwrap();
        assert_eq!(swept.len(), 1, "{backend}");
        let row = stored(&store, &inv.id).await;
        assert_eq!(row.status, Status::Failed);
        assert_eq!(row.error.map(|e| e.code).as_deref(), Some("INTERRUPTED"));

        // Its runner was alive: its caller got this end, and so does the row.
        let end = ended(Status::Succeeded, "late");
        assert!(
            invocations::finish(&store, &inv.id, 1_500, &end)
                .await
                .unwrap(),
            "{backend}"
        );
        let row = stored(&store, &inv.id).await;
        assert_eq!(row.status, Status::Succeeded, "{backend}");
        assert_eq!(row.output, Some(json!({"run": "late"})), "{backend}");
        assert_eq!(row.error, None, "{backend}");
        // A real end is final.
        let again = ended(Status::Failed, "again");
        assert!(
            !invocations::finish(&store, &inv.id, 1_500, &again)
                .await
                .unwrap(),
            "{backend}"
        );
    })
    .await;
}

#[tokio::test]
async fn the_worker_passes_over_busy_tools_in_one_statement() {
    on_both(|store| async move {
        let backend = store.backend();
        let busy_one = invocation("crm.busy", Mode::Async);
        let free_one = invocation("crm.free", Mode::Async);
        invocations::claim(&store, &busy_one, None).await.unwrap();
        invocations::claim(&store, &free_one, None).await.unwrap();
        let busy = [(
            "team-leases".to_owned(),
            "crm.busy".to_owned(),
            "1.0.0".to_owned(),
        )];
        let taken = invocations::take_work(&store, 1_000, 500, 10, &busy)
            .await
            .unwrap();
        let ids: Vec<_> = taken.iter().map(|t| t.invocation.id.as_str()).collect();
        assert_eq!(ids, [free_one.id.as_str()], "{backend}");
        // The busy tool's row was not touched: still PENDING, unleased.
        assert_eq!(stored(&store, &busy_one.id).await.status, Status::Pending);
        let later = invocations::take_work(&store, 1_000, 500, 10, &[])
            .await
            .unwrap();
        let ids: Vec<_> = later.iter().map(|t| t.invocation.id.as_str()).collect();
        assert_eq!(ids, [busy_one.id.as_str()], "{backend}");
    })
    .await;
}

/// A guarded write's audit events stand or fall with its guard when asked
/// to (a workflow callback's end, so an end is never audited that did not
/// happen), and are appended whatever it found otherwise (a conversation's
/// release), on both databases.
#[tokio::test]
async fn a_ledger_writes_audit_can_follow_its_guard() {
    use ai_orchestrator::{
        audit::{AuditEvent, Category, store as audit},
        config::DatabaseConfig,
        usage::ledger::{Done, LedgerWriter, Op, Write},
    };
    let dir = tempfile::tempdir().unwrap();
    let db = crate::common::TestPostgres::create().await;
    for url in [
        format!("sqlite://{}", dir.path().join("guard.db").display()),
        db.url.clone(),
    ] {
        let config = DatabaseConfig {
            url,
            ..DatabaseConfig::default()
        };
        let store = Store::connect(&config).await.unwrap();
        store.migrate().await.unwrap();
        let (stop, stopping) = tokio::sync::watch::channel(false);
        let (writer, _) = LedgerWriter::spawn(
            store.clone(),
            &config,
            64,
            1,
            Duration::from_secs(3600),
            stopping,
        )
        .unwrap();
        for (only_if_stored, action) in [(true, "guarded"), (false, "regardless")] {
            let op = Op::Write(Write {
                team_id: "team-guard".into(),
                // A callback's end of an invocation that does not exist.
                statements: vec![invocations::callbacks::expire("no-such-invocation", 0)],
                durable: true,
                audit: vec![AuditEvent::new(
                    "team-guard",
                    "p",
                    "trace",
                    Category::Workflow,
                    action,
                    "crm.sync_lead@1.0.0",
                )],
                audit_only_if_stored: only_if_stored,
                outbox: Vec::new(),
            });
            let done = writer.submit(op).await.unwrap();
            assert!(
                matches!(done, Done::Written { stored: false, .. }),
                "{done:?}"
            );
        }
        let filter = audit::Filter {
            team_id: "team-guard".into(),
            since_ms: None,
            until_ms: None,
            trace_id: None,
            after_seq: 0,
            limit: 10,
        };
        let actions: Vec<String> = audit::list(&store, &filter)
            .await
            .unwrap()
            .into_iter()
            .map(|l| l.event.action)
            .collect();
        assert_eq!(actions, ["regardless"], "{}", config.url);
        stop.send(true).unwrap();
    }
    db.drop_now().await;
}
