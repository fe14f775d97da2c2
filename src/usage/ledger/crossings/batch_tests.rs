//! [`find`] through a whole batch on a real SQLite file: reservations
//! admitted and settled in the batch, several settlements per bucket, one
//! that charges nothing, a user's bucket, a team's override row.

use super::*;
use crate::{
    config::{Config, DatabaseConfig},
    store::Store,
    usage::{
        UsageRecord,
        bucket::PeriodCaps,
        ledger::{self, Op, Reservation, Reserve},
    },
};

const USD: i64 = 1_000_000;

async fn store(dir: &std::path::Path) -> Store {
    let config = DatabaseConfig {
        url: format!("sqlite://{}", dir.join("caps.db").display()),
        ..DatabaseConfig::default()
    };
    let store = Store::connect(&config).await.unwrap();
    store.migrate().await.unwrap();
    store
}

/// A trigger on every warning; defaults that would fire at once if the
/// team's override row were not read (a day cap of one request).
fn triggers() -> Arc<CapTriggers> {
    let config = Config::from_toml_str(
        "[triggers.w]\non = \"usage.cap.warning\"\ntool = \"ops.alert\"\n",
        |_| None,
    )
    .unwrap();
    let defaults = Limits {
        team: PeriodCaps {
            day: Caps {
                requests: Some(1),
                ..Caps::default()
            },
            ..PeriodCaps::default()
        },
        user: PeriodCaps {
            month: Caps {
                cost_micros: Some(USD),
                ..Caps::default()
            },
            ..PeriodCaps::default()
        },
    };
    Arc::new(CapTriggers::new(
        Outbox::from_config(&config).unwrap(),
        defaults,
    ))
}

/// A call of user u1 admitted in memory and settled in the same batch.
fn call(
    trace: &str,
    tokens: i64,
    cost: i64,
    charge: bool,
    t: &Option<Arc<CapTriggers>>,
) -> [Op; 2] {
    let reserve = Reserve {
        id: format!("r-{trace}"),
        team_id: "acme".into(),
        user_id: "u1".into(),
        requests: 1,
        admitted: true,
        ..Reserve::default()
    };
    let settle = Settle {
        reservations: vec![Reservation::from(&reserve)],
        charge,
        recorded: true,
        record: UsageRecord {
            team_id: "acme".into(),
            user_id: "u1".into(),
            trace_id: trace.into(),
            input_tokens: tokens,
            cost_micros: Some(cost),
            ..UsageRecord::default()
        },
        month_start_ms: 0,
        day_start_ms: 0,
        user_id: "u1".into(),
        prompt_owner: None,
        audit: Vec::new(),
        outbox: Vec::new(),
        triggers: t.clone(),
    };
    [Op::Reserve(reserve), Op::Settle(settle)]
}

async fn batch(store: &Store, t: Option<Arc<CapTriggers>>) {
    let ops: Vec<Op> = [
        call("a", 50, 6 * USD / 10, true, &t),
        call("b", 40, 3 * USD / 10, true, &t),
        call("c", 500, 5 * USD, false, &t),
        call("d", 20, 2 * USD / 10, true, &t),
    ]
    .into_iter()
    .flatten()
    .collect();
    ledger::apply(store, &ops).await.unwrap();
}

async fn crossed(store: &Store) -> Vec<(String, String, String)> {
    let filter = crate::audit::store::Filter {
        team_id: "acme".into(),
        limit: 100,
        ..Default::default()
    };
    crate::audit::store::list(store, &filter)
        .await
        .unwrap()
        .into_iter()
        .map(|l| (l.event.action, l.event.subject, l.event.trace_id))
        .collect()
}

#[tokio::test]
async fn a_batch_audits_each_crossing_once_by_the_settlement_that_made_it() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(dir.path()).await;
    let month = PeriodCaps {
        month: Caps {
            tokens: Some(100),
            ..Caps::default()
        },
        day: Caps {
            requests: Some(3),
            ..Caps::default()
        },
    };
    ledger::set_caps(&store, "acme", "", month, 0)
        .await
        .unwrap();
    batch(&store, Some(triggers())).await;
    let s =
        |a: &str, subject: &str, trace: &str| (a.to_owned(), subject.to_owned(), trace.to_owned());
    let (w, r) = ("usage.cap.warning", "usage.cap.reached");
    assert_eq!(
        crossed(&store).await,
        [
            // Tokens 50, 90 (≥ 80), 90 (c charges nothing), 110 (≥ 100).
            s(w, "team:acme/month/tokens", "b"),
            s(r, "team:acme/month/tokens", "d"),
            // Requests 1, 2, 2, 3: 80 % of 3 rounds up to 3.
            s(w, "team:acme/day/requests", "d"),
            s(r, "team:acme/day/requests", "d"),
            // The user's default: 0.6, 0.9 (≥ 0.8), 1.1 USD.
            s(w, "user:u1/month/cost_usd", "b"),
            s(r, "user:u1/month/cost_usd", "d"),
        ]
    );
    let rows = crate::audit::outbox::rows(&store).await.unwrap();
    assert_eq!(rows.len(), 3, "one row per warning: {rows:?}");
    // Past every threshold: the next batch crosses nothing more.
    batch(&store, Some(triggers())).await;
    assert_eq!(crossed(&store).await.len(), 6);
}

#[tokio::test]
async fn without_a_trigger_following_a_cap_nothing_is_audited() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(dir.path()).await;
    batch(&store, None).await;
    assert!(crossed(&store).await.is_empty());
}

/// A token cap stops calls before settled spend reaches it: a refusal at or
/// past 80 % tells `reached`, once per period whoever tells it again.
#[tokio::test]
async fn a_refusal_past_the_warning_tells_reached_once() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(dir.path()).await;
    let bucket = Bucket::team_month("acme", 0);
    let refusal = |used: i64| Refusal {
        bucket: bucket.clone(),
        cap: CapKind::Tokens,
        limit: 1_000,
        used,
        requested: 400,
    };
    let caps = triggers();
    assert!(
        caps.reached_by_refusal(&refusal(700), "early").is_none(),
        "below 80 %"
    );
    let op = caps.reached_by_refusal(&refusal(850), "r-1").unwrap();
    assert!(
        caps.reached_by_refusal(&refusal(900), "r-2").is_none(),
        "told by this replica"
    );
    ledger::apply(&store, &[op]).await.unwrap();
    // Another replica (its own memory) tells it again: the guard row stops it.
    let again = triggers().reached_by_refusal(&refusal(900), "r-3").unwrap();
    ledger::apply(&store, &[again]).await.unwrap();
    let events = crossed(&store).await;
    assert_eq!(
        events,
        [(
            "usage.cap.reached".to_owned(),
            "team:acme/month/tokens".to_owned(),
            "r-1".to_owned()
        )]
    );
    let filter = crate::audit::store::Filter {
        team_id: "acme".into(),
        limit: 10,
        ..Default::default()
    };
    let reason = crate::audit::store::list(&store, &filter).await.unwrap()[0]
        .event
        .reason
        .clone();
    assert_eq!(
        reason,
        "CAP_REACHED cap=monthly_tokens limit=1000 spent=850"
    );
}
