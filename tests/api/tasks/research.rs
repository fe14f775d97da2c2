//! Research end to end: sources from a Perplexity-format fake's citations,
//! VERIFY routed to `research_verify` (its chain, prompt and usage bucket),
//! and malformed findings falling back.

use super::{app_with, replying};
use crate::common::{TestApp, ctx};
use ai_orchestrator::api::pb;
use serde_json::{Value, json};
use wiremock::{Mock, MockServer, ResponseTemplate, matchers::method};

/// A Perplexity chat completion answering `answer` with two citations.
fn perplexity_answer(model: &str, answer: &Value) -> ResponseTemplate {
    ResponseTemplate::new(200).set_body_json(json!({
        "id": "3c90c3cc-0d44-4b50-8888-8dd25736052a",
        "model": model,
        "object": "chat.completion",
        "created": 1_732_000_000,
        "citations": ["https://acme.example/careers", "https://news.example/acme-berlin"],
        "search_results": [
            {"title": "Careers at Acme", "url": "https://acme.example/careers", "date": "2026-11-01"},
            {"title": "Acme expands in Berlin", "url": "https://news.example/acme-berlin", "date": "2026-10-20"}
        ],
        "choices": [{"index": 0, "finish_reason": "stop",
                     "message": {"role": "assistant", "content": answer.to_string()}}],
        "usage": {"prompt_tokens": 210, "completion_tokens": 95, "total_tokens": 305}
    }))
}

/// A server with a SQLite file in `dir` and one `perplexity` provider at
/// `upstream` (key from `PPLX`), plus `tasks` (task and pricing tables).
async fn perplexity_app(dir: &tempfile::TempDir, upstream: &MockServer, tasks: &str) -> TestApp {
    let toml = format!(
        r#"
[database]
url = "sqlite://{}"
[providers.perplexity]
kind = "perplexity"
base_url = "{}"
api_key_env = "PPLX"
{tasks}"#,
        dir.path().join("research.db").display(),
        upstream.uri()
    );
    TestApp::spawn_toml_env(&toml, |n| (n == "PPLX").then(|| "pplx-test".to_owned())).await
}

#[tokio::test]
async fn research_sources_come_from_perplexity_citations() {
    let perplexity = MockServer::start().await;
    let answer = json!({
        "summary": "Acme is hiring backend engineers.",
        "findings": [
            {"claim": "Acme posted 12 engineering roles", "sources": ["[1]"], "confidence": 0.9},
            {"claim": "Hiring is concentrated in Berlin", "sources": [], "confidence": 0.6}
        ]
    });
    Mock::given(method("POST"))
        .respond_with(perplexity_answer(
            "llama-3.1-sonar-small-128k-online",
            &answer,
        ))
        .mount(&perplexity)
        .await;
    let dir = tempfile::tempdir().unwrap();
    let app = perplexity_app(
        &dir,
        &perplexity,
        r#"
[tasks.research_deep]
chain = [{ provider = "perplexity", model = "llama-3.1-sonar-small-128k-online" }]
[pricing."llama-3.1-sonar-small-128k-online"]
input_per_mtok = 0.2
output_per_mtok = 0.2
"#,
    )
    .await;
    let r = app
        .client
        .clone()
        .research(pb::ResearchRequest {
            context: ctx(),
            query: "Is Acme hiring?".into(),
            depth: pb::ResearchDepth::Deep as i32,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.summary, "Acme is hiring backend engineers.");
    assert_eq!(r.findings[0].sources, ["https://acme.example/careers"]);
    assert!(
        r.findings[1].sources.is_empty(),
        "a finding that cites nothing has no sources"
    );
    let cited: Vec<&str> = r.citations.iter().map(|c| c.url.as_str()).collect();
    assert_eq!(cited.len(), 2, "every citation, listed apart: {cited:?}");
    assert_eq!(cited[0], "https://acme.example/careers");
    assert_eq!(r.findings[0].confidence, 0.9);
    let meta = r.meta.unwrap();
    assert_eq!(
        (
            meta.usage.as_ref().unwrap().input_tokens,
            meta.prompt_key.as_str()
        ),
        (210, "research_deep")
    );
    app.stop().await;
}

const VERIFY_MODEL: &str = "llama-3.1-sonar-small-128k-online";
const DEEP_MODEL: &str = "llama-3.1-sonar-large-128k-online";

#[tokio::test]
async fn verify_depth_runs_the_research_verify_task() {
    let perplexity = MockServer::start().await;
    let answer = json!({
        "summary": "The claim holds: Acme opened a Berlin office.",
        "findings": [
            {"claim": "Acme opened an office in Berlin", "sources": ["[2]"], "confidence": 0.8}
        ]
    });
    Mock::given(method("POST"))
        .respond_with(perplexity_answer(VERIFY_MODEL, &answer))
        .mount(&perplexity)
        .await;
    let dir = tempfile::tempdir().unwrap();
    // Both depths on the same provider, told apart by model.
    let tasks = format!(
        r#"
[tasks.research_verify]
chain = [{{ provider = "perplexity", model = "{VERIFY_MODEL}" }}]
[tasks.research_deep]
chain = [{{ provider = "perplexity", model = "{DEEP_MODEL}" }}]
[pricing."{VERIFY_MODEL}"]
input_per_mtok = 0.2
output_per_mtok = 0.2
[pricing."{DEEP_MODEL}"]
input_per_mtok = 1.0
output_per_mtok = 1.0
"#
    );
    let app = perplexity_app(&dir, &perplexity, &tasks).await;
    let mut client = app.client.clone();
    let r = client
        .research(pb::ResearchRequest {
            context: ctx(),
            query: "Acme opened an office in Berlin".into(),
            depth: pb::ResearchDepth::Verify as i32,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.summary, "The claim holds: Acme opened a Berlin office.");
    assert_eq!(r.findings.len(), 1);
    assert_eq!(r.findings[0].sources, ["https://news.example/acme-berlin"]);
    assert_eq!(r.findings[0].confidence, 0.8);
    let meta = r.meta.unwrap();
    assert_eq!(
        (
            meta.prompt_key.as_str(),
            meta.prompt_version,
            meta.provider.as_str(),
            meta.model.as_str(),
            meta.degraded
        ),
        ("research_verify", 0, "perplexity", VERIFY_MODEL, false)
    );

    // Upstream got the verify chain's model and the verify prompt.
    let requests = perplexity.received_requests().await.unwrap();
    assert_eq!(requests.len(), 1);
    let sent: Value = serde_json::from_slice(&requests[0].body).unwrap();
    assert_eq!(sent["model"], VERIFY_MODEL);
    let sent = sent.to_string();
    assert!(sent.contains("You verify claims"), "{sent}");
    assert!(sent.contains("Claim to verify"), "{sent}");

    // Metered under the verify task.
    let usage = client
        .get_usage(pb::GetUsageRequest {
            team_id: "t1".into(),
            group_by: vec![pb::UsageDimension::Task as i32],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let tasks: Vec<&str> = usage.buckets.iter().map(|b| b.task.as_str()).collect();
    assert_eq!(tasks, ["research_verify"]);
    app.stop().await;
}

/// Every finding must carry a confidence in [0, 1]; an answer without one is
/// malformed, so the chain moves on instead of inventing a value.
#[tokio::test]
async fn a_finding_without_confidence_is_malformed_and_falls_back() {
    let no_confidence =
        replying(r#"{"summary":"s","findings":[{"claim":"c","sources":["https://a.example"]}]}"#);
    let valid = replying(
        r#"{"summary":"s","findings":[{"claim":"c","sources":["https://a.example"],"confidence":0.7}]}"#,
    );
    let (app, _dir) = app_with(&no_confidence, &valid, "").await;
    let r = app
        .client
        .clone()
        .research(pb::ResearchRequest {
            context: ctx(),
            query: "Is Acme hiring?".into(),
            depth: pb::ResearchDepth::Deep as i32,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.findings[0].confidence, 0.7, "the fallback's answer");
    let meta = r.meta.unwrap();
    assert!(meta.degraded);
    assert_eq!(
        meta.attempts
            .iter()
            .map(|a| (a.provider.as_str(), a.outcome))
            .collect::<Vec<_>>(),
        [
            ("primary", pb::AttemptOutcome::Malformed as i32),
            ("fallback", pb::AttemptOutcome::Success as i32)
        ]
    );
    app.stop().await;
}
