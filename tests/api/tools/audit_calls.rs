//! `[audit] calls` (SPEC §14.3) end to end: every model call leaves
//! `call.completed` or `call.failed` in its team's chain, committed with its
//! usage record and mirroring it (task, provider, model, tokens, cost,
//! outcome, attempts), with digests of the redacted input and of the answer,
//! never their content: through `Execute` and `ExecuteStream`, each model
//! call of an agent turn, a call that fails on every target, a failed turn
//! (`agent.turn.failed`); none with `calls = false`; the same events with
//! metering off; and the chain still verifies. Fake OpenAI and Anthropic
//! servers over real HTTP, a real SQLite file.

use super::{CALLER, events, verify, with_key};
use crate::{
    agents::{
        completed, converse, spawn, turn,
        upstream::{Reply, Upstream, openai_text, openai_tool_calls},
    },
    common::TestApp,
};
use ai_orchestrator::{
    api::pb,
    audit::digest,
    usage::{UsageRecord, pricing::usd, record::by_trace},
};
use serde_json::{Value, json};
use tonic::Code;
use tonic_types::StatusExt;

/// `meeting_brief` on OpenAI, Anthropic behind it.
const BRIEF: &str = r#"
[tasks.meeting_brief]
chain = [{ provider = "openai", model = "gpt-4o-mini" }, { provider = "anthropic", model = "claude-3-haiku-20240307" }]
"#;

/// OpenAI's answer `text`, not streamed (90 tokens in, 12 out).
fn openai_answer(text: &str) -> Reply {
    Reply::json(
        200,
        &json!({
            "id": "chatcmpl-AgT2", "object": "chat.completion", "created": 1_732_000_000,
            "model": "gpt-4o-mini-2024-07-18", "system_fingerprint": "fp_0ba0d124f1",
            "choices": [{"index": 0, "logprobs": null, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": text, "refusal": null}}],
            "usage": {"prompt_tokens": 90, "completion_tokens": 12, "total_tokens": 102}
        }),
    )
}

/// `Execute` of `meeting_brief` with `input`, for team t1.
fn execute(input: &Value) -> pb::ExecuteRequest {
    pb::ExecuteRequest {
        context: crate::common::ctx(),
        task: "meeting_brief".into(),
        input: Some(pb::execute_request::Input::InputJson(input.to_string())),
        ..Default::default()
    }
}

/// Every audit event of `trace` (team t1), in chain order.
async fn of_trace(app: &TestApp, trace: &str) -> Vec<pb::AuditEvent> {
    events(app, "t1")
        .await
        .into_iter()
        .filter(|e| e.trace_id == trace)
        .collect()
}

/// The `call.*` events of `trace`.
async fn calls(app: &TestApp, trace: &str) -> Vec<pb::AuditEvent> {
    let all = of_trace(app, trace).await;
    all.into_iter().filter(|e| e.category == "call").collect()
}

/// `(action, decision, the reason's first word)` of each event.
fn decisions(events: &[pb::AuditEvent]) -> Vec<(String, String, String)> {
    events
        .iter()
        .map(|e| {
            let reason = e.reason.split(' ').next().unwrap_or_default();
            (e.action.clone(), e.decision.clone(), reason.to_owned())
        })
        .collect()
}

/// Lowercase hex SHA-256.
fn is_digest(s: &str) -> bool {
    s.len() == 64
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// `e` is the event of the call `r` records: its figures, to the unit.
fn assert_mirrors(e: &pb::AuditEvent, r: &UsageRecord) {
    let attempts = serde_json::from_str::<Vec<Value>>(&r.attempts)
        .unwrap()
        .len();
    let reason = format!(
        "{} provider={} model={} input_tokens={} output_tokens={} attempts={attempts}",
        r.outcome, r.provider, r.model, r.input_tokens, r.output_tokens
    );
    assert_eq!(e.category, "call");
    assert_eq!(e.subject, r.task);
    assert_eq!(e.reason, reason);
    assert_eq!(e.actual_cost_usd, r.cost_micros.map(usd));
    assert_eq!(e.duration_ms, u64::try_from(r.latency_ms).ok());
    assert_eq!(
        (e.team_id.as_str(), e.principal.as_str()),
        ("t1", "crm-key")
    );
    assert!(is_digest(&e.input_sha256), "{e:?}");
}

#[tokio::test]
async fn execute_and_execute_stream_each_leave_one_call_completed_mirroring_the_record() {
    let answer = "Brief: meet Ann at 10.";
    let openai = Upstream::start([
        openai_answer(answer),
        Reply::sse(openai_text(&["Streamed ", "brief."])),
    ])
    .await;
    let unused = Upstream::start([]).await;
    let app = spawn(&openai.url(), &unused.url(), BRIEF).await;
    let input = json!({"attendee": "Ann", "email": "ann@example.com"});
    let reply = app
        .client
        .clone()
        .execute(with_key(CALLER, "call-ok", execute(&input)))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(reply.text, answer);

    // Read after the reply: the event was durable before it.
    let store = app.store().await;
    let records = by_trace(&store, "call-ok").await.unwrap();
    let [record] = records.as_slice() else {
        panic!("one usage record: {records:?}")
    };
    assert_eq!(
        (record.task.as_str(), record.provider.as_str()),
        ("meeting_brief", "openai")
    );
    assert_eq!((record.input_tokens, record.output_tokens), (90, 12));
    let found = calls(&app, "call-ok").await;
    let [event] = found.as_slice() else {
        panic!("one call event: {found:?}")
    };
    assert_eq!(
        (event.action.as_str(), event.decision.as_str()),
        ("call.completed", "ok")
    );
    assert_mirrors(event, record);
    let (estimated, actual) = (
        event.estimated_cost_usd.unwrap(),
        event.actual_cost_usd.unwrap(),
    );
    assert!(actual > 0.0 && estimated >= actual, "{estimated} {actual}");

    // Digests of the redacted input and of the answer, never of the content.
    assert!(is_digest(&event.output_sha256), "{event:?}");
    let (sha, bytes) = digest::digest(&input);
    assert_eq!(event.input_sha256, sha);
    assert_eq!(event.input_bytes, u64::try_from(bytes).ok());
    let other_email = json!({"attendee": "Ann", "email": "bob@example.com"});
    assert_eq!(
        event.input_sha256,
        digest::digest(&other_email).0,
        "redacted"
    );
    for raw in [
        digest::sha256_hex(input.to_string().as_bytes()),
        digest::sha256_hex(&digest::canonical(&input)),
    ] {
        assert_ne!(event.input_sha256, raw);
    }
    assert_eq!(
        event.output_sha256,
        digest::digest(&json!({"text": answer})).0
    );
    assert_ne!(event.output_sha256, digest::sha256_hex(answer.as_bytes()));
    let columns = format!("{event:?}");
    assert!(!columns.contains("ann@example.com") && !columns.contains("meet Ann"));

    // The streamed twin: its own event, the same input digest.
    let mut stream = app
        .client
        .clone()
        .execute_stream(with_key(CALLER, "call-stream", execute(&input)))
        .await
        .unwrap()
        .into_inner();
    while stream.message().await.unwrap().is_some() {}
    let records = by_trace(&store, "call-stream").await.unwrap();
    let found = calls(&app, "call-stream").await;
    let ([record], [streamed]) = (records.as_slice(), found.as_slice()) else {
        panic!("one record and one event: {records:?} {found:?}")
    };
    assert_eq!(streamed.action, "call.completed");
    assert_mirrors(streamed, record);
    assert_eq!(streamed.input_sha256, event.input_sha256);
    let text = json!({"text": "Streamed brief."});
    assert_eq!(streamed.output_sha256, digest::digest(&text).0);
    assert!(verify(&app, "t1").await.ok);
    app.stop().await;
}

#[tokio::test]
async fn a_call_failing_on_every_target_leaves_call_failed_with_its_reason() {
    // Nothing scripted: every attempt at either provider is a 500.
    let openai = Upstream::start([]).await;
    let anthropic = Upstream::start([]).await;
    let app = spawn(&openai.url(), &anthropic.url(), BRIEF).await;
    let failed = app
        .client
        .clone()
        .execute(with_key(
            CALLER,
            "call-fail",
            execute(&json!({"attendee": "Ann"})),
        ))
        .await
        .unwrap_err();
    assert_eq!(failed.code(), Code::Unavailable);
    assert!(!openai.bodies().is_empty() && !anthropic.bodies().is_empty());

    let store = app.store().await;
    let records = by_trace(&store, "call-fail").await.unwrap();
    let [record] = records.as_slice() else {
        panic!("one usage record: {records:?}")
    };
    assert_eq!(record.outcome, "ALL_PROVIDERS_FAILED");
    let found = calls(&app, "call-fail").await;
    assert_eq!(
        decisions(&found),
        [(
            "call.failed".into(),
            "error".into(),
            "ALL_PROVIDERS_FAILED".into()
        )]
    );
    assert_mirrors(&found[0], record);
    // No answer, so no output digest.
    assert_eq!(
        (found[0].output_sha256.as_str(), found[0].output_bytes),
        ("", None)
    );
    assert!(verify(&app, "t1").await.ok);
    app.stop().await;
}

#[tokio::test]
async fn each_model_call_of_a_turn_leaves_its_event_before_the_turns_end() {
    let openai = Upstream::start([
        Reply::sse(openai_tool_calls(&[(
            "call_1",
            "system__echo",
            &[r#"{"text":"hi"}"#],
        )])),
        Reply::sse(openai_text(&["Echoed."])),
    ])
    .await;
    let unused = Upstream::start([]).await;
    let app = spawn(&openai.url(), &unused.url(), "").await;
    let answered = turn(
        &app,
        CALLER,
        "call-turn",
        converse("helper", "Echo hi.", None),
    )
    .await
    .unwrap();
    assert_eq!(completed(&answered).text, "Echoed.");

    let all = of_trace(&app, "call-turn").await;
    // Tool events aside: the start, one event per model call, the end.
    let actions: Vec<&str> = all
        .iter()
        .filter(|e| e.category != "tool")
        .map(|e| e.action.as_str())
        .collect();
    assert_eq!(
        actions,
        [
            "agent.turn.start",
            "call.completed",
            "call.completed",
            "agent.turn.complete"
        ]
    );
    let store = app.store().await;
    let records: Vec<UsageRecord> = by_trace(&store, "call-turn")
        .await
        .unwrap()
        .into_iter()
        .filter(|r| r.provider == "openai")
        .collect();
    let found: Vec<&pb::AuditEvent> = all.iter().filter(|e| e.category == "call").collect();
    assert_eq!((records.len(), found.len()), (2, 2));
    for (e, r) in found.iter().zip(&records) {
        assert_eq!(e.subject, "agent:helper");
        assert_mirrors(e, r);
        assert!(is_digest(&e.output_sha256), "{e:?}");
    }
    let tokens: Vec<(i64, i64)> = records
        .iter()
        .map(|r| (r.input_tokens, r.output_tokens))
        .collect();
    assert_eq!(tokens, [(80, 20), (90, 12)]);
    // The second call also sent the tool call and its result.
    assert_ne!(found[0].input_sha256, found[1].input_sha256);
    let answer = digest::digest(&json!({"text": "Echoed."})).0;
    assert_eq!(found[1].output_sha256, answer);
    assert!(verify(&app, "t1").await.ok);
    app.stop().await;
}

#[tokio::test]
async fn a_failed_turn_leaves_call_failed_then_agent_turn_failed() {
    let openai = Upstream::start([]).await;
    let anthropic = Upstream::start([]).await;
    let app = spawn(&openai.url(), &anthropic.url(), "").await;
    let failed = turn(&app, CALLER, "turn-fail", converse("helper", "Hi", None))
        .await
        .unwrap_err();
    let reason = failed.get_details_error_info().map(|i| i.reason);
    assert_eq!(reason.as_deref(), Some("ALL_PROVIDERS_FAILED"));
    // Durable before the failure was answered, in the order it happened.
    let all = of_trace(&app, "turn-fail").await;
    let owned = |a: &str, d: &str, r: &str| (a.to_owned(), d.to_owned(), r.to_owned());
    assert_eq!(
        decisions(&all),
        [
            owned("agent.turn.start", "allow", ""),
            owned("call.failed", "error", "ALL_PROVIDERS_FAILED"),
            owned("agent.turn.failed", "error", "ALL_PROVIDERS_FAILED"),
        ]
    );
    // The turn's end carries the stable reason alone.
    assert_eq!(all[2].reason, "ALL_PROVIDERS_FAILED");
    assert_eq!(
        (all[1].subject.as_str(), all[2].subject.as_str()),
        ("agent:helper", "helper")
    );
    assert!(verify(&app, "t1").await.ok);
    app.stop().await;
}

#[tokio::test]
async fn with_calls_off_no_call_event_is_written_and_the_rest_still_is() {
    let openai = Upstream::start([
        openai_answer("Brief."),
        Reply::sse(openai_text(&["Hello."])),
    ])
    .await;
    let unused = Upstream::start([]).await;
    let extra = format!("{BRIEF}\n[audit]\ncalls = false\n");
    let app = spawn(&openai.url(), &unused.url(), &extra).await;
    app.client
        .clone()
        .execute(with_key(CALLER, "off-execute", execute(&json!({"a": 1}))))
        .await
        .unwrap();
    turn(&app, CALLER, "off-turn", converse("helper", "Hi", None))
        .await
        .unwrap();

    let all = events(&app, "t1").await;
    let kinds: Vec<(&str, &str)> = all
        .iter()
        .map(|e| (e.category.as_str(), e.action.as_str()))
        .collect();
    assert_eq!(
        kinds,
        [
            ("agent", "agent.turn.start"),
            ("agent", "agent.turn.complete")
        ]
    );
    // The calls are metered as ever.
    let store = app.store().await;
    assert_eq!(by_trace(&store, "off-execute").await.unwrap().len(), 1);
    assert!(verify(&app, "t1").await.ok);
    app.stop().await;
}

#[tokio::test]
async fn with_metering_off_a_call_is_audited_all_the_same() {
    let answer = "Brief: unmetered.";
    let openai = Upstream::start([openai_answer(answer)]).await;
    let unused = Upstream::start([]).await;
    let extra = format!("{BRIEF}\n[metering]\nenabled = false\n");
    let app = spawn(&openai.url(), &unused.url(), &extra).await;
    let input = json!({"attendee": "Ann"});
    app.client
        .clone()
        .execute(with_key(CALLER, "unmetered", execute(&input)))
        .await
        .unwrap();

    // No usage record, no reservation: the event was appended on its own,
    // durably before the reply.
    let store = app.store().await;
    assert!(by_trace(&store, "unmetered").await.unwrap().is_empty());
    let found = calls(&app, "unmetered").await;
    let [event] = found.as_slice() else {
        panic!("one call event: {found:?}")
    };
    assert_eq!(
        (event.action.as_str(), event.subject.as_str()),
        ("call.completed", "meeting_brief")
    );
    assert!(
        event
            .reason
            .starts_with("ok provider=openai model=gpt-4o-mini input_tokens=90 output_tokens=12"),
        "{}",
        event.reason
    );
    assert_eq!(event.estimated_cost_usd, None);
    assert!(event.actual_cost_usd.is_some_and(|c| c > 0.0));
    assert_eq!(event.input_sha256, digest::digest(&input).0);
    assert_eq!(
        event.output_sha256,
        digest::digest(&json!({"text": answer})).0
    );
    assert!(verify(&app, "t1").await.ok);
    app.stop().await;
}
