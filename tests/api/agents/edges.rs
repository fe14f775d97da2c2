//! The edges of a turn: tool calls that fail in each way the model must
//! read, the budget (before a model call, or between one and its tools)
//! and the deadline ending a turn, the history kept in
//! the prompt, the metrics of a turn, and `call converse`.

use super::{
    completed, conversation_id, converse, env, toml_with, turn,
    upstream::{Reply, Upstream, openai_text, openai_tool_calls},
};
use crate::{
    common::TestApp,
    observability::{counter, free_port, histogram_count, scrape},
    tools::{
        CALLER,
        webhook::{Answer, Webhook},
    },
};
use ai_orchestrator::api::pb::{self, converse_event::Event};
use serde_json::Value;
use std::{sync::Arc, time::Duration};
use tokio::sync::Notify;

const EXTRA: &str = r#"
[agents.hasty]
chain = [{ provider = "openai", model = "gpt-4o-mini" }]
core_prompt = "You are quick."
tools = ["crm.*"]
tool_timeout = "300ms"

[agents.in_order]
chain = [{ provider = "openai", model = "gpt-4o-mini" }]
core_prompt = "You call tools one at a time."
tools = ["crm.*"]
parallel_tool_calls = false

[agents.counted]
chain = [{ provider = "scripted", model = "gpt-4o-mini" }]
core_prompt = "You call tools."
tools = ["system.*"]
max_tool_calls = 2

[agents.forgetful]
chain = [{ provider = "openai", model = "gpt-4o-mini" }]
core_prompt = "You forget."
max_history_messages = 2
"#;

/// A server with the agents' config and [`EXTRA`], the workflow tools at
/// `webhook`, `/metrics` on `metrics` when given.
async fn spawn(openai: &Upstream, webhook: &str, metrics: Option<u16>) -> TestApp {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("agents.db").display());
    let mut toml = toml_with(&url, &openai.url(), &openai.url(), webhook, EXTRA);
    if let Some(port) = metrics {
        toml = toml.replacen(
            "listen = \"127.0.0.1:0\"",
            &format!("listen = \"127.0.0.1:0\"\nmetrics_listen = \"127.0.0.1:{port}\""),
            1,
        );
    }
    let mut app = TestApp::spawn_toml_env(&toml, env).await;
    app.keep(dir);
    app
}

fn results(events: &[Event]) -> Vec<(String, String, String)> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::ToolResult(r) => {
                Some((r.call_id.clone(), r.status.clone(), r.error_code.clone()))
            }
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn malformed_and_failing_tool_calls_are_results_the_model_reads() {
    let hook = Webhook::start().await;
    // A 4xx is not retried: the workflow fails at once.
    hook.script([Answer::status(422).body(r#"{"message": "lead L9 does not exist"}"#)]);
    let openai = Upstream::start([
        Reply::sse(openai_tool_calls(&[
            ("call_bad", "system__echo", &[r#"{"text": "#]),
            (
                "call_crm",
                "crm__add_note",
                &[r#"{"lead_id": "L9", "note": "hi"}"#],
            ),
        ])),
        Reply::sse(openai_text(&["Neither worked."])),
    ])
    .await;
    let app = spawn(&openai, &hook.url(), None).await;
    let events = turn(
        &app,
        CALLER,
        "edge-fail",
        converse("helper", "Try both.", None),
    )
    .await
    .unwrap();
    let mut got = results(&events);
    got.sort();
    assert_eq!(got[0].0, "call_bad");
    assert_eq!(
        (got[0].1.as_str(), got[0].2.as_str()),
        ("FAILED", "ARGUMENTS_INVALID")
    );
    assert_eq!(
        (got[1].0.as_str(), got[1].1.as_str()),
        ("call_crm", "FAILED")
    );
    assert!(
        !got[1].2.is_empty(),
        "a failed workflow has a code: {got:?}"
    );
    assert_eq!(completed(&events).text, "Neither worked.");
    // Both went back to the model, as errors, in the order of its calls.
    let sent = openai.bodies()[1]["messages"].as_array().unwrap().clone();
    let tool_messages: Vec<&Value> = sent.iter().filter(|m| m["role"] == "tool").collect();
    assert_eq!(tool_messages.len(), 2);
    assert_eq!(tool_messages[0]["tool_call_id"], "call_bad");
    assert!(
        tool_messages[0]["content"]
            .as_str()
            .unwrap()
            .contains("ARGUMENTS_INVALID")
    );
    assert_eq!(tool_messages[1]["tool_call_id"], "call_crm");
    assert!(
        tool_messages[1]["content"]
            .as_str()
            .unwrap()
            .contains("error")
    );
    // The malformed call never reached the tools; the workflow was posted once.
    assert_eq!(hook.count(), 1);
    // Its refusal is audited like the entry point's denials.
    let denied: Vec<(String, String)> = crate::tools::events(&app, "t1")
        .await
        .into_iter()
        .filter(|e| e.trace_id == "edge-fail" && e.action == "tool.denied")
        .map(|e| (e.subject, e.reason))
        .collect();
    assert_eq!(
        denied,
        [("system.echo@1.0.0".into(), "ARGUMENTS_INVALID".into())]
    );
}

/// A model's arguments get the limits a caller's tool input has: past
/// `server.max_input_bytes` (64 KiB) the call is refused before it reaches
/// the webhook, and the model reads why.
#[tokio::test]
async fn arguments_past_the_input_limit_never_reach_the_tool() {
    let hook = Webhook::start().await;
    let huge = format!(
        r#"{{"lead_id": "L9", "note": "{}"}}"#,
        "n".repeat(70 * 1024)
    );
    let openai = Upstream::start([
        Reply::sse(openai_tool_calls(&[(
            "call_huge",
            "crm__add_note",
            &[huge.as_str()],
        )])),
        Reply::sse(openai_text(&["Too long."])),
    ])
    .await;
    let app = spawn(&openai, &hook.url(), None).await;
    let events = turn(
        &app,
        CALLER,
        "edge-huge",
        converse("helper", "Note it.", None),
    )
    .await
    .unwrap();
    assert_eq!(
        results(&events),
        [(
            "call_huge".into(),
            "FAILED".into(),
            "ARGUMENTS_INVALID".into()
        )]
    );
    assert_eq!(hook.count(), 0, "the webhook got nothing");
    let sent = openai.bodies()[1]["messages"].as_array().unwrap().clone();
    let refusal = sent.iter().find(|m| m["role"] == "tool").unwrap()["content"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(refusal.contains("more than the 65536"), "{refusal}");
    assert!(
        refusal.len() < 1_000,
        "the refusal does not repeat the arguments"
    );
}

#[tokio::test]
async fn a_slow_tool_times_out_at_the_agents_tool_timeout() {
    let hook = Webhook::start().await;
    hook.slow(Duration::from_secs(3));
    let openai = Upstream::start([
        Reply::sse(openai_tool_calls(&[(
            "call_slow",
            "crm__add_note",
            &[r#"{"lead_id": "L1", "note": "slow"}"#],
        )])),
        Reply::sse(openai_text(&["It took too long."])),
    ])
    .await;
    let app = spawn(&openai, &hook.url(), None).await;
    let events = turn(
        &app,
        CALLER,
        "edge-slow",
        converse("hasty", "Note it.", None),
    )
    .await
    .unwrap();
    let result = events
        .iter()
        .find_map(|e| match e {
            Event::ToolResult(r) => Some(r.clone()),
            _ => None,
        })
        .unwrap();
    assert_eq!(result.status, "TIMED_OUT");
    assert!(result.duration_ms < 2_000, "{result:?}");
    assert_eq!(completed(&events).text, "It took too long.");
}

#[tokio::test]
async fn a_budget_too_small_for_the_next_model_call_ends_the_turn() {
    let openai = Upstream::start([]).await;
    let app = spawn(&openai, "http://127.0.0.1:9", None).await;
    let mut req = converse("helper", "Hi", None);
    req.budget = Some(pb::Budget {
        max_cost_usd: 0.000_000_1,
        ..Default::default()
    });
    let events = turn(&app, CALLER, "edge-budget", req).await.unwrap();
    let done = completed(&events);
    assert_eq!(done.stop_reason, pb::StopReason::Budget as i32);
    assert_eq!((done.iterations, done.text.as_str()), (0, ""));
    assert!(openai.bodies().is_empty(), "no model call past the budget");
}

/// The budget spent by the model call that asked for tools: each call is
/// answered as refused, so the stored turn pairs every call with a result
/// and the next turn's history is one a provider accepts.
#[tokio::test]
async fn a_budget_spent_before_the_tools_run_answers_each_call() {
    let openai = Upstream::start([
        Reply::sse(openai_tool_calls(&[(
            "call_B1",
            "system__echo",
            &[r#"{"text": "a"}"#],
        )])),
        Reply::sse(openai_text(&["Done."])),
    ])
    .await;
    // Unmetered, nothing is reserved: only the turn's own count of what
    // it spent stops it, after the model call.
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("agents.db").display());
    let toml = toml_with(
        &url,
        &openai.url(),
        &openai.url(),
        "http://127.0.0.1:9",
        EXTRA,
    ) + "\n[metering]\nenabled = false\n";
    let mut app = TestApp::spawn_toml_env(&toml, env).await;
    app.keep(dir);
    let mut req = converse("helper", "Echo a.", None);
    req.budget = Some(pb::Budget {
        max_cost_usd: 0.000_000_001,
        ..Default::default()
    });
    let events = turn(&app, CALLER, "edge-budget-tools", req).await.unwrap();
    let done = completed(&events);
    assert_eq!(done.stop_reason, pb::StopReason::Budget as i32);
    let results: Vec<(String, String, String)> = events
        .iter()
        .filter_map(|e| match e {
            Event::ToolResult(r) => {
                Some((r.call_id.clone(), r.status.clone(), r.error_code.clone()))
            }
            _ => None,
        })
        .collect();
    assert_eq!(
        results,
        [("call_B1".into(), "DENIED".into(), "BUDGET_EXCEEDED".into())]
    );
    let denied: Vec<(String, String)> = crate::tools::events(&app, "t1")
        .await
        .into_iter()
        .filter(|e| e.trace_id == "edge-budget-tools" && e.action == "tool.denied")
        .map(|e| (e.subject, e.reason))
        .collect();
    assert_eq!(denied, [("system.echo".into(), "BUDGET_EXCEEDED".into())]);

    let id = conversation_id(&events);
    turn(
        &app,
        CALLER,
        "edge-budget-next",
        converse("helper", "Again.", Some(&id)),
    )
    .await
    .unwrap();
    let sent = openai.bodies()[1]["messages"].as_array().unwrap().clone();
    let call_at = sent
        .iter()
        .position(|m| m["tool_calls"][0]["id"] == "call_B1")
        .expect("the stored call is in the history");
    assert_eq!(sent[call_at + 1]["role"], "tool");
    assert_eq!(sent[call_at + 1]["tool_call_id"], "call_B1");
}

/// A deadline that cuts the first target before its first delta ends the
/// turn: no fallback is announced to a target that will not be tried.
#[tokio::test]
async fn a_deadline_before_the_first_delta_announces_no_fallback() {
    let never = Arc::new(Notify::new());
    // The role chunk, then nothing.
    let openai = Upstream::start([Reply::sse(openai_text(&["Never"])).gated(1, never)]).await;
    let app = spawn(&openai, "http://127.0.0.1:9", None).await;
    let mut req = converse("helper", "Hi", None);
    req.budget = Some(pb::Budget {
        max_latency_ms: 500,
        ..Default::default()
    });
    let events = turn(&app, CALLER, "edge-deadline-first", req)
        .await
        .unwrap();
    assert_eq!(
        completed(&events).stop_reason,
        pb::StopReason::Deadline as i32
    );
    assert!(
        !events.iter().any(|e| matches!(e, Event::Fallback(_))),
        "{events:?}"
    );
    assert_eq!(openai.bodies().len(), 1, "the second target was not called");
}

#[tokio::test]
async fn the_deadline_ends_the_turn_with_the_text_streamed_so_far() {
    // The rest of the answer never comes.
    let never = Arc::new(Notify::new());
    let openai =
        Upstream::start([Reply::sse(openai_text(&["Partial", " rest"])).gated(2, never)]).await;
    let app = spawn(&openai, "http://127.0.0.1:9", None).await;
    let mut req = converse("helper", "Hi", None);
    req.budget = Some(pb::Budget {
        max_latency_ms: 800,
        ..Default::default()
    });
    let events = turn(&app, CALLER, "edge-deadline", req).await.unwrap();
    let done = completed(&events);
    assert_eq!(done.stop_reason, pb::StopReason::Deadline as i32);
    assert_eq!(done.text, "Partial");
    let store = app.store().await;
    let records = ai_orchestrator::usage::record::by_trace(&store, "edge-deadline")
        .await
        .unwrap();
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].outcome, "DEADLINE_EXCEEDED");
}

#[tokio::test]
async fn the_prompt_keeps_at_most_max_history_messages() {
    let openai = Upstream::start([
        Reply::sse(openai_text(&["One."])),
        Reply::sse(openai_text(&["Two."])),
        Reply::sse(openai_text(&["Three."])),
    ])
    .await;
    let app = spawn(&openai, "http://127.0.0.1:9", None).await;
    let first = turn(&app, CALLER, "forget-1", converse("forgetful", "a", None))
        .await
        .unwrap();
    let id = conversation_id(&first);
    for (trace, message) in [("forget-2", "b"), ("forget-3", "c")] {
        turn(
            &app,
            CALLER,
            trace,
            converse("forgetful", message, Some(&id)),
        )
        .await
        .unwrap();
    }
    let third: Vec<String> = openai.bodies()[2]["messages"]
        .as_array()
        .unwrap()
        .iter()
        .skip(1)
        .map(|m| m["content"].as_str().unwrap_or_default().to_owned())
        .collect();
    assert_eq!(third, ["b", "Two.", "c"]);
}

#[tokio::test]
async fn metrics_count_turns_iterations_and_tool_calls() {
    let port = free_port();
    let unused = Upstream::start([]).await;
    let app = spawn(&unused, "http://127.0.0.1:9", Some(port)).await;
    let before = scrape(port).await;
    let events = turn(
        &app,
        CALLER,
        "edge-metrics",
        // An agent no other test runs: the metrics are the process's.
        converse("counted", "Go.", None),
    )
    .await
    .unwrap();
    assert_eq!(
        completed(&events).stop_reason,
        pb::StopReason::MaxToolCalls as i32
    );
    let after = scrape(port).await;
    let delta = |metric: &str, labels: &[(&str, &str)]| {
        counter(&after, metric, labels) - counter(&before, metric, labels)
    };
    let agent = ("agent", "counted");
    assert_eq!(
        delta(
            "agent_turns_total",
            &[agent, ("stop_reason", "MAX_TOOL_CALLS")]
        ),
        1.0
    );
    let tool = ("tool", "system.echo");
    assert_eq!(
        delta(
            "agent_tool_calls_total",
            &[agent, tool, ("status", "SUCCEEDED")]
        ),
        2.0
    );
    assert_eq!(
        delta(
            "agent_tool_calls_total",
            &[agent, tool, ("status", "DENIED")]
        ),
        1.0
    );
    assert_eq!(
        histogram_count(&after, "agent_iterations", &[agent])
            - histogram_count(&before, "agent_iterations", &[agent]),
        1.0
    );
}

#[tokio::test]
async fn call_converse_prints_each_event_and_continues_a_conversation() {
    let unused = Upstream::start([]).await;
    let app = spawn(&unused, "http://127.0.0.1:9", None).await;
    let addr = format!("http://{}", app.addr);
    let args = |extra: &[&str]| {
        let mut a = vec![
            "call",
            "--addr",
            &addr,
            "--team",
            "t1",
            "--api-key",
            CALLER,
            "converse",
            "--agent",
            "busy_tools",
        ];
        a.extend_from_slice(extra);
        a.into_iter().map(str::to_owned).collect::<Vec<_>>()
    };
    let lines = |out: &str| -> Vec<Value> {
        out.lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}")))
            .collect()
    };
    let first = args(&["Go."]);
    let first: Vec<&str> = first.iter().map(String::as_str).collect();
    let (ok, out, err) = crate::cli::run_env(&first, &[]).await;
    assert!(ok, "{err}");
    let events = lines(&out);
    let id = events[0]["started"]["conversationId"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(events.iter().any(|e| e.get("toolCall").is_some()), "{out}");
    assert_eq!(
        events.last().unwrap()["completed"]["stopReason"],
        "STOP_REASON_MAX_TOOL_CALLS",
        "{out}"
    );
    let second = args(&["--conversation", &id, "Again."]);
    let second: Vec<&str> = second.iter().map(String::as_str).collect();
    let (ok, out, err) = crate::cli::run_env(&second, &[]).await;
    assert!(ok, "{err}");
    assert_eq!(lines(&out)[0]["started"]["conversationId"], id.as_str());
}

/// With `parallel_tool_calls = false` each tool call of an answer starts
/// only after the one before it has ended; by default they run together.
/// Told apart by how many the workflow holds at once, each taking 150 ms.
#[tokio::test]
async fn tool_calls_run_one_at_a_time_only_when_parallel_calls_are_off() {
    const TAKES: Duration = Duration::from_millis(150);
    let three = || {
        Reply::sse(openai_tool_calls(&[
            (
                "call_1",
                "crm__add_note",
                &[r#"{"lead_id": "L1", "note": "1"}"#],
            ),
            (
                "call_2",
                "crm__add_note",
                &[r#"{"lead_id": "L1", "note": "2"}"#],
            ),
            (
                "call_3",
                "crm__add_note",
                &[r#"{"lead_id": "L1", "note": "3"}"#],
            ),
        ]))
    };
    // `hasty` runs its calls together (the default); 150 ms is within its
    // 300 ms tool timeout.
    for (agent, one_at_a_time) in [("in_order", true), ("hasty", false)] {
        let hook = Webhook::start().await;
        hook.slow(TAKES);
        let openai = Upstream::start([three(), Reply::sse(openai_text(&["Noted."]))]).await;
        let app = spawn(&openai, &hook.url(), None).await;
        let events = turn(&app, CALLER, agent, converse(agent, "Note it.", None))
            .await
            .unwrap();
        let got = results(&events);
        assert_eq!(got.len(), 3, "{got:?}");
        assert!(got.iter().all(|r| r.1 == "SUCCEEDED"), "{got:?}");
        let mut at: Vec<_> = hook.received().iter().map(|r| r.at).collect();
        at.sort();
        assert_eq!(at.len(), 3);
        let gaps: Vec<Duration> = at.windows(2).map(|w| w[1] - w[0]).collect();
        // Overlap, not timing, tells them apart: a loaded machine may start
        // parallel calls far apart, but never overlaps ordered ones.
        let peak = hook.peak_in_flight();
        if one_at_a_time {
            assert_eq!(peak, 1, "{agent}: {gaps:?}");
            assert!(gaps.iter().all(|g| *g >= TAKES), "{agent}: {gaps:?}");
        } else {
            assert!(peak >= 2, "{agent}: peak {peak}, {gaps:?}");
        }
    }
}
