//! A hostile upstream cannot raise the server's memory past the documented
//! bound (docs/operations.md, "Memory"): a huge body, an endless stream of
//! text and an endless SSE line are each cut at the provider's
//! `max_response_bytes` and fall back.
//!
//! Its own test binary, so the process's resident set is this test's alone.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed expectation is the assertion

#[path = "api/common.rs"]
#[allow(dead_code)]
mod common;

use ai_orchestrator::api::pb;
use axum::{body::Body, http::header, response::IntoResponse, routing::post};
use common::{TestApp, ctx};
use tokio::net::TcpListener;
use tonic_types::StatusExt;

/// What each of the upstream's "models" sends: at least this much, in
/// 64 KiB chunks, unless the reader hangs up first.
const HOSTILE_BYTES: usize = 256 * 1024 * 1024;
const CHUNK: usize = 64 * 1024;
/// The provider's limit in this test.
const LIMIT: usize = 1024 * 1024;
/// Calls of each kind at once.
const CONCURRENT: usize = 4;

async fn hostile(body: String) -> impl IntoResponse {
    let request: serde_json::Value = serde_json::from_str(&body).unwrap();
    let model = request["model"].as_str().unwrap_or_default().to_owned();
    let piece = "x".repeat(CHUNK - 200);
    let content_type = if model == "huge-body" {
        "application/json"
    } else {
        "text/event-stream"
    };
    let stream = async_stream::stream! {
        let chunk = match model.as_str() {
            // A JSON body that never ends (one string value growing).
            "huge-body" => {
                yield Ok::<_, std::io::Error>(bytes::Bytes::from_static(br#"{"choices":[{"message":{"content":""#));
                bytes::Bytes::from("y".repeat(CHUNK))
            }
            // Valid chunks forever: the streamed text grows without end.
            "endless-stream" => {
                let event = serde_json::json!({"choices": [{"index": 0, "delta": {"content": piece}, "finish_reason": null}]});
                bytes::Bytes::from(format!("data: {event}\n\n"))
            }
            // One SSE line that never ends.
            _ => {
                yield Ok(bytes::Bytes::from_static(b"data: "));
                bytes::Bytes::from("z".repeat(CHUNK))
            }
        };
        for _ in 0..HOSTILE_BYTES / CHUNK {
            yield Ok(chunk.clone());
        }
    };
    (
        [(header::CONTENT_TYPE, content_type)],
        Body::from_stream(stream),
    )
}

fn toml(db: &str, upstream: &str) -> String {
    let task = |name: &str, model: &str| {
        format!(
            "[tasks.{name}]\nchain = [{{ provider = \"hostile\", model = \"{model}\" }}, {{ provider = \"spare\", model = \"m\" }}]\n"
        )
    };
    format!(
        r#"
[server]
default_timeout = "30s"
[database]
url = "{db}"
[providers.hostile]
kind = "openai"
base_url = "{upstream}/v1"
timeout = "30s"
max_response_bytes = {LIMIT}
[providers.spare]
kind = "mock"
[pricing.m]
price = "unknown"
[pricing.huge-body]
price = "unknown"
[pricing.endless-stream]
price = "unknown"
[pricing.endless-line]
price = "unknown"
{}{}{}"#,
        task("huge", "huge-body"),
        task("stream", "endless-stream"),
        task("line", "endless-line"),
    )
}

/// Resident set of this process, and its peak since the last reset, KiB.
fn rss_kib() -> (u64, u64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse().ok())
            .unwrap()
    };
    (field("VmRSS:"), field("VmHWM:"))
}

fn reset_peak() {
    // "5" resets VmHWM to the current RSS (Linux >= 4.0).
    std::fs::write("/proc/self/clear_refs", "5").unwrap();
}

fn execute(task: &str) -> pb::ExecuteRequest {
    pb::ExecuteRequest {
        context: ctx(),
        task: task.into(),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hostile_upstream_cannot_raise_memory_past_the_bound() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream = format!("http://{}", listener.local_addr().unwrap());
    let app = axum::Router::new().route("/v1/chat/completions", post(hostile));
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite://{}", dir.path().join("m.db").display());
    let app = TestApp::spawn_toml(&toml(&db, &upstream)).await;

    // Warm up every path once, so one-time allocations are not counted.
    let mut client = app.client.clone();
    client.execute(execute("huge")).await.unwrap();

    let (before, _) = rss_kib();
    reset_peak();
    let unary = (0..CONCURRENT).map(|_| {
        let mut c = app.client.clone();
        async move { c.execute(execute("huge")).await.unwrap().into_inner() }
    });
    let streams = ["stream", "line"]
        .into_iter()
        .flat_map(|task| (0..CONCURRENT).map(move |_| (task, ())));
    // An endless stream of text has passed deltas on before it is cut, so
    // it ends with an error (no fallback after output); an endless line
    // never gave a delta and falls back.
    let streamed = streams.map(|(task, ())| {
        let mut c = app.client.clone();
        async move {
            let mut events = c.execute_stream(execute(task)).await.unwrap().into_inner();
            let mut last = None;
            loop {
                match events.message().await {
                    Ok(Some(event)) => last = event.event,
                    Ok(None) => break,
                    Err(status) => {
                        assert_eq!(task, "stream", "{status:?}");
                        let info = status.get_details_error_info().unwrap();
                        assert_eq!(
                            info.metadata["attempts"],
                            "hostile/endless-stream:RESPONSE_TOO_LARGE"
                        );
                        return None;
                    }
                }
            }
            match last {
                Some(pb::execute_event::Event::Completed(done)) => Some(done),
                other => panic!("{task}: {other:?}"),
            }
        }
    });
    let (answers, streamed) = tokio::join!(
        futures::future::join_all(unary),
        futures::future::join_all(streamed)
    );
    let (_, peak) = rss_kib();
    assert_eq!(streamed.iter().filter(|s| s.is_none()).count(), CONCURRENT);
    for answer in answers.iter().chain(streamed.iter().flatten()) {
        let meta = answer.meta.as_ref().unwrap();
        assert_eq!(meta.provider, "spare", "fell back: {meta:?}");
        assert_eq!(
            meta.attempts[0].error_code, "RESPONSE_TOO_LARGE",
            "{meta:?}"
        );
    }
    // 12 calls each offered 256 MiB; each may hold a few times LIMIT.
    let grew_mib = peak.saturating_sub(before) / 1024;
    let bound_mib = (3 * CONCURRENT * 3 * LIMIT / (1024 * 1024) + 16) as u64;
    assert!(
        grew_mib <= bound_mib,
        "RSS grew {grew_mib} MiB (bound {bound_mib} MiB) under a hostile upstream"
    );
    app.stop().await;
}
