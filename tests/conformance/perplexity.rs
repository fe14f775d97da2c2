//! Perplexity (`kind = "perplexity"`): Chat Completions plus `citations` and
//! `search_results`. Its streams repeat the running message, usage and
//! sources in every chunk and end without `data: [DONE]`, as recorded from
//! api.perplexity.ai.

use crate::harness::{
    self, CANARY, Fixture, collect, data_events, finished, only_request, provider, request, serve,
    sse,
};
use ai_orchestrator::domain::{Citation, JsonSchemaFormat};
use serde_json::{Value, json};
use wiremock::ResponseTemplate;

const MODEL: &str = "sonar";
const TEXT: &str = "The Eiffel Tower is 330 metres tall [1][2].";
const PIECES: [&str; 5] = [
    "The Eiffel",
    " Tower is",
    " 330 metres",
    " tall [1]",
    "[2].",
];

fn citations() -> Value {
    json!([
        "https://www.toureiffel.paris/en/the-monument/key-figures",
        "https://en.wikipedia.org/wiki/Eiffel_Tower"
    ])
}

fn search_results() -> Value {
    json!([
        {"title": "Eiffel Tower key figures", "url": "https://www.toureiffel.paris/en/the-monument/key-figures", "date": "2024-03-12"},
        {"title": "Eiffel Tower - Wikipedia", "url": "https://en.wikipedia.org/wiki/Eiffel_Tower", "date": null},
        {"title": "How tall is the Eiffel Tower?", "url": "https://www.britannica.com/topic/Eiffel-Tower-Paris-France", "date": "2023-11-02"}
    ])
}

/// The sources a Perplexity answer with the fixture's payload must carry.
fn expected_sources() -> Vec<Citation> {
    let c = |url: &str, title: &str| Citation {
        url: url.into(),
        title: Some(title.into()),
    };
    vec![
        c(
            "https://www.toureiffel.paris/en/the-monument/key-figures",
            "Eiffel Tower key figures",
        ),
        c(
            "https://en.wikipedia.org/wiki/Eiffel_Tower",
            "Eiffel Tower - Wikipedia",
        ),
        c(
            "https://www.britannica.com/topic/Eiffel-Tower-Paris-France",
            "How tall is the Eiffel Tower?",
        ),
    ]
}

fn usage(completion_tokens: u64) -> Value {
    json!({
        "prompt_tokens": 12,
        "completion_tokens": completion_tokens,
        "total_tokens": 12 + completion_tokens,
        "search_context_size": "low",
        "cost": {"input_tokens_cost": 0.0, "output_tokens_cost": 0.0, "request_cost": 0.005, "total_cost": 0.005}
    })
}

/// Perplexity streams: each chunk carries the running `message`, the new
/// `delta`, running usage and the sources; the last has `finish_reason`.
fn chunks(pieces: &[&str], finish: bool, with_usage: bool) -> Vec<Value> {
    let mut so_far = String::new();
    let last = pieces.len().saturating_sub(1);
    pieces
        .iter()
        .enumerate()
        .map(|(i, piece)| {
            so_far.push_str(piece);
            let reason = if finish && i == last {
                json!("stop")
            } else {
                Value::Null
            };
            let mut c = json!({
                "id": "8c1596dd-319a-4c71-a1b8-e0c546b01641",
                "model": MODEL,
                "created": 1741689451,
                "citations": citations(),
                "search_results": search_results(),
                "object": "chat.completion",
                "choices": [{
                    "index": 0,
                    "finish_reason": reason,
                    "message": {"role": "assistant", "content": so_far},
                    "delta": {"role": "assistant", "content": piece}
                }]
            });
            if with_usage {
                c["usage"] = usage(i as u64 + 1);
            }
            c
        })
        .collect()
}

fn error_body(status: u16) -> Value {
    let kind = match status {
        400 => "invalid_model",
        401 => "invalid_api_key",
        429 => "rate_limit_exceeded",
        _ => "internal_server_error",
    };
    json!({"error": {
        "message": format!("{CANARY}: Invalid model 'sonar-x'. Permitted models can be found in the documentation."),
        "type": kind,
        "code": status
    }})
}

pub fn fixture() -> Fixture {
    Fixture {
        name: "perplexity",
        kind: "perplexity",
        model: MODEL,
        base_path: "",
        complete_path: "/chat/completions".into(),
        stream_path: "/chat/completions".into(),
        auth_header: ("authorization", "Bearer test-key"),
        success_body: json!({
            "id": "3c90c3cc-0d44-4b50-8888-8dd25736052a",
            "model": MODEL,
            "created": 1741689451,
            "usage": usage(5),
            "citations": citations(),
            "search_results": search_results(),
            "object": "chat.completion",
            "choices": [{
                "index": 0,
                "finish_reason": "stop",
                "message": {"role": "assistant", "content": TEXT},
                "delta": {"role": "assistant", "content": ""}
            }]
        }),
        expected_text: TEXT,
        expected_usage: (12, 5),
        stream_body: data_events(&chunks(&PIECES, true, true), false),
        stream_missing_usage_body: data_events(&chunks(&PIECES, true, false), false),
        truncated_stream_body: data_events(&chunks(&PIECES[..3], false, true), false),
        error_body,
        overloaded_status: None,
    }
}

#[tokio::test]
async fn conformance() {
    harness::run_suite(fixture()).await;
}

#[tokio::test]
async fn citations_are_mapped() {
    let f = fixture();
    let server = serve(
        &f.complete_path,
        ResponseTemplate::new(200).set_body_json(&f.success_body),
    )
    .await;
    let out = provider(&f, &server, true)
        .complete(request(&f, "t"))
        .await
        .unwrap();
    assert_eq!(out.citations, expected_sources());
    only_request(&server, "citations").await;
}

#[tokio::test]
async fn streamed_citations_are_mapped() {
    let f = fixture();
    let server = serve(&f.stream_path, sse(&f.stream_body)).await;
    let items = collect(&provider(&f, &server, true), request(&f, "t"))
        .await
        .unwrap();
    let (_, done) = finished(&items, "perplexity stream");
    assert_eq!(done.citations, expected_sources());
    let body: Value = only_request(&server, "stream").await.body_json().unwrap();
    assert_eq!(body["stream_options"]["include_usage"], json!(true));
}

#[tokio::test]
async fn schema_uses_perplexity_json_schema_form() {
    let f = fixture();
    let server = serve(
        &f.complete_path,
        ResponseTemplate::new(200).set_body_json(&f.success_body),
    )
    .await;
    let schema = json!({"type": "object", "properties": {"summary": {"type": "string"}}});
    let mut req = request(&f, "t");
    req.response_format = Some(JsonSchemaFormat {
        name: "research".into(),
        schema: schema.clone(),
    });
    provider(&f, &server, true).complete(req).await.unwrap();
    let body: Value = only_request(&server, "schema").await.body_json().unwrap();
    assert_eq!(
        body["response_format"],
        json!({"type": "json_schema", "json_schema": {"schema": schema}})
    );
}
