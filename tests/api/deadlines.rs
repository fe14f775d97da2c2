//! How a call ends early, end to end: the budget's deadline, a stream that
//! fails after its first delta, and a client that goes away (the upstream
//! HTTP call must be cancelled, not left running).

use crate::common::ctx;
use crate::routing::{calls, classification, classify, spawn_at};
use ai_orchestrator::api::pb;
use pb::execute_event::Event;
use serde_json::json;
use std::{
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};
use tokio::{net::TcpListener, sync::Notify};
use tonic::Code;
use tonic_types::StatusExt;
use wiremock::{Mock, MockServer, matchers::method};

/// How long an upstream may take to notice that the orchestrator hung up.
/// Well under the providers' 2 s timeout, so only a cancel can explain it.
const NOTICE: Duration = Duration::from_secs(1);

/// What a [`Scripted`] upstream tracks.
#[derive(Default)]
struct Probe {
    calls: AtomicUsize,
    /// A request arrived.
    called: Notify,
    /// The test lets the response go on past its head.
    release: Notify,
    /// A response body was dropped before it was finished: the client of
    /// the upstream (the orchestrator) hung up.
    hung_up: Notify,
}

/// Notifies `hung_up` when dropped unfinished.
struct HangUpGuard {
    probe: Arc<Probe>,
    finished: bool,
}

impl Drop for HangUpGuard {
    fn drop(&mut self) {
        if !self.finished {
            self.probe.hung_up.notify_one();
        }
    }
}

/// What a [`Scripted`] upstream does after the head of its response.
#[derive(Clone, Copy)]
enum Then {
    /// Waits for [`Probe::release`], sends this and ends the response.
    Send(&'static str),
    /// Never ends: sends this every 50 ms (so a hang-up is noticed on write).
    Hang(&'static str),
}

/// A fake OpenAI endpoint on a real socket that answers 200 with `head` at
/// once and then follows its script.
struct Scripted {
    uri: String,
    probe: Arc<Probe>,
    server: tokio::task::JoinHandle<()>,
}

impl Scripted {
    async fn start(content_type: &'static str, head: String, then: Then) -> Self {
        let probe = Arc::new(Probe::default());
        let shared = probe.clone();
        let handler = move || {
            let probe = shared.clone();
            let head = head.clone();
            async move {
                probe.calls.fetch_add(1, Ordering::SeqCst);
                probe.called.notify_one();
                let body = async_stream::stream! {
                    let mut guard = HangUpGuard { probe: probe.clone(), finished: false };
                    yield Ok::<_, std::io::Error>(bytes::Bytes::from(head));
                    match then {
                        Then::Send(tail) => {
                            probe.release.notified().await;
                            yield Ok(bytes::Bytes::from_static(tail.as_bytes()));
                            guard.finished = true;
                        }
                        Then::Hang(keepalive) => loop {
                            tokio::time::sleep(Duration::from_millis(50)).await;
                            yield Ok(bytes::Bytes::from_static(keepalive.as_bytes()));
                        },
                    }
                };
                (
                    [(axum::http::header::CONTENT_TYPE, content_type)],
                    axum::body::Body::from_stream(body),
                )
            }
        };
        let app = axum::Router::new().route("/v1/chat/completions", axum::routing::post(handler));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let uri = format!("http://{}", listener.local_addr().unwrap());
        let server = tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        Self { uri, probe, server }
    }

    fn calls(&self) -> usize {
        self.probe.calls.load(Ordering::SeqCst)
    }

    /// Waits (bounded) until the response body is dropped unfinished.
    async fn hung_up_within(&self, limit: Duration) -> bool {
        tokio::time::timeout(limit, self.probe.hung_up.notified())
            .await
            .is_ok()
    }
}

impl Drop for Scripted {
    fn drop(&mut self) {
        self.server.abort();
    }
}

/// One SSE `data:` line of a Chat Completions chunk carrying `delta`.
fn chunk(delta: serde_json::Value) -> String {
    let chunk = json!({"id": "chatcmpl-9", "object": "chat.completion.chunk", "created": 1_732_000_000,
                       "model": "gpt-4o-mini", "choices": [{"index": 0, "delta": delta, "finish_reason": null}]});
    format!("data: {chunk}\n\n")
}

/// The stream's start: the role chunk and a first delta, "Meet ".
fn first_delta() -> String {
    chunk(json!({"role": "assistant", "content": ""})) + &chunk(json!({"content": "Meet "}))
}

fn brief() -> pb::ExecuteRequest {
    pb::ExecuteRequest {
        context: ctx(),
        task: "meeting_brief".into(),
        ..Default::default()
    }
}

/// An upstream that is never called (the fallback in these tests).
async fn unused_fallback() -> MockServer {
    let fallback = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(classification())
        .mount(&fallback)
        .await;
    fallback
}

#[tokio::test]
async fn the_budget_bounds_the_whole_chain_without_a_grpc_deadline() {
    let (primary, fallback) = (MockServer::start().await, MockServer::start().await);
    for server in [&primary, &fallback] {
        Mock::given(method("POST"))
            .respond_with(classification().set_delay(Duration::from_secs(10)))
            .mount(server)
            .await;
    }
    let app = spawn_at(&primary.uri(), &fallback.uri(), "").await;
    let mut request = classify(pb::Priority::Background);
    request.budget = Some(pb::Budget {
        max_latency_ms: 300,
        max_cost_usd: 0.0,
    });
    // No `set_timeout`: the budget alone bounds the call.
    let started = Instant::now();
    let status = app.client.clone().classify_sms(request).await.unwrap_err();
    let took = started.elapsed();
    // The budget gets the gRPC deadline's early-reply margin (10% of
    // 300 ms): the server gives up at 270 ms so the reply arrives within it.
    assert!(
        took >= Duration::from_millis(265) && took < Duration::from_millis(1_000),
        "budget 300 ms, answered after {took:?}"
    );
    assert_eq!(status.code(), Code::DeadlineExceeded, "{status:?}");
    let info = status.get_details_error_info().unwrap();
    assert_eq!(info.reason, "DEADLINE_EXCEEDED");
    assert_eq!(
        info.metadata["attempts"], "primary/gpt-4o-mini:DEADLINE_EXCEEDED",
        "one attempt, cut at the deadline; no retry, no fallback"
    );
    assert_eq!((calls(&primary).await, calls(&fallback).await), (1, 0));
    app.stop().await;
}

#[tokio::test]
async fn a_stream_failing_after_its_first_delta_ends_with_an_error_and_no_fallback() {
    let in_stream_error = r#"data: {"error":{"message":"canary-upstream-secret","type":"server_error","param":null,"code":null}}

"#;
    // An in-stream error, and a stream cut off (no finish, no [DONE]).
    for (tail, code) in [
        (in_stream_error, "HTTP_502"),
        (": bye\n\n", "MALFORMED_RESPONSE"),
    ] {
        let primary = Scripted::start("text/event-stream", first_delta(), Then::Send(tail)).await;
        let fallback = unused_fallback().await;
        let app = spawn_at(&primary.uri, &fallback.uri(), "").await;
        let mut stream = app
            .client
            .clone()
            .execute_stream(brief())
            .await
            .unwrap()
            .into_inner();
        let event = |e: Option<pb::ExecuteEvent>| e.and_then(|e| e.event);
        let started = event(stream.message().await.unwrap());
        assert!(
            matches!(&started, Some(Event::Started(s)) if s.provider == "primary"),
            "{started:?}"
        );
        let delta = event(stream.message().await.unwrap());
        assert!(
            matches!(&delta, Some(Event::Delta(d)) if d.text == "Meet "),
            "{delta:?}"
        );
        // The delta has reached the client; only now does the upstream fail.
        primary.probe.release.notify_one();
        let status = match stream.message().await {
            Err(status) => status,
            Ok(more) => panic!("{tail:?}: expected an error, got {more:?}"),
        };
        assert_eq!(status.code(), Code::Unavailable, "{tail:?}: {status:?}");
        let info = status.get_details_error_info().unwrap();
        assert_eq!(info.reason, "ALL_PROVIDERS_FAILED");
        assert_eq!(
            info.metadata["attempts"],
            format!("primary/gpt-4o-mini:{code}")
        );
        assert!(!format!("{status:?}").contains("canary-upstream-secret"));
        assert_eq!(
            calls(&fallback).await,
            0,
            "{tail:?}: no fallback after output"
        );
        assert_eq!(primary.calls(), 1);
        app.stop().await;
    }
}

#[tokio::test]
async fn a_client_that_goes_away_cancels_the_upstream_call() {
    // 200 at once, then a JSON body that never completes (whitespace trickle).
    let primary = Scripted::start("application/json", " ".into(), Then::Hang(" ")).await;
    let fallback = unused_fallback().await;
    let app = spawn_at(&primary.uri, &fallback.uri(), "").await;
    let mut client = app.client.clone();
    // No grpc-timeout: only the client's going away can stop the server.
    let call = tokio::spawn(async move {
        client
            .classify_sms(classify(pb::Priority::Background))
            .await
    });
    tokio::time::timeout(Duration::from_secs(5), primary.probe.called.notified())
        .await
        .expect("the upstream was called");
    assert!(
        !primary.hung_up_within(Duration::from_millis(200)).await,
        "still waiting for the body while the client is there"
    );
    call.abort();
    let gave_up = Instant::now();
    assert!(
        primary.hung_up_within(NOTICE).await,
        "the upstream call outlived its client"
    );
    assert!(gave_up.elapsed() < NOTICE);
    assert_eq!(primary.calls(), 1, "no retry for a caller that is gone");
    assert_eq!(
        calls(&fallback).await,
        0,
        "no fallback for a caller that is gone"
    );
    app.stop().await;
}

#[tokio::test]
async fn dropping_a_stream_cancels_the_upstream_stream() {
    let primary = Scripted::start(
        "text/event-stream",
        first_delta(),
        Then::Hang(": keep-alive\n\n"),
    )
    .await;
    let fallback = unused_fallback().await;
    let app = spawn_at(&primary.uri, &fallback.uri(), "").await;
    let mut stream = app
        .client
        .clone()
        .execute_stream(brief())
        .await
        .unwrap()
        .into_inner();
    for _ in 0..2 {
        // Started, then the first delta.
        stream.message().await.unwrap().unwrap();
    }
    assert!(
        !primary.hung_up_within(Duration::from_millis(200)).await,
        "still streaming while the client is there"
    );
    drop(stream);
    let gave_up = Instant::now();
    assert!(
        primary.hung_up_within(NOTICE).await,
        "the upstream stream outlived its client"
    );
    assert!(gave_up.elapsed() < NOTICE);
    assert_eq!(calls(&fallback).await, 0);
    app.stop().await;
}

/// Callers whose own deadlines are shorter than a healthy provider's answer
/// time must not open its breaker: their cut attempts are the callers'
/// doing. Another team's call without such a deadline is still served by
/// that provider, not degraded to the fallback.
#[tokio::test]
async fn short_caller_deadlines_never_open_a_slow_providers_breaker() {
    let (primary, fallback) = (MockServer::start().await, MockServer::start().await);
    Mock::given(method("POST"))
        .respond_with(classification().set_delay(Duration::from_millis(400)))
        .mount(&primary)
        .await;
    Mock::given(method("POST"))
        .respond_with(classification())
        .mount(&fallback)
        .await;
    // A breaker that opens on the first counted failure.
    let app = spawn_at(
        &primary.uri(),
        &fallback.uri(),
        "[providers.primary.breaker]\nfailure_threshold = 1",
    )
    .await;
    // Unary calls and streams with a 100 ms budget (the server's deadline;
    // the client waits for its answer however loaded the machine is).
    let unary = (0..8).map(|_| {
        let mut client = app.client.clone();
        async move {
            let mut body = classify(pb::Priority::Background);
            body.budget = Some(pb::Budget {
                max_latency_ms: 100,
                max_cost_usd: 0.0,
            });
            client.classify_sms(body).await.unwrap_err()
        }
    });
    for status in futures::future::join_all(unary).await {
        assert_eq!(status.code(), Code::DeadlineExceeded, "{status:?}");
        let info = status.get_details_error_info().unwrap();
        assert_eq!(
            info.metadata["attempts"],
            "primary/gpt-4o-mini:DEADLINE_EXCEEDED"
        );
    }
    for _ in 0..3 {
        let mut request = brief();
        request.budget = Some(pb::Budget {
            max_latency_ms: 100,
            max_cost_usd: 0.0,
        });
        let mut stream = app
            .client
            .clone()
            .execute_stream(request)
            .await
            .unwrap()
            .into_inner();
        let status = loop {
            match stream.message().await {
                Ok(Some(_)) => continue,
                Ok(None) => panic!("the stream ended without the deadline error"),
                Err(status) => break status,
            }
        };
        assert_eq!(status.code(), Code::DeadlineExceeded, "{status:?}");
    }
    // The same deadline as the gRPC `grpc-timeout` header. The client's
    // own timer races the server's answer here, so either side may report
    // it, and a call the client abandoned first is counted as cancelled.
    for _ in 0..3 {
        let mut request = tonic::Request::new(classify(pb::Priority::Background));
        request.set_timeout(Duration::from_millis(100));
        let status = app.client.clone().classify_sms(request).await.unwrap_err();
        // tonic reports its own timer's expiry as CANCELLED.
        assert!(
            matches!(status.code(), Code::DeadlineExceeded | Code::Cancelled),
            "{status:?}"
        );
    }
    // A call the client abandoned is counted once the server sees it go.
    crate::common::wait_for(|| async {
        let health = app.provider_health("primary").await;
        health.recent_deadline_exceeded + health.recent_cancelled == 14
    })
    .await;
    let health = app.provider_health("primary").await;
    assert_eq!(
        health.state,
        pb::BreakerState::Closed as i32,
        "callers' deadlines opened the breaker: {health:?}"
    );
    assert_eq!(health.consecutive_failures, 0);
    assert_eq!((health.recent_calls, health.recent_errors), (0, 0));
    assert!(health.recent_deadline_exceeded >= 11, "{health:?}");

    // Another team, with time to wait: the primary serves it.
    let mut request = classify(pb::Priority::Background);
    request.context.as_mut().unwrap().team_id = "t2".into();
    let meta = app
        .client
        .clone()
        .classify_sms(request)
        .await
        .unwrap()
        .into_inner()
        .meta
        .unwrap();
    assert_eq!((meta.provider.as_str(), meta.degraded), ("primary", false));
    assert_eq!(calls(&fallback).await, 0);
    let health = app.provider_health("primary").await;
    assert_eq!((health.recent_calls, health.recent_errors), (1, 0));
    app.stop().await;
}

/// A caller that goes away mid-attempt leaves a CANCELLED attempt in the
/// provider's health, not a failure.
#[tokio::test]
async fn a_caller_that_goes_away_is_counted_as_cancelled_not_as_a_failure() {
    let primary = Scripted::start("application/json", " ".into(), Then::Hang(" ")).await;
    let fallback = unused_fallback().await;
    let app = spawn_at(
        &primary.uri,
        &fallback.uri(),
        "[providers.primary.breaker]\nfailure_threshold = 1",
    )
    .await;
    let mut client = app.client.clone();
    let call = tokio::spawn(async move {
        client
            .classify_sms(classify(pb::Priority::Background))
            .await
    });
    tokio::time::timeout(Duration::from_secs(5), primary.probe.called.notified())
        .await
        .expect("the upstream was called");
    call.abort();
    assert!(primary.hung_up_within(NOTICE).await);
    // The server drops the call's future when it notices; wait for that.
    let deadline = Instant::now() + Duration::from_secs(5);
    let health = loop {
        let health = app.provider_health("primary").await;
        if health.recent_cancelled > 0 || Instant::now() > deadline {
            break health;
        }
        tokio::task::yield_now().await;
    };
    assert_eq!(health.recent_cancelled, 1, "{health:?}");
    assert_eq!(health.state, pb::BreakerState::Closed as i32);
    assert_eq!((health.recent_calls, health.recent_errors), (0, 0));
    app.stop().await;
}
