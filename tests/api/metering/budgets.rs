//! Budgets per user and per UTC day (SPEC §14.2): a user's daily cap holds
//! exactly under 200 concurrent calls, on SQLite and on two replicas sharing
//! PostgreSQL; refusals name the limit; a team's daily cap; `limits set
//! --user`; no user id, no user caps; an older database keeps its balances.

use super::{Db, FAST, caps::limits_cli, month_now};
use crate::common::{TestApp, config_toml_with};
use ai_orchestrator::{
    api::pb,
    store::Store,
    usage::{
        bucket::{Bucket, Period, day_of},
        ledger,
    },
};
use tonic::Code;
use tonic_types::StatusExt;

fn classify_as(user: &str, message: &str) -> pb::ClassifySmsRequest {
    pb::ClassifySmsRequest {
        context: Some(pb::RequestContext {
            team_id: "t1".into(),
            user_id: user.into(),
            ..Default::default()
        }),
        message: message.into(),
        ..Default::default()
    }
}

fn today() -> i64 {
    day_of(chrono::Utc::now().timestamp_millis())
}

fn bucket(user: &str, period: Period) -> Bucket {
    Bucket {
        team_id: "t1".into(),
        user_id: user.into(),
        period,
        start_ms: match period {
            Period::Month => month_now(),
            Period::Day => today(),
        },
    }
}

/// Fires `n` concurrent calls by `user` over `apps`: (served, refusal subjects).
async fn burst_as(apps: &[&TestApp], user: &str, n: usize) -> (usize, Vec<String>) {
    let mut calls = Vec::new();
    for i in 0..n {
        let mut client = apps[i % apps.len()].client.clone();
        let request = classify_as(user, "Is the offer still valid?");
        calls.push(tokio::spawn(
            async move { client.classify_sms(request).await },
        ));
    }
    let (mut ok, mut subjects) = (0, Vec::new());
    for call in calls {
        match call.await.unwrap() {
            Ok(_) => ok += 1,
            Err(status) => {
                assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
                let info = status.get_details_error_info().unwrap();
                assert_eq!(info.reason, "QUOTA_EXCEEDED");
                let quota = status.get_details_quota_failure().expect("QuotaFailure");
                subjects.push(quota.violations[0].subject.clone());
            }
        }
    }
    (ok, subjects)
}

async fn a_users_daily_cap_holds(postgres: bool, replicas: usize) {
    let db = Db::new(postgres).await;
    let extra = "[metering.user_limits]\nmax_requests_per_day = 10\n";
    let toml = config_toml_with(&db.url(), FAST, FAST, extra);
    let mut apps = Vec::new();
    for _ in 0..replicas {
        apps.push(TestApp::spawn_toml(&toml).await);
    }
    let refs: Vec<&TestApp> = apps.iter().collect();
    let (ok, subjects) = burst_as(&refs, "u1", 200).await;
    assert_eq!(ok, 10, "exactly the daily cap is served");
    assert_eq!(subjects.len(), 190);
    assert!(
        subjects.iter().all(|s| s == "user:u1/day/requests"),
        "{subjects:?}"
    );
    // The cap is the user's: another user of the team is still served.
    let (ok, _) = burst_as(&refs, "u2", 3).await;
    assert_eq!(ok, 3);

    let store = db.store().await;
    let day = ledger::balance_of(&store, &bucket("u1", Period::Day))
        .await
        .unwrap();
    assert_eq!((day.spent_requests, day.reserved_requests), (10, 0));
    let team_day = ledger::balance_of(&store, &bucket("", Period::Day))
        .await
        .unwrap();
    let team_month = ledger::balance_of(&store, &bucket("", Period::Month))
        .await
        .unwrap();
    assert_eq!(
        team_day.spent_requests, 13,
        "the team's day counts both users"
    );
    assert_eq!(team_month.spent(), team_day.spent());
    assert_eq!(
        ai_orchestrator::usage::sweeper::open_reservations(&store)
            .await
            .unwrap(),
        0
    );
    store.close().await;
    for app in apps {
        app.stop().await;
    }
    db.cleanup().await;
}

#[tokio::test]
async fn a_users_daily_cap_holds_for_200_concurrent_calls_sqlite() {
    a_users_daily_cap_holds(false, 1).await;
}

#[tokio::test]
async fn a_users_daily_cap_holds_over_two_replicas_sharing_postgres() {
    a_users_daily_cap_holds(true, 2).await;
}

/// A team's daily token cap refuses with `team:<id>/day/tokens`, whoever calls.
#[tokio::test]
async fn a_teams_daily_cap_names_its_limit() {
    let db = Db::new(false).await;
    let extra = "[metering.default_limits]\nmax_tokens_per_day = 1\n";
    let app = TestApp::spawn_toml(&config_toml_with(&db.url(), FAST, FAST, extra)).await;
    let mut c = app.client.clone();
    for user in ["", "u1"] {
        let status = c
            .classify_sms(classify_as(user, "Hello"))
            .await
            .unwrap_err();
        assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
        let quota = status.get_details_quota_failure().unwrap();
        assert_eq!(quota.violations[0].subject, "team:t1/day/tokens");
        let info = status.get_details_error_info().unwrap();
        assert_eq!(info.metadata["cap"], "daily_tokens");
        assert_eq!(info.metadata["limit"], "1");
    }
    app.stop().await;
    db.cleanup().await;
}

/// Without a user id no user cap applies: a zero user cap refuses only calls naming a user.
#[tokio::test]
async fn user_caps_apply_only_to_calls_naming_a_user() {
    let db = Db::new(true).await;
    let extra = "[metering.user_limits]\nmax_requests = 0\n";
    let app = TestApp::spawn_toml(&config_toml_with(&db.url(), FAST, FAST, extra)).await;
    let mut c = app.client.clone();
    c.classify_sms(classify_as("", "Hello")).await.unwrap();
    let status = c
        .classify_sms(classify_as("u1", "Hello"))
        .await
        .unwrap_err();
    let quota = status.get_details_quota_failure().unwrap();
    assert_eq!(quota.violations[0].subject, "user:u1/month/requests");
    let store = db.store().await;
    let refused = ledger::balance_of(&store, &bucket("u1", Period::Month))
        .await
        .unwrap();
    assert_eq!(
        refused.used(),
        Default::default(),
        "a refusal holds nothing"
    );
    store.close().await;
    app.stop().await;
    db.cleanup().await;
}

/// `limits set --user` overrides `[metering.user_limits]` for one user, the
/// server enforces it, `show` prints both periods, `clear` removes it.
#[tokio::test]
async fn limits_set_user_overrides_one_user() {
    let db = Db::new(false).await;
    let Db::Sqlite(dir) = &db else { unreachable!() };
    let extra = "[metering]\nlimits_refresh = \"100ms\"\n[metering.user_limits]\nmax_requests_per_day = 50\n";
    let toml = config_toml_with(&db.url(), FAST, FAST, extra);
    let config = dir.path().join("config.toml");
    std::fs::write(&config, &toml).unwrap();
    let set = limits_cli(
        &config,
        &["set", "--team", "t1", "--user", "u1", "--max-requests", "1"],
    )
    .await;
    assert!(set.starts_with("updated\n"), "{set}");
    assert!(set.contains("user u1 of team t1"), "{set}");
    assert!(
        set.contains("max_requests 1  (used 0 + reserved 0)"),
        "{set}"
    );
    assert!(set.contains("max_requests_per_day 50"), "kept: {set}");
    assert!(
        set.contains("kept as in force: max_requests_per_day"),
        "{set}"
    );

    let app = TestApp::spawn_toml(&toml).await;
    let mut c = app.client.clone();
    c.classify_sms(classify_as("u1", "One")).await.unwrap();
    let status = c.classify_sms(classify_as("u1", "Two")).await.unwrap_err();
    let quota = status.get_details_quota_failure().unwrap();
    assert_eq!(quota.violations[0].subject, "user:u1/month/requests");
    // Another user keeps the config's caps.
    c.classify_sms(classify_as("u2", "One")).await.unwrap();
    c.classify_sms(classify_as("u2", "Two")).await.unwrap();

    let show = limits_cli(&config, &["show", "--team", "t1", "--user", "u1"]).await;
    assert!(
        show.contains("max_requests 1  (used 1 + reserved 0)"),
        "{show}"
    );
    assert!(
        show.contains("max_requests_per_day 50  (used 1 + reserved 0)"),
        "{show}"
    );
    let cleared = limits_cli(&config, &["clear", "--team", "t1", "--user", "u1"]).await;
    assert_eq!(
        cleared,
        "user u1 of team t1: override removed, config defaults apply\n"
    );
    crate::common::wait_for(|| {
        let mut c = c.clone();
        async move { c.classify_sms(classify_as("u1", "Again")).await.is_ok() }
    })
    .await;
    app.stop().await;
    db.cleanup().await;
}

/// A database migrated before budgets keeps its teams' balances and caps:
/// the month rows become the teams' month buckets, an override keeps its
/// monthly caps (and has no daily ones), and a call in flight at the
/// upgrade holds its reservation in its new buckets too, and is swept from all.
#[tokio::test]
async fn an_older_database_keeps_its_balances_and_caps() {
    let dir = tempfile::tempdir().unwrap();
    let store = crate::common::sqlite_migrated_before(dir.path(), "0011").await;
    let Store::Sqlite(pool) = &store else {
        unreachable!("a sqlite: URL")
    };
    let month = month_now();
    for sql in [
        format!(
            "INSERT INTO usage_ledger (team_id, month_start_ms, spent_tokens, spent_requests, \
             reserved_requests) VALUES ('t1', {month}, 500, 4, 1)"
        ),
        "INSERT INTO tenant_limits (team_id, max_tokens, max_requests, max_cost_micros, \
         updated_at_ms) VALUES ('t1', 9000, 7, NULL, 0)"
            .to_owned(),
        format!(
            "INSERT INTO usage_reservations (id, team_id, month_start_ms, input_tokens, \
             output_tokens, requests, cost_micros, task, user_id, trace_id, channel, priority, \
             created_at_ms) VALUES ('r-1', 't1', {month}, 10, 20, 1, 30, 'sms_classify', '', \
             'in-flight', '', '', {month})"
        ),
    ] {
        sqlx::query(sqlx::AssertSqlSafe(sql))
            .execute(pool)
            .await
            .unwrap();
    }
    store.migrate().await.unwrap();

    let team_month = Bucket::team_month("t1", month);
    let b = ledger::balance_of(&store, &team_month).await.unwrap();
    assert_eq!(
        (b.spent_tokens, b.spent_requests, b.reserved_requests),
        (500, 4, 1)
    );
    let team_day = Bucket {
        period: Period::Day,
        ..team_month.clone()
    };
    let d = ledger::balance_of(&store, &team_day).await.unwrap();
    assert_eq!(
        (
            d.reserved_tokens,
            d.reserved_requests,
            d.reserved_cost_micros
        ),
        (30, 1, 30)
    );
    let caps = ledger::caps_of(&store, "t1", "", Default::default())
        .await
        .unwrap();
    assert_eq!(
        (caps.month.tokens, caps.month.requests),
        (Some(9000), Some(7))
    );
    assert_eq!(
        caps.day,
        Default::default(),
        "no daily caps on an old override"
    );

    // The in-flight call is swept out of every bucket: the migration put
    // its reservation in its day too.
    let swept = ai_orchestrator::usage::sweeper::sweep(&store, i64::MAX)
        .await
        .unwrap();
    assert_eq!(swept, 1);
    let b = ledger::balance_of(&store, &team_month).await.unwrap();
    assert_eq!(
        (b.spent_tokens, b.spent_requests, b.reserved_requests),
        (530, 5, 0)
    );
    store.close().await;
}

/// GetUsage grouped by user sums each user's records, calls naming no user under "".
#[tokio::test]
async fn get_usage_groups_by_user() {
    let db = Db::new(false).await;
    let app = TestApp::spawn_toml(&config_toml_with(&db.url(), FAST, FAST, "")).await;
    let mut c = app.client.clone();
    for user in ["u1", "u1", "u2", ""] {
        c.classify_sms(classify_as(user, "Hello")).await.unwrap();
    }
    let got = c
        .get_usage(pb::GetUsageRequest {
            team_id: "t1".into(),
            group_by: vec![
                pb::UsageDimension::User as i32,
                pb::UsageDimension::Task as i32,
            ],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(got.totals.unwrap().requests, 4);
    let mut per_user: Vec<(String, String, u64)> = got
        .buckets
        .iter()
        .map(|b| {
            let requests = b.totals.as_ref().map_or(0, |t| t.requests);
            (b.user_id.clone(), b.task.clone(), requests)
        })
        .collect();
    per_user.sort();
    let row = |u: &str, n| (u.to_owned(), "sms_classify".to_owned(), n);
    assert_eq!(per_user, [row("", 1), row("u1", 2), row("u2", 1)]);
    app.stop().await;
    db.cleanup().await;
}

/// Batches that span a month's end (a call admitted before it, topped up
/// after) lock a team's month rows in order: two writers, each settling in
/// one month and reserving in the other, never deadlock on PostgreSQL.
#[tokio::test]
async fn batches_spanning_a_month_end_never_deadlock() {
    use ai_orchestrator::usage::{
        Amount, UsageRecord,
        ledger::{Done, Op, Reservation, Reserve, Settle},
    };
    let db = Db::new(true).await;
    let store = db.store().await;
    let (old, new) = (1_000 * 86_400_000, 1_030 * 86_400_000);
    let reserve = |id: String, month: i64| Reserve {
        id,
        team_id: "t1".into(),
        user_id: "u1".into(),
        month_start_ms: month,
        day_start_ms: month,
        input_tokens: 5,
        requests: 1,
        ..Reserve::default()
    };
    let settle = |r: &Reserve| Settle {
        reservations: vec![Reservation::from(r)],
        charge: true,
        recorded: false,
        record: UsageRecord {
            team_id: "t1".into(),
            input_tokens: 5,
            ..UsageRecord::default()
        },
        month_start_ms: r.month_start_ms,
        day_start_ms: r.day_start_ms,
        user_id: r.user_id.clone(),
        prompt_owner: None,
        audit: Vec::new(),
        outbox: Vec::new(),
        triggers: None,
    };
    for round in 0..20 {
        let mut batches = Vec::new();
        for (settled, reserved) in [(old, new), (new, old)] {
            let earlier = reserve(format!("{round}-{settled}-a"), settled);
            let admitted = ledger::apply(&store, &[Op::Reserve(earlier.clone())])
                .await
                .unwrap();
            assert_eq!(admitted, [Done::Admitted]);
            let ops = vec![
                Op::Settle(settle(&earlier)),
                Op::Reserve(reserve(format!("{round}-{reserved}-b"), reserved)),
            ];
            batches.push(ops);
        }
        let (a, b) = (batches.remove(0), batches.remove(0));
        let (store_a, store_b) = (store.clone(), store.clone());
        let (a, b) = tokio::join!(
            tokio::spawn(async move { ledger::apply(&store_a, &a).await }),
            tokio::spawn(async move { ledger::apply(&store_b, &b).await }),
        );
        assert_eq!(a.unwrap().expect("no deadlock")[1], Done::Admitted);
        assert_eq!(b.unwrap().expect("no deadlock")[1], Done::Admitted);
    }
    let month = ledger::balance_of(&store, &Bucket::team_month("t1", old))
        .await
        .unwrap();
    assert_eq!(month.spent(), Amount::new(100, 20, 0));
    store.close().await;
    db.cleanup().await;
}
