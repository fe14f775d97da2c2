//! The entry point's order of checks over gRPC: what a key may list, a
//! built-in run and audited, and every denial with its code, its stable
//! reason, its details and its audit event.

use super::{
    ADMIN, CALLER, VIEWER, events, invoke, output, spawn, tools, verify, webhook::Webhook, with_key,
};
use ai_orchestrator::api::pb;
use serde_json::json;
use sha2::{Digest, Sha256};
use tonic::Code;
use tonic_types::StatusExt;

fn sha256_hex(text: &str) -> String {
    hex::encode(Sha256::digest(text.as_bytes()))
}

async fn listed(app: &crate::common::TestApp, key: &str) -> Vec<String> {
    let reply = tools(app)
        .list_tools(with_key(
            key,
            "list-trace",
            pb::ListToolsRequest {
                context: crate::common::ctx(),
            },
        ))
        .await
        .unwrap()
        .into_inner();
    for t in &reply.tools {
        let schema: serde_json::Value = serde_json::from_str(&t.input_schema).unwrap();
        assert!(schema.is_object(), "{t:?}");
    }
    reply
        .tools
        .iter()
        .map(|t| format!("{}@{}", t.name, t.version))
        .collect()
}

#[tokio::test]
async fn list_tools_shows_only_what_the_key_may_use() {
    let hook = Webhook::start().await;
    let app = spawn(&hook.url(), "").await;
    // The caller's role grants system.*, sms.*, crm.*: not billing, and
    // the disabled sms.segments is nobody's.
    assert_eq!(
        listed(&app, CALLER).await,
        [
            "crm.add_note@1.0.0",
            "system.echo@1.0.0",
            "system.health@1.0.0"
        ]
    );
    // A viewer never gets a tool with side effects.
    assert_eq!(
        listed(&app, VIEWER).await,
        ["system.echo@1.0.0", "system.health@1.0.0"]
    );
    // An admin has tool:*.
    assert_eq!(
        listed(&app, ADMIN).await,
        [
            "billing.refund@2.1.0",
            "crm.add_note@1.0.0",
            "system.echo@1.0.0",
            "system.health@1.0.0"
        ]
    );
    // Another team's listing: refused as every RPC refuses it.
    let err = tools(&app)
        .list_tools(with_key(
            CALLER,
            "list-other-team",
            pb::ListToolsRequest {
                context: Some(pb::RequestContext {
                    team_id: "t2".into(),
                    ..Default::default()
                }),
            },
        ))
        .await
        .unwrap_err();
    denied(&err, Code::PermissionDenied, "TEAM_NOT_ALLOWED");
    // Without a key: the same refusal as every RPC.
    let err = tools(&app)
        .list_tools(pb::ListToolsRequest {
            context: crate::common::ctx(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated);
    app.stop().await;
}

#[tokio::test]
async fn a_builtin_runs_through_the_entry_point_and_both_steps_are_audited() {
    let hook = Webhook::start().await;
    let app = spawn(&hook.url(), "").await;
    let reply = tools(&app)
        .invoke_tool(with_key(
            CALLER,
            "echo-trace",
            invoke("system.echo", json!({"text": "hi"})),
        ))
        .await
        .unwrap();
    assert_eq!(reply.metadata().get("x-trace-id").unwrap(), "echo-trace");
    let reply = reply.into_inner();
    let inv = reply.invocation.unwrap();
    assert_eq!(inv.status(), pb::InvocationStatus::Succeeded);
    assert_eq!(
        (inv.tool.as_str(), inv.version.as_str()),
        ("system.echo", "1.0.0")
    );
    assert_eq!(output(&inv), json!({"text": "hi"}));
    assert!(!inv.deduplicated);
    assert!(!inv.invocation_id.is_empty());
    assert_eq!(reply.meta.unwrap().trace_id, "echo-trace");

    // Pinned to its version, and an unknown version is not found.
    let pinned = tools(&app)
        .invoke_tool(with_key(
            CALLER,
            "echo-pinned",
            invoke("system.echo@1.0.0", json!({"text": "x"})),
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        pinned.invocation.unwrap().status(),
        pb::InvocationStatus::Succeeded
    );
    let err = tools(&app)
        .invoke_tool(with_key(
            CALLER,
            "echo-unknown-version",
            invoke("system.echo@9.9.9", json!({"text": "x"})),
        ))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound);

    // Durable before the reply: the events are there as soon as it is.
    let all = events(&app, "t1").await;
    let traced: Vec<&pb::AuditEvent> = all.iter().filter(|e| e.trace_id == "echo-trace").collect();
    let actions: Vec<&str> = traced.iter().map(|e| e.action.as_str()).collect();
    assert_eq!(actions, ["tool.call", "tool.result"]);
    let digest = sha256_hex(r#"{"text":"hi"}"#);
    for e in &traced {
        assert_eq!(e.category, "tool");
        assert_eq!(e.subject, "system.echo@1.0.0");
        assert_eq!(e.principal, "crm-key");
        assert_eq!(e.team_id, "t1");
        assert_eq!(e.input_sha256, digest, "canonical JSON's SHA-256");
        assert_eq!(e.input_bytes, Some(13));
    }
    assert_eq!(traced[0].decision, "allow");
    assert_eq!(traced[1].decision, "ok");
    assert_eq!(traced[1].output_sha256, digest);
    assert!(traced[1].duration_ms.is_some());
    let v = verify(&app, "t1").await;
    assert!(v.ok, "{v:?}");
    assert_eq!(v.events_checked, all.len() as u64);
    // The chain links: each event's prev_hash is the last one's hash.
    for pair in all.windows(2) {
        assert_eq!(pair[1].prev_hash, pair[0].hash);
        assert_eq!(pair[1].seq, pair[0].seq + 1);
    }
    app.stop().await;
}

/// Asserts `err` is `code` with `reason`, and returns it.
fn denied(err: &tonic::Status, code: Code, reason: &str) {
    assert_eq!(err.code(), code, "{err:?}");
    let info = err.get_details_error_info().expect("ErrorInfo");
    assert_eq!(info.reason, reason, "{err:?}");
}

#[tokio::test]
async fn every_denial_has_its_code_reason_details_and_audit_event() {
    let hook = Webhook::start().await;
    let app = spawn(&hook.url(), "").await;
    let call = |key: &'static str, trace: &'static str, req: pb::InvokeToolRequest| {
        let mut client = tools(&app);
        async move { client.invoke_tool(with_key(key, trace, req)).await }
    };
    let note = json!({"lead_id": "L1", "note": "call back"});

    let err = call(CALLER, "deny-1", invoke("crm.nothing", json!({})))
        .await
        .unwrap_err();
    denied(&err, Code::NotFound, "TOOL_NOT_FOUND");
    assert!(err.message().contains("`crm.nothing`"), "{}", err.message());

    let err = call(
        CALLER,
        "deny-2",
        invoke("sms.segments", json!({"text": "hi"})),
    )
    .await
    .unwrap_err();
    denied(&err, Code::PermissionDenied, "TOOL_DISABLED");

    let err = call(CALLER, "deny-3", invoke("billing.refund", json!({})))
        .await
        .unwrap_err();
    denied(&err, Code::PermissionDenied, "CAPABILITY_MISSING");
    let info = err.get_details_error_info().unwrap();
    assert_eq!(info.metadata["capability"], "tool:billing.refund");

    let err = call(VIEWER, "deny-4", invoke("crm.add_note", note.clone()))
        .await
        .unwrap_err();
    denied(&err, Code::PermissionDenied, "SIDE_EFFECTS_FORBIDDEN");

    let bad = json!({"note": "x".repeat(2001), "extra": 1});
    let err = call(CALLER, "deny-5", invoke("crm.add_note", bad))
        .await
        .unwrap_err();
    denied(&err, Code::InvalidArgument, "TOOL_INPUT_INVALID");
    let violations = err
        .get_details_bad_request()
        .expect("BadRequest")
        .field_violations;
    let fields: Vec<&str> = violations.iter().map(|v| v.field.as_str()).collect();
    assert_eq!(fields, ["/lead_id", "/note"], "{violations:?}");
    assert!(
        violations[0].description.contains("lead_id"),
        "{violations:?}"
    );
    assert!(
        !format!("{err:?}").contains("xxxx"),
        "an input value never comes back in the error"
    );

    let mut budget = invoke("crm.add_note", note.clone());
    budget.budget = Some(pb::Budget {
        max_cost_usd: 0.0005,
        ..Default::default()
    });
    let err = call(CALLER, "deny-6", budget).await.unwrap_err();
    denied(&err, Code::ResourceExhausted, "BUDGET_EXCEEDED");
    let quota = err.get_details_quota_failure().expect("QuotaFailure");
    assert_eq!(quota.violations[0].subject, "budget.max_cost_usd");

    for trace in ["quota-ok-1", "quota-ok-2"] {
        call(CALLER, trace, invoke("system.health", json!({})))
            .await
            .unwrap();
    }
    let before = super::usage_totals(&app).await.requests;
    let err = call(CALLER, "deny-7", invoke("system.health", json!({})))
        .await
        .unwrap_err();
    denied(&err, Code::ResourceExhausted, "QUOTA_EXCEEDED");
    let quota = err.get_details_quota_failure().expect("QuotaFailure");
    assert_eq!(quota.violations[0].subject, "max_per_hour");
    // Refused after its cost was reserved (the quota comes after the
    // estimate): the reservation is given back, nothing is charged. The
    // next call's settlement is durable before its reply, and commits
    // after anything the refusal queued.
    call(
        CALLER,
        "after-quota",
        invoke("system.echo", json!({"text": "x"})),
    )
    .await
    .unwrap();
    assert_eq!(super::usage_totals(&app).await.requests, before + 1);

    assert_eq!(hook.count(), 0, "no denied invocation reaches the webhook");

    // Every denial is audited, with its reason, before the error returns.
    let all = events(&app, "t1").await;
    let expected = [
        ("deny-1", "crm.nothing", "TOOL_NOT_FOUND"),
        ("deny-2", "sms.segments@1.0.0", "TOOL_DISABLED"),
        ("deny-3", "billing.refund@2.1.0", "CAPABILITY_MISSING"),
        ("deny-4", "crm.add_note@1.0.0", "SIDE_EFFECTS_FORBIDDEN"),
        ("deny-5", "crm.add_note@1.0.0", "TOOL_INPUT_INVALID"),
        ("deny-6", "crm.add_note@1.0.0", "BUDGET_EXCEEDED"),
        ("deny-7", "system.health@1.0.0", "QUOTA_EXCEEDED"),
    ];
    for (trace, subject, reason) in expected {
        let found: Vec<&pb::AuditEvent> = all.iter().filter(|e| e.trace_id == trace).collect();
        assert_eq!(found.len(), 1, "{trace}: {found:?}");
        let e = found[0];
        assert_eq!(
            (
                e.action.as_str(),
                e.decision.as_str(),
                e.reason.as_str(),
                e.subject.as_str()
            ),
            ("tool.denied", "deny", reason, subject),
            "{trace}"
        );
        assert!(!e.input_sha256.is_empty(), "{trace}");
    }
    let principal = |trace: &str| {
        all.iter()
            .find(|e| e.trace_id == trace)
            .map(|e| e.principal.clone())
            .unwrap()
    };
    assert_eq!(principal("deny-4"), "viewer-key");
    assert!(verify(&app, "t1").await.ok);
    app.stop().await;
}
