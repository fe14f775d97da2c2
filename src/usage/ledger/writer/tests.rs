//! The writers' handle over a queue nobody drains, and in-memory admission
//! on a real SQLite file: withdrawals, settlements never sent, sweeps.

use super::*;
use crate::usage::{amount::Amount, ledger::Settle};

fn reserve(team: &str) -> Op {
    Op::Reserve(Reserve {
        team_id: team.into(),
        requests: 1,
        ..Reserve::default()
    })
}

fn settle(team: &str) -> Op {
    Op::Settle(Settle {
        reservations: Vec::new(),
        charge: false,
        recorded: true,
        record: crate::usage::UsageRecord {
            team_id: team.into(),
            ..Default::default()
        },
        month_start_ms: 0,
        day_start_ms: 0,
        user_id: String::new(),
        prompt_owner: None,
        audit: Vec::new(),
        outbox: Vec::new(),
        triggers: None,
    })
}

/// A call dropped while waiting for room in a full queue takes its admission back.
#[tokio::test]
async fn an_admission_dropped_before_it_is_queued_is_withdrawn() {
    use futures::FutureExt;
    let dir = tempfile::tempdir().unwrap();
    let config = DatabaseConfig {
        url: format!("sqlite://{}", dir.path().join("q.db").display()),
        ..DatabaseConfig::default()
    };
    let store = Store::connect(&config).await.unwrap();
    store.migrate().await.unwrap();
    let admission = Arc::new(Admission::new(store.clone(), Duration::from_secs(3600)));
    // A queue of one that nobody drains.
    let (tx, _rx) = mpsc::channel(1);
    let writer = LedgerWriter {
        shards: vec![tx].into(),
        admission: Some(admission.clone()),
        wal_syncs: None,
        outbox: None,
        caps: None,
    };
    let first = writer.submit(reserve("t")).await.unwrap();
    assert_eq!(first, Done::Admitted);
    let counted = |a: &Admission| a.snapshot("t", 0).map(|(_, pending)| pending);
    assert_eq!(counted(&admission), Some(Amount::new(0, 1, 0)));

    // The second call is admitted at once, then waits for room: dropped, withdrawn.
    let waiting = writer.submit(reserve("t")).now_or_never();
    assert!(waiting.is_none(), "waits for room in the queue");
    assert_eq!(counted(&admission), Some(Amount::new(0, 1, 0)));

    // A settlement dropped while it waits for room is taken back.
    let admitted = Reserve {
        team_id: "t".into(),
        requests: 1,
        ..Reserve::default()
    };
    let Op::Settle(mut settle) = settle_of(&admitted) else {
        unreachable!("a settlement")
    };
    settle.record.input_tokens = 5;
    let mut with_charge = Amount::new(0, 1, 0);
    with_charge += settle.charged();
    assert_eq!(admission.open("t", 0), Some(1));
    let mut waiting = Box::pin(writer.submit(Op::Settle(settle)));
    assert!((&mut waiting).now_or_never().is_none(), "waits for room");
    assert_eq!(counted(&admission), Some(with_charge));
    drop(waiting);
    assert_eq!(counted(&admission), Some(Amount::new(0, 1, 0)));
    assert_eq!(admission.open("t", 0), Some(0));

    // The same for one queued without waiting for its commit.
    let Op::Settle(mut settle) = settle_of(&admitted) else {
        unreachable!("a settlement")
    };
    settle.record.input_tokens = 5;
    let mut waiting = Box::pin(writer.enqueue(Op::Settle(settle)));
    assert!((&mut waiting).now_or_never().is_none(), "waits for room");
    assert_eq!(counted(&admission), Some(with_charge));
    drop(waiting);
    assert_eq!(counted(&admission), Some(Amount::new(0, 1, 0)));
    store.close().await;
}

/// A settlement that reached the writer is not also taken back.
#[tokio::test]
async fn a_settlement_sent_is_not_taken_back() {
    let dir = tempfile::tempdir().unwrap();
    let (writer, admission, store) = on_file(dir.path()).await;
    let (first, second) = (reserve_for("a", "t"), reserve_for("b", "t"));
    for r in [&first, &second] {
        let admitted = writer.submit(Op::Reserve(r.clone())).await.unwrap();
        assert_eq!(admitted, Done::Admitted);
    }
    assert_eq!(admission.open("t", 0), Some(2));
    assert_eq!(
        writer.submit(settle_of(&first)).await.unwrap(),
        Done::Settled
    );
    assert_eq!(admission.open("t", 0), Some(1));
    let (committed, pending) = admission.snapshot("t", 0).unwrap();
    assert_eq!(committed.spent(), Amount::new(0, 1, 0));
    let mut counted = committed.reserved();
    counted += pending;
    assert_eq!(counted, Amount::new(0, 1, 0), "the second call's request");
    store.close().await;
}

/// Caps of two requests a month, for every team of these tests.
const TWO_REQUESTS: crate::usage::policy::Caps = crate::usage::policy::Caps {
    requests: Some(2),
    tokens: None,
    cost_micros: None,
};

/// A call's first reservation for `team` under [`TWO_REQUESTS`].
fn reserve_for(id: &str, team: &str) -> Reserve {
    Reserve {
        id: id.into(),
        team_id: team.into(),
        requests: 1,
        default_caps: TWO_REQUESTS.into(),
        ..Reserve::default()
    }
}

/// The settlement of `r`'s call, charging its request.
fn settle_of(r: &Reserve) -> Op {
    Op::Settle(Settle {
        reservations: vec![crate::usage::ledger::Reservation::from(r)],
        charge: true,
        recorded: true,
        record: crate::usage::UsageRecord {
            team_id: r.team_id.clone(),
            trace_id: r.id.clone(),
            ..Default::default()
        },
        month_start_ms: 0,
        day_start_ms: 0,
        user_id: String::new(),
        prompt_owner: None,
        audit: Vec::new(),
        outbox: Vec::new(),
        triggers: None,
    })
}

/// The writers on a new SQLite file, and its in-memory admission.
async fn on_file(dir: &std::path::Path) -> (LedgerWriter, Arc<Admission>, Store) {
    let config = DatabaseConfig {
        url: format!("sqlite://{}", dir.join("f.db").display()),
        ..DatabaseConfig::default()
    };
    let store = Store::connect(&config).await.unwrap();
    store.migrate().await.unwrap();
    // Dropping the sender would stop the writers.
    let (stop, stopping) = watch::channel(false);
    std::mem::forget(stop);
    let (writer, _handle) = LedgerWriter::spawn(
        store.clone(),
        &config,
        64,
        1,
        Duration::from_secs(3600),
        stopping,
    )
    .unwrap();
    let admission = writer.admission.clone().unwrap();
    (writer, admission, store)
}

/// A call run to its end: admitted (or refused), then settled.
async fn call(writer: &LedgerWriter, id: &str, team: &str) -> Done {
    let r = reserve_for(id, team);
    let admitted = writer.submit(Op::Reserve(r.clone())).await.unwrap();
    if admitted == Done::Admitted {
        assert_eq!(writer.submit(settle_of(&r)).await.unwrap(), Done::Settled);
    }
    admitted
}

/// Admission drops idle teams once it holds enough, keeps those with a
/// call open, and reads a dropped team's row back exactly.
#[tokio::test]
async fn admission_forgets_idle_teams_and_reads_them_back_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let (writer, admission, store) = on_file(dir.path()).await;
    admission.sweep_at(4);
    // "busy" keeps a call open across the sweeps; "spent" uses its cap.
    let open = reserve_for("open", "busy");
    let admitted = writer.submit(Op::Reserve(open.clone())).await.unwrap();
    assert_eq!(admitted, Done::Admitted);
    for id in ["s0", "s1"] {
        assert_eq!(call(&writer, id, "spent").await, Done::Admitted);
    }
    for (n, team) in ["a", "b", "c", "d", "e", "f", "g", "h"]
        .into_iter()
        .enumerate()
    {
        assert_eq!(call(&writer, &format!("o{n}"), team).await, Done::Admitted);
    }
    // Sweeps at c and f: busy, f, g and h are left.
    assert!(admission.snapshot("spent", 0).is_none(), "dropped");
    assert_eq!(admission.open("busy", 0), Some(1), "kept while open");
    assert_eq!(admission.entries(), 4);

    // Read back from its row: both requests spent, the third refused.
    assert!(matches!(
        call(&writer, "s2", "spent").await,
        Done::Refused(_)
    ));
    // The open call settles; "busy" is then done with.
    assert_eq!(
        writer.submit(settle_of(&open)).await.unwrap(),
        Done::Settled
    );
    assert_eq!(admission.open("busy", 0), Some(0));
    assert_eq!(
        admission.snapshot("busy", 0).map(|(_, p)| p),
        Some(Amount::ZERO)
    );
    store.close().await;
}

/// A row read before a sweep is read again rather than trusted: the cap holds.
#[tokio::test]
async fn a_row_read_across_a_sweep_is_read_again() {
    let dir = tempfile::tempdir().unwrap();
    let (writer, admission, store) = on_file(dir.path()).await;
    admission.sweep_at(2);

    // A first call of "k" reads its row (nothing spent yet) and pauses.
    let (there, resume) = admission.pause_after_read();
    let late = writer.submit(Op::Reserve(reserve_for("late", "k")));
    let mut late = std::pin::pin!(late);
    tokio::select! {
        _ = &mut late => panic!("the call paused after its read"),
        _ = there => {}
    }
    // Meanwhile two calls of "k" spend its cap, and a sweep drops "k".
    for id in ["k1", "k2"] {
        assert_eq!(call(&writer, id, "k").await, Done::Admitted);
    }
    for (id, team) in [("x1", "x"), ("y1", "y")] {
        assert_eq!(call(&writer, id, team).await, Done::Admitted);
    }
    assert!(admission.snapshot("k", 0).is_none(), "swept");

    // The paused call would see nothing spent in its row.
    resume.send(()).unwrap();
    assert!(matches!(late.await.unwrap(), Done::Refused(_)));
    store.close().await;
}

#[test]
fn a_team_always_uses_one_writer_and_teams_spread_over_all() {
    let (senders, _receivers): (Vec<_>, Vec<_>) = (0..4).map(|_| mpsc::channel(1)).unzip();
    let writer = LedgerWriter {
        shards: senders.into(),
        admission: None,
        wal_syncs: None,
        outbox: None,
        caps: None,
    };
    let index = |op: &Op| {
        let shard = writer.shard(op).unwrap();
        writer
            .shards
            .iter()
            .position(|s| s.same_channel(shard))
            .unwrap()
    };
    let mut used = std::collections::HashSet::new();
    for t in 0..64 {
        let team = format!("team-{t}");
        let first = index(&reserve(&team));
        assert_eq!(index(&settle(&team)), first, "{team}");
        assert_eq!(index(&reserve(&team)), first, "{team}");
        used.insert(first);
    }
    assert_eq!(used.len(), 4, "64 teams use every writer");
}
