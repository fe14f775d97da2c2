//! Metering: caps hold exactly under concurrency (one server and two sharing
//! PostgreSQL), month rollover, cancelled and failed calls settle, GetUsage
//! agrees with the records and the responses. Every scenario runs on SQLite
//! and on PostgreSQL; GetUsage and the caps' other paths are in the
//! submodules.

use crate::common::{TestApp, TestPostgres, config_toml_with, ctx, wait_for};
use ai_orchestrator::usage::bucket::Bucket;
use ai_orchestrator::{
    api::pb,
    config::DatabaseConfig,
    store::Store,
    usage::{
        Amount,
        ledger::{self, Done, Op, Reserve},
        policy::Caps,
        record, summary, sweeper,
    },
};
use std::time::Duration;
use tonic::Code;
use tonic_types::StatusExt;

mod admission;
mod budgets;
mod caps;
mod fast_fail;
mod get_usage;
mod overflow;
mod wal;

/// A database for one scenario: a temp SQLite file or a fresh PostgreSQL db.
pub(crate) enum Db {
    Sqlite(tempfile::TempDir),
    Postgres(TestPostgres),
}

impl Db {
    pub(crate) async fn new(postgres: bool) -> Self {
        if postgres {
            Db::Postgres(TestPostgres::create().await)
        } else {
            Db::Sqlite(tempfile::tempdir().unwrap())
        }
    }

    pub(crate) fn url(&self) -> String {
        match self {
            Db::Sqlite(dir) => format!("sqlite://{}", dir.path().join("metering.db").display()),
            Db::Postgres(pg) => pg.url.clone(),
        }
    }

    pub(crate) async fn store(&self) -> Store {
        let store = Store::connect(&DatabaseConfig {
            url: self.url(),
            ..DatabaseConfig::default()
        })
        .await
        .unwrap();
        store.migrate().await.unwrap();
        store
    }

    pub(crate) async fn cleanup(self) {
        if let Db::Postgres(pg) = self {
            pg.drop_now().await;
        }
    }
}

const FAST: &str = "latency = \"5ms\"";

fn classify(message: &str) -> pb::ClassifySmsRequest {
    pb::ClassifySmsRequest {
        context: ctx(),
        message: message.into(),
        ..Default::default()
    }
}

fn month_now() -> i64 {
    summary::month_of(chrono::Utc::now()).0
}

/// Fires `n` concurrent ClassifySms calls spread over `apps`; returns
/// (ok, quota refusals) and fails on any other outcome.
async fn burst(apps: &[&TestApp], n: usize) -> (usize, usize) {
    let mut calls = Vec::new();
    for i in 0..n {
        let mut client = apps[i % apps.len()].client.clone();
        calls.push(tokio::spawn(async move {
            client
                .classify_sms(classify("Is the offer still valid?"))
                .await
        }));
    }
    let (mut ok, mut refused) = (0, 0);
    for call in calls {
        match call.await.unwrap() {
            Ok(_) => ok += 1,
            Err(status) => {
                assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
                let info = status.get_details_error_info().unwrap();
                assert_eq!(info.reason, "QUOTA_EXCEEDED");
                let quota = status
                    .get_details_quota_failure()
                    .expect("QuotaFailure detail");
                assert!(
                    quota.violations[0].subject.ends_with("/month/requests"),
                    "{quota:?}"
                );
                assert!(
                    quota.violations[0].description.contains("0 remaining"),
                    "{quota:?}"
                );
                refused += 1;
            }
        }
    }
    (ok, refused)
}

async fn exactly_k_of_200_succeed(postgres: bool) {
    const K: usize = 37;
    let db = Db::new(postgres).await;
    let extra = format!("[metering.default_limits]\nmax_requests = {K}\n");
    let app = TestApp::spawn_toml(&config_toml_with(&db.url(), FAST, FAST, &extra)).await;
    let store = db.store().await;

    // Watch the invariant while the burst runs.
    let watcher_store = store.clone();
    let watcher = tokio::spawn(async move {
        let mut worst = 0;
        for _ in 0..200 {
            let b = ledger::balance_of(&watcher_store, &Bucket::team_month("t1", month_now()))
                .await
                .unwrap();
            worst = worst.max(b.spent_requests + b.reserved_requests);
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        worst
    });
    let (ok, refused) = burst(&[&app], 200).await;
    assert_eq!((ok, refused), (K, 200 - K));
    assert!(
        watcher.await.unwrap() <= K as i64,
        "spent + reserved overshot the cap mid-burst"
    );

    let b = ledger::balance_of(&store, &Bucket::team_month("t1", month_now()))
        .await
        .unwrap();
    assert_eq!(
        (
            b.spent_requests,
            b.reserved_requests,
            b.reserved_tokens,
            b.reserved_cost_micros
        ),
        (K as i64, 0, 0, 0)
    );
    assert_eq!(sweeper::open_reservations(&store).await.unwrap(), 0);
    // Refused calls never reached a provider and left no record.
    let s = summary::summarize(&store, "t1", month_now(), i64::MAX, &[])
        .await
        .unwrap();
    assert_eq!(s.totals.requests, K as u64);
    store.close().await;
    app.stop().await;
    db.cleanup().await;
}

#[tokio::test]
async fn exactly_k_of_200_concurrent_calls_succeed_sqlite() {
    exactly_k_of_200_succeed(false).await;
}

#[tokio::test]
async fn exactly_k_of_200_concurrent_calls_succeed_postgres() {
    exactly_k_of_200_succeed(true).await;
}

#[tokio::test]
async fn two_replicas_sharing_postgres_never_overshoot() {
    const K: usize = 23;
    let db = Db::new(true).await;
    let extra = format!("[metering.default_limits]\nmax_requests = {K}\n");
    let toml = config_toml_with(&db.url(), FAST, FAST, &extra);
    let (a, b) = (
        TestApp::spawn_toml(&toml).await,
        TestApp::spawn_toml(&toml).await,
    );
    let (ok, refused) = burst(&[&a, &b], 200).await;
    assert_eq!((ok, refused), (K, 200 - K));
    let store = db.store().await;
    let bal = ledger::balance_of(&store, &Bucket::team_month("t1", month_now()))
        .await
        .unwrap();
    assert_eq!((bal.spent_requests, bal.reserved_requests), (K as i64, 0));
    store.close().await;
    a.stop().await;
    b.stop().await;
    db.cleanup().await;
}

/// Many teams over two replicas, each with several ledger writers sharing
/// one PostgreSQL database: batches of different teams commit in parallel
/// and lock ledger rows in one order, so every call is either served or
/// refused by its own team's cap (no batch is aborted as a deadlock
/// victim), and each team's cap holds exactly.
#[tokio::test]
async fn many_teams_over_replicas_and_writers_hold_every_cap() {
    const TEAMS: usize = 6;
    const K: usize = 9;
    const CALLS: usize = 240;
    let db = Db::new(true).await;
    let extra =
        format!("[metering]\nledger_writers = 2\n[metering.default_limits]\nmax_requests = {K}\n");
    let toml = config_toml_with(&db.url(), FAST, FAST, &extra);
    let (a, b) = (
        TestApp::spawn_toml(&toml).await,
        TestApp::spawn_toml(&toml).await,
    );
    let mut calls = Vec::new();
    for i in 0..CALLS {
        let mut client = [&a, &b][i % 2].client.clone();
        let team = format!("team-{}", (i / 2) % TEAMS);
        calls.push(tokio::spawn(async move {
            let mut request = classify("Is the offer still valid?");
            if let Some(c) = request.context.as_mut() {
                c.team_id = team.clone();
            }
            (team, client.classify_sms(request).await)
        }));
    }
    let mut ok = std::collections::BTreeMap::<String, usize>::new();
    for call in calls {
        let (team, result) = call.await.unwrap();
        match result {
            Ok(_) => *ok.entry(team).or_default() += 1,
            Err(status) => assert_eq!(
                status.get_details_error_info().map(|i| i.reason),
                Some("QUOTA_EXCEEDED".to_owned()),
                "{status:?}"
            ),
        }
    }
    let store = db.store().await;
    for t in 0..TEAMS {
        let team = format!("team-{t}");
        assert_eq!(ok.get(&team), Some(&K), "{team}: {ok:?}");
        let bal = ledger::balance_of(&store, &Bucket::team_month(&team, month_now()))
            .await
            .unwrap();
        assert_eq!((bal.spent_requests, bal.reserved_requests), (K as i64, 0));
    }
    store.close().await;
    a.stop().await;
    b.stop().await;
    db.cleanup().await;
}

async fn token_and_cost_caps_hold(postgres: bool) {
    let db = Db::new(postgres).await;
    let app = TestApp::spawn_toml(&config_toml_with(&db.url(), FAST, FAST, "")).await;
    let store = db.store().await;
    // A per-team override set like the CLI does: a token cap a few calls wide.
    ledger::set_caps(
        &store,
        "t1",
        "",
        Caps {
            tokens: Some(2_000),
            requests: None,
            cost_micros: None,
        }
        .into(),
        0,
    )
    .await
    .unwrap();
    let (ok, refused) = {
        let mut calls = Vec::new();
        for _ in 0..40 {
            let mut c = app.client.clone();
            calls.push(tokio::spawn(async move {
                c.classify_sms(classify("How much is it?")).await
            }));
        }
        let mut counts = (0, 0);
        for call in calls {
            match call.await.unwrap() {
                Ok(_) => counts.0 += 1,
                Err(s) => {
                    assert_eq!(
                        s.get_details_quota_failure().unwrap().violations[0].subject,
                        "team:t1/month/tokens"
                    );
                    counts.1 += 1;
                }
            }
        }
        counts
    };
    assert!(
        ok >= 1 && refused >= 1,
        "cap must admit some and refuse some: {ok} ok, {refused} refused"
    );
    let b = ledger::balance_of(&store, &Bucket::team_month("t1", month_now()))
        .await
        .unwrap();
    assert!(
        b.spent_tokens <= 2_000,
        "settled tokens {} exceed the cap",
        b.spent_tokens
    );
    assert_eq!(b.reserved_tokens, 0);

    // GetUsage reports the override and what remains of it.
    let usage = app
        .client
        .clone()
        .get_usage(pb::GetUsageRequest {
            team_id: "t1".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(usage.limits.unwrap().max_tokens, Some(2_000));
    assert_eq!(
        usage.remaining.unwrap().max_tokens,
        Some(2_000 - b.spent_tokens as u64)
    );
    store.close().await;
    app.stop().await;
    db.cleanup().await;
}

#[tokio::test]
async fn token_caps_hold_and_are_reported_sqlite() {
    token_and_cost_caps_hold(false).await;
}

#[tokio::test]
async fn token_caps_hold_and_are_reported_postgres() {
    token_and_cost_caps_hold(true).await;
}

async fn month_rollover(postgres: bool) {
    let db = Db::new(postgres).await;
    let store = db.store().await;
    let caps = Caps {
        requests: Some(1),
        ..Caps::default()
    };
    let reserve = |id: &str, month: i64| {
        Op::Reserve(Reserve {
            id: id.into(),
            team_id: "t9".into(),
            month_start_ms: month,
            day_start_ms: month,
            input_tokens: 10,
            output_tokens: 10,
            requests: 1,
            cost_micros: 5,
            default_caps: caps.into(),
            task: "sms_classify".into(),
            user_id: String::new(),
            trace_id: id.into(),
            channel: "sms".into(),
            priority: "interactive".into(),
            created_at_ms: month,
            admitted: false,
        })
    };
    let nov = summary::month_of(
        chrono::DateTime::parse_from_rfc3339("2026-11-30T23:59:59Z")
            .unwrap()
            .into(),
    )
    .0;
    let dec = summary::month_of(
        chrono::DateTime::parse_from_rfc3339("2026-12-01T00:00:00Z")
            .unwrap()
            .into(),
    )
    .0;
    assert!(dec > nov);
    let done = ledger::apply(
        &store,
        &[reserve("a", nov), reserve("b", nov), reserve("c", dec)],
    )
    .await
    .unwrap();
    assert_eq!(done[0], Done::Admitted);
    assert!(
        matches!(&done[1], Done::Refused(r) if r.remaining() == 0),
        "November is full: {:?}",
        done[1]
    );
    assert_eq!(done[2], Done::Admitted, "December starts from zero");
    store.close().await;
    db.cleanup().await;
}

/// PostgreSQL admits every reservation in SQL, against the shared ledger:
/// a reservation claiming to be admitted in memory (only a SQLite file's
/// writer does that) is guarded like any other, never written unchecked.
#[tokio::test]
async fn postgres_guards_a_reservation_that_claims_it_was_admitted() {
    let db = Db::new(true).await;
    let store = db.store().await;
    let over = |id: &str| {
        Op::Reserve(Reserve {
            id: id.into(),
            team_id: "t8".into(),
            requests: 1,
            default_caps: Caps {
                requests: Some(1),
                ..Caps::default()
            }
            .into(),
            admitted: true,
            ..Reserve::default()
        })
    };
    let done = ledger::apply(&store, &[over("a"), over("b")])
        .await
        .unwrap();
    assert_eq!(done[0], Done::Admitted);
    assert!(matches!(done[1], Done::Refused(_)), "{:?}", done[1]);
    store.close().await;
    db.cleanup().await;
}

#[tokio::test]
async fn caps_reset_at_the_utc_month_boundary_sqlite() {
    month_rollover(false).await;
}

#[tokio::test]
async fn caps_reset_at_the_utc_month_boundary_postgres() {
    month_rollover(true).await;
}

/// The two backends apply a batch alike (one plan, `usage::ledger`): the
/// SQLite writer's own connection and a PostgreSQL transaction give the
/// same admissions and refusals (a team's group that fits, one that does
/// not and is admitted one by one, a first-time team), the same
/// settlement, the same balances.
#[tokio::test]
async fn both_backends_apply_a_batch_alike() {
    let caps = Caps {
        requests: Some(3),
        tokens: Some(1_000),
        ..Caps::default()
    };
    let reserve = |id: &str, team: &str, tokens: i64| {
        Op::Reserve(Reserve {
            id: id.into(),
            team_id: team.into(),
            month_start_ms: 0,
            day_start_ms: 0,
            input_tokens: tokens,
            output_tokens: 0,
            requests: 1,
            cost_micros: 7,
            default_caps: caps.into(),
            task: "meeting_brief".into(),
            user_id: "u".into(),
            trace_id: id.into(),
            channel: "api".into(),
            priority: "interactive".into(),
            created_at_ms: 0,
            admitted: false,
        })
    };
    let first = vec![
        reserve("a1", "ta", 100),
        reserve("b1", "tb", 400),
        reserve("a2", "ta", 100),
        reserve("b2", "tb", 700),
        reserve("b3", "tb", 500),
    ];
    let settle = Op::Settle(ledger::Settle {
        reservations: vec![
            ledger::Reservation {
                id: "a1".into(),
                amount: Amount::new(100, 1, 7),
            },
            ledger::Reservation {
                id: "swept".into(),
                amount: Amount::new(5, 1, 1),
            },
        ],
        charge: true,
        recorded: true,
        record: record::UsageRecord {
            team_id: "ta".into(),
            task: "meeting_brief".into(),
            trace_id: "a1".into(),
            input_tokens: 30,
            output_tokens: 20,
            cost_micros: Some(3),
            outcome: "ok".into(),
            attempts: "[]".into(),
            ..record::UsageRecord::default()
        },
        month_start_ms: 0,
        day_start_ms: 0,
        user_id: String::new(),
        prompt_owner: None,
        audit: Vec::new(),
        outbox: Vec::new(),
        triggers: None,
    });
    let second = vec![reserve("a3", "ta", 100), settle, reserve("a4", "ta", 100)];

    let mut outcomes = Vec::new();
    for postgres in [true, false] {
        let db = Db::new(postgres).await;
        let store = db.store().await;
        let mut conn = (!postgres).then(|| {
            let path = ledger::sqlite::file_of(&db.url()).unwrap();
            ledger::sqlite::open(&path, &DatabaseConfig::default()).unwrap()
        });
        let mut done = Vec::new();
        for batch in [&first, &second] {
            done.push(match conn.as_mut() {
                Some(conn) => ledger::sqlite::apply(conn, batch).unwrap(),
                None => ledger::apply(&store, batch).await.unwrap(),
            });
        }
        let balances = (
            ledger::balance_of(&store, &Bucket::team_month("ta", 0))
                .await
                .unwrap(),
            ledger::balance_of(&store, &Bucket::team_month("tb", 0))
                .await
                .unwrap(),
        );
        let records = record::by_trace(&store, "a1").await.unwrap();
        outcomes.push((
            done,
            balances,
            records,
            sweeper::open_reservations(&store).await.unwrap(),
        ));
        store.close().await;
        db.cleanup().await;
    }
    let (done, (ta, tb), records, open) = &outcomes[0];
    // ta: both fit together; tb: 400 + 700 > 1000 tokens, so one by one:
    // b1 fits, b2 does not, b3 does (900).
    assert_eq!(done[0][0], Done::Admitted);
    assert_eq!(done[0][2], Done::Admitted);
    assert_eq!(done[0][1], Done::Admitted);
    assert!(matches!(&done[0][3], Done::Refused(r) if r.limit == 1_000 && r.used == 400));
    assert_eq!(done[0][4], Done::Admitted);
    // Second batch: a1 settles (a request spent, its reservation released;
    // "swept" was already gone), a3 is ta's third request, a4 its fourth.
    assert_eq!(done[1][1], Done::Settled);
    assert_eq!(done[1][0], Done::Admitted);
    assert!(matches!(&done[1][2], Done::Refused(r) if r.limit == 3 && r.used == 3));
    assert_eq!(
        (ta.spent_tokens, ta.spent_requests, ta.spent_cost_micros),
        (50, 1, 3)
    );
    assert_eq!((ta.reserved_tokens, ta.reserved_requests), (200, 2));
    assert_eq!((tb.reserved_tokens, tb.reserved_requests), (900, 2));
    assert_eq!(records.len(), 1);
    assert_eq!(*open, 4, "a2, a3, b1, b3 are still open");
    assert_eq!(outcomes[0], outcomes[1], "both backends agree");
}

async fn cancelled_call_settles(postgres: bool) {
    let db = Db::new(postgres).await;
    let slow = "latency = \"3s\"";
    let app = TestApp::spawn_toml(&config_toml_with(&db.url(), slow, slow, "")).await;
    let store = db.store().await;
    let mut client = app.client.clone();
    let mut request = tonic::Request::new(classify("Can you call me back?"));
    request
        .metadata_mut()
        .insert("x-trace-id", "cancel-me".parse().unwrap());
    let call = tokio::spawn(async move { client.classify_sms(request).await });

    // Wait until the reservation exists, then walk away (client cancel).
    wait_for(|| async { sweeper::open_reservations(&store).await.unwrap() == 1 }).await;
    call.abort();

    wait_for(|| async { sweeper::open_reservations(&store).await.unwrap() == 0 }).await;
    let records = record::by_trace(&store, "cancel-me").await.unwrap();
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].outcome, "CANCELLED");
    assert!(records[0].input_tokens > 0, "charged at the estimate");
    let b = ledger::balance_of(&store, &Bucket::team_month("t1", month_now()))
        .await
        .unwrap();
    assert_eq!((b.reserved_requests, b.spent_requests), (0, 1));
    store.close().await;
    app.stop().await;
    db.cleanup().await;
}

#[tokio::test]
async fn cancelled_call_settles_sqlite() {
    cancelled_call_settles(false).await;
}

#[tokio::test]
async fn cancelled_call_settles_postgres() {
    cancelled_call_settles(true).await;
}

async fn records_match_responses(postgres: bool) {
    let db = Db::new(postgres).await;
    // Primary always fails: every served call is degraded with a failed attempt.
    let app =
        TestApp::spawn_toml(&config_toml_with(&db.url(), "failure_rate = 1.0", FAST, "")).await;
    let store = db.store().await;
    let mut c = app.client.clone();
    let (mut tokens_in, mut tokens_out, mut cost) = (0, 0, 0.0);
    for message in ["When are you open?", "Yes!", "Maybe later", "STOP"] {
        let meta = c
            .classify_sms(classify(message))
            .await
            .unwrap()
            .into_inner()
            .meta
            .unwrap();
        let u = meta.usage.unwrap();
        tokens_in += u.input_tokens;
        tokens_out += u.output_tokens;
        cost += u.cost_usd;
        let records = record::by_trace(&store, &meta.trace_id).await.unwrap();
        assert_eq!(records.len(), 1, "one record per call");
        assert_eq!(records[0].input_tokens as u64, u.input_tokens);
        if message == "STOP" {
            assert_eq!(
                (records[0].input_tokens, records[0].cost_micros),
                (0, Some(0))
            );
        } else {
            assert!(records[0].degraded);
            let attempts: Vec<serde_json::Value> =
                serde_json::from_str(&records[0].attempts).unwrap();
            // The primary failed (or, once its breaker opened, was skipped);
            // the fallback served.
            assert!(attempts.len() >= 2, "{attempts:?}");
            assert!(
                ["HTTP_503", "CIRCUIT_OPEN"].contains(&attempts[0]["error_code"].as_str().unwrap()),
                "{attempts:?}"
            );
            assert_eq!(attempts.last().unwrap()["outcome"], "Success");
        }
    }
    let usage = c
        .get_usage(pb::GetUsageRequest {
            team_id: "t1".into(),
            group_by: vec![pb::UsageDimension::Model as i32],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let t = usage.totals.unwrap();
    assert_eq!(
        (t.requests, t.input_tokens, t.output_tokens, t.degraded),
        (4, tokens_in, tokens_out, 3)
    );
    assert!(
        (t.cost_usd - cost).abs() < 1e-9,
        "GetUsage {} vs responses {cost}",
        t.cost_usd
    );
    let bucket_sum: u64 = usage
        .buckets
        .iter()
        .map(|b| b.totals.as_ref().unwrap().requests)
        .sum();
    assert_eq!(bucket_sum, 4);
    // The ledger charged exactly what the records say.
    let b = ledger::balance_of(&store, &Bucket::team_month("t1", month_now()))
        .await
        .unwrap();
    assert_eq!(b.spent_tokens as u64, tokens_in + tokens_out);
    assert_eq!(
        b.spent_requests, 3,
        "the keyword answer is recorded but not counted against caps"
    );

    // Every provider down: the failure is recorded with its attempts.
    drop(c);
    app.stop().await;
    let down = TestApp::spawn_toml(&config_toml_with(
        &db.url(),
        "failure_rate = 1.0",
        "failure_rate = 1.0",
        "",
    ))
    .await;
    let mut request = tonic::Request::new(classify("hello?"));
    request
        .metadata_mut()
        .insert("x-trace-id", "all-down".parse().unwrap());
    let status = down.client.clone().classify_sms(request).await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable);
    let records = record::by_trace(&store, "all-down").await.unwrap();
    assert_eq!(records[0].outcome, "ALL_PROVIDERS_FAILED");
    let attempts: Vec<serde_json::Value> = serde_json::from_str(&records[0].attempts).unwrap();
    assert!(attempts.len() >= 2, "{attempts:?}");
    assert!(attempts.iter().all(|a| a["outcome"] != "Success"));
    store.close().await;
    down.stop().await;
    db.cleanup().await;
}

#[tokio::test]
async fn records_match_responses_and_get_usage_sqlite() {
    records_match_responses(false).await;
}

#[tokio::test]
async fn records_match_responses_and_get_usage_postgres() {
    records_match_responses(true).await;
}

#[tokio::test]
async fn budget_below_the_estimate_is_refused_before_any_call() {
    use wiremock::{Mock, MockServer, matchers::method};
    let (primary, fallback) = (MockServer::start().await, MockServer::start().await);
    for upstream in [&primary, &fallback] {
        Mock::given(method("POST"))
            .respond_with(crate::routing::classification())
            .mount(upstream)
            .await;
    }
    let app = crate::routing::spawn_at(&primary.uri(), &fallback.uri(), "").await;
    let status = app
        .client
        .clone()
        .classify_sms(pb::ClassifySmsRequest {
            context: ctx(),
            budget: Some(pb::Budget {
                max_latency_ms: 0,
                // Below a micro-dollar: printed as sent, not as 0.000000.
                max_cost_usd: 0.000_000_5,
            }),
            message: "What's the price?".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::FailedPrecondition);
    let info = status.get_details_error_info().unwrap();
    assert_eq!(info.reason, "BUDGET_EXCEEDED");
    assert_eq!(info.metadata["budget_usd"], "0.0000005");
    let estimate = &info.metadata["estimated_cost_usd"];
    assert!(estimate.parse::<f64>().unwrap() > 0.0, "{estimate}");
    let violation = &status.get_details_bad_request().unwrap().field_violations[0];
    assert_eq!(
        violation.description,
        format!("estimated cost {estimate} USD exceeds the budget 0.0000005 USD")
    );
    // Refused before any provider work: no upstream call, no record, no
    // reservation left.
    assert_eq!(
        (
            crate::routing::calls(&primary).await,
            crate::routing::calls(&fallback).await
        ),
        (0, 0)
    );
    let store = app.store().await;
    assert!(
        record::by_trace(&store, &info.metadata["trace_id"])
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(sweeper::open_reservations(&store).await.unwrap(), 0);
    store.close().await;
    app.stop().await;
}

/// A call with a trace ID, so its usage record can be read back.
fn traced<T>(body: T, trace_id: &str) -> tonic::Request<T> {
    let mut request = tonic::Request::new(body);
    request
        .metadata_mut()
        .insert("x-trace-id", trace_id.parse().unwrap());
    request
}
