//! Anthropic Messages API traffic, as recorded (ids and wording shortened),
//! for the conformance suite.

use super::harness::{self, Fixture};
use serde_json::{Value, json};

const MODEL: &str = "claude-3-haiku-20240307";
const TEXT: &str = "Tomorrow afternoon works. How about 2:30 PM? I'll send an invite.";

/// The deltas the streamed answer arrives in; they join to [`TEXT`].
const DELTAS: [&str; 5] = [
    "Tomorrow afternoon works",
    ". How about 2:30",
    " PM?",
    " I'll send",
    " an invite.",
];

fn event(name: &str, data: &str) -> String {
    format!("event: {name}\ndata: {data}\n\n")
}

/// `message_start` through the last text delta, with or without usage.
fn stream_head(with_usage: bool) -> String {
    let usage = if with_usage {
        r#","usage":{"input_tokens":31,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":1}"#
    } else {
        ""
    };
    let mut body = event(
        "message_start",
        &format!(
            r#"{{"type":"message_start","message":{{"id":"msg_01TmcR5Kf8Hn2vQdX3a9LzPw","type":"message","role":"assistant","model":"{MODEL}","content":[],"stop_reason":null,"stop_sequence":null{usage}}}}}"#
        ),
    );
    body += &event(
        "content_block_start",
        r#"{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#,
    );
    body += &event("ping", r#"{"type": "ping"}"#);
    for delta in DELTAS {
        let data = json!({"type": "content_block_delta", "index": 0,
            "delta": {"type": "text_delta", "text": delta}});
        body += &event("content_block_delta", &data.to_string());
    }
    body
}

/// `content_block_stop`, `message_delta` and `message_stop`.
fn stream_tail(with_usage: bool) -> String {
    let usage = if with_usage {
        r#","usage":{"output_tokens":19}"#
    } else {
        ""
    };
    event(
        "content_block_stop",
        r#"{"type":"content_block_stop","index":0}"#,
    ) + &event(
        "message_delta",
        &format!(
            r#"{{"type":"message_delta","delta":{{"stop_reason":"end_turn","stop_sequence":null}}{usage}}}"#
        ),
    ) + &event("message_stop", r#"{"type":"message_stop"}"#)
}

/// Anthropic's error envelope for each status it documents.
fn error_body(status: u16) -> Value {
    let kind = match status {
        400 => "invalid_request_error",
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        529 => "overloaded_error",
        _ => "api_error",
    };
    json!({
        "type": "error",
        "error": {"type": kind, "message": "canary-upstream-secret: details for humans"},
        "request_id": "req_011CPn5wXfLxbGkQvkN3Hm7e"
    })
}

/// The Anthropic fixture.
pub fn fixture() -> Fixture {
    Fixture {
        name: "anthropic",
        kind: "anthropic",
        model: MODEL,
        base_path: "/v1",
        complete_path: "/v1/messages".into(),
        stream_path: "/v1/messages".into(),
        auth_header: ("x-api-key", "test-key"),
        success_body: json!({
            "id": "msg_01XFDUDYJgAACzvnptvVoYEL",
            "type": "message",
            "role": "assistant",
            "model": MODEL,
            "content": [{"type": "text", "text": TEXT}],
            "stop_reason": "end_turn",
            "stop_sequence": null,
            "usage": {
                "input_tokens": 31,
                "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": 0,
                "cache_creation": {"ephemeral_5m_input_tokens": 0, "ephemeral_1h_input_tokens": 0},
                "output_tokens": 19,
                "service_tier": "standard"
            }
        }),
        expected_text: TEXT,
        expected_usage: (31, 19),
        stream_body: stream_head(true) + &stream_tail(true),
        stream_missing_usage_body: stream_head(false) + &stream_tail(false),
        // Cut after the text deltas: no message_delta, no message_stop.
        truncated_stream_body: stream_head(true),
        error_body,
        overloaded_status: Some(529),
    }
}

#[tokio::test]
async fn conformance() {
    harness::run_suite(fixture()).await
}
