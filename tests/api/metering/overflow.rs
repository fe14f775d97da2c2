//! Provider-reported usage can never overflow or corrupt the ledger: an
//! answer with absurd, negative or non-integer token counts is malformed
//! and falls back, charged only its plausible part; every amount stays
//! non-negative in Rust and in SQL (CHECK constraints); and one bad
//! operation fails alone, never the batch it shared. On SQLite and
//! PostgreSQL.

use super::{Db, month_now};
use crate::common::{TestApp, ctx};
use ai_orchestrator::usage::bucket::Bucket;
use ai_orchestrator::{
    api::pb,
    config::DatabaseConfig,
    usage::{
        UsageRecord,
        ledger::{self, Done, LedgerWriter, Op, Reservation, Reserve, Settle},
    },
};
use serde_json::json;
use std::time::Duration;
use tokio::sync::watch;
use wiremock::{Mock, MockServer, ResponseTemplate, matchers::method};

/// A Chat Completions answer claiming `usage`.
fn claiming(usage: serde_json::Value) -> ResponseTemplate {
    ResponseTemplate::new(200).set_body_json(json!({
        "id": "chatcmpl-9", "object": "chat.completion", "created": 1_732_000_000,
        "model": "gpt-4o-mini",
        "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant",
            "content": "{\"intent\":\"QUESTION\",\"confidence\":0.9,\"reason\":\"asks\"}"}}],
        "usage": usage
    }))
}

fn toml(db: &str, upstream: &str) -> String {
    format!(
        r#"
[database]
url = "{db}"
[providers.primary]
kind = "openai"
base_url = "{upstream}/v1"
# Every absurd answer must reach the parser: no breaker in the way.
breaker = {{ failure_threshold = 100 }}
[providers.spare]
kind = "mock"
[tasks.sms_classify]
chain = [{{ provider = "primary", model = "gpt-4o-mini" }}, {{ provider = "spare", model = "gpt-4o-mini" }}]
max_tokens = 512
[pricing."gpt-4o-mini"]
input_per_mtok = 0.15
output_per_mtok = 0.60
[retry]
max_attempts = 1
"#
    )
}

async fn absurd_usage_is_malformed_and_charged_its_plausible_part(postgres: bool) {
    let db = Db::new(postgres).await;
    let upstream = MockServer::start().await;
    let app = TestApp::spawn_toml(&toml(&db.url(), &upstream.uri())).await;
    let absurd = [
        json!({"prompt_tokens": u64::MAX, "completion_tokens": u64::MAX}),
        json!({"prompt_tokens": 12, "completion_tokens": 1_000_000_000_000_u64}),
        json!({"prompt_tokens": 9_223_372_036_854_775_807_u64, "completion_tokens": 3}),
        json!({"prompt_tokens": -1, "completion_tokens": 5}),
        json!({"prompt_tokens": 1e300, "completion_tokens": 5}),
        json!({"prompt_tokens": "NaN", "completion_tokens": 5}),
    ];
    for usage in &absurd {
        upstream.reset().await;
        Mock::given(method("POST"))
            .respond_with(claiming(usage.clone()))
            .mount(&upstream)
            .await;
        let answer = app
            .client
            .clone()
            .classify_sms(pb::ClassifySmsRequest {
                context: ctx(),
                message: "How much is it?".into(),
                ..Default::default()
            })
            .await
            .unwrap_or_else(|s| panic!("{usage}: {s:?}"))
            .into_inner();
        let meta = answer.meta.unwrap();
        assert_eq!(meta.provider, "spare", "{usage}: fell back");
        assert_eq!(
            meta.attempts[0].outcome,
            pb::AttemptOutcome::Malformed as i32,
            "{usage}"
        );
        let u = meta.usage.unwrap();
        // The plausible part at most: 2 x 512 + 1024 output tokens.
        assert!(u.output_tokens <= 2048 + 10_000, "{usage}: {u:?}");
        assert!(
            u.cost_usd.is_finite() && u.cost_usd >= 0.0 && u.cost_usd < 0.01,
            "{usage}: {u:?}"
        );
    }
    // The ledger and GetUsage stay sane: nothing negative, nothing wrapped.
    let store = db.store().await;
    let b = ledger::balance_of(&store, &Bucket::team_month("t1", month_now()))
        .await
        .unwrap();
    assert_eq!(b.spent_requests, absurd.len() as i64);
    assert!(b.spent_tokens > 0 && b.spent_tokens < 1_000_000, "{b:?}");
    assert!(
        b.spent_cost_micros >= 0 && b.spent_cost_micros < 10_000,
        "{b:?}"
    );
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
    let totals = usage.totals.unwrap();
    assert!(
        totals.cost_usd >= 0.0 && totals.cost_usd < 0.01,
        "{totals:?}"
    );
    assert_eq!(totals.requests, absurd.len() as u64);
    store.close().await;
    app.stop().await;
    db.cleanup().await;
}

#[tokio::test]
async fn absurd_provider_usage_is_charged_its_plausible_part_sqlite() {
    absurd_usage_is_malformed_and_charged_its_plausible_part(false).await;
}

#[tokio::test]
async fn absurd_provider_usage_is_charged_its_plausible_part_postgres() {
    absurd_usage_is_malformed_and_charged_its_plausible_part(true).await;
}

fn reserve(id: &str) -> Reserve {
    Reserve {
        id: id.into(),
        team_id: "t1".into(),
        month_start_ms: month_now(),
        input_tokens: 10,
        requests: 1,
        cost_micros: 2,
        task: "t".into(),
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

/// Operations no API path builds any more (the amounts are validated
/// first), submitted straight to the writer among good ones: the database
/// refuses them (a negative cost, a sum past i64) and only they fail.
async fn a_bad_operation_fails_alone(postgres: bool) {
    let db = Db::new(postgres).await;
    let store = db.store().await;
    let config = DatabaseConfig {
        url: db.url(),
        ..DatabaseConfig::default()
    };
    let (stop, stopped) = watch::channel(false);
    let (writer, _done) = LedgerWriter::spawn(
        store.clone(),
        &config,
        256,
        1,
        Duration::from_secs(3600),
        stopped,
    )
    .unwrap();
    let good: Vec<Reserve> = (0..20).map(|i| reserve(&format!("good-{i}"))).collect();
    let bad = [reserve("negative"), reserve("overflowing")];
    for r in good.iter().chain(&bad) {
        assert_eq!(
            writer.submit(Op::Reserve(r.clone())).await.unwrap(),
            Done::Admitted
        );
    }
    let mut settles: Vec<Op> = good.iter().map(|r| Op::Settle(settle(r, 7, 3))).collect();
    settles.insert(5, Op::Settle(settle(&bad[0], 7, -5)));
    settles.insert(15, Op::Settle(settle(&bad[1], i64::MAX, 3)));
    let results = futures::future::join_all(settles.into_iter().map(|op| writer.submit(op))).await;
    let failed: Vec<usize> = results
        .iter()
        .enumerate()
        .filter(|(_, r)| r.is_err())
        .map(|(i, _)| i)
        .collect();
    assert_eq!(failed, [5, 15], "{results:?}");
    // Exactly the good calls are charged and recorded.
    let b = ledger::balance_of(&store, &Bucket::team_month("t1", month_now()))
        .await
        .unwrap();
    assert_eq!(
        (b.spent_tokens, b.spent_requests, b.spent_cost_micros),
        (20 * 7, 20, 20 * 3)
    );
    assert!(
        b.reserved_tokens >= 0 && b.reserved_cost_micros >= 0,
        "{b:?}"
    );
    let _ = stop.send(true);
    store.close().await;
    db.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_operation_fails_alone_sqlite() {
    a_bad_operation_fails_alone(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_operation_fails_alone_postgres() {
    a_bad_operation_fails_alone(true).await;
}
