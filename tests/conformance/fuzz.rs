//! Property tests standing in for fuzzing: every adapter's response and SSE
//! parsing, and the config parser, fed arbitrary and mutated input. The
//! properties: never a panic; errors are typed and never carry upstream
//! text; a stream yields at most one `Done`, as its last item.
//!
//! `PROPTEST_CASES` raises the case count for a longer manual run (CI uses
//! the default below, a few seconds).

use crate::harness::{self, CANARY, Fixture};
use ai_orchestrator::{
    config::Config,
    domain::{ProviderError, StreamEvent},
};
use proptest::{
    prelude::*,
    test_runner::{Config as RunnerConfig, TestCaseError, TestRunner},
};
use serde_json::{Map, Value};
use wiremock::{Mock, MockServer, ResponseTemplate, matchers::any as any_request};

const KEYS: &[&str] = &[
    "id",
    "object",
    "model",
    "choices",
    "index",
    "message",
    "role",
    "content",
    "delta",
    "finish_reason",
    "usage",
    "prompt_tokens",
    "completion_tokens",
    "total_tokens",
    "error",
    "type",
    "code",
    "citations",
    "search_results",
    "url",
    "title",
    "candidates",
    "parts",
    "text",
    "finishReason",
    "usageMetadata",
    "promptTokenCount",
    "candidatesTokenCount",
    "stop_reason",
    "input_tokens",
    "output_tokens",
    "content_block",
    "index",
    "refusal",
];

const EVENTS: &[&str] = &[
    "message_start",
    "content_block_start",
    "content_block_delta",
    "content_block_stop",
    "message_delta",
    "message_stop",
    "ping",
    "error",
    "completion",
    "",
];

fn cases(default: u32) -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(default)
}

fn leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        prop_oneof![Just(u64::MAX), Just(0u64), any::<u64>()].prop_map(Value::from),
        any::<f64>()
            .prop_map(|f| serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number)),
        ".{0,12}".prop_map(Value::String),
        Just(Value::String(CANARY.into())),
        proptest::sample::select(KEYS).prop_map(|k| Value::String(k.into())),
    ]
}

/// JSON trees shaped like provider payloads (their key names, any values).
fn json_tree() -> impl Strategy<Value = Value> {
    leaf().prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            proptest::collection::vec((proptest::sample::select(KEYS), inner), 0..6).prop_map(
                |kvs| {
                    let mut m = Map::new();
                    for (k, v) in kvs {
                        m.insert(k.to_owned(), v);
                    }
                    Value::Object(m)
                }
            ),
        ]
    })
}

/// A valid recorded payload, cut, spliced or with bytes replaced.
fn mutated(valid: String) -> impl Strategy<Value = Vec<u8>> {
    let len = valid.len().max(1);
    (
        0..len,
        0..len,
        proptest::collection::vec(any::<u8>(), 0..8),
        0..4u8,
    )
        .prop_map(move |(a, b, junk, op)| {
            let mut bytes = valid.clone().into_bytes();
            let (a, b) = (a.min(bytes.len()), b.min(bytes.len()));
            match op {
                0 => bytes.truncate(a),
                1 => {
                    bytes.splice(a..a, junk);
                }
                2 => {
                    let (lo, hi) = (a.min(b), a.max(b));
                    let piece = bytes[lo..hi].to_vec();
                    bytes.splice(hi..hi, piece);
                }
                _ => {
                    let (lo, hi) = (a.min(b), a.max(b));
                    bytes.drain(lo..hi);
                }
            }
            bytes
        })
}

/// SSE bodies: provider-shaped events, comments, retries, junk lines.
fn sse_body() -> impl Strategy<Value = Vec<u8>> {
    let line = prop_oneof![
        4 => json_tree().prop_map(|v| format!("data: {v}")),
        1 => Just("data: [DONE]".to_owned()),
        2 => proptest::sample::select(EVENTS).prop_map(|e| format!("event: {e}")),
        1 => Just(":keep-alive".to_owned()),
        2 => Just(String::new()),
        1 => Just("retry: 10".to_owned()),
        1 => "[^\r\n]{0,20}",
    ];
    (
        proptest::collection::vec(line, 0..24),
        prop_oneof![Just("\n"), Just("\r\n")],
    )
        .prop_map(|(lines, sep)| lines.join(sep).into_bytes())
}

fn status() -> impl Strategy<Value = u16> {
    prop_oneof![
        6 => Just(200u16),
        1 => proptest::sample::select(&[400u16, 401, 404, 408, 429, 500, 502, 503, 529][..]),
        1 => 100u16..600,
    ]
}

/// What the fake upstream answers in one case.
#[derive(Debug, Clone)]
struct Answer {
    status: u16,
    content_type: &'static str,
    body: Vec<u8>,
}

fn answers(f: &Fixture) -> impl Strategy<Value = Answer> {
    let body = prop_oneof![
        json_tree().prop_map(|v| v.to_string().into_bytes()),
        mutated(f.success_body.to_string()),
        mutated(f.stream_body.clone()),
        mutated((f.error_body)(500).to_string()),
        sse_body(),
        proptest::collection::vec(any::<u8>(), 0..256),
    ];
    let content_type =
        proptest::sample::select(&["application/json", "text/event-stream", "text/plain"][..]);
    (status(), content_type, body).prop_map(|(status, content_type, body)| Answer {
        status,
        content_type,
        body,
    })
}

fn check_error(e: &ProviderError, what: &str) -> Result<(), TestCaseError> {
    let shown = format!("{e} {e:?} {}", e.code());
    prop_assert!(
        !shown.contains(CANARY),
        "{what}: upstream text leaked: {shown}"
    );
    Ok(())
}

fn fuzz_adapter(f: &Fixture) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let server = rt.block_on(MockServer::start());
    let provider = harness::provider(f, &server, true);
    let mut runner = TestRunner::new(RunnerConfig {
        cases: cases(48),
        failure_persistence: None,
        ..RunnerConfig::default()
    });
    let result = runner.run(&answers(f), |answer| {
        rt.block_on(async {
            server.reset().await;
            let template = ResponseTemplate::new(answer.status)
                .set_body_raw(answer.body.clone(), answer.content_type);
            Mock::given(any_request())
                .respond_with(template)
                .mount(&server)
                .await;

            if let Err(e) = provider.complete(harness::request(f, "fuzz")).await {
                check_error(&e, "complete")?;
            }
            match harness::collect(&provider, harness::request(f, "fuzz")).await {
                Err(e) => check_error(&e, "stream start")?,
                Ok(items) => {
                    for (i, item) in items.iter().enumerate() {
                        match item {
                            Ok(StreamEvent::Done(_)) => {
                                prop_assert_eq!(i + 1, items.len(), "Done is last")
                            }
                            Ok(StreamEvent::Delta(_)) => {}
                            Err(e) => check_error(e, "stream item")?,
                        }
                    }
                }
            }
            Ok(())
        })
    });
    if let Err(e) = result {
        panic!("{}: {e}", f.name);
    }
}

#[test]
fn openai_parsing_survives_arbitrary_responses() {
    fuzz_adapter(&crate::openai::fixture());
}

#[test]
fn openai_compatible_parsing_survives_arbitrary_responses() {
    fuzz_adapter(&crate::openai_compatible::fixture());
}

#[test]
fn perplexity_parsing_survives_arbitrary_responses() {
    fuzz_adapter(&crate::perplexity::fixture());
}

#[test]
fn anthropic_parsing_survives_arbitrary_responses() {
    fuzz_adapter(&crate::anthropic::fixture());
}

#[test]
fn gemini_parsing_survives_arbitrary_responses() {
    fuzz_adapter(&crate::gemini::fixture());
}

const EXAMPLE: &str = include_str!("../../config/example.toml");

const VALUES: &[&str] = &[
    "\"\"",
    "-1",
    "0",
    "1e309",
    "-0.0",
    "\"x\"",
    "[]",
    "{}",
    "true",
    "\"0s\"",
    "\"18446744073709551615s\"",
    "\"99999999999999h\"",
    "18446744073709551616",
    "\"unknown\"",
    "\"http://\"",
    "[{ provider = \"openai\" }]",
    "nan",
    "inf",
];

/// The example config with lines deleted, duplicated, swapped, or values
/// replaced by hostile ones.
fn config_text() -> impl Strategy<Value = String> {
    let lines: Vec<String> = EXAMPLE.lines().map(str::to_owned).collect();
    let n = lines.len();
    let edit = (0..4u8, 0..n, 0..n, proptest::sample::select(VALUES));
    proptest::collection::vec(edit, 1..6).prop_map(move |edits| {
        let mut lines = lines.clone();
        for (op, a, b, value) in edits {
            if lines.is_empty() {
                break;
            }
            let (a, b) = (a % lines.len(), b % lines.len());
            match op {
                0 => {
                    lines.remove(a);
                }
                1 => {
                    let l = lines[a].clone();
                    lines.insert(b, l);
                }
                2 => lines.swap(a, b),
                _ => {
                    if let Some((key, _)) = lines[a].split_once('=') {
                        lines[a] = format!("{key}= {value}");
                    }
                }
            }
        }
        lines.join("\n")
    })
}

#[test]
fn the_config_parser_never_panics_and_names_a_key() {
    let env = |_: &str| Some("k".to_owned());
    let mut runner = TestRunner::new(RunnerConfig {
        cases: cases(512),
        failure_persistence: None,
        ..RunnerConfig::default()
    });
    let text = prop_oneof![
        4 => config_text(),
        1 => proptest::collection::vec(any::<u8>(), 0..512)
            .prop_map(|b| String::from_utf8_lossy(&b).into_owned()),
    ];
    runner
        .run(&text, |toml| {
            if let Err(e) = Config::from_toml_str(&toml, env) {
                prop_assert!(!e.paths().is_empty(), "{e}");
                prop_assert!(e.paths().iter().all(|p| !p.is_empty()), "{e}");
            }
            Ok(())
        })
        .unwrap();
}

/// Inputs the properties above once failed on, kept as fixed cases.
#[tokio::test]
async fn regressions_found_by_fuzzing() {
    // A stream opening with a UTF-8 BOM (allowed by SSE) made the SSE
    // parser slice inside the BOM and panic.
    let f = crate::openai::fixture();
    let server = harness::serve(
        &f.stream_path,
        harness::sse(&format!("\u{feff}{}", f.stream_body)),
    )
    .await;
    let provider = harness::provider(&f, &server, true);
    let items = harness::collect(&provider, harness::request(&f, "bom"))
        .await
        .unwrap();
    let (text, _) = harness::finished(&items, "BOM stream");
    assert_eq!(text, f.expected_text);

    // serde's "invalid type: string \"…\"" quoted upstream text.
    for f in [crate::anthropic::fixture(), crate::gemini::fixture()] {
        let body = format!(r#"{{"usage":["{CANARY}"],"usageMetadata":["{CANARY}"]}}"#);
        let server = harness::serve(
            &f.complete_path,
            ResponseTemplate::new(200).set_body_raw(body, "application/json"),
        )
        .await;
        let provider = harness::provider(&f, &server, true);
        let err = provider
            .complete(harness::request(&f, "leak"))
            .await
            .unwrap_err();
        assert_eq!(err.code(), "MALFORMED_RESPONSE", "{}", f.name);
        assert!(!format!("{err:?}").contains(CANARY), "{}: {err:?}", f.name);
    }
}
