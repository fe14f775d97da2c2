//! An agent turn's spans (SPEC §11, issue #28): in a process of its own,
//! so no other span test's subscriber or server shares its tracing state.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed expectation is the assertion

#[path = "api/common.rs"]
#[allow(dead_code)]
mod common;
#[path = "api/span_capture.rs"]
mod span_capture;

use ai_orchestrator::api::pb;
use common::{TestApp, ctx};
use span_capture::capture_spans;

/// One `invoke_agent <name>` span per turn under the Converse RPC's span,
/// with each model call's attempt span and each tool call's span as its
/// children.
#[tokio::test]
async fn an_agent_turn_is_a_span_with_its_model_and_tool_calls_as_children() {
    use futures::StreamExt;

    let capture = capture_spans(1.0).await;
    let dir = tempfile::tempdir().unwrap();
    let toml = format!(
        r#"
[database]
url = "sqlite://{}"
[providers.m]
kind = "mock"
[providers.m.mock]
tool_script = [[{{ tool = "system.echo", arguments = '{{"text":"x"}}' }}, {{ tool = "system.echo", arguments = '{{"text":"y"}}' }}]]
[pricing.x]
price = "unknown"
[agents.helper]
chain = [{{ provider = "m", model = "x" }}]
core_prompt = "You help."
tools = ["system.*"]
"#,
        dir.path().join("t.db").display(),
    );
    let app = TestApp::spawn_toml(&toml).await;
    let mut agents = pb::agent_service_client::AgentServiceClient::new(app.channel.clone());
    let mut events = agents
        .converse(pb::ConverseRequest {
            context: ctx(),
            agent: "helper".into(),
            message: "Echo twice.".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let mut last = None;
    while let Some(event) = events.next().await {
        last = event.unwrap().event;
    }
    assert!(matches!(
        last,
        Some(pb::converse_event::Event::Completed(_))
    ));
    app.stop().await;

    let spans = capture
        .spans_once("ai.orchestrator.v1.AgentService/Converse", 1)
        .await;
    let turn = spans
        .iter()
        .find(|s| s.name == "invoke_agent helper")
        .unwrap_or_else(|| panic!("a turn span: {spans:#?}"));
    // The turn is a child of the request's span.
    let rpc = spans
        .iter()
        .find(|s| s.span_context.span_id() == turn.parent_span_id)
        .unwrap_or_else(|| panic!("the RPC's span, parent of the turn's: {spans:#?}"));
    assert_eq!(rpc.name, "ai.orchestrator.v1.AgentService/Converse");
    let children: Vec<&str> = spans
        .iter()
        .filter(|s| s.parent_span_id == turn.span_context.span_id())
        .map(|s| s.name.as_ref())
        .collect();
    let model_calls = children.iter().filter(|n| n.starts_with("chat ")).count();
    let tool_calls = children
        .iter()
        .filter(|n| **n == "execute_tool system.echo")
        .count();
    assert_eq!((model_calls, tool_calls), (2, 2), "{children:?}");
}
