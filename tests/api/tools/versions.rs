//! Tool identity is `name@version` (SPEC §9.1), and quotas guard each one
//! (§9.3), end to end. Several versions of one webhook tool side by side,
//! each posting to its own path so the fake webhook shows which one ran: an
//! unpinned call gets the highest enabled version by semver, a pin runs its
//! own version, a disabled pin is TOOL_DISABLED, an unknown one
//! TOOL_NOT_FOUND. And a SYNC call refused by `max_concurrent` while
//! another one is held in the webhook.

use super::{CALLER, events, invoke, run, spawn, tools, webhook::Webhook, with_key};
use crate::common::{TestApp, wait_for};
use ai_orchestrator::api::pb;
use axum::http::StatusCode;
use serde_json::json;
use std::sync::{
    Arc,
    atomic::{AtomicUsize, Ordering},
};
use tokio::sync::Semaphore;
use tonic::Code;
use tonic_types::StatusExt;

/// Three versions of `crm.lookup`, declared both ways the config allows
/// (a `version` key, a `name@version` key). 1.10.0 sorts above 1.2.0 as
/// semver, below it as text.
fn lookup_versions(hook: &Webhook, newest_enabled: bool) -> String {
    format!(
        r#"
[tools."crm.lookup"]
version = "1.2.0"
kind = "http"
url = "{url}/webhook/lookup-1.2.0"

[tools."crm.lookup@1.10.0"]
kind = "http"
url = "{url}/webhook/lookup-1.10.0"

[tools."crm.lookup@2.0.0"]
kind = "http"
enabled = {newest_enabled}
url = "{url}/webhook/lookup-2.0.0"
"#,
        url = hook.url()
    )
}

/// The paths the webhook was POSTed, in order.
fn paths(hook: &Webhook) -> Vec<String> {
    hook.received().into_iter().map(|r| r.path).collect()
}

/// Runs `tool` for lead `lead` as the caller key and returns the version
/// that served it (a refusal or a failed run fails the test).
async fn served(app: &TestApp, trace: &str, tool: &str, lead: &str) -> String {
    let inv = run(app, CALLER, trace, tool, json!({"lead_id": lead})).await;
    assert_eq!(
        inv.status(),
        pb::InvocationStatus::Succeeded,
        "{trace}: {inv:?}"
    );
    assert_eq!(inv.tool, "crm.lookup", "{trace}");
    inv.version
}

/// The refusal of `tool` as the caller key.
async fn refusal(app: &TestApp, trace: &str, tool: &str, lead: &str) -> tonic::Status {
    tools(app)
        .invoke_tool(with_key(
            CALLER,
            trace,
            invoke(tool, json!({"lead_id": lead})),
        ))
        .await
        .expect_err(tool)
}

/// Asserts `err` is `code` with the stable `reason`.
fn refused(err: &tonic::Status, code: Code, reason: &str) {
    assert_eq!(err.code(), code, "{err:?}");
    let info = err.get_details_error_info().expect("ErrorInfo");
    assert_eq!(info.reason, reason, "{err:?}");
}

/// `name@version` of every tool ListTools shows the caller key, in order.
async fn listed(app: &TestApp) -> Vec<String> {
    tools(app)
        .list_tools(with_key(
            CALLER,
            "list-versions",
            pb::ListToolsRequest {
                context: crate::common::ctx(),
            },
        ))
        .await
        .expect("ListTools")
        .into_inner()
        .tools
        .iter()
        .map(|t| format!("{}@{}", t.name, t.version))
        .collect()
}

#[tokio::test]
async fn an_unpinned_call_gets_the_highest_version_and_a_pin_runs_its_own() {
    let hook = Webhook::start().await;
    let app = spawn(&hook.url(), &lookup_versions(&hook, true)).await;
    // Each call a different lead: the idempotency key never merges them.
    for (trace, tool, lead, version) in [
        ("unpinned", "crm.lookup", "L-1", "2.0.0"),
        ("pin-1.2.0", "crm.lookup@1.2.0", "L-2", "1.2.0"),
        ("pin-1.10.0", "crm.lookup@1.10.0", "L-3", "1.10.0"),
        ("pin-2.0.0", "crm.lookup@2.0.0", "L-4", "2.0.0"),
    ] {
        assert_eq!(served(&app, trace, tool, lead).await, version, "{trace}");
    }
    assert_eq!(
        paths(&hook),
        [
            "/webhook/lookup-2.0.0",
            "/webhook/lookup-1.2.0",
            "/webhook/lookup-1.10.0",
            "/webhook/lookup-2.0.0",
        ],
        "each call reached the webhook of the version that served it"
    );

    // A version nobody declared is not found, and posts nothing.
    let err = refusal(&app, "pin-missing", "crm.lookup@3.0.0", "L-5").await;
    refused(&err, Code::NotFound, "TOOL_NOT_FOUND");
    assert_eq!(hook.count(), 4);

    // Every version is listed, by name then newest version first.
    assert_eq!(
        listed(&app).await,
        [
            "crm.add_note@1.0.0",
            "crm.lookup@2.0.0",
            "crm.lookup@1.10.0",
            "crm.lookup@1.2.0",
            "system.echo@1.0.0",
            "system.health@1.0.0",
        ]
    );
    app.stop().await;
}

#[tokio::test]
async fn a_disabled_highest_version_gives_way_and_refuses_its_pin() {
    let hook = Webhook::start().await;
    let app = spawn(&hook.url(), &lookup_versions(&hook, false)).await;
    // The next highest by semver serves: 1.10.0, not 1.2.0.
    assert_eq!(
        served(&app, "unpinned", "crm.lookup", "L-1").await,
        "1.10.0"
    );
    assert_eq!(
        served(&app, "pin-1.2.0", "crm.lookup@1.2.0", "L-2").await,
        "1.2.0"
    );
    let err = refusal(&app, "pin-disabled", "crm.lookup@2.0.0", "L-3").await;
    refused(&err, Code::PermissionDenied, "TOOL_DISABLED");
    assert_eq!(
        paths(&hook),
        ["/webhook/lookup-1.10.0", "/webhook/lookup-1.2.0"],
        "the disabled version's webhook is never posted"
    );

    // The audit names the version that ran, and the one refused.
    let all = events(&app, "t1").await;
    let of = |trace: &str| -> Vec<(String, String, String)> {
        all.iter()
            .filter(|e| e.trace_id == trace)
            .map(|e| (e.action.clone(), e.subject.clone(), e.decision.clone()))
            .collect()
    };
    let event = |action: &str, subject: &str, decision: &str| {
        (action.to_owned(), subject.to_owned(), decision.to_owned())
    };
    assert_eq!(
        of("unpinned"),
        [
            event("workflow.invoke", "crm.lookup@1.10.0", "allow"),
            event("workflow.result", "crm.lookup@1.10.0", "ok"),
        ]
    );
    assert_eq!(
        of("pin-disabled"),
        [event("tool.denied", "crm.lookup@2.0.0", "deny")]
    );

    // A disabled version is nobody's to use, so it is not listed.
    assert_eq!(
        listed(&app).await,
        [
            "crm.add_note@1.0.0",
            "crm.lookup@1.10.0",
            "crm.lookup@1.2.0",
            "system.echo@1.0.0",
            "system.health@1.0.0",
        ]
    );
    app.stop().await;
}

/// A webhook that holds every answer until it is opened: a POST stays in
/// flight for exactly as long as the test needs it there.
struct Gate {
    url: String,
    arrived: Arc<AtomicUsize>,
    open: Arc<Semaphore>,
}

impl Gate {
    async fn start() -> Self {
        let arrived = Arc::new(AtomicUsize::new(0));
        let open = Arc::new(Semaphore::new(0));
        let (counter, gate) = (arrived.clone(), open.clone());
        let app = axum::Router::new().fallback(move || {
            let (counter, gate) = (counter.clone(), gate.clone());
            async move {
                counter.fetch_add(1, Ordering::SeqCst);
                // The permit goes back when the answer leaves: once
                // opened, every POST is answered.
                let _pass = gate.acquire().await.expect("the gate is never closed");
                (StatusCode::OK, r#"{"ok": true}"#)
            }
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        Self { url, arrived, open }
    }

    /// POSTs received so far, answered or held.
    fn arrived(&self) -> usize {
        self.arrived.load(Ordering::SeqCst)
    }

    /// Lets the held answers (and every later one) through.
    fn open(&self) {
        self.open.add_permits(1);
    }
}

#[tokio::test]
async fn a_sync_call_over_max_concurrent_is_refused_with_quota_failure() {
    let gate = Gate::start().await;
    let extra = format!(
        r#"
[tools."crm.hold"]
kind = "http"
url = "{}/webhook/hold"
quota = {{ max_concurrent = 1 }}
"#,
        gate.url
    );
    let app = spawn(&gate.url, &extra).await;
    let hold = |lead: &str| invoke("crm.hold", json!({"lead_id": lead}));

    // One SYNC call in flight, held in the webhook.
    let first = {
        let mut client = tools(&app);
        let req = with_key(CALLER, "held", hold("L-1"));
        tokio::spawn(async move { client.invoke_tool(req).await })
    };
    wait_for(|| async { gate.arrived() == 1 }).await;

    // A second one finds the team's only slot taken.
    let err = tools(&app)
        .invoke_tool(with_key(CALLER, "over-quota", hold("L-2")))
        .await
        .expect_err("max_concurrent = 1 is taken");
    refused(&err, Code::ResourceExhausted, "QUOTA_EXCEEDED");
    let info = err.get_details_error_info().expect("ErrorInfo");
    assert_eq!(info.metadata["limit"], "max_concurrent");
    let quota = err.get_details_quota_failure().expect("QuotaFailure");
    assert_eq!(quota.violations.len(), 1, "{quota:?}");
    assert_eq!(quota.violations[0].subject, "max_concurrent");
    assert_eq!(
        gate.arrived(),
        1,
        "the refused call never reached the webhook"
    );

    // The first completes, its slot is free again, and a third call runs.
    gate.open();
    let first = first
        .await
        .expect("the first call's task")
        .expect("the first call")
        .into_inner()
        .invocation
        .expect("an invocation");
    assert_eq!(first.status(), pb::InvocationStatus::Succeeded, "{first:?}");
    let third = run(&app, CALLER, "after", "crm.hold", json!({"lead_id": "L-3"})).await;
    assert_eq!(third.status(), pb::InvocationStatus::Succeeded, "{third:?}");
    assert_eq!(gate.arrived(), 2);

    // The refusal is audited with its reason, against the version held.
    let all = events(&app, "t1").await;
    let denied: Vec<&pb::AuditEvent> = all.iter().filter(|e| e.trace_id == "over-quota").collect();
    assert_eq!(denied.len(), 1, "{denied:?}");
    assert_eq!(
        (
            denied[0].action.as_str(),
            denied[0].subject.as_str(),
            denied[0].reason.as_str()
        ),
        ("tool.denied", "crm.hold@1.0.0", "QUOTA_EXCEEDED")
    );
    app.stop().await;
}
