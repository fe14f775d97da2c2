//! The API through a gRPC client nobody here wrote: Python's official
//! `grpcio` (PyPI) runs `grpc_interop.py` against the server started from
//! `config/local.toml` as shipped (mock providers, auth off). The script
//! compiles our protos with `grpc_tools.protoc`, makes the calls and prints
//! what it saw as JSON lines; this test asserts on them. It checks what a
//! tonic client cannot: that the wire format, the rich error details and
//! the trace ID metadata read the same in another implementation.

use crate::{common::TestApp, tools::counterparts};
use serde_json::{Value, json};
use std::{collections::BTreeMap, path::Path};

/// The trace ID the script sends as `x-trace-id` metadata on ClassifySms.
const TRACE_HEADER: &str = "py-interop-1";

/// `config/local.toml` on a temp SQLite file at `database_url`, without the
/// metrics listener and with the HTTP edge on a free port (their fixed
/// ports would clash with a running server).
fn local_toml(database_url: &str) -> String {
    let root = env!("CARGO_MANIFEST_DIR");
    let local = std::fs::read_to_string(Path::new(root).join("config/local.toml")).unwrap();
    let database = "url = \"sqlite://data/ai-orchestrator.db\"";
    assert!(local.contains(database), "local.toml's database changed");
    local
        .lines()
        .filter(|line| !line.starts_with("metrics_listen"))
        .map(|line| {
            if line == database {
                format!("url = \"{database_url}\"")
            } else {
                line.replace("127.0.0.1:8080", "127.0.0.1:0")
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The script's observations by check name (each check printed once).
fn observations(stdout: &str) -> BTreeMap<String, Value> {
    let mut checks = BTreeMap::new();
    for line in stdout.lines().filter(|l| !l.trim().is_empty()) {
        let value: Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
        let name = value["check"].as_str().expect("a check name").to_owned();
        assert!(
            checks.insert(name.clone(), value).is_none(),
            "{name} printed twice"
        );
    }
    checks
}

/// Event kinds in order, consecutive deltas merged into one (how many
/// pieces the mock's text comes in is not the point).
fn merged(kinds: &Value) -> Vec<&str> {
    let mut out: Vec<&str> = Vec::new();
    for kind in kinds.as_array().expect("kinds") {
        let kind = kind.as_str().expect("a kind");
        if !(kind == "delta" && out.last() == Some(&"delta")) {
            out.push(kind);
        }
    }
    out
}

#[tokio::test]
async fn pythons_grpcio_client_reads_the_api_as_specified() {
    // Installs on first use (blocking): before the server runs on this thread.
    let python = counterparts::python_with_grpc();
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("interop.db").display());
    let mut app = TestApp::spawn_toml(&local_toml(&url)).await;
    app.keep(dir);

    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/api/grpc_interop.py");
    let out = tokio::process::Command::new(&python)
        .arg(script)
        .arg(app.addr.to_string())
        .kill_on_drop(true)
        .output()
        .await
        .expect("run grpc_interop.py");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "stdout:\n{stdout}\nstderr:\n{stderr}");
    let checks = observations(&stdout);
    assert_eq!(
        checks.keys().map(String::as_str).collect::<Vec<_>>(),
        [
            "classify_sms",
            "converse",
            "execute_stream",
            "invoke_echo",
            "short_deadline",
            "unknown_task"
        ],
        "{stdout}"
    );

    // §3: the `x-trace-id` request metadata is the trace ID, returned in
    // `meta.trace_id` and the response metadata. The mock's confidence
    // (0.5) is below the 0.70 review threshold.
    assert_eq!(
        checks["classify_sms"],
        json!({
            "check": "classify_sms",
            "intent": "SMS_INTENT_CALLBACK_LATER",
            "needs_review": true,
            "meta_trace_id": TRACE_HEADER,
            "header_trace_id": TRACE_HEADER,
        })
    );

    // §2: the richer error model, decoded by grpcio-status: exactly one
    // ErrorInfo with the stable reason, our domain and the trace ID
    // (`context.trace_id`) in its metadata.
    assert_eq!(
        checks["unknown_task"],
        json!({
            "check": "unknown_task",
            "code": "INVALID_ARGUMENT",
            "error_infos": 1,
            "reason": "TASK_UNKNOWN",
            "domain": "ai-orchestrator",
            "trace_id": "py-interop-2",
            "header_trace_id": "py-interop-2",
        })
    );

    // Server streaming: `started`, the text in deltas, `completed` last
    // with the whole text (the mock's plain-text answer).
    let stream = &checks["execute_stream"];
    assert_eq!(
        merged(&stream["kinds"]),
        ["started", "delta", "completed"],
        "{stream}"
    );
    assert_eq!(
        stream["text_len"],
        json!("mock reply to 1 message(s)".len()),
        "{stream}"
    );
    assert_eq!(stream["deltas_are_text"], json!(true), "{stream}");
    assert_eq!(stream["trace_id"], json!("py-interop-3"), "{stream}");

    // §9.6: a built-in tool with a Struct input and output.
    assert_eq!(
        checks["invoke_echo"],
        json!({
            "check": "invoke_echo",
            "status": "INVOCATION_STATUS_SUCCEEDED",
            "output": {"text": "hi from python"},
            "tool": "system.echo",
        })
    );

    // §11.1: local.toml's scripted agent calls system.echo once, then answers.
    let turn = &checks["converse"];
    assert_eq!(
        merged(&turn["kinds"]),
        ["started", "tool_call", "tool_result", "delta", "completed"],
        "{turn}"
    );
    assert_eq!(turn["stop_reason"], json!("STOP_REASON_FINAL_ANSWER"));
    assert_eq!(turn["conversation_id_set"], json!(true));
    assert_eq!(turn["trace_id"], json!("py-interop-5"));
    assert_eq!(turn["tool_results"], json!([["system.echo", "SUCCEEDED"]]));

    // A 1 ms budget against a provider answering after 20 ms: the
    // server's DEADLINE_EXCEEDED, its ErrorInfo and the trace ID.
    assert_eq!(
        checks["short_deadline"],
        json!({
            "check": "short_deadline",
            "code": "DEADLINE_EXCEEDED",
            "error_infos": 1,
            "reason": "DEADLINE_EXCEEDED",
            "domain": "ai-orchestrator",
            "trace_id": "py-interop-6",
            "header_trace_id": "py-interop-6",
        })
    );

    app.stop().await;
}
