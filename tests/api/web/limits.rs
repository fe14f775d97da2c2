//! The edge's own refusals, over real HTTP: a body over
//! `server.max_message_bytes` (413, unread), inputs over
//! `server.max_input_bytes`, JSON nested past `server.max_input_depth`, a
//! body that is not JSON or not the format (a 400 naming the field), an
//! unknown route, a malformed trace ID; each in OpenAI's error shape with
//! the trace ID, and counted in the edge's metrics. Then the team rules
//! with auth off, and `tool_choice` reaching two wire formats.

use super::{Edge, KEY};
use crate::{
    common::{TestApp, config_toml_with, wait_for},
    observability::{counter, free_port, scrape},
};
use reqwest::StatusCode;
use serde_json::{Value, json};

/// Posts `body` (raw) to the chat route with the key and `trace`.
async fn post(
    edge: &Edge,
    body: impl Into<reqwest::Body>,
    trace: &str,
) -> (StatusCode, Value, String) {
    let response = reqwest::Client::new()
        .post(format!("{}/chat/completions", edge.base_url()))
        .bearer_auth(KEY)
        .header("content-type", "application/json")
        .header("x-trace-id", trace)
        .body(body)
        .send()
        .await
        .unwrap();
    let status = response.status();
    let trace = response
        .headers()
        .get("x-trace-id")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    (status, response.json().await.unwrap_or(Value::Null), trace)
}

/// `(status, code, param)` of a refusal, checking its shape and trace ID.
async fn refused(edge: &Edge, body: impl Into<reqwest::Body>) -> (u16, String, Value) {
    let (status, v, trace) = post(edge, body, "limits-1").await;
    assert_eq!(trace, "limits-1", "{v}");
    let error = &v["error"];
    assert!(
        error["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{v}"
    );
    assert!(error["type"].is_string(), "{v}");
    let code = error["code"].as_str().unwrap_or_default().to_owned();
    (status.as_u16(), code, error["param"].clone())
}

fn chat(content: &str) -> Value {
    json!({"model": "chat", "messages": [{"role": "user", "content": content}]})
}

#[tokio::test]
async fn oversized_deep_and_malformed_bodies_are_refused_naming_the_field() {
    let metrics = free_port();
    let edge = Edge::start(&format!(
        "max_message_bytes = 70000\nmax_input_bytes = 8192\nmax_input_depth = 8\n\
         metrics_listen = \"127.0.0.1:{metrics}\""
    ))
    .await;

    let huge = chat(&"x".repeat(80_000)).to_string();
    assert_eq!(
        refused(&edge, huge).await,
        (413, "INVALID_INPUT".into(), json!("body"))
    );
    let large = chat(&"x".repeat(10_000)).to_string();
    assert_eq!(
        refused(&edge, large).await,
        (400, "INVALID_INPUT".into(), json!("body"))
    );
    let many: Vec<Value> = (0..101)
        .map(|_| json!({"role": "user", "content": "x"}))
        .collect();
    let many = json!({"model": "chat", "messages": many}).to_string();
    let (status, _, param) = refused(&edge, many).await;
    assert_eq!((status, param), (400, json!("messages")));
    let agent = json!({"model": "agent/helper", "messages": [{"role": "user", "content": "hi"}]});
    let (status, _, param) = refused(&edge, agent.to_string()).await;
    assert_eq!((status, param), (400, json!("model")));
    let mut deep = chat("hi");
    deep["metadata"] = json!({"a": {"b": {"c": {"d": {"e": {"f": {"g": {}}}}}}}});
    assert_eq!(
        refused(&edge, deep.to_string()).await,
        (400, "INVALID_INPUT".into(), json!("body"))
    );
    assert_eq!(
        refused(&edge, "{not json").await,
        (400, "INVALID_INPUT".into(), json!("body"))
    );
    let no_messages = json!({"model": "chat"}).to_string();
    assert_eq!(
        refused(&edge, no_messages).await,
        (400, "INVALID_INPUT".into(), json!("messages"))
    );
    let no_content = json!({"model": "chat", "messages": [{"role": "user"}]}).to_string();
    let (status, _, param) = refused(&edge, no_content).await;
    assert_eq!((status, param), (400, json!("messages[0].content")));
    let orphan = json!({"model": "chat", "messages": [
        {"role": "user", "content": "hi"},
        {"role": "tool", "tool_call_id": "nope", "content": "{}"}]});
    let (status, _, param) = refused(&edge, orphan.to_string()).await;
    assert_eq!((status, param), (400, json!("messages[1].tool_call_id")));
    // None of these reached a provider.
    assert!(
        edge.fakes
            .openai
            .received_requests()
            .await
            .unwrap_or_default()
            .is_empty()
    );

    // A path we do not serve, and a trace ID we cannot carry.
    let http = reqwest::Client::new();
    let lost = http
        .get(format!("{}/engines", edge.base_url()))
        .bearer_auth(KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(lost.status(), StatusCode::NOT_FOUND);
    assert!(lost.headers().contains_key("x-trace-id"));
    assert_eq!(
        lost.json::<Value>().await.unwrap()["error"]["code"],
        "NOT_FOUND"
    );
    let bad_trace = http
        .get(format!("{}/models", edge.base_url()))
        .bearer_auth(KEY)
        .header("x-trace-id", "not a trace id")
        .send()
        .await
        .unwrap();
    assert_eq!(bad_trace.status(), StatusCode::BAD_REQUEST);
    assert_eq!(bad_trace.headers()["x-should-retry"], "false");
    assert_eq!(
        bad_trace.json::<Value>().await.unwrap()["error"]["param"],
        "x-trace-id"
    );
    // A served path with a method it does not take, with the caller's trace ID.
    let wrong = http
        .get(format!("{}/chat/completions", edge.base_url()))
        .bearer_auth(KEY)
        .header("x-trace-id", "limits-405")
        .send()
        .await
        .unwrap();
    assert_eq!(wrong.status(), StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(wrong.headers()["x-trace-id"], "limits-405");
    assert_eq!(
        wrong.json::<Value>().await.unwrap()["error"]["param"],
        "method"
    );

    let scraped = scrape(metrics).await;
    let route = ("route", "POST /v1/chat/completions");
    assert!(
        counter(
            &scraped,
            "http_server_requests_total",
            &[route, ("status", "413")]
        ) >= 1.0
    );
    assert!(
        counter(
            &scraped,
            "http_server_requests_total",
            &[route, ("status", "400")]
        ) >= 8.0
    );
    assert!(
        counter(
            &scraped,
            "orchestrator_errors_total",
            &[("reason", "INVALID_INPUT")]
        ) >= 9.0
    );
    edge.stop().await;
}

#[tokio::test]
async fn with_auth_off_every_request_names_its_team() {
    let port = free_port();
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite://{}", dir.path().join("auth_off.db").display());
    let extra = format!("[http]\nlisten = \"127.0.0.1:{port}\"\n");
    let mut app = TestApp::spawn_toml(&config_toml_with(
        &db,
        "latency = \"1ms\"",
        "latency = \"1ms\"",
        &extra,
    ))
    .await;
    app.keep(dir);
    wait_for(|| async {
        tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_ok()
    })
    .await;
    let url = format!("http://127.0.0.1:{port}/v1/chat/completions");
    let body =
        json!({"model": "meeting_brief", "messages": [{"role": "user", "content": "Brief me"}]});
    let http = reqwest::Client::new();

    let anonymous = http.post(&url).json(&body).send().await.unwrap();
    assert_eq!(anonymous.status(), StatusCode::BAD_REQUEST);
    let v: Value = anonymous.json().await.unwrap();
    assert_eq!(
        (v["error"]["code"].as_str(), v["error"]["param"].as_str()),
        (Some("INVALID_INPUT"), Some("x-team-id"))
    );

    let named = http
        .post(&url)
        .header("x-team-id", "t1")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(named.status(), StatusCode::OK);
    let v: Value = named.json().await.unwrap();
    assert_eq!(v["object"], "chat.completion");
    assert!(
        v["usage"]["total_tokens"].as_u64().is_some_and(|t| t > 0),
        "{v}"
    );
    app.stop().await;
}

#[tokio::test]
async fn tool_choice_reaches_openai_and_anthropic_in_their_formats() {
    let edge = Edge::start("").await;
    let tools = json!([{"type": "function", "function": {"name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]);
    let http = reqwest::Client::new();
    let send = |model: &str, choice: Value| {
        http.post(format!("{}/chat/completions", edge.base_url()))
            .bearer_auth(KEY)
            .json(
                &json!({"model": model, "tools": tools, "tool_choice": choice,
                          "messages": [{"role": "user", "content": "Weather in Paris?"}]}),
            )
            .send()
    };
    let named = json!({"type": "function", "function": {"name": "get_weather"}});
    assert_eq!(
        send("chat_tools", named.clone()).await.unwrap().status(),
        StatusCode::OK
    );
    let openai = edge.fakes.openai.received_requests().await.unwrap();
    let body: Value = openai.last().unwrap().body_json().unwrap();
    assert_eq!(body["tool_choice"], named);
    assert_eq!(body["tools"][0]["function"]["name"], "get_weather");

    // `fallback`'s OpenAI-wire target fails; its Anthropic one gets the choice.
    assert_eq!(
        send("fallback", json!("required")).await.unwrap().status(),
        StatusCode::OK
    );
    let anthropic = edge.fakes.anthropic.received_requests().await.unwrap();
    let body: Value = anthropic.last().unwrap().body_json().unwrap();
    assert_eq!(body["tool_choice"], json!({"type": "any"}));
    assert_eq!(body["tools"][0]["name"], "get_weather");
    assert!(body["tools"][0]["input_schema"].is_object());

    // A choice naming no tool never reaches a provider.
    let stray = json!({"type": "function", "function": {"name": "nope"}});
    let response = send("chat_tools", stray).await.unwrap();
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    let v: Value = response.json().await.unwrap();
    assert_eq!(v["error"]["param"], "tool_choice.function.name");
    edge.stop().await;
}
