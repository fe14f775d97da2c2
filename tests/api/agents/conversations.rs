//! Conversations (SPEC §11.6–11.7): team-scoped reads, erasure (also in
//! the middle of a turn), a second concurrent turn refused, a turn whose
//! caller left (mid-answer or still preparing) giving its conversation
//! back, memory suggestions stored on the turn, the retention sweeper, and
//! the same store on PostgreSQL.

use super::{
    agents, completed, conversation_id, converse, spawn, toml, turn,
    upstream::{Reply, Upstream, openai_error, openai_text, openai_tool_calls},
};
use crate::{
    common::{TestApp, TestPostgres},
    tools::{CALLER, MULTI, with_key},
};
use ai_orchestrator::{agent::conversations, api::pb};
use futures::StreamExt;
use pb::converse_event::Event;
use std::sync::Arc;
use tokio::sync::Notify;
use tonic::Code;
use tonic_types::StatusExt;

fn get(id: &str, team: &str) -> pb::GetConversationRequest {
    pb::GetConversationRequest {
        context: Some(pb::RequestContext {
            team_id: team.into(),
            ..Default::default()
        }),
        conversation_id: id.into(),
    }
}

fn delete(id: &str) -> pb::DeleteConversationRequest {
    pb::DeleteConversationRequest {
        context: crate::common::ctx(),
        conversation_id: id.into(),
    }
}

fn reason(status: &tonic::Status) -> String {
    status
        .get_details_error_info()
        .map(|i| i.reason)
        .unwrap_or_default()
}

#[tokio::test]
async fn a_conversation_is_its_teams_and_erased_on_delete() {
    let openai = Upstream::start([
        Reply::sse(openai_text(&["Hello."])),
        Reply::sse(openai_text(&["Again."])),
    ])
    .await;
    let app = spawn(&openai.url(), &openai.url(), "").await;
    let events = turn(&app, CALLER, "conv-1", converse("helper", "Hi", None))
        .await
        .unwrap();
    let id = conversation_id(&events);

    // Another team (a key of t1 and t2 asking as t2) finds nothing.
    let other = agents(&app)
        .get_conversation(with_key(MULTI, "conv-2", get(&id, "t2")))
        .await
        .unwrap_err();
    assert_eq!(other.code(), Code::NotFound);
    let mut as_t2 = converse("helper", "Hi", Some(&id));
    as_t2.context.as_mut().unwrap().team_id = "t2".into();
    let continued = turn(&app, MULTI, "conv-3", as_t2).await.unwrap_err();
    assert_eq!(
        (continued.code(), reason(&continued).as_str()),
        (Code::NotFound, "CONVERSATION_NOT_FOUND")
    );

    let mut other_delete = delete(&id);
    other_delete.context.as_mut().unwrap().team_id = "t2".into();
    let refused = agents(&app)
        .delete_conversation(with_key(MULTI, "conv-3b", other_delete))
        .await
        .unwrap_err();
    assert_eq!(
        refused.code(),
        Code::NotFound,
        "another team cannot erase it"
    );

    // Deleting erases the content; then it is gone for everyone.
    let deleted = agents(&app)
        .delete_conversation(with_key(CALLER, "conv-4", delete(&id)))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(deleted.messages_deleted, 2);
    let gone = agents(&app)
        .get_conversation(with_key(CALLER, "conv-5", get(&id, "t1")))
        .await
        .unwrap_err();
    assert_eq!(gone.code(), Code::NotFound);
    let again = agents(&app)
        .delete_conversation(with_key(CALLER, "conv-6", delete(&id)))
        .await
        .unwrap_err();
    assert_eq!(again.code(), Code::NotFound);
    let after = turn(&app, CALLER, "conv-7", converse("helper", "Hi", Some(&id)))
        .await
        .unwrap_err();
    assert_eq!(after.code(), Code::NotFound);
    let store = app.store().await;
    assert!(
        conversations::history(&store, &id, 100)
            .await
            .unwrap()
            .is_empty()
    );
}

/// A conversation's first turn, completed, then its second started and
/// running (its first delta out; the upstream holds the rest): the
/// conversation's ID and the second turn's events. Trace IDs are
/// `<trace>-1` and `<trace>-2`.
async fn second_turn_running(
    app: &TestApp,
    trace: &str,
) -> (String, tonic::Streaming<pb::ConverseEvent>) {
    let first = turn(
        app,
        CALLER,
        &format!("{trace}-1"),
        converse("helper", "One", None),
    )
    .await
    .unwrap();
    let id = conversation_id(&first);
    let mut second = agents(app)
        .converse(with_key(
            CALLER,
            &format!("{trace}-2"),
            converse("helper", "Two", Some(&id)),
        ))
        .await
        .unwrap()
        .into_inner();
    loop {
        match second.next().await {
            Some(Ok(pb::ConverseEvent {
                event: Some(Event::Delta(_)),
            })) => break,
            Some(Ok(_)) => continue,
            other => panic!("{other:?}"),
        }
    }
    (id, second)
}

#[tokio::test]
async fn a_second_turn_while_one_runs_is_aborted() {
    let gate = Arc::new(Notify::new());
    let openai = Upstream::start([
        Reply::sse(openai_text(&["First."])),
        Reply::sse(openai_text(&["Slow", " answer."])).gated(2, gate.clone()),
        Reply::sse(openai_text(&["Third."])),
    ])
    .await;
    let app = spawn(&openai.url(), &openai.url(), "").await;
    let (id, mut slow) = second_turn_running(&app, "busy").await;
    let refused = turn(
        &app,
        CALLER,
        "busy-3",
        converse("helper", "Three", Some(&id)),
    )
    .await
    .unwrap_err();
    assert_eq!(
        (refused.code(), reason(&refused).as_str()),
        (Code::Aborted, "CONVERSATION_BUSY")
    );
    gate.notify_one();
    while let Some(item) = slow.next().await {
        item.unwrap();
    }
    // Once it ended, the conversation takes the next turn.
    let third = turn(
        &app,
        CALLER,
        "busy-4",
        converse("helper", "Three", Some(&id)),
    )
    .await
    .unwrap();
    assert_eq!(completed(&third).text, "Third.");
}

/// A conversation erased while a turn runs keeps nothing of that turn: the
/// turn's rows are written behind the release of its lease, which the
/// erasure took with it, so the turn completes (there is nothing left to
/// store it in) and no orphan message or turn row appears.
#[tokio::test]
async fn a_conversation_erased_during_a_turn_keeps_none_of_it() {
    let gate = Arc::new(Notify::new());
    let openai = Upstream::start([
        Reply::sse(openai_text(&["First."])),
        Reply::sse(openai_text(&["Slow", " answer."])).gated(2, gate.clone()),
    ])
    .await;
    let app = spawn(&openai.url(), &openai.url(), "").await;
    let (id, mut slow) = second_turn_running(&app, "erase").await;
    let deleted = agents(&app)
        .delete_conversation(with_key(CALLER, "erase-3", delete(&id)))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(deleted.messages_deleted, 2, "the first turn's two messages");
    gate.notify_one();
    let mut last = None;
    while let Some(item) = slow.next().await {
        last = item.unwrap().event;
    }
    assert!(matches!(last, Some(Event::Completed(_))), "{last:?}");
    let store = app.store().await;
    assert!(
        conversations::history(&store, &id, 100)
            .await
            .unwrap()
            .is_empty()
    );
    assert!(conversations::turns(&store, &id).await.unwrap().is_empty());
    // Its end is in the audit log all the same, written with the rows the
    // guard left out, after its model call's event.
    let ends: Vec<String> = crate::tools::events(&app, "t1")
        .await
        .into_iter()
        .filter(|e| e.trace_id == "erase-2")
        .map(|e| e.action)
        .collect();
    assert_eq!(
        ends,
        ["agent.turn.start", "call.completed", "agent.turn.complete"]
    );
}

#[tokio::test]
async fn memory_suggestions_are_filtered_emitted_and_stored_on_the_turn() {
    let unused = Upstream::start([]).await;
    let app = spawn(&unused.url(), &unused.url(), "").await;
    let events = turn(
        &app,
        CALLER,
        "memo-1",
        converse("memo", "I like mornings.", None),
    )
    .await
    .unwrap();
    let items = events
        .iter()
        .find_map(|e| match e {
            Event::MemorySuggestions(m) => Some(m.items.clone()),
            _ => None,
        })
        .expect("a memory_suggestions event");
    // The secret, the duplicate and the empty one are dropped.
    assert_eq!(items, ["Prefers morning appointments", "Has two dogs"]);
    assert_eq!(completed(&events).text, "Noted: mornings work.");
    let conversation = agents(&app)
        .get_conversation(with_key(
            CALLER,
            "memo-2",
            get(&conversation_id(&events), "t1"),
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(conversation.memory_suggestions.len(), 1);
    assert_eq!(conversation.memory_suggestions[0].turn, 1);
    assert_eq!(conversation.memory_suggestions[0].items, items);
    assert_eq!(conversation.messages[1].content, "Noted: mornings work.");
}

#[tokio::test]
async fn unknown_agents_and_empty_messages_are_invalid() {
    let unused = Upstream::start([]).await;
    let app = spawn(&unused.url(), &unused.url(), "").await;
    let unknown = turn(&app, CALLER, "bad-1", converse("nobody", "Hi", None))
        .await
        .unwrap_err();
    assert_eq!(
        (unknown.code(), reason(&unknown).as_str()),
        (Code::InvalidArgument, "AGENT_UNKNOWN")
    );
    // The refusal names the agents there are, as `--group-by` names its choices.
    assert!(
        unknown
            .message()
            .contains("unknown agent `nobody`; known agents: busy_tools, helper, looper"),
        "{}",
        unknown.message()
    );
    let empty = turn(&app, CALLER, "bad-2", converse("helper", "  ", None))
        .await
        .unwrap_err();
    assert_eq!(empty.code(), Code::InvalidArgument);
}

/// A turn with a tool call, a continued turn that replays it, a read, and
/// the sweeper on `app`.
async fn round_trip(app: &TestApp, openai: &Upstream) {
    let first = turn(app, CALLER, "pg-1", converse("helper", "One", None))
        .await
        .unwrap();
    let id = conversation_id(&first);
    turn(app, CALLER, "pg-2", converse("helper", "Two", Some(&id)))
        .await
        .unwrap();
    let read = agents(app)
        .get_conversation(with_key(CALLER, "pg-3", get(&id, "t1")))
        .await
        .unwrap()
        .into_inner();
    let roles: Vec<&str> = read.messages.iter().map(|m| m.role.as_str()).collect();
    assert_eq!(
        roles,
        [
            "user",
            "assistant",
            "tool",
            "assistant",
            "user",
            "assistant"
        ]
    );
    let call = &read.messages[1].tool_calls[0];
    assert_eq!(
        (call.id.as_str(), call.tool.as_str()),
        ("call_R1", "system.echo")
    );
    assert_eq!(call.arguments, r#"{"text": "one"}"#);
    let result = read.messages[2].tool_result.as_ref().unwrap();
    assert_eq!(
        (result.call_id.as_str(), result.is_error),
        ("call_R1", false)
    );
    assert_eq!(read.messages[5].content, "Second.");
    assert_eq!(read.turns, 2);
    // The second turn sent the stored tool call and result back.
    let bodies = openai.bodies();
    assert_eq!(bodies.len(), 3);
    let sent = bodies[2]["messages"].as_array().unwrap();
    assert_eq!(sent[2]["tool_calls"][0]["id"], "call_R1");
    assert_eq!(sent[2]["tool_calls"][0]["function"]["name"], "system__echo");
    assert_eq!(sent[3]["role"], "tool");
    assert_eq!(sent[3]["tool_call_id"], "call_R1");
    // Nothing has expired yet; past its retention it reads as gone, and
    // the sweeper erases it.
    let store = app.store().await;
    let now = chrono::Utc::now().timestamp_millis();
    assert_eq!(conversations::sweep(&store, now).await.unwrap(), 0);
    let later = read.expires_at_ms + 1;
    assert!(
        conversations::find(&store, "t1", &id, later)
            .await
            .unwrap()
            .is_none()
    );
    assert_eq!(conversations::sweep(&store, later).await.unwrap(), 1);
    assert!(
        conversations::find(&store, "t1", &id, 0)
            .await
            .unwrap()
            .is_none()
    );
    assert!(
        conversations::history(&store, &id, 10)
            .await
            .unwrap()
            .is_empty()
    );
}

fn two_turns() -> [Reply; 3] {
    [
        Reply::sse(openai_tool_calls(&[(
            "call_R1",
            "system__echo",
            &[r#"{"text": "one"}"#],
        )])),
        Reply::sse(openai_text(&["First."])),
        Reply::sse(openai_text(&["Second."])),
    ]
}

#[tokio::test]
async fn a_failed_turn_stores_nothing_and_frees_its_conversation() {
    let openai = Upstream::start([
        Reply::sse(openai_text(&["Hello."])),
        openai_error(500),
        Reply::sse(openai_text(&["Back."])),
    ])
    .await;
    // Anthropic is down too: the second turn fails.
    let anthropic = Upstream::start([openai_error(500)]).await;
    let app = spawn(&openai.url(), &anthropic.url(), "").await;
    let first = turn(&app, CALLER, "fail-1", converse("helper", "Hi", None))
        .await
        .unwrap();
    let id = conversation_id(&first);
    let failed = turn(
        &app,
        CALLER,
        "fail-2",
        converse("helper", "Again", Some(&id)),
    )
    .await
    .unwrap_err();
    assert_eq!(
        (failed.code(), reason(&failed).as_str()),
        (Code::Unavailable, "ALL_PROVIDERS_FAILED")
    );
    // Audited as failed, durably, before the error was answered: its model
    // call (the reason first, its figures after) and the turn.
    let audit: Vec<(String, String, String)> = crate::tools::events(&app, "t1")
        .await
        .into_iter()
        .filter(|e| e.trace_id == "fail-2")
        .map(|e| {
            let reason = e.reason.split(' ').next().unwrap_or_default().to_owned();
            (e.action, e.decision, reason)
        })
        .collect();
    assert_eq!(
        audit,
        [
            ("agent.turn.start".into(), "allow".into(), String::new()),
            (
                "call.failed".into(),
                "error".into(),
                "ALL_PROVIDERS_FAILED".into()
            ),
            (
                "agent.turn.failed".into(),
                "error".into(),
                "ALL_PROVIDERS_FAILED".into()
            ),
        ]
    );
    // The lease is back at once, and the failed turn left no message.
    let third = turn(
        &app,
        CALLER,
        "fail-3",
        converse("helper", "Third", Some(&id)),
    )
    .await
    .unwrap();
    assert_eq!(completed(&third).text, "Back.");
    let read = agents(&app)
        .get_conversation(with_key(CALLER, "fail-4", get(&id, "t1")))
        .await
        .unwrap()
        .into_inner();
    let texts: Vec<&str> = read.messages.iter().map(|m| m.content.as_str()).collect();
    assert_eq!(texts, ["Hi", "Hello.", "Third", "Back."]);
}

#[tokio::test]
async fn a_turn_whose_caller_left_gives_its_conversation_back() {
    let never = Arc::new(Notify::new());
    let openai = Upstream::start([
        Reply::sse(openai_text(&["First."])),
        Reply::sse(openai_text(&["Slow", " answer."])).gated(2, never),
        Reply::sse(openai_text(&["Next."])),
    ])
    .await;
    let app = spawn(&openai.url(), &openai.url(), "").await;
    let first = turn(&app, CALLER, "left-0", converse("helper", "One", None))
        .await
        .unwrap();
    let id = conversation_id(&first);
    let mut stream = agents(&app)
        .converse(with_key(
            CALLER,
            "left-1",
            converse("helper", "Two", Some(&id)),
        ))
        .await
        .unwrap()
        .into_inner();
    loop {
        match stream.next().await {
            Some(Ok(pb::ConverseEvent {
                event: Some(Event::Delta(_)),
            })) => break,
            Some(Ok(_)) => continue,
            other => panic!("{other:?}"),
        }
    }
    // The caller goes away mid-answer: the conversation is free again at
    // once (not at the lease's end), and the cut turn stored nothing.
    drop(stream);
    the_next_turn_is_served_and_the_cut_one_left_nothing(&app, &id, "left-2").await;
    // Its model call in flight was charged as CANCELLED, in its
    // conversation and iteration, so per-conversation usage sees it.
    let store = app.store().await;
    let cancelled = || {
        let store = store.clone();
        async move {
            let records = ai_orchestrator::usage::record::by_trace(&store, "left-1").await;
            records
                .unwrap_or_default()
                .into_iter()
                .find(|r| r.outcome == "CANCELLED")
        }
    };
    crate::common::wait_for(|| async { cancelled().await.is_some() }).await;
    let cancelled = cancelled().await.unwrap();
    assert_eq!(
        (cancelled.conversation_id.as_str(), cancelled.iteration),
        (id.as_str(), 1)
    );
}

/// Waits until a turn on conversation `id` (opened with "One" / "First.")
/// is served "Next.", then checks the turn cut before it stored nothing.
async fn the_next_turn_is_served_and_the_cut_one_left_nothing(
    app: &TestApp,
    id: &str,
    trace: &str,
) {
    crate::common::wait_for(|| async move {
        turn(app, CALLER, trace, converse("helper", "Three", Some(id)))
            .await
            .is_ok_and(|events| completed(&events).text == "Next.")
    })
    .await;
    let texts: Vec<String> = conversations::history(&app.store().await, id, 10)
        .await
        .unwrap()
        .into_iter()
        .map(|m| m.message.content)
        .collect();
    assert_eq!(texts, ["One", "First.", "Three", "Next."]);
}

#[tokio::test]
async fn a_turn_dropped_while_it_prepares_gives_its_conversation_back() {
    // On PostgreSQL a lock on the history holds the second turn in
    // `prepare`, after its lease was taken and before any event.
    let pg = TestPostgres::create().await;
    // A spare reply: should the held turn outlive its caller after all,
    // whichever turn asks next still hears "Next.".
    let openai = Upstream::start([
        Reply::sse(openai_text(&["First."])),
        Reply::sse(openai_text(&["Next."])),
        Reply::sse(openai_text(&["Next."])),
    ])
    .await;
    let app =
        TestApp::spawn_toml_env(&toml(&pg.url, &openai.url(), &openai.url(), ""), super::env).await;
    let first = turn(&app, CALLER, "prep-0", converse("helper", "One", None))
        .await
        .unwrap();
    let id = conversation_id(&first);

    let db = sqlx::PgPool::connect(&pg.url).await.unwrap();
    let mut lock = db.begin().await.unwrap();
    sqlx::query("LOCK TABLE conversation_messages IN ACCESS EXCLUSIVE MODE")
        .execute(&mut *lock)
        .await
        .unwrap();
    let held = tokio::spawn({
        let mut client = agents(&app);
        let request = with_key(CALLER, "prep-1", converse("helper", "Two", Some(&id)));
        async move { client.converse(request).await.map(|_| ()) }
    });
    let db_ref = &db;
    crate::common::wait_for(|| async move {
        sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
             AND wait_event_type = 'Lock' AND query LIKE '%conversation_messages%'",
        )
        .fetch_one(db_ref)
        .await
        .unwrap()
            > 0
    })
    .await;
    // The caller goes away while the turn waits: the conversation is free
    // again at once, not when the lease (deadline + 30 s) runs out.
    held.abort();
    assert!(held.await.unwrap_err().is_cancelled());
    lock.rollback().await.unwrap();
    the_next_turn_is_served_and_the_cut_one_left_nothing(&app, &id, "prep-2").await;
    db.close().await;
    app.stop().await;
    pg.drop_now().await;
}

/// An ID far longer than any real one is still an answer with its code:
/// the error repeats a bounded part of it (a status rides in the trailers,
/// which clients refuse past 16 KiB).
#[tokio::test]
async fn a_huge_conversation_id_is_not_found_not_a_transport_error() {
    let openai = Upstream::start([]).await;
    let app = spawn(&openai.url(), &openai.url(), "").await;
    let id = "x".repeat(40_000);
    let err = agents(&app)
        .get_conversation(with_key(CALLER, "huge-id", get(&id, "t1")))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound, "{}", err.message());
    assert!(err.message().len() < 2_000, "{}", err.message().len());
    let err = agents(&app)
        .delete_conversation(with_key(CALLER, "huge-id-2", delete(&id)))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
}

/// An agent name of tens of KiB (within the request's 64 KiB) is still
/// AGENT_UNKNOWN: the error's violation repeats a bounded part of it, so
/// the status's trailers stay far below what a client accepts.
#[tokio::test]
async fn a_huge_unknown_agent_name_is_invalid_argument_not_a_transport_error() {
    let openai = Upstream::start([]).await;
    let app = spawn(&openai.url(), &openai.url(), "").await;
    let name = "a".repeat(40_000);
    let err = turn(&app, CALLER, "huge-agent", converse(&name, "hi", None))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{}", err.message());
    assert_eq!(
        err.get_details_error_info().unwrap().reason,
        "AGENT_UNKNOWN"
    );
    let violation = &err.get_details_bad_request().unwrap().field_violations[0];
    assert_eq!(violation.field, "agent");
    assert!(
        violation.description.len() < 300,
        "{}",
        violation.description.len()
    );
    assert!(err.message().len() < 2_000, "{}", err.message().len());
}

#[tokio::test]
async fn conversations_round_trip_and_expire_on_sqlite() {
    let openai = Upstream::start(two_turns()).await;
    let app = spawn(&openai.url(), &openai.url(), "").await;
    round_trip(&app, &openai).await;
}

#[tokio::test]
async fn conversations_round_trip_and_expire_on_postgres() {
    let pg = TestPostgres::create().await;
    let openai = Upstream::start(two_turns()).await;
    let app =
        TestApp::spawn_toml_env(&toml(&pg.url, &openai.url(), &openai.url(), ""), super::env).await;
    round_trip(&app, &openai).await;
    app.stop().await;
    pg.drop_now().await;
}
