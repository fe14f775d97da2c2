//! One broken provider connection must not open the breaker for everyone
//! (issue #31). A fake OpenAI upstream speaking real HTTP/2 (hyper's h2c
//! server) sits behind a proxy that, on the first connection only, sends a
//! GOAWAY or resets the TCP connection with 32 streams in flight, or holds
//! the server's SETTINGS until 32 streams have been sent past its small
//! `max_concurrent_streams`. In each, the breaker stays CLOSED, every call
//! succeeds on a new connection (or the same one, now within its limit),
//! and GetProviderHealth shows what happened.

mod hypercorn;

use crate::common::{TestApp, ctx};
use ai_orchestrator::api::pb;
use hyper_util::rt::{TokioExecutor, TokioIo};
use std::{
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
};

/// Calls in flight when the connection event happens.
const IN_FLIGHT: usize = 32;

/// What the proxy does to the first connection.
#[derive(Clone, Copy)]
enum Chaos {
    /// Once `IN_FLIGHT` streams were opened: a GOAWAY naming the 16th as
    /// the last stream processed, then the connection closes.
    GoAway,
    /// Once `IN_FLIGHT` streams were opened: the TCP connection is reset.
    Reset,
    /// The server's bytes (its SETTINGS first) are held until `IN_FLIGHT`
    /// streams were opened, so the client sends past the server's limit.
    HoldSettings,
}

/// An h2c upstream answering Chat Completions after `delay`; calls on its
/// first connection are held (never answered) when `hold_first` is set.
async fn upstream(max_streams: u32, hold_first: bool, delay: Duration) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let body = serde_json::json!({
        "id": "chatcmpl-AbC123", "object": "chat.completion", "created": 1_732_000_000,
        "model": "gpt-4o-mini-2024-07-18",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "Brief: Acme, Tuesday."},
                     "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 120, "completion_tokens": 18, "total_tokens": 138}
    })
    .to_string();
    tokio::spawn(async move {
        for connection in 0.. {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            let body = body.clone();
            let hold = hold_first && connection == 0;
            let service = hyper::service::service_fn(move |_req| {
                let body = body.clone();
                async move {
                    if hold {
                        std::future::pending::<()>().await;
                    }
                    tokio::time::sleep(delay).await;
                    hyper::Response::builder()
                        .header("content-type", "application/json")
                        .body(body)
                }
            });
            tokio::spawn(
                hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                    .max_concurrent_streams(max_streams)
                    .serve_connection(TokioIo::new(tcp), service),
            );
        }
    });
    addr
}

/// The client-initiated stream IDs opened by HEADERS frames in a
/// client-to-server HTTP/2 byte stream, fed in any chunks.
#[derive(Default)]
struct StreamsOpened {
    buf: Vec<u8>,
    preface_done: bool,
    ids: Vec<u32>,
}

impl StreamsOpened {
    fn feed(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
        if !self.preface_done {
            if self.buf.len() < 24 {
                return;
            }
            self.buf.drain(..24);
            self.preface_done = true;
        }
        while self.buf.len() >= 9 {
            let len = u32::from_be_bytes([0, self.buf[0], self.buf[1], self.buf[2]]) as usize;
            if self.buf.len() < 9 + len {
                return;
            }
            let kind = self.buf[3];
            let id = u32::from_be_bytes([self.buf[5], self.buf[6], self.buf[7], self.buf[8]])
                & 0x7fff_ffff;
            if kind == 0x1 && !self.ids.contains(&id) {
                self.ids.push(id);
            }
            self.buf.drain(..9 + len);
        }
    }
}

/// Where a server-to-client HTTP/2 byte stream stands: bytes left of the
/// frame being relayed, so a frame is only ever injected between two.
#[derive(Default)]
struct FrameEdge {
    header: Vec<u8>,
    left: usize,
}

impl FrameEdge {
    fn feed(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            if self.left > 0 {
                let n = self.left.min(bytes.len());
                self.left -= n;
                bytes = &bytes[n..];
                continue;
            }
            let n = (9 - self.header.len()).min(bytes.len());
            self.header.extend_from_slice(&bytes[..n]);
            bytes = &bytes[n..];
            if self.header.len() == 9 {
                let h = &self.header;
                self.left = u32::from_be_bytes([0, h[0], h[1], h[2]]) as usize;
                self.header.clear();
            }
        }
    }

    fn at_boundary(&self) -> bool {
        self.left == 0 && self.header.is_empty()
    }
}

/// A GOAWAY frame: last stream ID and NO_ERROR.
fn goaway(last_stream_id: u32) -> Vec<u8> {
    let mut frame = vec![0, 0, 8, 0x7, 0, 0, 0, 0, 0];
    frame.extend_from_slice(&last_stream_id.to_be_bytes());
    frame.extend_from_slice(&0_u32.to_be_bytes());
    frame
}

/// A TCP proxy to `upstream` doing `chaos` to its first connection.
/// Returns its address and the connections it accepted.
async fn proxy(upstream: SocketAddr, chaos: Chaos) -> (SocketAddr, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let accepted = Arc::new(AtomicUsize::new(0));
    let counter = accepted.clone();
    tokio::spawn(async move {
        loop {
            let Ok((client, _)) = listener.accept().await else {
                return;
            };
            let first = counter.fetch_add(1, Ordering::SeqCst) == 0;
            let server = TcpStream::connect(upstream).await.unwrap();
            tokio::spawn(relay(client, server, first.then_some(chaos)));
        }
    });
    (addr, accepted)
}

async fn relay(client: TcpStream, server: TcpStream, chaos: Option<Chaos>) {
    if matches!(chaos, Some(Chaos::Reset)) {
        // Closing with a zero linger sends RST instead of FIN.
        client.set_zero_linger().unwrap();
    }
    let (mut client_rx, mut client_tx) = client.into_split();
    let (mut server_rx, mut server_tx) = server.into_split();
    let mut opened = StreamsOpened::default();
    let mut edge = FrameEdge::default();
    let mut holding = matches!(chaos, Some(Chaos::HoldSettings));
    let mut held = Vec::new();
    let (mut up, mut down) = (vec![0_u8; 16384], vec![0_u8; 16384]);
    loop {
        tokio::select! {
            n = client_rx.read(&mut up) => {
                let Ok(n @ 1..) = n else { return };
                if server_tx.write_all(&up[..n]).await.is_err() {
                    return;
                }
                opened.feed(&up[..n]);
            }
            n = server_rx.read(&mut down) => {
                let Ok(n @ 1..) = n else { return };
                edge.feed(&down[..n]);
                if holding {
                    held.extend_from_slice(&down[..n]);
                } else if client_tx.write_all(&down[..n]).await.is_err() {
                    return;
                }
            }
        }
        if opened.ids.len() < IN_FLIGHT {
            continue;
        }
        match chaos {
            Some(Chaos::GoAway) if edge.at_boundary() => {
                // GOAWAY, then a clean close (FIN): the client reads both.
                // Unread bytes left on our side would make the kernel send
                // a reset, which can discard them.
                drop((server_rx, server_tx));
                let _ = client_tx.write_all(&goaway(opened.ids[15])).await;
                let _ = client_tx.shutdown().await;
                while matches!(client_rx.read(&mut up).await, Ok(1..)) {}
                return;
            }
            // Closed with a zero linger: the client gets a reset (the
            // halves must be one socket again, or dropping the write half
            // sends a FIN first).
            Some(Chaos::Reset) => {
                drop(client_rx.reunite(client_tx));
                return;
            }
            Some(Chaos::HoldSettings) if holding => {
                holding = false;
                if client_tx.write_all(&held).await.is_err() {
                    return;
                }
            }
            _ => {}
        }
    }
}

async fn spawn(proxy: SocketAddr) -> TestApp {
    let dir = tempfile::tempdir().unwrap();
    let toml = format!(
        r#"
[server]
default_timeout = "20s"
[database]
url = "sqlite://{}"
[providers.h2]
kind = "openai"
base_url = "http://{proxy}/v1"
api_key_env = "TEST_OPENAI_KEY"
http2_prior_knowledge = true
timeout = "10s"
[tasks.meeting_brief]
chain = [{{ provider = "h2", model = "gpt-4o-mini" }}]
[pricing."gpt-4o-mini"]
input_per_mtok = 0.15
output_per_mtok = 0.60
[retry]
base_backoff = "20ms"
max_backoff = "80ms"
"#,
        dir.path().join("h2.db").display()
    );
    let mut app = TestApp::spawn_toml_env(&toml, |name| {
        (name == "TEST_OPENAI_KEY").then(|| "sk-test".into())
    })
    .await;
    app.keep(dir);
    app
}

/// `IN_FLIGHT` BACKGROUND calls at once (the full retry schedule); returns
/// the provider's health after they all ended.
async fn burst(app: &TestApp) -> pb::ProviderHealth {
    let calls = (0..IN_FLIGHT).map(|_| {
        let mut client = app.client.clone();
        async move {
            let mut context = ctx().unwrap();
            context.priority = pb::Priority::Background as i32;
            client
                .execute(pb::ExecuteRequest {
                    context: Some(context),
                    task: "meeting_brief".into(),
                    ..Default::default()
                })
                .await
        }
    });
    for result in futures::future::join_all(calls).await {
        let meta = result.unwrap().into_inner().meta.unwrap();
        assert_eq!(meta.provider, "h2");
    }
    app.provider_health("h2").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_goaway_with_streams_in_flight_does_not_open_the_breaker() {
    let (proxy, connections) =
        proxy(upstream(250, true, Duration::ZERO).await, Chaos::GoAway).await;
    let app = spawn(proxy).await;
    let health = burst(&app).await;
    assert_eq!(health.state, pb::BreakerState::Closed as i32, "{health:?}");
    // Above the GOAWAY's last stream ID: never processed, resent at once.
    assert_eq!(health.recent_resent, 16, "{health:?}");
    // At or below it: may have been processed, failed with the connection
    // and retried by the normal rules.
    assert_eq!(health.recent_connection_errors, 16, "{health:?}");
    assert!(connections.load(Ordering::SeqCst) >= 2);
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_connection_with_streams_in_flight_does_not_open_the_breaker() {
    let (proxy, connections) = proxy(upstream(250, true, Duration::ZERO).await, Chaos::Reset).await;
    let app = spawn(proxy).await;
    let health = burst(&app).await;
    assert_eq!(health.state, pb::BreakerState::Closed as i32, "{health:?}");
    assert_eq!(health.consecutive_failures, 0, "{health:?}");
    assert_eq!(
        health.recent_connection_errors, IN_FLIGHT as u32,
        "{health:?}"
    );
    assert_eq!(health.recent_resent, 0, "{health:?}");
    assert!(connections.load(Ordering::SeqCst) >= 2);
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_refused_past_the_servers_limit_are_resent_not_counted() {
    // The first four calls last long enough that the server sees all 32
    // streams while they run, and refuses the other 28.
    let slow = Duration::from_millis(300);
    let (proxy, _) = proxy(upstream(4, false, slow).await, Chaos::HoldSettings).await;
    let app = spawn(proxy).await;
    let health = burst(&app).await;
    assert_eq!(health.state, pb::BreakerState::Closed as i32, "{health:?}");
    assert_eq!(health.consecutive_failures, 0, "{health:?}");
    assert_eq!(health.recent_resent, (IN_FLIGHT - 4) as u32, "{health:?}");
    assert_eq!(health.recent_connection_errors, 0, "{health:?}");
    assert_eq!(health.recent_errors, 0, "{health:?}");
    app.stop().await;
}

/// An HTTP/1.1 upstream with keep-alive. Once `stale` is set, every
/// connection accepted before reads its next request and resets instead of
/// answering (as if the server had dropped its idle connections just as
/// they were reused); connections accepted after answer every call.
async fn stale_keepalive_upstream(stale: Arc<std::sync::atomic::AtomicBool>) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let body = serde_json::json!({
        "id": "chatcmpl-AbC123", "object": "chat.completion", "created": 1_732_000_000,
        "model": "gpt-4o-mini-2024-07-18",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "Brief."},
                     "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 120, "completion_tokens": 18, "total_tokens": 138}
    })
    .to_string();
    let response = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    tokio::spawn(async move {
        loop {
            let Ok((mut tcp, _)) = listener.accept().await else {
                return;
            };
            let (response, stale) = (response.clone(), stale.clone());
            let old = !stale.load(Ordering::SeqCst);
            tokio::spawn(async move {
                while read_request(&mut tcp).await.is_some() {
                    if old && stale.load(Ordering::SeqCst) {
                        // Closing with a zero linger resets the connection.
                        let _ = tcp.set_zero_linger();
                        return;
                    }
                    if tcp.write_all(response.as_bytes()).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    addr
}

/// Reads one HTTP/1.1 request (head and `content-length` body).
async fn read_request(tcp: &mut TcpStream) -> Option<()> {
    let mut buf = Vec::new();
    let mut chunk = [0_u8; 4096];
    let head_end = loop {
        if let Some(at) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
        let n = tcp.read(&mut chunk).await.ok().filter(|n| *n > 0)?;
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_lowercase();
    let length: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    while buf.len() < head_end + length {
        let n = tcp.read(&mut chunk).await.ok().filter(|n| *n > 0)?;
        buf.extend_from_slice(&chunk[..n]);
    }
    Some(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_stale_pooled_http1_connections_counts_once() {
    let stale = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let upstream = stale_keepalive_upstream(stale.clone()).await;
    let dir = tempfile::tempdir().unwrap();
    let toml = format!(
        r#"
[database]
url = "sqlite://{}"
[providers.h1]
kind = "openai"
base_url = "http://{upstream}/v1"
api_key_env = "TEST_OPENAI_KEY"
[tasks.meeting_brief]
chain = [{{ provider = "h1", model = "gpt-4o-mini" }}]
[pricing."gpt-4o-mini"]
input_per_mtok = 0.15
output_per_mtok = 0.60
[retry]
base_backoff = "20ms"
max_backoff = "80ms"
"#,
        dir.path().join("h1.db").display()
    );
    let mut app = TestApp::spawn_toml_env(&toml, |name| {
        (name == "TEST_OPENAI_KEY").then(|| "sk-test".into())
    })
    .await;
    app.keep(dir);
    // The first burst fills the pool with connections the server will
    // reset on reuse; the second meets them all at once.
    let call = || {
        let mut client = app.client.clone();
        async move {
            let mut context = ctx().unwrap();
            context.priority = pb::Priority::Background as i32;
            client
                .execute(pb::ExecuteRequest {
                    context: Some(context),
                    task: "meeting_brief".into(),
                    ..Default::default()
                })
                .await
        }
    };
    for result in futures::future::join_all((0..IN_FLIGHT).map(|_| call())).await {
        result.unwrap();
    }
    stale.store(true, Ordering::SeqCst);
    for result in futures::future::join_all((0..IN_FLIGHT).map(|_| call())).await {
        assert_eq!(result.unwrap().into_inner().meta.unwrap().provider, "h1");
    }
    let health = app.provider_health("h1").await;
    assert_eq!(health.state, pb::BreakerState::Closed as i32, "{health:?}");
    assert_eq!(health.consecutive_failures, 0, "{health:?}");
    assert!(health.recent_connection_errors >= 1, "{health:?}");
    app.stop().await;
}
