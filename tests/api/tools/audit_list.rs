//! `ListAuditEvents` (SPEC §10) filters and paging, and `audit verify`
//! without `--team` over a database holding several teams' chains. Events
//! come from real tool calls with distinct trace IDs; time windows are cut
//! at the times the server itself reported, never at wall-clock guesses.

use super::{
    ADMIN, CALLER, MULTI, WEBHOOK_SECRET, audit, events, invoke, spawn, tools, verify,
    webhook::Webhook, with_key,
};
use crate::{cli::run_env, common::TestApp};
use ai_orchestrator::{api::pb, store::Store};
use serde_json::json;
use tonic::{Code, Status};
use tonic_types::StatusExt;

type Req = pb::ListAuditEventsRequest;

/// A request for team t1's chain, as `edit` sets it.
fn t1(edit: impl FnOnce(&mut Req)) -> Req {
    let mut req = Req {
        team_id: "t1".into(),
        ..Default::default()
    };
    edit(&mut req);
    req
}

/// One `ListAuditEvents` call as the admin key.
async fn list(app: &TestApp, req: Req) -> Result<pb::ListAuditEventsResponse, Status> {
    audit(app)
        .list_audit_events(with_key(ADMIN, "audit-list", req))
        .await
        .map(tonic::Response::into_inner)
}

/// A page that must be served.
async fn page(app: &TestApp, req: Req) -> pb::ListAuditEventsResponse {
    list(app, req).await.expect("ListAuditEvents")
}

/// Every page of `req`, following its tokens: the events in the order
/// served, and each page's size.
async fn walk(app: &TestApp, mut req: Req) -> (Vec<pb::AuditEvent>, Vec<usize>) {
    let (mut all, mut sizes) = (Vec::new(), Vec::new());
    // Bounded, so a token that never empties fails instead of hanging.
    for _ in 0..50 {
        let p = page(app, req.clone()).await;
        sizes.push(p.events.len());
        all.extend(p.events);
        if p.next_page_token.is_empty() {
            return (all, sizes);
        }
        req.page_token = p.next_page_token;
    }
    panic!("no last page after 50 pages: {sizes:?}");
}

/// `system.echo` for `team` as `key`, traced as `trace`: a `tool.call` and
/// a `tool.result` event, durable before the reply.
async fn echo(app: &TestApp, key: &str, team: &str, trace: &str) {
    let mut req = invoke("system.echo", json!({"text": trace}));
    req.context = Some(pb::RequestContext {
        team_id: team.into(),
        ..Default::default()
    });
    let reply = tools(app).invoke_tool(with_key(key, trace, req)).await;
    reply.unwrap_or_else(|e| panic!("{trace}: {e:?}"));
}

fn ids(events: &[pb::AuditEvent]) -> Vec<String> {
    events.iter().map(|e| e.id.clone()).collect()
}

/// An event's time, unix ms (the stored precision).
fn ms(e: &pb::AuditEvent) -> i64 {
    let t = e.time.as_ref().expect("an event has a time");
    t.seconds * 1000 + i64::from(t.nanos / 1_000_000)
}

/// The ids of `all` timed in `[from, to)` ms: what a window must select.
fn within(all: &[pb::AuditEvent], from: i64, to: i64) -> Vec<String> {
    let inside = all.iter().filter(|e| (from..to).contains(&ms(e)));
    inside.map(|e| e.id.clone()).collect()
}

/// The ids of t1's events from `since`'s time (inclusive) to `until`'s.
async fn window(
    app: &TestApp,
    since: Option<&pb::AuditEvent>,
    until: Option<&pb::AuditEvent>,
) -> Vec<String> {
    let req = t1(|r| {
        r.since = since.and_then(|e| e.time);
        r.until = until.and_then(|e| e.time);
    });
    ids(&walk(app, req).await.0)
}

/// Asserts `req` is refused as INVALID_ARGUMENT, with the stable reason
/// and `field` named.
async fn refused(app: &TestApp, req: Req, field: &str) {
    let err = list(app, req).await.expect_err("refused");
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    let info = err.get_details_error_info().expect("ErrorInfo");
    assert_eq!(info.reason, "INVALID_INPUT", "{err:?}");
    let bad = err.get_details_bad_request().expect("BadRequest");
    assert_eq!(bad.field_violations[0].field, field, "{bad:?}");
}

async fn exec(store: &Store, sql: &str) {
    let sql = sqlx::AssertSqlSafe(sql.to_owned());
    match store {
        Store::Sqlite(pool) => sqlx::raw_sql(sql).execute(pool).await.map(drop),
        Store::Postgres(pool) => sqlx::raw_sql(sql).execute(pool).await.map(drop),
    }
    .unwrap_or_else(|e| panic!("{e}"));
}

#[tokio::test]
async fn the_trace_filter_returns_only_that_traces_events_of_the_team() {
    let hook = Webhook::start().await;
    let app = spawn(&hook.url(), "").await;
    for trace in ["list-a", "list-b", "list-a"] {
        echo(&app, CALLER, "t1", trace).await;
    }
    // The same trace in another team's chain must not leak into t1's.
    echo(&app, MULTI, "t2", "list-a").await;
    let all = events(&app, "t1").await;
    assert_eq!(all.len(), 6, "a call and a result per invocation");

    let a = page(&app, t1(|r| r.trace_id = "list-a".into())).await;
    let expected = all.iter().filter(|e| e.trace_id == "list-a");
    assert_eq!(
        ids(&a.events),
        expected.map(|e| e.id.clone()).collect::<Vec<_>>()
    );
    let seen: Vec<(&str, &str, &str)> = a
        .events
        .iter()
        .map(|e| (e.trace_id.as_str(), e.team_id.as_str(), e.action.as_str()))
        .collect();
    let (call, result) = (
        ("list-a", "t1", "tool.call"),
        ("list-a", "t1", "tool.result"),
    );
    assert_eq!(seen, [call, result, call, result], "in chain order");
    assert!(a.next_page_token.is_empty(), "a short page is the last");
    let t2 = events(&app, "t2").await;
    assert_eq!(t2.len(), 2);
    assert!(
        t2.iter()
            .all(|e| e.trace_id == "list-a" && e.team_id == "t2")
    );

    let b = page(&app, t1(|r| r.trace_id = "list-b".into())).await;
    assert_eq!(ids(&b.events), ids(&all[2..4]));
    let none = page(&app, t1(|r| r.trace_id = "no-such-trace".into())).await;
    assert!(none.events.is_empty() && none.next_page_token.is_empty());
    app.stop().await;
}

#[tokio::test]
async fn since_is_inclusive_and_until_exclusive_at_the_listed_times() {
    let hook = Webhook::start().await;
    let app = spawn(&hook.url(), "").await;
    // A cut needs events before, at and after it: three instants. Every
    // reply waits for a durable write, so a few calls do; call until so.
    let mut all = Vec::new();
    for i in 0..50 {
        echo(&app, CALLER, "t1", &format!("window-{i}")).await;
        all = events(&app, "t1").await;
        let mut times: Vec<i64> = all.iter().map(ms).collect();
        times.sort_unstable();
        times.dedup();
        if times.len() >= 3 {
            break;
        }
    }
    let (first, last) = (&all[0], &all[all.len() - 1]);
    // Cut at the first event later than the first one: an event's own time.
    let cut = all.iter().find(|e| ms(e) > ms(first)).unwrap();
    assert!(ms(cut) < ms(last), "the events span three instants");

    let from_cut = window(&app, Some(cut), None).await;
    assert_eq!(from_cut, within(&all, ms(cut), i64::MAX));
    assert!(from_cut.contains(&cut.id), "since is inclusive");
    assert!(!from_cut.contains(&first.id));
    let before_cut = window(&app, None, Some(cut)).await;
    assert_eq!(before_cut, within(&all, i64::MIN, ms(cut)));
    assert!(!before_cut.contains(&cut.id), "until is exclusive");
    assert!(before_cut.contains(&first.id));
    // The two halves split the chain: nothing in both, nothing in neither.
    assert_eq!([before_cut, from_cut].concat(), ids(&all));

    let both = window(&app, Some(cut), Some(last)).await;
    assert_eq!(both, within(&all, ms(cut), ms(last)));
    assert!(both.contains(&cut.id) && !both.contains(&last.id));

    // The code does not refuse a window that ends before it starts (nor an
    // empty one): it selects nothing.
    for (since, until) in [(last, first), (cut, cut)] {
        let p = page(&app, t1(|r| (r.since, r.until) = (since.time, until.time))).await;
        assert!(p.events.is_empty() && p.next_page_token.is_empty());
    }
    app.stop().await;
}

#[tokio::test]
async fn pages_of_two_walk_the_chain_in_order_without_gap_or_duplicate() {
    let hook = Webhook::start().await;
    let app = spawn(&hook.url(), "").await;
    echo(&app, CALLER, "t1", "page-1").await;
    echo(&app, CALLER, "t1", "page-2").await;
    // A denial is one event: five in all, so the last page of two is short.
    let denied = invoke("billing.refund", json!({}));
    let err = tools(&app)
        .invoke_tool(with_key(CALLER, "page-denied", denied))
        .await;
    assert_eq!(err.unwrap_err().code(), Code::PermissionDenied);
    let all = events(&app, "t1").await;
    assert_eq!(all.len(), 5);

    let paged = |size: u32, trace: &str| {
        t1(|r| {
            r.page_size = size;
            r.trace_id = trace.into();
        })
    };
    let (walked, sizes) = walk(&app, paged(2, "")).await;
    assert_eq!(sizes, [2, 2, 1]);
    assert_eq!(ids(&walked), ids(&all), "every event once, in chain order");
    let seqs: Vec<u64> = walked.iter().map(|e| e.seq).collect();
    assert_eq!(seqs, [1, 2, 3, 4, 5]);
    assert_eq!(walked[4].action, "tool.denied");

    // A full page that ends the chain carries no token: the last page is
    // the last, never followed by an empty one.
    let (walked, sizes) = walk(&app, paged(5, "")).await;
    assert_eq!((sizes, ids(&walked)), (vec![5], ids(&all)));
    // Tokens carry the filter along: one event per page of one trace.
    let (walked, sizes) = walk(&app, paged(1, "page-2")).await;
    assert_eq!(sizes, [1, 1]);
    assert_eq!(ids(&walked), ids(&all[2..4]));
    app.stop().await;
}

#[tokio::test]
async fn a_bad_page_token_or_timestamp_is_invalid_argument() {
    let hook = Webhook::start().await;
    let app = spawn(&hook.url(), "").await;
    echo(&app, CALLER, "t1", "bad-args").await;
    for token in ["not-a-token", "-1", "1.5"] {
        refused(&app, t1(|r| r.page_token = token.into()), "page_token").await;
    }
    let bad_time = Some(prost_types::Timestamp {
        seconds: 0,
        nanos: -1,
    });
    refused(&app, t1(|r| r.since = bad_time), "since").await;
    refused(&app, t1(|r| r.until = bad_time), "until").await;
    // A well-formed token past the chain's end is simply the last page.
    let past = page(&app, t1(|r| r.page_token = "999".into())).await;
    assert!(past.events.is_empty() && past.next_page_token.is_empty());
    assert_eq!(page(&app, t1(|_| ())).await.events.len(), 2, "still listed");
    app.stop().await;
}

/// Page size 0 is the default (100) and a larger one is capped at 1000:
/// both need more than 1000 events. Listing does not check hashes, so the
/// chain is lengthened with copies of a real event in SQL rather than
/// with hundreds of tool calls.
#[tokio::test]
async fn page_size_zero_is_the_default_and_a_large_one_is_capped() {
    let hook = Webhook::start().await;
    let app = spawn(&hook.url(), "").await;
    echo(&app, CALLER, "t1", "sizes").await;
    let columns = ai_orchestrator::audit::store::sql::COLUMNS;
    // The same columns, read from event 2 with a new id and seq 2 + i.
    let copied = columns
        .replacen("id, ", "id || '-' || i, ", 1)
        .replace("seq, ", "seq + i, ");
    exec(
        &app.store().await,
        &format!(
            "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 1100) \
         INSERT INTO audit_events ({columns}) SELECT {copied} FROM audit_events, n \
         WHERE team_id = 't1' AND seq = 2"
        ),
    )
    .await;
    let all = events(&app, "t1").await;
    assert_eq!(all.len(), 1102);
    assert_eq!(all.iter().map(|e| e.seq).max(), Some(1102));

    let first = page(&app, t1(|_| ())).await;
    assert_eq!(ids(&first.events), ids(&all[..100]), "page_size 0: 100");
    assert!(!first.next_page_token.is_empty());
    for size in [1000, 1001, u32::MAX] {
        let (walked, sizes) = walk(&app, t1(|r| r.page_size = size)).await;
        assert_eq!(sizes, [1000, 102], "page_size {size}");
        assert_eq!(ids(&walked), ids(&all), "page_size {size}");
    }
    app.stop().await;
}

/// `audit verify` of the CLI on `config`, for every team: (success,
/// stdout + stderr).
async fn verify_every_team(config: &std::path::Path) -> (bool, String) {
    let args = ["--config", config.to_str().unwrap(), "audit", "verify"];
    let (ok, out, err) = run_env(&args, &[("N8N_API_KEY", WEBHOOK_SECRET)]).await;
    (ok, format!("{out}{err}"))
}

#[tokio::test]
async fn audit_verify_without_a_team_checks_every_team() {
    let hook = Webhook::start().await;
    let app = spawn(&hook.url(), "").await;
    echo(&app, CALLER, "t1", "cli-1").await;
    echo(&app, CALLER, "t1", "cli-2").await;
    echo(&app, MULTI, "t2", "cli-3").await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("aio.toml");
    std::fs::write(&config, super::toml(&app.database_url, &hook.url(), "")).unwrap();

    let (ok, out) = verify_every_team(&config).await;
    assert!(ok, "{out}");
    assert!(out.contains("team t1: ok, 4 events"), "{out}");
    assert!(out.contains("team t2: ok, 2 events"), "{out}");

    // Break t1, the first team in order: t2 is still checked after it.
    let sql = "UPDATE audit_events SET subject = subject || 'x' WHERE team_id = 't1' AND seq = 2";
    exec(&app.store().await, sql).await;
    assert!(!verify(&app, "t1").await.ok && verify(&app, "t2").await.ok);
    let (ok, out) = verify_every_team(&config).await;
    assert!(!ok, "a broken team fails the run: {out}");
    assert!(out.contains("team t1: BROKEN at seq 2 (hash"), "{out}");
    assert!(out.contains("team t2: ok, 2 events"), "{out}");
    let named = out
        .lines()
        .any(|l| l.trim_end() == "audit chain broken for: t1");
    assert!(named, "only t1 is named: {out}");

    // A team whose head row is gone is still found, by its events.
    exec(
        &app.store().await,
        "DELETE FROM audit_heads WHERE team_id = 't2'",
    )
    .await;
    let (ok, out) = verify_every_team(&config).await;
    assert!(!ok, "{out}");
    assert!(out.contains("team t2: BROKEN"), "{out}");
    let named = out
        .lines()
        .any(|l| l.trim_end() == "audit chain broken for: t1, t2");
    assert!(named, "both are named: {out}");
    app.stop().await;
}
