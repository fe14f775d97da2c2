//! Admission decided in memory on a SQLite file (`usage::admission`): a
//! reservation is answered before its row is written, so the ledger's
//! in-memory view must count it until the writer has committed it, take
//! in whatever the writer really did, keep counting reservations whose
//! batch failed, and read caps again after `metering.limits_refresh`. And
//! the file belongs to one server.

use super::{Db, month_now};
use crate::common::config_toml_with;
use crate::common::wait_for;
use ai_orchestrator::usage::bucket::Bucket;
use ai_orchestrator::{
    config::{Config, DatabaseConfig},
    store::Store,
    usage::{
        Amount,
        ledger::{
            self, Done, LedgerWriter, Op, Reservation, Reserve, Settle,
            sqlite::{self as sqlite_writer, Admission},
        },
        policy::{CapKind, Caps},
        record::{self, UsageRecord},
        sweeper,
    },
};
use futures::FutureExt;
use std::time::Duration;
use tokio::sync::watch;

fn reserve(id: &str, team: &str, month: i64) -> Reserve {
    Reserve {
        id: id.into(),
        team_id: team.into(),
        month_start_ms: month,
        input_tokens: 100,
        output_tokens: 50,
        requests: 1,
        cost_micros: 20,
        task: "sms_classify".into(),
        trace_id: id.into(),
        ..Reserve::default()
    }
}

fn settle(r: &Reserve, tokens: i64, cost: i64) -> Settle {
    Settle {
        reservations: vec![Reservation::from(r)],
        charge: true,
        recorded: true,
        record: UsageRecord {
            team_id: r.team_id.clone(),
            task: r.task.clone(),
            trace_id: r.trace_id.clone(),
            input_tokens: tokens,
            output_tokens: 0,
            cost_micros: Some(cost),
            outcome: "ok".into(),
            attempts: "[]".into(),
            ..UsageRecord::default()
        },
        month_start_ms: r.month_start_ms,
        day_start_ms: 0,
        user_id: String::new(),
        prompt_owner: None,
        audit: Vec::new(),
        outbox: Vec::new(),
        triggers: None,
    }
}

async fn writer(db: &Db, store: &Store, refresh: Duration) -> (LedgerWriter, watch::Sender<bool>) {
    let config = DatabaseConfig {
        url: db.url(),
        ..DatabaseConfig::default()
    };
    let (stop, stopped) = watch::channel(false);
    let (writer, _done) =
        LedgerWriter::spawn(store.clone(), &config, 256, 1, refresh, stopped).unwrap();
    (writer, stop)
}

/// A call admitted in memory can settle before its reservation's batch
/// ran: both then land in one batch, and the reservation is never written
/// (its row would be inserted and deleted in one transaction, its estimate
/// reserved and released on one ledger row). Another call's reservation in
/// the same batch is written and stays reserved.
#[tokio::test]
async fn a_reservation_settled_in_its_own_batch_leaves_nothing_open() {
    let db = Db::new(false).await;
    let store = db.store().await;
    let path = sqlite_writer::file_of(&db.url()).unwrap();
    let mut conn = sqlite_writer::open(&path, &DatabaseConfig::default()).unwrap();
    let admitted = |id| Reserve {
        admitted: true,
        ..reserve(id, "t1", 0)
    };
    let (r, running) = (admitted("same-batch"), admitted("still-running"));
    let changes = conn.total_changes();
    let (done, rows) = sqlite_writer::apply_reading(
        &mut conn,
        &[
            Op::Reserve(r.clone()),
            Op::Reserve(running.clone()),
            Op::Settle(settle(&r, 120, 15)),
        ],
    )
    .unwrap();
    assert_eq!(done, [Done::Admitted, Done::Admitted, Done::Settled]);
    // The team's month and day rows each created and updated once, the
    // other call's reservation and the usage record inserted (its trigger
    // adding it to the day's two rollups): nothing for `same-batch`'s
    // reservation itself.
    assert_eq!(conn.total_changes() - changes, 6 + 2);
    assert_eq!(sweeper::open_reservations(&store).await.unwrap(), 1);
    let b = ledger::balance_of(&store, &Bucket::team_month("t1", 0))
        .await
        .unwrap();
    assert_eq!(
        (b.spent_tokens, b.spent_requests, b.spent_cost_micros),
        (120, 1, 15)
    );
    assert_eq!(
        b.reserved(),
        running.amount(),
        "only the running call's estimate stays reserved"
    );
    let day = Bucket {
        period: ai_orchestrator::usage::bucket::Period::Day,
        ..Bucket::team_month("t1", 0)
    };
    assert_eq!(
        rows,
        [(Bucket::team_month("t1", 0), b), (day, b)],
        "the rows as committed"
    );
    assert_eq!(
        record::by_trace(&store, "same-batch").await.unwrap().len(),
        1
    );

    // The running call settles in a later batch: its written reservation
    // is found, deleted and released.
    let (done, _) =
        sqlite_writer::apply_reading(&mut conn, &[Op::Settle(settle(&running, 80, 5))]).unwrap();
    assert_eq!(done, [Done::Settled]);
    assert_eq!(sweeper::open_reservations(&store).await.unwrap(), 0);
    let b = ledger::balance_of(&store, &Bucket::team_month("t1", 0))
        .await
        .unwrap();
    assert_eq!(
        (b.spent_tokens, b.spent_requests, b.spent_cost_micros),
        (200, 2, 20)
    );
    assert_eq!(
        (
            b.reserved_tokens,
            b.reserved_requests,
            b.reserved_cost_micros
        ),
        (0, 0, 0)
    );
    store.close().await;
    db.cleanup().await;
}

/// Reservations answered before they are written still count: of eight
/// submitted at once under a cap of three requests, three are admitted;
/// once written, memory and the ledger row agree, and a settlement moves
/// its call from reserved to spent in both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admissions_count_until_written_and_memory_follows_the_ledger() {
    let db = Db::new(false).await;
    let store = db.store().await;
    let month = month_now();
    let caps = Caps {
        requests: Some(3),
        ..Caps::default()
    };
    ledger::set_caps(&store, "t1", "", caps.into(), 0)
        .await
        .unwrap();
    let (writer, _stop) = writer(&db, &store, Duration::from_secs(60)).await;

    let rs: Vec<Reserve> = (0..8)
        .map(|i| reserve(&format!("r{i}"), "t1", month))
        .collect();
    let answers =
        futures::future::join_all(rs.iter().map(|r| writer.submit(Op::Reserve(r.clone())))).await;
    let admitted: Vec<&Reserve> = rs
        .iter()
        .zip(&answers)
        .filter(|(_, a)| matches!(a, Ok(Done::Admitted)))
        .map(|(r, _)| r)
        .collect();
    assert_eq!(admitted.len(), 3, "{answers:?}");
    for a in &answers {
        if let Ok(Done::Refused(refusal)) = a {
            assert_eq!(
                (refusal.cap, refusal.limit, refusal.used),
                (CapKind::Requests, 3, 3)
            );
        }
    }

    let admission = writer.admission().expect("a SQLite file admits in memory");
    wait_for(|| async { sweeper::open_reservations(&store).await.unwrap() == 3 }).await;
    wait_for(|| async { admission.snapshot("t1", month).unwrap().1 == Amount::ZERO }).await;
    let row = ledger::balance_of(&store, &Bucket::team_month("t1", month))
        .await
        .unwrap();
    assert_eq!(admission.snapshot("t1", month).unwrap().0, row);
    assert_eq!((row.reserved_requests, row.reserved_tokens), (3, 450));

    let first = admitted[0];
    assert_eq!(
        writer
            .submit(Op::Settle(settle(first, 90, 10)))
            .await
            .unwrap(),
        Done::Settled
    );
    let (committed, pending) = admission.snapshot("t1", month).unwrap();
    assert_eq!(pending, Amount::ZERO);
    assert_eq!(
        committed,
        ledger::balance_of(&store, &Bucket::team_month("t1", month))
            .await
            .unwrap()
    );
    assert_eq!(
        (
            committed.spent_requests,
            committed.reserved_requests,
            committed.spent_tokens
        ),
        (1, 2, 90)
    );
    // Still full: two reserved and one spent.
    let refused = writer
        .submit(Op::Reserve(reserve("late", "t1", month)))
        .await
        .unwrap();
    assert!(matches!(refused, Done::Refused(_)), "{refused:?}");
    store.close().await;
    db.cleanup().await;
}

/// Caps are re-read once older than `limits_refresh`: at zero, a cap set
/// by another process (the `limits` CLI) applies to the very next call.
#[tokio::test]
async fn caps_are_read_again_after_limits_refresh() {
    for (refresh, applies) in [(Duration::ZERO, true), (Duration::from_secs(3600), false)] {
        let db = Db::new(false).await;
        let store = db.store().await;
        let month = month_now();
        let (writer, _stop) = writer(&db, &store, refresh).await;
        let first = writer
            .submit(Op::Reserve(reserve("a", "t1", month)))
            .await
            .unwrap();
        assert_eq!(first, Done::Admitted);
        let tight = Caps {
            requests: Some(1),
            ..Caps::default()
        };
        ledger::set_caps(&store, "t1", "", tight.into(), 0)
            .await
            .unwrap();
        let second = writer
            .submit(Op::Reserve(reserve("b", "t1", month)))
            .await
            .unwrap();
        assert_eq!(
            matches!(second, Done::Refused(_)),
            applies,
            "refresh {refresh:?}: {second:?}"
        );
        store.close().await;
        db.cleanup().await;
    }
}

/// A batch that fails (here: its table is gone) rolls back the rows of
/// reservations whose calls are already running; they stay counted in
/// memory until those calls settle, and then nothing is left pending.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_batch_keeps_its_reservations_counted_until_they_settle() {
    let db = Db::new(false).await;
    let store = db.store().await;
    let month = month_now();
    let (writer, _stop) = writer(&db, &store, Duration::from_secs(60)).await;
    let admission = writer.admission().unwrap();
    let ok = reserve("ok", "t1", month);
    assert_eq!(
        writer.submit(Op::Reserve(ok.clone())).await.unwrap(),
        Done::Admitted
    );
    wait_for(|| async { sweeper::open_reservations(&store).await.unwrap() == 1 }).await;

    let Store::Sqlite(pool) = &store else {
        unreachable!()
    };
    sqlx::query("ALTER TABLE usage_reservations RENAME TO usage_reservations_gone")
        .execute(pool)
        .await
        .unwrap();
    let lost = reserve("lost", "t1", month);
    assert_eq!(
        writer.submit(Op::Reserve(lost.clone())).await.unwrap(),
        Done::Admitted,
        "answered before its batch runs"
    );
    // Its batch fails; its amount stays pending (held), on top of `ok`'s
    // committed reservation.
    let held = lost.amount();
    wait_for(|| async {
        let (committed, pending) = admission.snapshot("t1", month).unwrap();
        committed.reserved_requests == 1 && pending == held
    })
    .await;
    // A later operation is answered only once the writer has applied the
    // failed batch before it (one queue, in order): still held then.
    let barrier = Settle {
        reservations: Vec::new(),
        charge: false,
        recorded: true,
        ..settle(&reserve("barrier", "t2", month), 0, 0)
    };
    writer.submit(Op::Settle(barrier)).await.unwrap();
    assert_eq!(admission.snapshot("t1", month).unwrap().1, held);

    // Its call settles (that batch fails too): nothing is left pending.
    let failed = writer.submit(Op::Settle(settle(&lost, 10, 1))).await;
    assert!(failed.is_err(), "{failed:?}");
    assert_eq!(admission.snapshot("t1", month).unwrap().1, Amount::ZERO);
    store.close().await;
    db.cleanup().await;
}

/// Two servers on one SQLite file would each admit against their own
/// memory and sweep the other's reservations: the second is refused.
#[tokio::test]
async fn a_second_server_on_the_same_sqlite_file_is_refused() {
    let db = Db::new(false).await;
    let toml = config_toml_with(&db.url(), super::FAST, super::FAST, "");
    let app = crate::common::TestApp::spawn_toml(&toml).await;
    let config = Config::from_toml_str(&toml, |_| None).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let second = tokio::time::timeout(
        Duration::from_secs(10),
        ai_orchestrator::serve(listener, config, std::future::pending()),
    )
    .await
    .expect("the second server gives up at once");
    let error = format!("{:#}", second.unwrap_err());
    assert!(
        error.contains("in use by another ai-orchestrator server"),
        "{error}"
    );
    // The first is unaffected, and once stopped, the file is free again.
    app.stop().await;
    let path = sqlite_writer::file_of(&db.url()).unwrap();
    drop(sqlite_writer::claim(&path).expect("free after the first server stopped"));
    db.cleanup().await;
}

/// A call cancelled while it was reading its team's caps again must not
/// leave the team marked as being read (the calls after it would keep the
/// old caps for good): the next call reads them.
#[tokio::test]
async fn a_cancelled_caps_read_does_not_freeze_the_caps() {
    let db = Db::new(false).await;
    db.store().await.close().await; // created and migrated
    // One connection, so holding it makes the caps read wait.
    let store = Store::connect(&DatabaseConfig {
        url: db.url(),
        max_connections: 1,
        ..DatabaseConfig::default()
    })
    .await
    .unwrap();
    let month = month_now();
    let admission = Admission::new(store.clone(), Duration::ZERO);
    let first = admission.admit(&reserve("a", "t1", month)).await.unwrap();
    assert_eq!(first, Ok(()));
    let tight = Caps {
        requests: Some(1),
        ..Caps::default()
    };
    ledger::set_caps(&store, "t1", "", tight.into(), 0)
        .await
        .unwrap();
    // Polled once while the pool's only connection is taken, so it is
    // waiting to read the caps, then dropped.
    let Store::Sqlite(pool) = &store else {
        unreachable!()
    };
    let taken = pool.acquire().await.unwrap();
    let cancelled = reserve("cancelled", "t1", month);
    let polled = admission.admit(&cancelled).now_or_never();
    assert!(polled.is_none(), "still reading the caps: {polled:?}");
    drop(taken);
    let next = admission.admit(&reserve("b", "t1", month)).await.unwrap();
    let refusal = next.expect_err("the new cap applies");
    assert_eq!((refusal.cap, refusal.limit), (CapKind::Requests, 1));
    store.close().await;
    db.cleanup().await;
}
