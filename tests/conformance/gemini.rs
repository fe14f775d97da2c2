//! Gemini API traffic, as recorded (wording shortened), for the conformance
//! suite.

use super::harness::{self, Fixture};
use serde_json::{Value, json};

const MODEL: &str = "gemini-2.0-flash";
const TEXT: &str = "Tomorrow afternoon works. How about 2:30 PM? I'll send an invite.";

/// The pieces the streamed answer arrives in; they join to [`TEXT`].
const PIECES: [&str; 3] = [
    "Tomorrow",
    " afternoon works. How about 2:30 PM?",
    " I'll send an invite.",
];

/// One `data:` event; Gemini ends each with a blank CRLF line.
fn chunk(data: &Value) -> String {
    format!("data: {data}\r\n\r\n")
}

/// The first `sent` chunks of the streamed answer. Gemini repeats cumulative
/// usage in every chunk; the last one carries `finishReason` and the final
/// counts.
fn stream(with_usage: bool, sent: usize) -> String {
    let mut body = String::new();
    for (i, piece) in PIECES.iter().enumerate().take(sent) {
        let last = i + 1 == PIECES.len();
        let mut candidate = json!({"content": {"parts": [{"text": piece}], "role": "model"}});
        if last {
            candidate["finishReason"] = json!("STOP");
        }
        let mut data = json!({
            "candidates": [candidate],
            "modelVersion": MODEL,
            "responseId": "kWq1aN3QGb2Oz7IPq8fS0Ag"
        });
        if with_usage {
            data["usageMetadata"] = if last {
                json!({"promptTokenCount": 24, "candidatesTokenCount": 17, "totalTokenCount": 41,
                    "promptTokensDetails": [{"modality": "TEXT", "tokenCount": 24}],
                    "candidatesTokensDetails": [{"modality": "TEXT", "tokenCount": 17}]})
            } else {
                json!({"promptTokenCount": 24, "totalTokenCount": 24,
                    "promptTokensDetails": [{"modality": "TEXT", "tokenCount": 24}]})
            };
        }
        body += &chunk(&data);
    }
    body
}

/// Google's error envelope for each status.
fn error_body(status: u16) -> Value {
    let kind = match status {
        400 => "INVALID_ARGUMENT",
        401 => "UNAUTHENTICATED",
        403 => "PERMISSION_DENIED",
        404 => "NOT_FOUND",
        429 => "RESOURCE_EXHAUSTED",
        503 => "UNAVAILABLE",
        504 => "DEADLINE_EXCEEDED",
        _ => "INTERNAL",
    };
    json!({"error": {
        "code": status,
        "message": "canary-upstream-secret: details for humans",
        "status": kind
    }})
}

/// The Gemini fixture.
pub fn fixture() -> Fixture {
    Fixture {
        name: "gemini",
        kind: "gemini",
        model: MODEL,
        base_path: "/v1beta",
        complete_path: format!("/v1beta/models/{MODEL}:generateContent"),
        stream_path: format!("/v1beta/models/{MODEL}:streamGenerateContent"),
        auth_header: ("x-goog-api-key", "test-key"),
        success_body: json!({
            "candidates": [{
                "content": {"parts": [{"text": TEXT}], "role": "model"},
                "finishReason": "STOP",
                "avgLogprobs": -0.0812_f64
            }],
            "usageMetadata": {
                "promptTokenCount": 24,
                "candidatesTokenCount": 17,
                "totalTokenCount": 41,
                "promptTokensDetails": [{"modality": "TEXT", "tokenCount": 24}],
                "candidatesTokensDetails": [{"modality": "TEXT", "tokenCount": 17}]
            },
            "modelVersion": MODEL,
            "responseId": "kWq1aN3QGb2Oz7IPq8fS0Ag"
        }),
        expected_text: TEXT,
        expected_usage: (24, 17),
        stream_body: stream(true, PIECES.len()),
        stream_missing_usage_body: stream(false, PIECES.len()),
        // The server closed before the chunk with a finishReason.
        truncated_stream_body: stream(true, PIECES.len() - 1),
        error_body,
        overloaded_status: None,
    }
}

#[tokio::test]
async fn conformance() {
    harness::run_suite(fixture()).await
}
