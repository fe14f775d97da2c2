//! Agents (SPEC §11) end to end: the real server with auth, the generated
//! client, fake providers speaking OpenAI's and Anthropic's wire formats
//! over real HTTP (streams sent frame by frame), the scripted mock, real
//! SQLite files and PostgreSQL.

pub mod approvals;
mod conversations;
mod edges;
mod golden;
mod guardrails;
mod history;
mod layers;
pub mod upstream;

use crate::{
    common::TestApp,
    tools::{tools_extra, with_key},
};
use ai_orchestrator::api::pb::{self, agent_service_client::AgentServiceClient};
use futures::StreamExt;
use pb::converse_event::Event;
use tonic::{Status, transport::Channel};

/// The agents' config on `database_url`, OpenAI and Anthropic at these
/// base URLs, `extra` appended.
pub fn toml(database_url: &str, openai: &str, anthropic: &str, extra: &str) -> String {
    toml_with(database_url, openai, anthropic, "http://127.0.0.1:9", extra)
}

/// Like [`toml`], the workflow tools posting to `webhook`.
pub fn toml_with(
    database_url: &str,
    openai: &str,
    anthropic: &str,
    webhook: &str,
    extra: &str,
) -> String {
    format!(
        r#"
[server]
listen = "127.0.0.1:0"
default_timeout = "10s"
health_probe_interval = "1s"

[database]
url = "{database_url}"
max_connections = 4

[providers.openai]
kind = "openai"
base_url = "{openai}"
api_key_env = "TEST_OPENAI_KEY"
timeout = "5s"

[providers.anthropic]
kind = "anthropic"
base_url = "{anthropic}"
api_key_env = "TEST_ANTHROPIC_KEY"
timeout = "5s"

[providers.scripted]
kind = "mock"
[providers.scripted.mock]
tool_script = [
  [{{ tool = "system.echo", arguments = '{{"text":"a"}}' }}, {{ tool = "system.echo", arguments = '{{"text":"b"}}' }}, {{ tool = "system.echo", arguments = '{{"text":"c"}}' }}],
  [{{ tool = "system.echo", arguments = '{{"text":"d"}}' }}],
  [{{ tool = "system.echo", arguments = '{{"text":"e"}}' }}],
]

[providers.memo]
kind = "mock"
[providers.memo.mock]
reply = '{{"content": "Noted: mornings work.", "memory_suggestions": ["Prefers morning appointments", "Password is hunter2", "prefers morning appointments", "", "Her access_token is x1", "Reach her at ann@example.com", "Has two dogs"]}}'

[retry]
interactive_max_wait = "0ms"

[pricing."gpt-4o-mini"]
input_per_mtok = 0.15
output_per_mtok = 0.60
[pricing."claude-3-haiku-20240307"]
input_per_mtok = 0.25
output_per_mtok = 1.25

[agents.helper]
chain = [{{ provider = "openai", model = "gpt-4o-mini" }}, {{ provider = "anthropic", model = "claude-3-haiku-20240307" }}]
core_prompt = "You are the test agent. Use tools when asked."
tools = ["system.*", "crm.*"]

[agents.busy_tools]
chain = [{{ provider = "scripted", model = "gpt-4o-mini" }}]
core_prompt = "You call tools."
tools = ["system.*"]
max_tool_calls = 2

[agents.looper]
chain = [{{ provider = "scripted", model = "gpt-4o-mini" }}]
core_prompt = "You call tools."
tools = ["system.*"]
max_iterations = 2
parallel_tool_calls = false

[agents.memo]
chain = [{{ provider = "memo", model = "gpt-4o-mini" }}]
core_prompt = "You remember."
memory_suggestions = true
{tools}
{extra}
"#,
        tools = tools_extra(webhook),
    )
}

/// The environment the config reads.
pub fn env(name: &str) -> Option<String> {
    match name {
        "TEST_OPENAI_KEY" => Some("sk-test-openai".into()),
        "TEST_ANTHROPIC_KEY" => Some("sk-ant-test".into()),
        other => crate::tools::env(other),
    }
}

/// A server on a fresh SQLite file.
pub async fn spawn(openai: &str, anthropic: &str, extra: &str) -> TestApp {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("agents.db").display());
    let mut app = TestApp::spawn_toml_env(&toml(&url, openai, anthropic, extra), env).await;
    app.keep(dir);
    app
}

/// The agent service on `app`.
pub fn agents(app: &TestApp) -> AgentServiceClient<Channel> {
    AgentServiceClient::new(app.channel.clone())
}

/// A turn of `agent` for team t1 (in `conversation`, if any).
pub fn converse(agent: &str, message: &str, conversation: Option<&str>) -> pb::ConverseRequest {
    let mut context = crate::common::ctx().unwrap();
    if let Some(id) = conversation {
        context.conversation_id = id.into();
    }
    pb::ConverseRequest {
        context: Some(context),
        agent: agent.into(),
        message: message.into(),
        ..Default::default()
    }
}

/// Every event of a turn as `key`, or the status it failed with (before
/// or during the stream).
pub async fn turn(
    app: &TestApp,
    key: &str,
    trace: &str,
    req: pb::ConverseRequest,
) -> Result<Vec<Event>, Status> {
    let mut stream = agents(app)
        .converse(with_key(key, trace, req))
        .await?
        .into_inner();
    let mut events = Vec::new();
    while let Some(item) = stream.next().await {
        events.push(item?.event.expect("an event"));
    }
    Ok(events)
}

/// The turn's `completed` event.
pub fn completed(events: &[Event]) -> &pb::TurnCompleted {
    match events.last() {
        Some(Event::Completed(c)) => c,
        other => panic!("the last event is not completed: {other:?}"),
    }
}

/// The conversation the turn ran in (from `started`).
pub fn conversation_id(events: &[Event]) -> String {
    match events.first() {
        Some(Event::Started(s)) => s.conversation_id.clone(),
        other => panic!("the first event is not started: {other:?}"),
    }
}

/// The events' kinds, in order (deltas merged into one).
pub fn kinds(events: &[Event]) -> Vec<&'static str> {
    let mut out: Vec<&'static str> = Vec::new();
    for e in events {
        let kind = match e {
            Event::Started(_) => "started",
            Event::Delta(_) => "delta",
            Event::ToolCall(_) => "tool_call",
            Event::ToolResult(_) => "tool_result",
            Event::Fallback(_) => "fallback",
            Event::MemorySuggestions(_) => "memory_suggestions",
            Event::ApprovalRequired(_) => "approval_required",
            Event::Completed(_) => "completed",
        };
        if !(kind == "delta" && out.last() == Some(&"delta")) {
            out.push(kind);
        }
    }
    out
}
