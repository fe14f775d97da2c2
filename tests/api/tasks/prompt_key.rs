//! `ExecuteRequest.prompt_key` (SPEC §14.4): a call renders the named key's
//! stored version (the team's, else the global one, never a built-in) in
//! place of the task's own prompt. The upstream receives its text; the
//! response meta and the usage record name it. An unknown key is NOT_FOUND
//! (`PROMPT_NOT_FOUND`), a malformed one INVALID_ARGUMENT; neither reaches
//! a provider.

use crate::common::{TestApp, ctx};
use ai_orchestrator::{
    api::pb::{self, execute_event::Event, prompt_admin_client::PromptAdminClient},
    usage::record,
};
use serde_json::json;
use tonic::Code;
use tonic_types::StatusExt;
use wiremock::{Mock, MockServer, ResponseTemplate, matchers::method};

/// A Chat Completions success whose content is `content`.
fn completion(content: &str) -> ResponseTemplate {
    ResponseTemplate::new(200).set_body_json(json!({
        "id": "chatcmpl-AbC125",
        "object": "chat.completion",
        "created": 1_732_000_000,
        "model": "gpt-4o-mini-2024-07-18",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content, "refusal": null},
                     "logprobs": null, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 90, "completion_tokens": 12, "total_tokens": 102},
        "system_fingerprint": "fp_0ba0d124f1"
    }))
}

/// A Chat Completions stream answering "Meet Acme at 10." in two deltas, with its usage.
fn streamed() -> ResponseTemplate {
    let chunk = |delta: serde_json::Value, finish: serde_json::Value| {
        json!({"id": "chatcmpl-10", "object": "chat.completion.chunk", "created": 1_732_000_000,
               "model": "gpt-4o-mini", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
    };
    let mut sse = String::new();
    for (delta, finish) in [
        (json!({"role": "assistant", "content": ""}), json!(null)),
        (json!({"content": "Meet "}), json!(null)),
        (json!({"content": "Acme at 10."}), json!(null)),
        (json!({}), json!("stop")),
    ] {
        sse.push_str(&format!("data: {}\n\n", chunk(delta, finish)));
    }
    sse.push_str(&format!(
        "data: {}\n\n",
        json!({"id": "chatcmpl-10", "object": "chat.completion.chunk", "created": 1_732_000_000,
               "model": "gpt-4o-mini", "choices": [],
               "usage": {"prompt_tokens": 50, "completion_tokens": 6, "total_tokens": 56}})
    ));
    sse.push_str("data: [DONE]\n\n");
    ResponseTemplate::new(200)
        .insert_header("content-type", "text/event-stream")
        .set_body_string(sse)
}

/// A server whose `meeting_brief` chain is one OpenAI target at `upstream`.
async fn spawn(upstream: &MockServer) -> TestApp {
    let dir = tempfile::tempdir().unwrap();
    let toml = format!(
        r#"
[server]
default_timeout = "10s"
[retry]
max_attempts = 1
[database]
url = "sqlite://{}"
[providers.openai]
kind = "openai"
base_url = "{}/v1"
api_key_env = "TEST_OPENAI_KEY"
timeout = "2s"
[tasks.meeting_brief]
chain = [{{ provider = "openai", model = "gpt-4o-mini" }}]
[pricing."gpt-4o-mini"]
input_per_mtok = 0.15
output_per_mtok = 0.60
"#,
        dir.path().join("prompt_key.db").display(),
        upstream.uri()
    );
    let mut app = TestApp::spawn_toml_env(&toml, |name| {
        (name == "TEST_OPENAI_KEY").then(|| "sk-test".to_owned())
    })
    .await;
    app.keep(dir);
    app
}

/// Creates version 1 of `key` for `team` ('' = global), active, with a
/// `system` prompt and a user template asking for `{{company}}`.
async fn activate(app: &TestApp, team: &str, key: &str, system: &str, user: &str) {
    PromptAdminClient::new(app.channel.clone())
        .create_prompt_version(pb::CreatePromptVersionRequest {
            team_id: team.into(),
            prompt_key: key.into(),
            system_prompt: system.into(),
            user_prompt_template: user.into(),
            activate: true,
            ..Default::default()
        })
        .await
        .unwrap();
}

/// `meeting_brief` about Acme for `team`, naming `prompt_key`, traced as `trace`.
fn brief(team: &str, prompt_key: &str, trace: &str) -> pb::ExecuteRequest {
    let mut context = ctx().unwrap();
    context.team_id = team.into();
    context.trace_id = trace.into();
    pb::ExecuteRequest {
        context: Some(context),
        task: "meeting_brief".into(),
        input: Some(pb::execute_request::Input::InputJson(
            r#"{"company":"Acme"}"#.into(),
        )),
        prompt_key: prompt_key.into(),
        ..Default::default()
    }
}

/// The bodies the upstream received, in order, as text.
async fn bodies(upstream: &MockServer) -> Vec<String> {
    upstream
        .received_requests()
        .await
        .unwrap()
        .iter()
        .map(|r| String::from_utf8_lossy(&r.body).into_owned())
        .collect()
}

/// `(prompt_key, prompt_version)` of the one usage record of `trace`.
async fn recorded_prompt(app: &TestApp, trace: &str) -> (String, i64) {
    let store = app.store().await;
    let records = record::by_trace(&store, trace).await.unwrap();
    store.close().await;
    assert_eq!(records.len(), 1, "{records:?}");
    assert_eq!(records[0].task, "meeting_brief");
    (records[0].prompt_key.clone(), records[0].prompt_version)
}

fn prompt_of(meta: Option<&pb::ResponseMeta>) -> (String, u32) {
    let meta = meta.unwrap();
    (meta.prompt_key.clone(), meta.prompt_version)
}

/// The named key beats the task's own (the team has both): its texts are
/// what the upstream receives, and the meta and the usage record name it.
/// Without a key the same team gets the task's own prompt.
#[tokio::test]
async fn the_named_prompt_key_is_rendered_sent_and_recorded() {
    let upstream = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(completion("Acme: meet at 10."))
        .mount(&upstream)
        .await;
    let app = spawn(&upstream).await;
    let (own, short) = (
        "Full brief for {{company}}.",
        "Short brief for {{company}}.",
    );
    activate(&app, "t1", "meeting_brief", "Write the FULL brief.", own).await;
    activate(&app, "t1", "brief_short", "Write a SHORT brief.", short).await;

    let r = app
        .client
        .clone()
        .execute(brief("t1", "brief_short", "pk-named"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.text, "Acme: meet at 10.");
    assert_eq!(prompt_of(r.meta.as_ref()), ("brief_short".into(), 1));
    let sent = bodies(&upstream).await;
    assert_eq!(sent.len(), 1);
    assert!(
        sent[0].contains("Write a SHORT brief.") && sent[0].contains("Short brief for Acme."),
        "{}",
        sent[0]
    );
    assert!(!sent[0].contains("FULL"), "{}", sent[0]);
    assert_eq!(
        recorded_prompt(&app, "pk-named").await,
        ("brief_short".into(), 1)
    );

    let r = app
        .client
        .clone()
        .execute(brief("t1", "", "pk-own"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(prompt_of(r.meta.as_ref()), ("meeting_brief".into(), 1));
    let sent = bodies(&upstream).await;
    assert!(sent[1].contains("Full brief for Acme."), "{}", sent[1]);
    assert_eq!(
        recorded_prompt(&app, "pk-own").await,
        ("meeting_brief".into(), 1)
    );
    app.stop().await;
}

/// ExecuteStream takes the same request: the named key is streamed with,
/// and its completed event and usage record name it.
#[tokio::test]
async fn execute_stream_renders_the_named_prompt_key_too() {
    let upstream = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(streamed())
        .mount(&upstream)
        .await;
    let app = spawn(&upstream).await;
    let short = "Short brief for {{company}}.";
    activate(&app, "t1", "brief_short", "Write a SHORT brief.", short).await;

    let mut stream = app
        .client
        .clone()
        .execute_stream(brief("t1", "brief_short", "pk-stream"))
        .await
        .unwrap()
        .into_inner();
    let mut last = None;
    while let Some(event) = stream.message().await.unwrap() {
        last = event.event;
    }
    let Some(Event::Completed(done)) = &last else {
        panic!("no completed event: {last:?}")
    };
    assert_eq!(done.text, "Meet Acme at 10.");
    assert_eq!(prompt_of(done.meta.as_ref()), ("brief_short".into(), 1));
    let sent = bodies(&upstream).await;
    assert_eq!(sent.len(), 1);
    assert!(sent[0].contains("Short brief for Acme."), "{}", sent[0]);
    assert_eq!(
        recorded_prompt(&app, "pk-stream").await,
        ("brief_short".into(), 1)
    );
    app.stop().await;
}

/// A global key serves a team without its own version; a team's own
/// version shadows it for that team only.
#[tokio::test]
async fn a_global_prompt_key_serves_a_team_without_its_own() {
    let upstream = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(completion("ok"))
        .mount(&upstream)
        .await;
    let app = spawn(&upstream).await;
    let global = "Global short brief for {{company}}.";
    activate(&app, "", "brief_short", "Write a GLOBAL brief.", global).await;
    activate(&app, "", "brief_short", "Write a GLOBAL brief.", global).await;
    let team = "Team short brief for {{company}}.";
    activate(&app, "t1", "brief_short", "Write the team's brief.", team).await;

    let mut c = app.client.clone();
    let r = c
        .execute(brief("t2", "brief_short", "pk-global"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        prompt_of(r.meta.as_ref()),
        ("brief_short".into(), 2),
        "t2 has none of its own: the global active version"
    );
    let r = c
        .execute(brief("t1", "brief_short", "pk-team"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(prompt_of(r.meta.as_ref()), ("brief_short".into(), 1));
    let sent = bodies(&upstream).await;
    assert!(
        sent[0].contains("Global short brief for Acme."),
        "{}",
        sent[0]
    );
    assert!(
        sent[1].contains("Team short brief for Acme."),
        "{}",
        sent[1]
    );
    assert_eq!(
        recorded_prompt(&app, "pk-global").await,
        ("brief_short".into(), 2)
    );
    app.stop().await;
}

/// No stored version for the team or globally is NOT_FOUND with reason
/// `PROMPT_NOT_FOUND`, on both RPCs: an unknown key, another team's key,
/// and a task's name with only its built-in (a named key never falls back
/// to one). Nothing reaches the provider and nothing is recorded.
#[tokio::test]
async fn an_unknown_prompt_key_is_not_found() {
    let upstream = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(completion("never"))
        .mount(&upstream)
        .await;
    let app = spawn(&upstream).await;
    let theirs = "Their brief for {{company}}.";
    activate(&app, "t2", "brief_t2", "Write t2's brief.", theirs).await;

    let mut c = app.client.clone();
    for key in ["no_such_prompt", "brief_t2", "meeting_brief"] {
        let unary = c.execute(brief("t1", key, "pk-unknown")).await.unwrap_err();
        let streamed = c
            .execute_stream(brief("t1", key, "pk-unknown"))
            .await
            .unwrap_err();
        for status in [unary, streamed] {
            assert_eq!(status.code(), Code::NotFound, "{key}: {status:?}");
            let info = status.get_details_error_info().unwrap();
            assert_eq!(info.reason, "PROMPT_NOT_FOUND", "{key}");
            assert_eq!(info.metadata["prompt_key"], key);
            assert_eq!(info.metadata["trace_id"], "pk-unknown");
            assert!(status.message().contains(key), "{}", status.message());
        }
    }
    assert!(bodies(&upstream).await.is_empty());
    let store = app.store().await;
    let records = record::by_trace(&store, "pk-unknown").await.unwrap();
    store.close().await;
    assert!(
        records.is_empty(),
        "a refusal leaves no record: {records:?}"
    );
    app.stop().await;
}

/// A key no version could be stored under (blank, control characters, over
/// 128 bytes) is INVALID_ARGUMENT with a violation on `prompt_key`.
#[tokio::test]
async fn a_malformed_prompt_key_is_invalid_argument() {
    let upstream = MockServer::start().await;
    let app = spawn(&upstream).await;
    let mut c = app.client.clone();
    let too_long = "k".repeat(129);
    for key in ["two\nlines", "tab\there", "   ", too_long.as_str()] {
        let unary = c.execute(brief("t1", key, "pk-bad")).await.unwrap_err();
        let streamed = c
            .execute_stream(brief("t1", key, "pk-bad"))
            .await
            .unwrap_err();
        for status in [unary, streamed] {
            assert_eq!(status.code(), Code::InvalidArgument, "{key:?}: {status:?}");
            let reason = status.get_details_error_info().unwrap().reason;
            assert_eq!(reason, "INVALID_INPUT", "{key:?}");
            let bad = status.get_details_bad_request().unwrap();
            assert_eq!(bad.field_violations[0].field, "prompt_key", "{key:?}");
        }
    }
    assert!(bodies(&upstream).await.is_empty());
    app.stop().await;
}
