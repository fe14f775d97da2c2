//! The platform's trigger events (SPEC §16): `usage.cap.warning` (80 %)
//! and `usage.cap.reached` found in the ledger transaction that settles the
//! crossing spend, and `breaker.opened` told by a provider's breaker; each
//! starts its trigger's tool once, for the trigger's `team`.

use super::{CALLER, events, fetch, tools_extra, triggers::alerts, webhook::Webhook, with_key};
use crate::common::{TestApp, config_toml_with, wait_for};
use ai_orchestrator::{api::pb, audit::outbox};
use serde_json::json;

/// `ops.alert` (a webhook, one attempt) and `triggers`, relayed every 30ms.
fn alerting(hook: &Webhook, triggers: &str) -> String {
    format!(
        "{}\n[trigger_relay]\npoll_interval = \"30ms\"\n{triggers}\n",
        super::triggers::alert_tool(hook)
    )
}

/// A server on a fresh SQLite file; `primary` configures the primary mock.
async fn spawn(hook: &Webhook, primary: &str, extra: &str) -> TestApp {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("sqlite://{}", dir.path().join("platform.db").display());
    let mut app = spawn_on(&url, hook, primary, extra).await;
    app.keep(dir);
    app
}

async fn spawn_on(url: &str, hook: &Webhook, primary: &str, extra: &str) -> TestApp {
    let toml = config_toml_with(
        url,
        primary,
        "latency = \"1ms\"",
        &format!("{}{extra}", tools_extra(&hook.url())),
    );
    TestApp::spawn_toml_env(&toml, super::env).await
}

async fn classify(app: &TestApp, trace: &str) -> Result<pb::ResponseMeta, tonic::Status> {
    app.client
        .clone()
        .classify_sms(with_key(
            CALLER,
            trace,
            crate::tasks::classify("call me back"),
        ))
        .await
        .map(|r| r.into_inner().meta.unwrap_or_default())
}

/// A daily request cap of 5: the 4th call's settlement crosses 80 %, the
/// 5th reaches it, the 6th is refused; each trigger's webhook sees its
/// event once, with the cap's fields, and the tool runs for team `ops`.
#[tokio::test]
async fn a_cap_crossed_starts_its_triggers_once_each() {
    let hook = Webhook::start().await;
    let app = spawn(&hook, "latency = \"1ms\"", &alerting(&hook, CAP_TRIGGERS)).await;
    for i in 1..=5 {
        classify(&app, &format!("cap-{i}"))
            .await
            .expect("under the cap");
    }
    let refused = classify(&app, "cap-6").await.expect_err("over the cap");
    assert_eq!(
        refused.code(),
        tonic::Code::ResourceExhausted,
        "{refused:?}"
    );
    let store = app.store().await;
    let got = two_alerts(&hook, &store).await;
    assert_eq!(
        got,
        [
            json!({"text": "CAP_REACHED cap=daily_requests limit=5 spent=5", "team": "t1", "subject": "team:t1/day/requests"}),
            json!({"text": "daily_requests at 4/5", "team": "t1", "trace": "cap-4"}),
        ]
    );
    // On t1's chain, by the ledger; the refused 6th call crossed nothing more.
    let caps: Vec<_> = events(&app, "t1")
        .await
        .into_iter()
        .filter(|e| e.action.starts_with("usage.cap."))
        .map(|e| (e.action, e.principal, e.decision, e.category))
        .collect();
    assert_eq!(
        caps,
        [
            (
                "usage.cap.warning".into(),
                "system:ledger".into(),
                "allow".into(),
                "usage".into()
            ),
            (
                "usage.cap.reached".into(),
                "system:ledger".into(),
                "deny".into(),
                "usage".into()
            ),
        ]
    );
    // The alerts ran for team ops, as the triggers' principals.
    let ran: Vec<_> = events(&app, "ops")
        .await
        .into_iter()
        .filter(|e| e.action == "workflow.invoke")
        .map(|e| e.principal)
        .collect();
    assert_eq!(ran.len(), 2, "{ran:?}");
    assert!(ran.contains(&"trigger:cap_warn".to_owned()));
    app.stop().await;
}

/// Two replicas on PostgreSQL settle the same team's calls at once: each
/// crossing is still audited once, whichever settlement made it.
#[tokio::test]
async fn two_replicas_on_postgres_audit_each_crossing_once() {
    let hook = Webhook::start().await;
    let db = crate::common::TestPostgres::create().await;
    let extra = alerting(&hook, CAP_TRIGGERS);
    let a = spawn_on(&db.url, &hook, "latency = \"1ms\"", &extra).await;
    let b = spawn_on(&db.url, &hook, "latency = \"1ms\"", &extra).await;
    let calls = (1..=5).map(|i| classify(if i % 2 == 0 { &a } else { &b }, "pg"));
    for result in futures::future::join_all(calls).await {
        result.expect("under the cap");
    }
    let store = a.store().await;
    let got = two_alerts(&hook, &store).await;
    assert_eq!(
        got[0]["text"],
        "CAP_REACHED cap=daily_requests limit=5 spent=5"
    );
    assert_eq!(got[1]["text"], "daily_requests at 4/5");
    let crossed = events(&a, "t1")
        .await
        .into_iter()
        .filter(|e| e.action.starts_with("usage.cap."))
        .count();
    assert_eq!(crossed, 2);
    a.stop().await;
    b.stop().await;
    db.drop_now().await;
}

/// Waits for both cap triggers' rows to be FIRED: their alerts, sorted.
async fn two_alerts(
    hook: &Webhook,
    store: &ai_orchestrator::store::Store,
) -> Vec<serde_json::Value> {
    wait_for(|| async {
        let rows = outbox::rows(store).await.unwrap();
        rows.len() == 2 && rows.iter().all(|(_, status, _)| status == "FIRED")
    })
    .await;
    wait_for(|| async { alerts(hook).len() >= 2 }).await;
    let mut got = alerts(hook);
    got.sort_by_key(|a| a["text"].to_string());
    assert_eq!(got.len(), 2, "each trigger once: {got:?}");
    got
}

const CAP_TRIGGERS: &str = r#"
[metering.default_limits]
max_requests_per_day = 5

[triggers.cap_warn]
on = "usage.cap.warning"
filter = { team = "t1" }
tool = "ops.alert"
team = "ops"
role = "admin"
input = { text = "{{event.cap}} at {{event.spent}}/{{event.limit}}", team = "{{event.team}}", trace = "{{event.trace_id}}" }

[triggers.cap_hit]
on = "usage.cap.reached"
tool = "ops.alert"
team = "ops"
role = "admin"
input = { text = "{{event.reason}}", team = "{{event.team}}", subject = "{{event.subject}}" }
"#;

/// The primary fails every call and its breaker opens on the first: the
/// opening is audited on the global chain and starts the trigger's tool
/// for the trigger's team.
#[tokio::test]
async fn a_breaker_opening_starts_its_trigger_for_the_triggers_team() {
    let hook = Webhook::start().await;
    let triggers = r#"
[providers.primary.breaker]
failure_threshold = 1

[triggers.provider_down]
on = "breaker.opened"
tool = "ops.alert"
team = "t1"
role = "admin"
input = { text = "{{event.provider}} opened: {{event.reason}}", team = "{{event.team}}" }
"#;
    let primary = "latency = \"1ms\"\nfailure_rate = 1.0";
    let app = spawn(&hook, primary, &alerting(&hook, triggers)).await;
    let meta = classify(&app, "brk-1").await.expect("the fallback serves");
    assert_eq!(meta.provider, "fallback");
    wait_for(|| async { !alerts(&hook).is_empty() }).await;
    assert_eq!(
        alerts(&hook),
        [json!({"text": "primary opened: BREAKER_OPENED consecutive_failures=1", "team": ""})]
    );
    let opened: Vec<_> = events(&app, "")
        .await
        .into_iter()
        .filter(|e| e.action == "breaker.opened")
        .collect();
    assert_eq!(opened.len(), 1, "{opened:?}");
    assert_eq!(
        (opened[0].subject.as_str(), opened[0].category.as_str()),
        ("primary", "provider")
    );
    let store = app.store().await;
    wait_for(|| async { outbox::rows(&store).await.unwrap()[0].1 == "FIRED" }).await;
    let invocation = outbox::rows(&store).await.unwrap()[0].2.clone().unwrap();
    // Team t1's invocation: t1's caller key reads it.
    let inv = fetch(&app, &invocation).await;
    assert_eq!(inv.tool, "ops.alert");
    app.stop().await;
}
