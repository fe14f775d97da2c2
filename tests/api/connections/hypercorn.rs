//! The provider leg against an HTTP/2 server nobody here wrote: hypercorn
//! (PyPI), which ends a connection after `keep_alive_max_requests`
//! requests with a GOAWAY and then closes it under the streams still in
//! flight, as nginx does after `keepalive_requests`. This is how the burst
//! of issue #31 happens against real servers (docs/adr/0020): every call
//! on that connection fails within the same millisecond, some before the
//! request was processed (above the GOAWAY's last stream ID: resent), some
//! while their response body was being read (retried). None of it may
//! open the breaker.

use super::spawn;
use crate::{common::ctx, tools::counterparts};
use ai_orchestrator::api::pb;
use std::{path::Path, process::Stdio};
use tokio::io::{AsyncBufReadExt, BufReader};

/// Callers, each with one call in flight at a time (closed loop).
const CALLERS: usize = 64;
/// Calls per caller.
const CALLS: usize = 8;
/// Requests hypercorn serves on one connection before it ends it.
const PER_CONNECTION: usize = 200;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_ending_connections_under_load_never_opens_the_breaker() {
    let script =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/api/connections/hypercorn_upstream.py");
    let mut upstream = tokio::process::Command::new(counterparts::python_with_hypercorn())
        .arg(script)
        .arg(PER_CONNECTION.to_string())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let stdout = upstream.stdout.take().unwrap();
    let port = BufReader::new(stdout)
        .lines()
        .next_line()
        .await
        .unwrap()
        .expect("hypercorn prints its port");
    let app = spawn(format!("127.0.0.1:{port}").parse().unwrap()).await;

    let callers = (0..CALLERS).map(|_| {
        let mut client = app.client.clone();
        async move {
            let mut codes = Vec::new();
            for _ in 0..CALLS {
                let mut context = ctx().unwrap();
                context.priority = pb::Priority::Background as i32;
                let call = client
                    .execute(pb::ExecuteRequest {
                        context: Some(context),
                        task: "meeting_brief".into(),
                        ..Default::default()
                    })
                    .await;
                codes.push(
                    call.map(|_| ())
                        .map_err(|s| (s.code(), s.message().to_owned())),
                );
            }
            codes
        }
    });
    let codes: Vec<_> = futures::future::join_all(callers)
        .await
        .into_iter()
        .flatten()
        .collect();

    let failed: Vec<_> = codes.iter().filter_map(|c| c.as_ref().err()).collect();
    // A call cut by a connection is retried on a new one (BACKGROUND: the
    // full retry schedule). One cut on every attempt fails honestly, with
    // its attempts, and so does one whose stream got no answer after a
    // GOAWAY until the deadline: rare, and never refused by an open
    // breaker.
    let honest = |(code, message): &&(tonic::Code, String)| {
        (*code == tonic::Code::Unavailable && message.contains("provider attempt(s) failed"))
            || *code == tonic::Code::DeadlineExceeded
    };
    assert!(
        failed.len() <= CALLERS / 16 && failed.iter().all(honest),
        "{} of {} calls failed: {failed:?}",
        failed.len(),
        codes.len()
    );

    let health = app.provider_health("h2").await;
    assert_eq!(health.state, pb::BreakerState::Closed as i32, "{health:?}");
    // hypercorn did end connections under the calls (512 calls, 200 per
    // connection), by its own count; nothing else failed.
    let stats: serde_json::Value = reqwest::get(format!("http://127.0.0.1:{port}/stats"))
        .await
        .expect("hypercorn's stats")
        .json()
        .await
        .expect("stats JSON");
    assert!(
        stats["busiest_connection"].as_u64() >= Some(PER_CONNECTION as u64),
        "no connection reached its limit: {stats}"
    );
    assert_eq!(
        health.recent_errors, health.recent_connection_errors,
        "{health:?}"
    );
    app.stop().await;
}
