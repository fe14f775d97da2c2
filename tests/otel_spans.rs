//! Spans in an OpenTelemetry exporter, in-process. Its own test binary:
//! spans reach the exporter through a subscriber installed process-wide
//! (see `span_capture`), one test at a time.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed expectation is the assertion

#[path = "api/common.rs"]
#[allow(dead_code)]
mod common;
#[path = "api/span_capture.rs"]
mod span_capture;

use ai_orchestrator::api::pb;
use common::{TestApp, ctx};
use span_capture::capture_spans;

/// Spans reach an OpenTelemetry exporter: the `request` span continues the
/// caller's `traceparent` (same trace ID, the caller's span as parent), each
/// `provider_attempt` is its child with provider/model/retry/outcome/tokens,
/// and the upstream receives a `traceparent` naming the attempt's span.
#[tokio::test]
async fn spans_continue_the_callers_trace_and_nest_attempts() {
    use wiremock::{Mock, MockServer, ResponseTemplate, matchers::method};

    let capture = capture_spans(0.0).await;

    const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
    const CALLER_SPAN: &str = "00f067aa0ba902b7";
    const MESSAGE: &str = "CANARY-SPAN-MESSAGE call me";
    let upstream = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(500).set_body_string(
            r#"{"error":{"message":"boom","type":"server_error","param":null,"code":null}}"#,
        ))
        .up_to_n_times(1)
        .mount(&upstream)
        .await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(200).set_body_json(serde_json::json!({
            "id": "chatcmpl-1", "object": "chat.completion", "created": 1_732_000_000,
            "model": "gpt-4o-mini-2024-07-18",
            "choices": [{"index": 0, "finish_reason": "stop", "logprobs": null,
                "message": {"role": "assistant", "refusal": null,
                    "content": "{\"intent\":\"QUESTION\",\"confidence\":0.9,\"reason\":\"asks\"}"}}],
            "usage": {"prompt_tokens": 120, "completion_tokens": 18, "total_tokens": 138}
        })))
        .mount(&upstream)
        .await;
    let dir = tempfile::tempdir().unwrap();
    let toml = format!(
        r#"
[database]
url = "sqlite://{}"
[providers.openai]
kind = "openai"
base_url = "{}/v1"
api_key_env = "K"
[tasks.sms_classify]
chain = [{{ provider = "openai", model = "gpt-4o-mini" }}]
[pricing."gpt-4o-mini"]
input_per_mtok = 0.15
output_per_mtok = 0.6
[retry]
max_attempts = 2
base_backoff = "5ms"
max_backoff = "5ms"
"#,
        dir.path().join("o.db").display(),
        upstream.uri()
    );
    let app = TestApp::spawn_toml_env(&toml, |n| (n == "K").then(|| "sk-test".to_owned())).await;
    let mut request = tonic::Request::new(pb::ClassifySmsRequest {
        context: ctx(),
        message: MESSAGE.into(),
        ..Default::default()
    });
    request.metadata_mut().insert(
        "traceparent",
        format!("00-{TRACE}-{CALLER_SPAN}-01").parse().unwrap(),
    );
    let reply = app.client.clone().classify_sms(request).await.unwrap();
    assert_eq!(reply.into_inner().meta.unwrap().trace_id, TRACE);
    app.stop().await;

    let spans = capture
        .spans_once("ai.orchestrator.v1.Orchestrator/ClassifySms", 1)
        .await;
    let request_span = spans
        .iter()
        .find(|s| s.span_kind == opentelemetry::trace::SpanKind::Server)
        .expect("a request span, sampled because the caller's was (ratio 0 for new traces)");
    assert_eq!(request_span.span_context.trace_id().to_string(), TRACE);
    assert_eq!(request_span.parent_span_id.to_string(), CALLER_SPAN);
    let attr = |s: &opentelemetry_sdk::trace::SpanData, key: &str| {
        s.attributes
            .iter()
            .find(|kv| kv.key.as_str() == key)
            .map(|kv| kv.value.to_string())
    };
    assert_eq!(attr(request_span, "trace_id").as_deref(), Some(TRACE));
    assert_eq!(attr(request_span, "team_id").as_deref(), Some("t1"));
    // The OpenTelemetry RPC conventions.
    assert_eq!(
        request_span.name,
        "ai.orchestrator.v1.Orchestrator/ClassifySms"
    );
    assert_eq!(attr(request_span, "rpc.system").as_deref(), Some("grpc"));
    assert_eq!(
        attr(request_span, "rpc.service").as_deref(),
        Some("ai.orchestrator.v1.Orchestrator")
    );
    assert_eq!(
        attr(request_span, "rpc.method").as_deref(),
        Some("ClassifySms")
    );
    assert_eq!(
        attr(request_span, "rpc.grpc.status_code").as_deref(),
        Some("0")
    );
    assert_eq!(
        attr(request_span, "span_id"),
        Some(request_span.span_context.span_id().to_string())
    );

    let mut attempts: Vec<_> = spans
        .iter()
        .filter(|s| s.span_kind == opentelemetry::trace::SpanKind::Client)
        .collect();
    attempts.sort_by_key(|s| attr(s, "retry"));
    assert_eq!(attempts.len(), 2, "{spans:#?}");
    for (i, a) in attempts.iter().enumerate() {
        assert_eq!(a.span_context.trace_id().to_string(), TRACE);
        assert_eq!(a.parent_span_id, request_span.span_context.span_id());
        assert_eq!(attr(a, "provider").as_deref(), Some("openai"));
        assert_eq!(attr(a, "model").as_deref(), Some("gpt-4o-mini"));
        assert_eq!(attr(a, "retry").as_deref(), Some(i.to_string().as_str()));
    }
    assert_ne!(attr(attempts[0], "outcome").as_deref(), Some("ok"));
    assert_eq!(attr(attempts[1], "outcome").as_deref(), Some("ok"));
    assert_eq!(attr(attempts[1], "input_tokens").as_deref(), Some("120"));
    assert_eq!(attr(attempts[1], "output_tokens").as_deref(), Some("18"));
    // The OpenTelemetry GenAI conventions: a failed attempt is an error
    // with its type; an answered one carries the answer's facts.
    for a in &attempts {
        assert_eq!(a.name, "chat gpt-4o-mini");
        assert_eq!(attr(a, "gen_ai.operation.name").as_deref(), Some("chat"));
        assert_eq!(attr(a, "gen_ai.provider.name").as_deref(), Some("openai"));
        assert_eq!(
            attr(a, "gen_ai.request.model").as_deref(),
            Some("gpt-4o-mini")
        );
    }
    assert!(matches!(
        attempts[0].status,
        opentelemetry::trace::Status::Error { .. }
    ));
    assert_eq!(attr(attempts[0], "error.type").as_deref(), Some("HTTP_500"));
    assert_eq!(attempts[1].status, opentelemetry::trace::Status::Unset);
    assert_eq!(
        attr(attempts[1], "gen_ai.response.model").as_deref(),
        Some("gpt-4o-mini-2024-07-18")
    );
    assert_eq!(
        attr(attempts[1], "gen_ai.usage.input_tokens").as_deref(),
        Some("120")
    );
    assert_eq!(
        attr(attempts[1], "gen_ai.usage.output_tokens").as_deref(),
        Some("18")
    );
    assert_eq!(
        attr(attempts[1], "gen_ai.response.finish_reasons").as_deref(),
        Some("stop")
    );

    // Upstream saw our attempt spans as parents, in the caller's trace.
    let received = upstream.received_requests().await.unwrap();
    assert_eq!(received.len(), 2);
    for (r, a) in received.iter().zip(&attempts) {
        let tp = r.headers.get("traceparent").unwrap().to_str().unwrap();
        assert_eq!(
            tp,
            format!("00-{TRACE}-{}-01", a.span_context.span_id()),
            "upstream traceparent names the attempt span"
        );
    }

    // Contents never reach span attributes or events.
    let dump = format!("{spans:?}");
    assert!(!dump.contains("CANARY-SPAN-MESSAGE") && !dump.contains("sk-test"));
}

/// A streamed call (ExecuteStream) traces like a unary one: the `request`
/// span continues the caller's trace and lasts the whole stream, each
/// target gets a `provider_attempt` child (the primary failing before any
/// output, then the fallback streaming), and each upstream receives a
/// `traceparent` naming its attempt span. No contents in spans.
#[tokio::test]
async fn streamed_calls_trace_each_attempt_under_the_request() {
    use wiremock::{Mock, MockServer, ResponseTemplate, matchers::method};

    let capture = capture_spans(0.0).await;

    const TRACE: &str = "0af7651916cd43dd8448eb211c80319c";
    const CALLER_SPAN: &str = "b7ad6b7169203331";
    const CANARY: &str = "CANARY-STREAM-INPUT";
    let (primary, fallback) = (MockServer::start().await, MockServer::start().await);
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(503).set_body_string(
            r#"{"error":{"message":"busy","type":"server_error","param":null,"code":null}}"#,
        ))
        .mount(&primary)
        .await;
    let chunk = |delta: serde_json::Value, finish: serde_json::Value| {
        serde_json::json!({"id": "chatcmpl-7", "object": "chat.completion.chunk",
            "created": 1_732_000_000, "model": "gpt-4o-mini",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
    };
    let mut sse = String::new();
    for (delta, finish) in [
        (
            serde_json::json!({"role": "assistant", "content": ""}),
            serde_json::Value::Null,
        ),
        (
            serde_json::json!({"content": "Brief: "}),
            serde_json::Value::Null,
        ),
        (
            serde_json::json!({"content": "meet Ann."}),
            serde_json::Value::Null,
        ),
        (serde_json::json!({}), serde_json::json!("stop")),
    ] {
        sse.push_str(&format!("data: {}\n\n", chunk(delta, finish)));
    }
    sse.push_str(&format!(
        "data: {}\n\n",
        serde_json::json!({"id": "chatcmpl-7", "object": "chat.completion.chunk",
            "created": 1_732_000_000, "model": "gpt-4o-mini", "choices": [],
            "usage": {"prompt_tokens": 40, "completion_tokens": 5, "total_tokens": 45}})
    ));
    sse.push_str("data: [DONE]\n\n");
    Mock::given(method("POST"))
        .respond_with(
            ResponseTemplate::new(200)
                .insert_header("content-type", "text/event-stream")
                .set_body_string(sse),
        )
        .mount(&fallback)
        .await;
    let dir = tempfile::tempdir().unwrap();
    let toml = format!(
        r#"
[database]
url = "sqlite://{}"
[providers.primary]
kind = "openai"
base_url = "{}/v1"
api_key_env = "K"
[providers.fallback]
kind = "openai"
base_url = "{}/v1"
api_key_env = "K"
[tasks.meeting_brief]
chain = [{{ provider = "primary", model = "gpt-4o-mini" }}, {{ provider = "fallback", model = "gpt-4o" }}]
[pricing."gpt-4o-mini"]
input_per_mtok = 0.15
output_per_mtok = 0.6
[pricing."gpt-4o"]
input_per_mtok = 2.5
output_per_mtok = 10.0
[retry]
max_attempts = 1
"#,
        dir.path().join("s.db").display(),
        primary.uri(),
        fallback.uri()
    );
    let app = TestApp::spawn_toml_env(&toml, |n| (n == "K").then(|| "sk-test".to_owned())).await;
    let mut request = tonic::Request::new(pb::ExecuteRequest {
        context: ctx(),
        task: "meeting_brief".into(),
        input: Some(pb::execute_request::Input::InputJson(format!(
            r#"{{"notes":"{CANARY}"}}"#
        ))),
        ..Default::default()
    });
    request.metadata_mut().insert(
        "traceparent",
        format!("00-{TRACE}-{CALLER_SPAN}-01").parse().unwrap(),
    );
    let mut stream = app
        .client
        .clone()
        .execute_stream(request)
        .await
        .unwrap()
        .into_inner();
    let mut last = None;
    while let Some(event) = stream.message().await.unwrap() {
        last = event.event;
    }
    let Some(pb::execute_event::Event::Completed(done)) = last else {
        panic!("the stream must complete: {last:?}")
    };
    assert_eq!(done.text, "Brief: meet Ann.");
    assert_eq!(done.meta.unwrap().trace_id, TRACE);
    app.stop().await;

    let spans = capture
        .spans_once("ai.orchestrator.v1.Orchestrator/ExecuteStream", 1)
        .await;
    let attr = |s: &opentelemetry_sdk::trace::SpanData, key: &str| {
        s.attributes
            .iter()
            .find(|kv| kv.key.as_str() == key)
            .map(|kv| kv.value.to_string())
    };
    let request_span = spans
        .iter()
        .find(|s| {
            s.span_kind == opentelemetry::trace::SpanKind::Server
                && attr(s, "rpc").as_deref() == Some("ExecuteStream")
        })
        .expect("a request span for the stream");
    assert_eq!(request_span.span_context.trace_id().to_string(), TRACE);
    assert_eq!(request_span.parent_span_id.to_string(), CALLER_SPAN);

    let attempts: Vec<_> = spans
        .iter()
        .filter(|s| s.span_kind == opentelemetry::trace::SpanKind::Client)
        .collect();
    assert_eq!(attempts.len(), 2, "{spans:#?}");
    let of = |p: &str| {
        *attempts
            .iter()
            .find(|a| attr(a, "provider").as_deref() == Some(p))
            .unwrap_or_else(|| panic!("no attempt span for {p}: {attempts:#?}"))
    };
    let (first, second) = (of("primary"), of("fallback"));
    for a in [first, second] {
        assert_eq!(a.span_context.trace_id().to_string(), TRACE);
        assert_eq!(a.parent_span_id, request_span.span_context.span_id());
        assert_eq!(attr(a, "retry").as_deref(), Some("0"));
        // The request span lasts the whole stream: it ends after every attempt.
        assert!(a.end_time <= request_span.end_time);
    }
    assert_eq!(attr(first, "model").as_deref(), Some("gpt-4o-mini"));
    assert_eq!(attr(first, "outcome").as_deref(), Some("HTTP_503"));
    assert_eq!(attr(second, "model").as_deref(), Some("gpt-4o"));
    assert_eq!(attr(second, "outcome").as_deref(), Some("ok"));
    assert_eq!(attr(second, "input_tokens").as_deref(), Some("40"));
    assert_eq!(attr(second, "output_tokens").as_deref(), Some("5"));

    for (server, a) in [(&primary, first), (&fallback, second)] {
        let received = server.received_requests().await.unwrap();
        assert_eq!(received.len(), 1);
        let tp = received[0]
            .headers
            .get("traceparent")
            .unwrap()
            .to_str()
            .unwrap();
        assert_eq!(
            tp,
            format!("00-{TRACE}-{}-01", a.span_context.span_id()),
            "upstream traceparent names the attempt span"
        );
        // The canary did go upstream (so its absence below means something).
        assert!(String::from_utf8_lossy(&received[0].body).contains(CANARY));
    }

    let dump = format!("{spans:?}");
    assert!(!dump.contains(CANARY) && !dump.contains("sk-test") && !dump.contains("meet Ann"));
}

/// Without a caller's `traceparent`, the trace ID the service generates is
/// also the exported trace's: the reply's `meta.trace_id`, the request
/// span's OpenTelemetry trace ID and its attempt's are one ID.
#[tokio::test]
async fn a_generated_trace_id_is_the_exported_trace_id() {
    let capture = capture_spans(1.0).await;

    let app = TestApp::spawn().await;
    let reply = app
        .client
        .clone()
        .classify_sms(pb::ClassifySmsRequest {
            context: ctx(),
            message: "What does it cost?".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    let trace_id = reply.into_inner().meta.unwrap().trace_id;
    app.stop().await;
    assert_eq!(trace_id.len(), 32, "{trace_id}");

    let spans = capture
        .spans_once("ai.orchestrator.v1.Orchestrator/ClassifySms", 1)
        .await;
    let server = spans
        .iter()
        .find(|s| s.span_kind == opentelemetry::trace::SpanKind::Server)
        .expect("a request span");
    assert_eq!(server.span_context.trace_id().to_string(), trace_id);
    assert_eq!(
        server.parent_span_id,
        opentelemetry::trace::SpanId::INVALID,
        "a root"
    );
    let client = spans
        .iter()
        .find(|s| s.span_kind == opentelemetry::trace::SpanKind::Client)
        .expect("an attempt span");
    assert_eq!(client.span_context.trace_id().to_string(), trace_id);
}

/// Each tool invocation is a span `execute_tool <tool>` under the RPC's:
/// CLIENT for a workflow webhook (it calls out), INTERNAL for a built-in,
/// with the GenAI tool attributes, and never the input.
#[tokio::test]
async fn each_tool_invocation_is_a_span_under_the_rpc() {
    use opentelemetry::trace::SpanKind;
    use wiremock::{Mock, MockServer, ResponseTemplate, matchers::method};

    let capture = capture_spans(1.0).await;

    const CANARY: &str = "CANARY-TOOL-SPAN-INPUT";
    let webhook = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(200).set_body_json(serde_json::json!({"ok": true})))
        .mount(&webhook)
        .await;
    let dir = tempfile::tempdir().unwrap();
    let toml = format!(
        r#"
[database]
url = "sqlite://{}"
[providers.m]
kind = "mock"
[tasks.sms_classify]
chain = [{{ provider = "m", model = "x" }}]
[pricing.x]
price = "unknown"
[tools."crm.add_note"]
kind = "http"
url = "{}/hook"
side_effects = true
"#,
        dir.path().join("t.db").display(),
        webhook.uri()
    );
    let app = TestApp::spawn_toml(&toml).await;
    let mut tools = pb::tool_service_client::ToolServiceClient::new(app.channel.clone());
    for tool in ["system.echo", "crm.add_note"] {
        let mut input = serde_json::Map::new();
        input.insert("text".into(), CANARY.into());
        let reply = tools
            .invoke_tool(pb::InvokeToolRequest {
                context: ctx(),
                tool: tool.into(),
                input: Some(ai_orchestrator::api::convert::json_to_struct(input)),
                mode: pb::InvocationMode::Sync as i32,
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(
            reply.invocation.unwrap().status(),
            pb::InvocationStatus::Succeeded,
            "{tool}"
        );
    }
    app.stop().await;

    let spans = capture
        .spans_once("ai.orchestrator.v1.ToolService/InvokeTool", 2)
        .await;
    let attr = |s: &opentelemetry_sdk::trace::SpanData, key: &str| {
        s.attributes
            .iter()
            .find(|kv| kv.key.as_str() == key)
            .map(|kv| kv.value.to_string())
    };
    for (tool, kind) in [
        ("system.echo", SpanKind::Internal),
        ("crm.add_note", SpanKind::Client),
    ] {
        let span = spans
            .iter()
            .find(|s| s.name == format!("execute_tool {tool}"))
            .unwrap_or_else(|| panic!("a span for {tool}: {spans:#?}"));
        assert_eq!(span.span_kind, kind, "{tool}");
        assert_eq!(
            attr(span, "gen_ai.operation.name").as_deref(),
            Some("execute_tool")
        );
        assert_eq!(attr(span, "gen_ai.tool.name").as_deref(), Some(tool));
        assert_eq!(attr(span, "status").as_deref(), Some("SUCCEEDED"));
        // Its parent is the RPC's span.
        let rpc = spans
            .iter()
            .find(|s| s.span_context.span_id() == span.parent_span_id)
            .unwrap_or_else(|| panic!("the RPC's span, parent of {tool}'s: {spans:#?}"));
        assert_eq!(rpc.name, "ai.orchestrator.v1.ToolService/InvokeTool");
        assert_eq!(rpc.span_kind, SpanKind::Server);
    }
    assert!(!format!("{spans:?}").contains(CANARY));
}

/// The HTTP edge's request span is the same server span as gRPC's, named by
/// its route: it continues the caller's `traceparent`, and the provider
/// attempts are its children.
#[tokio::test]
async fn an_http_request_span_continues_the_callers_trace() {
    use wiremock::{Mock, MockServer, ResponseTemplate, matchers::method};

    let capture = capture_spans(0.0).await;
    const TRACE: &str = "5bf92f3577b34da6a3ce929d0e0e4737";
    const CALLER_SPAN: &str = "10f067aa0ba902b8";
    let upstream = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(200).set_body_json(serde_json::json!({
            "id": "chatcmpl-1", "object": "chat.completion", "created": 1_732_000_000,
            "model": "gpt-4o-mini",
            "choices": [{"index": 0, "finish_reason": "stop",
                "message": {"role": "assistant", "content": "Hi."}}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}
        })))
        .mount(&upstream)
        .await;
    let dir = tempfile::tempdir().unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let toml = format!(
        r#"
[database]
url = "sqlite://{}"
[http]
listen = "127.0.0.1:{port}"
[providers.openai]
kind = "openai"
base_url = "{}/v1"
api_key_env = "K"
[tasks.chat]
chain = [{{ provider = "openai", model = "gpt-4o-mini" }}]
[pricing."gpt-4o-mini"]
input_per_mtok = 0.15
output_per_mtok = 0.6
"#,
        dir.path().join("h.db").display(),
        upstream.uri()
    );
    let app = TestApp::spawn_toml_env(&toml, |n| (n == "K").then(|| "sk-test".to_owned())).await;
    common::wait_for(|| async {
        tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_ok()
    })
    .await;
    let answer = reqwest::Client::new()
        .post(format!("http://127.0.0.1:{port}/v1/chat/completions"))
        .header("x-team-id", "t1")
        .header("traceparent", format!("00-{TRACE}-{CALLER_SPAN}-01"))
        .json(&serde_json::json!({"model": "chat",
            "messages": [{"role": "user", "content": "Hello"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.headers()["x-trace-id"], TRACE);
    app.stop().await;

    let spans = capture.spans_once("POST /v1/chat/completions", 1).await;
    let request_span = spans
        .iter()
        .find(|s| s.name == "POST /v1/chat/completions")
        .expect("the HTTP request span");
    assert_eq!(
        request_span.span_kind,
        opentelemetry::trace::SpanKind::Server
    );
    assert_eq!(request_span.span_context.trace_id().to_string(), TRACE);
    assert_eq!(request_span.parent_span_id.to_string(), CALLER_SPAN);
    let attr = |key: &str| {
        request_span
            .attributes
            .iter()
            .find(|kv| kv.key.as_str() == key)
            .map(|kv| kv.value.to_string())
    };
    assert_eq!(attr("http.route").as_deref(), Some("/v1/chat/completions"));
    assert_eq!(attr("http.request.method").as_deref(), Some("POST"));
    assert_eq!(attr("team_id").as_deref(), Some("t1"));
    let attempt = spans
        .iter()
        .find(|s| s.span_kind == opentelemetry::trace::SpanKind::Client)
        .expect("a provider attempt span");
    assert_eq!(
        attempt.parent_span_id,
        request_span.span_context.span_id(),
        "the attempt is the request's child"
    );
}
