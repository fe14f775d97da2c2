//! The SQLite ledger writer's own connection under sustained writes and at
//! stop: its automatic checkpoint lets the WAL start over, so the WAL stays
//! bounded in both durability modes (a passive checkpointer beside a busy
//! writer never caught up, and the WAL grew without bound); and a stop that
//! comes while a batch is still being applied ends the writer.

use super::Db;
use ai_orchestrator::{
    config::{DatabaseConfig, SqliteDurability},
    usage::{
        Amount,
        ledger::{Done, LedgerWriter, Op, Reservation, Reserve, Settle, sqlite as sqlite_writer},
        record::{self, UsageRecord},
    },
};
use std::time::Duration;
use tokio::sync::watch;

/// Calls metered one after another (a commit each, so as many WAL frames
/// as possible): ~5 pages per commit, two commits per call, i.e. ~40 MiB of
/// WAL frames in all, ten times the bound checked.
const CALLS: usize = 1_000;
/// How long admission trusts a team's caps.
const REFRESH: Duration = Duration::from_secs(1);
/// A stopped writer commits what is queued and ends well within this.
const STOPS_WITHIN: Duration = Duration::from_secs(10);
/// SQLite's 1,000-frame threshold is ~4 MiB; what the writer adds between
/// two background passes comes on top.
const BOUND: u64 = 12 * 1024 * 1024;

async fn wal_stays_bounded(durability: SqliteDurability) {
    let db = Db::new(false).await;
    let store = db.store().await;
    let config = DatabaseConfig {
        url: db.url(),
        sqlite_synchronous: durability,
        // SQLite's own default, so the bound below is a few checkpoints
        // wide (the server's default, 10,000 frames, is ~40 MiB).
        sqlite_wal_autocheckpoint: 1_000,
        ..DatabaseConfig::default()
    };
    let (stop, stopped) = watch::channel(false);
    let (writer, done) =
        LedgerWriter::spawn(store.clone(), &config, 256, 1, REFRESH, stopped).unwrap();
    let mut wal = sqlite_writer::file_of(&db.url()).unwrap().into_os_string();
    wal.push("-wal");

    let mut largest = 0;
    for i in 0..CALLS {
        let id = format!("call-{i}");
        let admitted = writer
            .submit(Op::Reserve(Reserve {
                id: id.clone(),
                team_id: format!("team-{}", i % 8),
                input_tokens: 100,
                output_tokens: 50,
                requests: 1,
                cost_micros: 10,
                task: "meeting_brief".into(),
                trace_id: id.clone(),
                ..Reserve::default()
            }))
            .await
            .unwrap();
        assert_eq!(admitted, Done::Admitted);
        let settled = writer
            .submit(Op::Settle(Settle {
                reservations: vec![Reservation {
                    id: id.clone(),
                    amount: Amount::new(150, 1, 10),
                }],
                charge: true,
                recorded: true,
                record: UsageRecord {
                    team_id: format!("team-{}", i % 8),
                    task: "meeting_brief".into(),
                    trace_id: id,
                    input_tokens: 90,
                    output_tokens: 40,
                    cost_micros: Some(9),
                    outcome: "ok".into(),
                    attempts: "[]".into(),
                    ..UsageRecord::default()
                },
                month_start_ms: 0,
                day_start_ms: 0,
                user_id: String::new(),
                prompt_owner: None,
                audit: Vec::new(),
                outbox: Vec::new(),
                triggers: None,
            }))
            .await
            .unwrap();
        assert_eq!(settled, Done::Settled);
        largest = largest.max(std::fs::metadata(&wal).map(|m| m.len()).unwrap_or(0));
    }
    stop.send(true).unwrap();
    tokio::time::timeout(STOPS_WITHIN, done)
        .await
        .expect("the writer stops")
        .unwrap();

    assert!(
        largest < BOUND,
        "WAL reached {largest} bytes over {CALLS} calls ({durability:?})"
    );
    let last = record::by_trace(&store, &format!("call-{}", CALLS - 1))
        .await
        .unwrap();
    assert_eq!(last.len(), 1, "every call recorded");
    store.close().await;
    db.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_wal_stays_bounded_with_full_durability() {
    wal_stays_bounded(SqliteDurability::Full).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_wal_stays_bounded_with_normal_durability() {
    wal_stays_bounded(SqliteDurability::Normal).await;
}

/// The SQLite writer answers a batch's callers from the blocking task that
/// applies it, so a caller can ask the writer to stop before the writer's
/// loop has seen the batch end. The stop must still close the queue (the
/// caller here still holds a handle, as the server's meter does) and end
/// the writer: it once waited forever for more work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_right_after_an_answer_ends_the_writer() {
    let db = Db::new(false).await;
    let store = db.store().await;
    let config = DatabaseConfig {
        url: db.url(),
        ..DatabaseConfig::default()
    };
    for round in 0..20 {
        let (stop, stopped) = watch::channel(false);
        let (writer, done) =
            LedgerWriter::spawn(store.clone(), &config, 256, 1, REFRESH, stopped).unwrap();
        let admitted = writer
            .submit(Op::Reserve(Reserve {
                id: format!("stop-{round}"),
                team_id: "t".into(),
                requests: 1,
                ..Reserve::default()
            }))
            .await
            .unwrap();
        assert_eq!(admitted, Done::Admitted);
        stop.send(true).unwrap();
        tokio::time::timeout(STOPS_WITHIN, done)
            .await
            .unwrap_or_else(|_| panic!("round {round}: the writer did not stop"))
            .unwrap();
        drop(writer);
    }
    store.close().await;
    db.cleanup().await;
}
