//! GetUsage against the records and the ledger: period validation, unpriced
//! calls, errors and latency percentiles, limits of the period's month.

use super::{Db, FAST, classify, month_now, traced};
use crate::common::{TestApp, config_toml_with, ctx};
use ai_orchestrator::usage::bucket::Bucket;
use ai_orchestrator::{
    api::pb,
    usage::{
        UsageRecord,
        ledger::{self, Done, Op, Reserve, Settle},
        policy::Caps,
        record, summary,
    },
};
use tonic::Code;
use tonic_types::StatusExt;

fn usage_request(period: Option<(i64, i64)>) -> pb::GetUsageRequest {
    let ts = |ms: i64| prost_types::Timestamp {
        seconds: ms.div_euclid(1000),
        nanos: (ms.rem_euclid(1000) * 1_000_000) as i32,
    };
    pb::GetUsageRequest {
        team_id: "t1".into(),
        period_start: period.map(|p| ts(p.0)),
        period_end: period.map(|p| ts(p.1)),
        ..Default::default()
    }
}

#[tokio::test]
async fn get_usage_refuses_invalid_periods() {
    let app = TestApp::spawn().await;
    let mut c = app.client.clone();
    let at = |seconds: i64, nanos: i32| Some(prost_types::Timestamp { seconds, nanos });
    let cases = [
        // Would overflow `seconds * 1000`.
        (at(i64::MAX, 0), None, "period_start"),
        (None, at(i64::MIN, 0), "period_end"),
        // Outside what a Timestamp may hold.
        (at(253_402_300_800, 0), None, "period_start"),
        (at(0, -1), None, "period_start"),
        (at(0, 0), at(0, 1_000_000_000), "period_end"),
        // Empty or reversed period.
        (at(1_000, 0), at(999, 0), "period_end"),
        (at(1_000, 0), at(1_000, 0), "period_end"),
    ];
    for (start, end, field) in cases {
        let status = c
            .get_usage(pb::GetUsageRequest {
                team_id: "t1".into(),
                period_start: start,
                period_end: end,
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument, "{start:?}..{end:?}");
        assert_eq!(
            status.get_details_error_info().unwrap().reason,
            "INVALID_INPUT"
        );
        let bad = status.get_details_bad_request().unwrap();
        assert_eq!(bad.field_violations[0].field, field, "{start:?}..{end:?}");
    }
    // The widest valid period is answered.
    let widest = c
        .get_usage(pb::GetUsageRequest {
            team_id: "t1".into(),
            period_start: at(-62_135_596_800, 0),
            period_end: at(253_402_300_799, 999_999_999),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(widest.totals.unwrap().requests, 0);
    app.stop().await;
}

async fn unpriced_model_records_null_cost(postgres: bool) {
    let db = Db::new(postgres).await;
    let app = TestApp::spawn_toml(&config_toml_with(&db.url(), FAST, FAST, "")).await;
    let store = db.store().await;
    let mut c = app.client.clone();
    // research_verify's primary is `sonar`, priced "unknown" in the test config.
    let research = c
        .research(traced(
            pb::ResearchRequest {
                context: ctx(),
                query: "Is Acme hiring?".into(),
                ..Default::default()
            },
            "unpriced-1",
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(research.meta.unwrap().model, "sonar");
    c.classify_sms(traced(classify("Sounds good"), "priced-1"))
        .await
        .unwrap();

    let unpriced = record::by_trace(&store, "unpriced-1").await.unwrap();
    assert_eq!(unpriced.len(), 1);
    assert_eq!(unpriced[0].cost_micros, None, "unknown price: null cost");
    assert!(unpriced[0].input_tokens > 0);
    let priced = record::by_trace(&store, "priced-1").await.unwrap();
    let priced_cost = priced[0].cost_micros.unwrap();
    assert!(priced_cost > 0);

    let usage = c.get_usage(usage_request(None)).await.unwrap().into_inner();
    let t = usage.totals.unwrap();
    assert_eq!((t.requests, t.unpriced_requests), (2, 1));
    assert!((t.cost_usd - priced_cost as f64 / 1e6).abs() < 1e-12);
    // Unpriced calls do not count against cost caps.
    let b = ledger::balance_of(&store, &Bucket::team_month("t1", month_now()))
        .await
        .unwrap();
    assert_eq!((b.spent_cost_micros, b.spent_requests), (priced_cost, 2));
    store.close().await;
    app.stop().await;
    db.cleanup().await;
}

#[tokio::test]
async fn unpriced_model_records_null_cost_sqlite() {
    unpriced_model_records_null_cost(false).await;
}

#[tokio::test]
async fn unpriced_model_records_null_cost_postgres() {
    unpriced_model_records_null_cost(true).await;
}

/// Nearest-rank percentile, computed independently of the server's.
/// The nearest-rank percentile as GetUsage reports it: the floor of its
/// latency bucket (exact below 32 ms, ~3 % wide above; a loaded host
/// makes the failing calls slower than that).
fn nearest_rank(sorted: &[i64], p: usize) -> u32 {
    let rank = (p * sorted.len()).div_ceil(100).max(1);
    ai_orchestrator::usage::summary::latency_floor(sorted[rank - 1]) as u32
}

async fn latency_and_errors_match_records(postgres: bool) {
    let db = Db::new(postgres).await;
    // A task whose only provider is down, failing fast (no retries).
    let extra = r#"
[retry]
max_attempts = 1
[providers.down]
kind = "mock"
timeout = "5s"
[providers.down.mock]
failure_rate = 1.0
[tasks.broken]
chain = [{ provider = "down", model = "gpt-4o-mini" }]
"#;
    let app = TestApp::spawn_toml(&config_toml_with(
        &db.url(),
        "latency = \"2ms\"",
        FAST,
        extra,
    ))
    .await;
    let store = db.store().await;
    let mut c = app.client.clone();
    let mut traces = Vec::new();
    for i in 0..9 {
        let trace = format!("lat-{i}");
        c.classify_sms(traced(classify("Tell me more"), &trace))
            .await
            .unwrap();
        traces.push(trace);
    }
    for i in 0..2 {
        let trace = format!("err-{i}");
        let status = c
            .execute(traced(
                pb::ExecuteRequest {
                    context: ctx(),
                    task: "broken".into(),
                    ..Default::default()
                },
                &trace,
            ))
            .await
            .unwrap_err();
        assert_eq!(status.code(), Code::Unavailable);
        traces.push(trace);
    }

    let mut latencies = Vec::new();
    let mut errors = 0;
    for trace in &traces {
        let records = record::by_trace(&store, trace).await.unwrap();
        assert_eq!(records.len(), 1, "{trace}");
        latencies.push(records[0].latency_ms);
        errors += u64::from(records[0].outcome != "ok");
    }
    latencies.sort();
    assert_eq!(errors, 2);

    let usage = c
        .get_usage(pb::GetUsageRequest {
            group_by: vec![pb::UsageDimension::Task as i32],
            ..usage_request(None)
        })
        .await
        .unwrap()
        .into_inner();
    let t = usage.totals.unwrap();
    assert_eq!(
        (t.requests, t.errors, t.latency_p50_ms, t.latency_p95_ms),
        (
            11,
            errors,
            nearest_rank(&latencies, 50),
            nearest_rank(&latencies, 95)
        ),
        "latencies {latencies:?}"
    );
    let broken = usage.buckets.iter().find(|b| b.task == "broken").unwrap();
    assert_eq!(broken.totals.as_ref().unwrap().errors, 2);
    store.close().await;
    app.stop().await;
    db.cleanup().await;
}

#[tokio::test]
async fn get_usage_latency_and_errors_match_records_sqlite() {
    latency_and_errors_match_records(false).await;
}

#[tokio::test]
async fn get_usage_latency_and_errors_match_records_postgres() {
    latency_and_errors_match_records(true).await;
}

async fn get_usage_across_months(postgres: bool) {
    let db = Db::new(postgres).await;
    let app = TestApp::spawn_toml(&config_toml_with(&db.url(), FAST, FAST, "")).await;
    let store = db.store().await;
    let caps = Caps {
        requests: Some(10),
        ..Caps::default()
    };
    ledger::set_caps(&store, "t1", "", caps.into(), 0)
        .await
        .unwrap();
    // One call last month, reserved and settled like a real one.
    let (this_month, next_month) = summary::month_of(chrono::Utc::now());
    let last_month = summary::month_of_ms(this_month - 1).unwrap().0;
    let done = ledger::apply(
        &store,
        &[Op::Reserve(Reserve {
            id: "last-month".into(),
            team_id: "t1".into(),
            month_start_ms: last_month,
            day_start_ms: this_month - 86_400_000,
            input_tokens: 100,
            output_tokens: 100,
            requests: 1,
            cost_micros: 50,
            default_caps: Caps::default().into(),
            task: "sms_classify".into(),
            user_id: String::new(),
            trace_id: "last-month".into(),
            channel: "sms".into(),
            priority: "interactive".into(),
            created_at_ms: this_month - 60_000,
            admitted: false,
        })],
    )
    .await
    .unwrap();
    assert_eq!(done, [Done::Admitted]);
    ledger::apply(
        &store,
        &[Op::Settle(Settle {
            reservations: vec![ledger::Reservation {
                id: "last-month".into(),
                amount: ai_orchestrator::usage::Amount::new(200, 1, 50),
            }],
            charge: true,
            recorded: true,
            record: UsageRecord {
                created_at_ms: this_month - 60_000,
                team_id: "t1".into(),
                task: "sms_classify".into(),
                trace_id: "last-month".into(),
                input_tokens: 30,
                output_tokens: 12,
                cost_micros: Some(7),
                latency_ms: 40,
                outcome: "ok".into(),
                attempts: "[]".into(),
                ..UsageRecord::default()
            },
            month_start_ms: last_month,
            day_start_ms: 0,
            user_id: String::new(),
            prompt_owner: None,
            audit: Vec::new(),
            outbox: Vec::new(),
            triggers: None,
        })],
    )
    .await
    .unwrap();
    // Two calls this month through the server.
    let mut c = app.client.clone();
    for _ in 0..2 {
        c.classify_sms(classify("Any news?")).await.unwrap();
    }

    let now = c.get_usage(usage_request(None)).await.unwrap().into_inner();
    assert_eq!(
        now.totals.unwrap().requests,
        2,
        "last month's call is not in this month"
    );
    assert_eq!(now.limits.unwrap().max_requests, Some(10));
    assert_eq!(now.remaining.unwrap().max_requests, Some(8));

    let last = c
        .get_usage(usage_request(Some((last_month, this_month))))
        .await
        .unwrap()
        .into_inner();
    let t = last.totals.unwrap();
    assert_eq!((t.requests, t.input_tokens, t.output_tokens), (1, 30, 12));
    assert_eq!(last.limits.unwrap().max_requests, Some(10));
    assert_eq!(
        last.remaining.unwrap().max_requests,
        Some(9),
        "remaining describes the month the period starts in"
    );

    // A period starting next month: nothing used yet.
    let next = c
        .get_usage(usage_request(Some((next_month, next_month + 86_400_000))))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(next.totals.unwrap().requests, 0);
    assert_eq!(next.remaining.unwrap().max_requests, Some(10));
    store.close().await;
    app.stop().await;
    db.cleanup().await;
}

#[tokio::test]
async fn get_usage_limits_follow_the_period_month_sqlite() {
    get_usage_across_months(false).await;
}

#[tokio::test]
async fn get_usage_limits_follow_the_period_month_postgres() {
    get_usage_across_months(true).await;
}

/// A record of the rollup test: (at, task, input, output, cost, latency,
/// outcome).
type Row = (i64, &'static str, i64, i64, Option<i64>, i64, &'static str);

/// GetUsage reads whole days from the database's per-day rollups and the
/// partial days at a period's edges from the records: any period, aligned
/// to days or not, gives what the records themselves sum to, groups
/// included, and percentiles to the histogram's bucket.
async fn rollups_and_partial_days_agree_with_the_records(postgres: bool) {
    let db = Db::new(postgres).await;
    let app = TestApp::spawn_toml(&config_toml_with(&db.url(), FAST, FAST, "")).await;
    let store = db.store().await;
    const H: i64 = 3_600_000;
    const DAY: i64 = 24 * H;
    // 2026-10-05T00:00:00Z, a day in a past month.
    let d0 = 1_791_158_400_000_i64;
    assert_eq!(d0 % DAY, 0);
    let records: Vec<Row> = vec![
        (d0 + H, "sms_classify", 10, 1, Some(5), 10, "ok"),
        (d0 + 13 * H, "meeting_brief", 20, 2, Some(7), 40, "ok"),
        (
            d0 + DAY + 2 * H,
            "sms_classify",
            30,
            3,
            None,
            150,
            "ALL_PROVIDERS_FAILED",
        ),
        (
            d0 + DAY + 20 * H,
            "meeting_brief",
            40,
            4,
            Some(11),
            999,
            "ok",
        ),
        (
            d0 + 2 * DAY + 5 * H,
            "sms_classify",
            50,
            5,
            Some(13),
            2500,
            "ok",
        ),
        (
            d0 + 2 * DAY + 23 * H,
            "meeting_brief",
            60,
            6,
            Some(17),
            31,
            "ok",
        ),
    ];
    let ops: Vec<Op> = records
        .iter()
        .enumerate()
        .map(|(i, (at, task, input, output, cost, latency, outcome))| {
            Op::Settle(Settle {
                reservations: Vec::new(),
                charge: false,
                recorded: true,
                record: UsageRecord {
                    created_at_ms: *at,
                    team_id: "t1".into(),
                    task: (*task).into(),
                    provider: "primary".into(),
                    model: "gpt-4o-mini".into(),
                    trace_id: format!("rollup-{i}"),
                    input_tokens: *input,
                    output_tokens: *output,
                    cost_micros: *cost,
                    latency_ms: *latency,
                    outcome: (*outcome).into(),
                    attempts: "[]".into(),
                    ..UsageRecord::default()
                },
                month_start_ms: summary::month_of_ms(*at).unwrap().0,
                day_start_ms: 0,
                user_id: String::new(),
                prompt_owner: None,
                audit: Vec::new(),
                outbox: Vec::new(),
                triggers: None,
            })
        })
        .collect();
    ledger::apply(&store, &ops).await.unwrap();

    let mut c = app.client.clone();
    for (from, to) in [
        (d0 + 12 * H, d0 + 2 * DAY + 6 * H), // partial, whole, partial
        (d0, d0 + 3 * DAY),                  // whole days only
        (d0 + DAY + H, d0 + DAY + 21 * H),   // inside one day
        (d0 - DAY, d0 + DAY + 3 * H),        // an empty whole day, then partial
    ] {
        let inside: Vec<_> = records.iter().filter(|r| r.0 >= from && r.0 < to).collect();
        let mut request = usage_request(Some((from, to)));
        request.group_by = vec![
            pb::UsageDimension::Task as i32,
            pb::UsageDimension::Day as i32,
        ];
        let got = c.get_usage(request).await.unwrap().into_inner();
        let t = got.totals.unwrap();
        let n = inside.len() as u64;
        assert_eq!(t.requests, n, "{from}..{to}");
        assert_eq!(
            t.input_tokens,
            inside.iter().map(|r| r.2 as u64).sum::<u64>()
        );
        assert_eq!(
            t.output_tokens,
            inside.iter().map(|r| r.3 as u64).sum::<u64>()
        );
        let cost: i64 = inside.iter().filter_map(|r| r.4).sum();
        assert!(
            (t.cost_usd - cost as f64 / 1e6).abs() < 1e-12,
            "{from}..{to}"
        );
        assert_eq!(
            t.errors,
            inside.iter().filter(|r| r.6 != "ok").count() as u64
        );
        let mut floors: Vec<i64> = inside.iter().map(|r| summary::latency_floor(r.5)).collect();
        floors.sort();
        let rank = |p: usize| {
            floors
                .get((p * floors.len()).div_ceil(100).max(1) - 1)
                .map_or(0, |v| *v as u32)
        };
        assert_eq!(
            (t.latency_p50_ms, t.latency_p95_ms),
            (rank(50), rank(95)),
            "{from}..{to}"
        );
        // Every (task, day) group sums its own records.
        let groups = got.buckets.len();
        let mut keys: Vec<(String, i64)> = inside
            .iter()
            .map(|r| (r.1.to_owned(), r.0.div_euclid(DAY)))
            .collect();
        keys.sort();
        keys.dedup();
        assert_eq!(groups, keys.len(), "{from}..{to}: {:?}", got.buckets);
        for b in &got.buckets {
            let totals = b.totals.as_ref().unwrap();
            let day = chrono::NaiveDate::parse_from_str(&b.day, "%Y-%m-%d").unwrap();
            let day_ms = day
                .and_hms_opt(0, 0, 0)
                .unwrap()
                .and_utc()
                .timestamp_millis();
            let mine = inside
                .iter()
                .filter(|r| r.1 == b.task && r.0.div_euclid(DAY) * DAY == day_ms)
                .count() as u64;
            assert_eq!(totals.requests, mine, "{b:?}");
        }
    }
    store.close().await;
    app.stop().await;
    db.cleanup().await;
}

#[tokio::test]
async fn rollups_and_partial_days_agree_with_the_records_sqlite() {
    rollups_and_partial_days_agree_with_the_records(false).await;
}

#[tokio::test]
async fn rollups_and_partial_days_agree_with_the_records_postgres() {
    rollups_and_partial_days_agree_with_the_records(true).await;
}
