//! An operator in Chromium: every page, its figures against GetUsage, the
//! CSV, a refused login, a forged post, and an approval clicked through.

use super::{extra, held_turn, spawn};
use crate::common::TestApp;
use crate::{
    agents::{completed, converse, turn},
    tools::{ADMIN, CALLER, counterparts, webhook::Webhook, with_key},
    web::report,
};
use ai_orchestrator::api::pb::{self, converse_event::Event};
use serde_json::Value;
use std::path::PathBuf;

async fn get_usage(app: &TestApp, by: &[pb::UsageDimension]) -> pb::GetUsageResponse {
    app.client
        .clone()
        .get_usage(with_key(
            ADMIN,
            "console-usage",
            pb::GetUsageRequest {
                team_id: "t1".into(),
                group_by: by.iter().map(|d| *d as i32).collect(),
                ..Default::default()
            },
        ))
        .await
        .unwrap()
        .into_inner()
}

/// Dollars as the console shows them (exact micro-dollars).
fn usd(cost: f64) -> String {
    format!("${cost:.6}")
}

/// Runs the browser script; its report.
async fn browse(base: &str, approval: &str) -> Value {
    let shots = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/console-screenshots");
    let script = format!(
        "{}/tests/api/console/browser.mjs",
        env!("CARGO_MANIFEST_DIR")
    );
    report(
        tokio::process::Command::new("node")
            .arg(script)
            .env("AIO_CONSOLE", base)
            .env("AIO_ADMIN_KEY", ADMIN)
            .env("AIO_CALLER_KEY", CALLER)
            .env("AIO_TEAM", "t1")
            .env("AIO_APPROVAL", approval)
            .env("AIO_PLAYWRIGHT", counterparts::node_playwright())
            .env("AIO_CHROMIUM", counterparts::CHROMIUM)
            .env("AIO_SHOTS", shots),
    )
    .await
}

#[tokio::test]
async fn an_operator_reads_every_page_and_approves_a_held_call_in_a_browser() {
    let hook = Webhook::start().await;
    let (app, base) = spawn(&hook, &extra()).await;
    let (conversation, approval) = held_turn(&app).await;
    let usage = get_usage(&app, &[]).await;
    let totals = usage.totals.unwrap();
    assert!(totals.requests > 0);
    let by_task = get_usage(&app, &[pb::UsageDimension::Task]).await;

    let r = browse(&base, &approval).await;
    let p = &r["pages"];
    // Login: signed out goes to the form; a caller key is refused; the cookie is guarded.
    assert_eq!(r["signed_out_at"], "/console/login", "{r}");
    assert_eq!(r["refused_status"], 403, "{r}");
    assert!(
        r["refused_text"]
            .as_str()
            .unwrap()
            .contains("not an admin key")
    );
    assert_eq!(
        r["cookie"],
        serde_json::json!([{"name": "aio_console", "httpOnly": true, "sameSite": "Strict", "path": "/console"}])
    );
    // Keyboard: the skip link comes first and moves focus to the content.
    assert_eq!(r["first_tab"], "Skip to content");
    assert_eq!(r["after_skip"], "main");
    // Every page loads, names itself once and marks its navigation entry; headings
    // start at h1; every field has a label.
    for (name, h1) in [
        ("overview", "Overview"),
        ("usage", "Usage"),
        ("teams", "Teams"),
        ("providers", "Providers"),
        ("calls", "Calls"),
        ("tools", "Tools"),
        ("audit", "Audit"),
    ] {
        let page = &p[name];
        assert_eq!(page["status"], 200, "{name}: {page}");
        assert_eq!(page["h1"], h1, "{name}");
        assert_eq!(page["current"], h1, "{name}");
        let headings = page["headings"].as_array().unwrap();
        assert_eq!(headings[0], "H1", "{name}: {headings:?}");
        assert_eq!(headings.iter().filter(|h| *h == "H1").count(), 1, "{name}");
        assert_eq!(page["unlabelled"], serde_json::json!([]), "{name}");
    }
    // The figures are GetUsage's.
    let requests = totals.requests.to_string();
    assert_eq!(p["overview"]["requests_month"], requests.as_str());
    assert_eq!(p["overview"]["spend_month"], usd(totals.cost_usd).as_str());
    assert_eq!(p["usage"]["requests"], requests.as_str());
    assert_eq!(
        p["usage"]["input_tokens"],
        totals.input_tokens.to_string().as_str()
    );
    assert_eq!(
        p["usage"]["output_tokens"],
        totals.output_tokens.to_string().as_str()
    );
    assert_eq!(p["usage"]["cost"], usd(totals.cost_usd).as_str());
    assert_eq!(p["usage"]["bars"], by_task.buckets.len());
    let limits = usage.limits.unwrap();
    let remaining = usage.remaining.unwrap();
    let spent = limits.max_requests.unwrap() - remaining.max_requests.unwrap();
    assert_eq!(
        p["teams"]["monthly_requests_spent"],
        spent.to_string().as_str()
    );
    assert_eq!(p["teams"]["monthly_requests_limit"], "1000");
    assert_eq!(
        p["providers"]["rows"], 5,
        "openai, anthropic, scripted, memo, noting"
    );
    assert_eq!(p["calls"]["trace_attempts"], 1);
    assert!(
        p["audit"]["verified"]
            .as_str()
            .unwrap()
            .starts_with("The chain holds"),
        "{p}"
    );
    // The CSV is GetUsage's grouping by task.
    let csv = r["csv"].as_str().unwrap();
    let lines: Vec<&str> = csv.lines().collect();
    assert!(lines[0].starts_with("team,month,task,requests,"), "{csv}");
    assert_eq!(lines.len() - 1, by_task.buckets.len(), "{csv}");
    for b in &by_task.buckets {
        let t = b.totals.unwrap();
        let cells = format!(
            ",{},{},{},{},",
            b.task, t.requests, t.input_tokens, t.output_tokens
        );
        assert!(lines.iter().any(|l| l.contains(&cells)), "{cells} in {csv}");
    }
    // A forged post changes nothing; the click decides, and the turn resumes.
    assert_eq!(r["forged_status"], 403, "{r}");
    assert_eq!(p["tools"]["pending"], 1);
    assert_eq!(r["pending_after_forgery"], 1);
    assert_eq!(r["decided"], format!("Approval {approval} approved."));
    assert_eq!(r["pending_after_click"], 0);
    assert_eq!(hook.count(), 0, "approved, not yet resumed");
    let mut resume = converse("noter", "", Some(&conversation));
    resume.resume = true;
    let events = turn(&app, CALLER, "console-resumed", resume).await.unwrap();
    let ran = events
        .iter()
        .find_map(|e| match e {
            Event::ToolResult(r) => Some(r.clone()),
            _ => None,
        })
        .expect("a tool_result");
    assert_eq!(ran.status, "SUCCEEDED");
    assert_eq!(
        completed(&events).stop_reason(),
        pb::StopReason::FinalAnswer
    );
    assert_eq!(hook.count(), 1);
    app.stop().await;
}
