//! What the load generator sends: gRPC calls to the orchestrator over a few
//! HTTP/2 connections (round-robin), Chat Completions calls to its HTTP edge
//! over pooled HTTP/1.1 keep-alive connections, or the body the
//! orchestrator sent upstream replayed straight to the fake upstream (the
//! baseline).

use crate::loadgen::{MakeRequest, Outcome};
use ai_orchestrator::api::pb::{
    self, agent_service_client::AgentServiceClient, orchestrator_client::OrchestratorClient,
    tool_service_client::ToolServiceClient,
};
use axum::body::Bytes;
use futures::future::BoxFuture;
use hyper::client::conn::http2::SendRequest;
use hyper_util::rt::{TokioExecutor, TokioIo};
use std::{
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    task::{Context, Poll},
    time::Duration,
};

/// Teams the load is spread over (each has its own ledger row).
const TEAMS: [&str; 8] = [
    "bench-t0", "bench-t1", "bench-t2", "bench-t3", "bench-t4", "bench-t5", "bench-t6", "bench-t7",
];

/// Input of the `Execute` calls (a `meeting_brief`).
pub const BRIEF_INPUT: &str = r#"{"company":"Acme Corp","attendees":["Ann Lee (VP Sales)","Bob Diaz (CTO)"],"meeting_at":"2025-03-12T15:00:00Z","notes":"Second call. 40 reps on the current tool, renewal in Q3. Asked about SSO and volume pricing."}"#;

/// Input of the `InvokeTool` calls (`system.echo`): about the size of an
/// SMS with its context.
const ECHO_TEXT: &str = "Yes, I'm interested - can you call me tomorrow afternoon? Ann, Acme Corp";

/// The RPCs under test.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rpc {
    /// `Execute` of a generic task.
    Execute,
    /// `ClassifySms`.
    ClassifySms,
    /// `InvokeTool` of `system.echo`: the tools' entry point (policy,
    /// schema, ledger, audit) without an upstream.
    InvokeTool,
    /// `AgentService.Converse`: one turn of three model calls (streamed)
    /// and two tool calls, stored as a new conversation.
    Converse,
    /// `POST /v1/chat/completions` on the HTTP edge (SPEC §13): `Execute`'s
    /// HTTP twin, the same task as `model` and its input as the one user
    /// message.
    ChatHttp,
}

impl Rpc {
    /// Name used in results.
    pub fn name(self) -> &'static str {
        match self {
            Rpc::Execute => "Execute",
            Rpc::ClassifySms => "ClassifySms",
            Rpc::InvokeTool => "InvokeTool",
            Rpc::Converse => "Converse",
            Rpc::ChatHttp => "ChatCompletionsHttp",
        }
    }

    /// Whether it calls the upstream with a body the direct baseline can
    /// replay (one non-streamed call per request). `ChatHttp`'s upstream
    /// body is not `Execute`'s (no prompt template), so the fake upstream
    /// keeps it apart and its baseline replays its own.
    pub fn has_direct_baseline(self) -> bool {
        matches!(self, Rpc::Execute | Rpc::ClassifySms | Rpc::ChatHttp)
    }
}

/// The gRPC clients of the load on one HTTP/2 connection: the
/// `Orchestrator` (what it dereferences to) and the `ToolService`; and the
/// server's HTTP edge, when it has one.
#[derive(Clone)]
pub struct Client {
    orchestrator: OrchestratorClient<H2>,
    /// The `ToolService` on the same connection.
    pub tools: ToolServiceClient<H2>,
    /// The `AgentService` on the same connection.
    pub agents: AgentServiceClient<H2>,
    /// The same server's HTTP edge (one pool shared by every `Client` of
    /// the server), when it was started with `[http]`.
    http: Option<HttpEdge>,
}

impl Client {
    fn new(h2: H2, http: Option<HttpEdge>) -> Self {
        Self {
            orchestrator: OrchestratorClient::new(h2.clone()),
            tools: ToolServiceClient::new(h2.clone()),
            agents: AgentServiceClient::new(h2),
            http,
        }
    }
}

impl std::ops::Deref for Client {
    type Target = OrchestratorClient<H2>;
    fn deref(&self) -> &Self::Target {
        &self.orchestrator
    }
}

impl std::ops::DerefMut for Client {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.orchestrator
    }
}

/// One HTTP/2 connection used by the gRPC client as it is. A tonic
/// `Channel` puts a queue and a task of its own in front of the connection
/// (to reconnect and balance), a hand-off per request that the load
/// generator would pay on the cores it shares with the server.
#[derive(Clone)]
pub struct H2 {
    send: SendRequest<tonic::body::Body>,
    authority: http::uri::Authority,
}

impl H2 {
    /// Opens a connection to `addr` (Nagle off, as the server's sockets).
    pub async fn connect(addr: SocketAddr) -> anyhow::Result<Self> {
        let tcp =
            tokio::time::timeout(Duration::from_secs(5), tokio::net::TcpStream::connect(addr))
                .await
                .map_err(|_| anyhow::anyhow!("connecting to {addr} timed out"))??;
        tcp.set_nodelay(true)?;
        let (send, connection) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tcp)).await?;
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, "gRPC connection closed");
            }
        });
        Ok(Self {
            send,
            authority: addr.to_string().parse()?,
        })
    }
}

impl tower::Service<http::Request<tonic::body::Body>> for H2 {
    type Response = http::Response<hyper::body::Incoming>;
    type Error = hyper::Error;
    type Future = BoxFuture<'static, Result<Self::Response, hyper::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), hyper::Error>> {
        self.send.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<tonic::body::Body>) -> Self::Future {
        // The generated client sends a path only; HTTP/2 wants the origin too.
        let mut parts = request.uri().clone().into_parts();
        parts.scheme = Some(http::uri::Scheme::HTTP);
        parts.authority = Some(self.authority.clone());
        if let Ok(uri) = http::Uri::from_parts(parts) {
            *request.uri_mut() = uri;
        }
        Box::pin(self.send.send_request(request))
    }
}

/// `count` separate HTTP/2 connections to the orchestrator, each beside
/// its HTTP edge `http` when it has one.
pub async fn connect(
    addr: SocketAddr,
    count: usize,
    http: Option<HttpEdge>,
) -> anyhow::Result<Arc<Vec<Client>>> {
    let mut clients = Vec::with_capacity(count);
    for _ in 0..count.max(1) {
        clients.push(Client::new(H2::connect(addr).await?, http.clone()));
    }
    Ok(Arc::new(clients))
}

/// The team of call `i`, on either edge.
fn team(i: u64) -> &'static str {
    TEAMS[(i % TEAMS.len() as u64) as usize]
}

fn context(i: u64) -> Option<pb::RequestContext> {
    Some(pb::RequestContext {
        team_id: team(i).to_owned(),
        user_id: "bench-user".to_owned(),
        channel: pb::Channel::System as i32,
        priority: pb::Priority::Interactive as i32,
        ..Default::default()
    })
}

/// How each gRPC call is sent.
#[derive(Debug, Clone, Copy)]
pub struct Sending {
    /// Client-side timeout of one request.
    pub timeout: Duration,
    /// Each call carries its own random `x-trace-id`, as callers that
    /// propagate their own trace do. Without it none is sent and the server
    /// makes a time-ordered one (UUIDv7), which lands at the right edge of
    /// every index on `trace_id` instead of anywhere in it.
    pub caller_trace_ids: bool,
}

impl Sending {
    fn prepare<T>(self, request: &mut tonic::Request<T>) {
        request.set_timeout(self.timeout);
        if self.caller_trace_ids
            && let Ok(id) = random_trace_id().parse()
        {
            request.metadata_mut().insert("x-trace-id", id);
        }
    }
}

/// An ID shaped as the server's own (32 hex digits), new for each call of
/// the process and spread uniformly: a counter through SplitMix64, a
/// bijection, so the first 16 digits alone never repeat.
fn random_trace_id() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let high = splitmix64(NEXT.fetch_add(1, Ordering::Relaxed));
    format!("{high:016x}{:016x}", splitmix64(high))
}

/// SplitMix64's output function (Steele, Lea and Flood, 2014).
fn splitmix64(n: u64) -> u64 {
    let mut z = n.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn status_code(status: &tonic::Status) -> String {
    format!("GRPC_{:?}", status.code()).to_uppercase()
}

/// What the answer must be to count as OK.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expect {
    /// Served by the primary target.
    Primary,
    /// Served by a fallback (`meta.degraded`).
    Degraded,
    /// Refused with UNAVAILABLE (every target skipped).
    Refused,
}

fn check_meta(meta: Option<&pb::ResponseMeta>, expect: Expect) -> Outcome {
    let degraded = meta.is_some_and(|m| m.degraded);
    match (expect, degraded) {
        (Expect::Primary, false) | (Expect::Degraded, true) => Ok(()),
        (Expect::Primary, true) => Err("UNEXPECTED_FALLBACK".into()),
        (Expect::Degraded, false) => Err("NOT_DEGRADED".into()),
        (Expect::Refused, _) => Err("ANSWERED".into()),
    }
}

/// A failed call: OK when a refusal was expected and this is one.
fn check_status(status: &tonic::Status, expect: Expect) -> Outcome {
    match (expect, status.code()) {
        (Expect::Refused, tonic::Code::Unavailable) => Ok(()),
        _ => Err(status_code(status)),
    }
}

/// gRPC calls of `rpc` (for `Execute`, of `task`) round-robin over
/// `clients`; for `ChatHttp`, its HTTP twin on their server's HTTP edge.
pub fn grpc(
    clients: Arc<Vec<Client>>,
    rpc: Rpc,
    task: &str,
    expect: Expect,
    sending: Sending,
) -> MakeRequest {
    let task = task.to_owned();
    Arc::new(move |i| {
        let mut client = clients[(i % clients.len() as u64) as usize].clone();
        let task = task.clone();
        Box::pin(async move {
            match rpc {
                Rpc::Execute => {
                    let mut request = tonic::Request::new(pb::ExecuteRequest {
                        context: context(i),
                        budget: None,
                        task,
                        input: Some(pb::execute_request::Input::InputJson(
                            BRIEF_INPUT.to_owned(),
                        )),
                        prompt_key: String::new(),
                    });
                    sending.prepare(&mut request);
                    match client.execute(request).await {
                        Ok(r) => check_meta(r.get_ref().meta.as_ref(), expect),
                        Err(status) => check_status(&status, expect),
                    }
                }
                Rpc::ClassifySms => {
                    let mut request = tonic::Request::new(pb::ClassifySmsRequest {
                        context: context(i),
                        budget: None,
                        message: "Yes, I'm interested - can you call me tomorrow afternoon?".to_owned(),
                        history: vec![pb::SmsMessage {
                            direction: pb::SmsDirection::Outbound as i32,
                            text: "Hi Ann, this is Sam from Acme. Would a 15-minute call about SSO pricing help?"
                                .to_owned(),
                            sent_at: None,
                        }],
                    });
                    sending.prepare(&mut request);
                    match client.classify_sms(request).await {
                        Ok(r) if r.get_ref().intent == pb::SmsIntent::Interested as i32 => {
                            check_meta(r.get_ref().meta.as_ref(), expect)
                        }
                        Ok(_) => Err("WRONG_INTENT".into()),
                        Err(status) => check_status(&status, expect),
                    }
                }
                Rpc::InvokeTool => {
                    let mut input = serde_json::Map::new();
                    input.insert("text".to_owned(), ECHO_TEXT.into());
                    let mut request = tonic::Request::new(pb::InvokeToolRequest {
                        context: context(i),
                        tool: "system.echo".to_owned(),
                        input: Some(ai_orchestrator::api::convert::json_to_struct(input)),
                        mode: pb::InvocationMode::Sync as i32,
                        ..Default::default()
                    });
                    sending.prepare(&mut request);
                    match client.tools.invoke_tool(request).await {
                        Ok(r) => match r.get_ref().invocation.as_ref().map(|i| i.status()) {
                            Some(pb::InvocationStatus::Succeeded) => match expect {
                                Expect::Primary => Ok(()),
                                _ => Err("ANSWERED".into()),
                            },
                            _ => Err("TOOL_NOT_SUCCEEDED".into()),
                        },
                        Err(status) => check_status(&status, expect),
                    }
                }
                Rpc::Converse => {
                    let mut request = tonic::Request::new(pb::ConverseRequest {
                        context: context(i),
                        agent: crate::server::AGENT.to_owned(),
                        message: format!("Echo \"{ECHO_TEXT}\" back to me, in two calls."),
                        ..Default::default()
                    });
                    sending.prepare(&mut request);
                    match client.agents.converse(request).await {
                        Ok(r) => turn(r.into_inner(), expect).await,
                        Err(status) => check_status(&status, expect),
                    }
                }
                Rpc::ChatHttp => match (&client.http, expect) {
                    (Some(edge), Expect::Primary) => edge.chat(i, &task, sending).await,
                    (Some(_), _) => Err("HTTP_EDGE_EXPECTS_PRIMARY".into()),
                    (None, _) => Err("NO_HTTP_EDGE".into()),
                },
            }
        })
    })
}

/// The orchestrator's HTTP edge: `POST /v1/chat/completions` over pooled
/// HTTP/1.1 keep-alive connections with Nagle off. HTTP/1.1 carries one
/// call at a time per connection, so the pool opens as many as the load
/// has in flight and keeps them for the next calls.
#[derive(Clone)]
pub struct HttpEdge {
    client: reqwest::Client,
    url: Arc<str>,
}

impl HttpEdge {
    /// Waits (up to 10 s) until the edge at `addr` accepts a connection,
    /// then makes its client, keeping up to `pool` idle connections.
    pub async fn connect(addr: SocketAddr, pool: usize) -> anyhow::Result<Self> {
        let until = tokio::time::Instant::now() + Duration::from_secs(10);
        while tokio::net::TcpStream::connect(addr).await.is_err() {
            anyhow::ensure!(
                tokio::time::Instant::now() < until,
                "the HTTP edge at {addr} accepted no connection within 10 s"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let client = reqwest::Client::builder()
            .http1_only()
            .no_proxy()
            .tcp_nodelay(true)
            .pool_max_idle_per_host(pool)
            .pool_idle_timeout(Duration::from_secs(90))
            .build()?;
        Ok(Self {
            client,
            url: format!("http://{addr}/v1/chat/completions").into(),
        })
    }

    /// Call `i`: `task` as `model`, `Execute`'s input as the one user
    /// message, the team in `x-team-id` (the bench's servers run with auth
    /// off, SPEC §13).
    async fn chat(&self, i: u64, task: &str, sending: Sending) -> Outcome {
        let body = serde_json::json!({
            "model": task,
            "messages": [{"role": "user", "content": BRIEF_INPUT}],
            "user": "bench-user",
        })
        .to_string();
        let mut request = self
            .client
            .post(&*self.url)
            .header("content-type", "application/json")
            .header("x-team-id", team(i))
            .timeout(sending.timeout)
            .body(body);
        if sending.caller_trace_ids {
            request = request.header("x-trace-id", random_trace_id());
        }
        let response = request.send().await.map_err(|e| transport_code(&e))?;
        let status = response.status();
        let body = response.bytes().await.map_err(|e| transport_code(&e))?;
        chat_outcome(status, &body)
    }
}

/// A short code for a request that got no full answer.
fn transport_code(e: &reqwest::Error) -> String {
    if e.is_timeout() {
        "CLIENT_TIMEOUT"
    } else if e.is_connect() {
        "CONNECT"
    } else if e.is_body() || e.is_decode() {
        "BODY"
    } else {
        "TRANSPORT"
    }
    .to_owned()
}

/// OK for a 200 whose first choice has text; else the error body's
/// `error.code` (the server's stable reason), or `HTTP_<status>`.
fn chat_outcome(status: reqwest::StatusCode, body: &[u8]) -> Outcome {
    let json: Option<serde_json::Value> = serde_json::from_slice(body).ok();
    if status != reqwest::StatusCode::OK {
        let code = json.as_ref().and_then(|v| v["error"]["code"].as_str());
        return Err(code.map_or_else(|| format!("HTTP_{}", status.as_u16()), str::to_owned));
    }
    match json
        .as_ref()
        .and_then(|v| v["choices"][0]["message"]["content"].as_str())
    {
        Some(text) if !text.is_empty() => Ok(()),
        Some(_) => Err("EMPTY_CONTENT".into()),
        None => Err("NOT_A_COMPLETION".into()),
    }
}

/// Reads a turn's events to its end: OK when it completed with the final
/// answer after three model calls and two tool calls.
async fn turn(mut events: tonic::Streaming<pb::ConverseEvent>, expect: Expect) -> Outcome {
    use pb::converse_event::Event;
    let mut last = None;
    loop {
        match events.message().await {
            Ok(Some(event)) => last = event.event,
            Ok(None) => break,
            Err(status) => return check_status(&status, expect),
        }
    }
    match last {
        Some(Event::Completed(done))
            if done.stop_reason == pb::StopReason::FinalAnswer as i32
                && (done.iterations, done.tool_calls) == (3, 2) =>
        {
            check_meta(done.meta.as_ref(), expect)
        }
        Some(Event::Completed(_)) => Err("WRONG_TURN".into()),
        _ => Err("NO_COMPLETED_EVENT".into()),
    }
}

/// The HTTP client of the direct baseline over `leg`: pooled keep-alive
/// with Nagle off, as the orchestrator's own upstream client, trusting the
/// fake upstream's CA (`ca_pem`) over TLS.
pub fn http_client(
    pool: usize,
    leg: crate::upstream::Leg,
    ca_pem: &str,
) -> anyhow::Result<reqwest::Client> {
    use crate::upstream::Leg;
    let builder = reqwest::Client::builder();
    let builder = match leg {
        Leg::H1 => builder,
        Leg::H2c => builder.http2_prior_knowledge(),
        Leg::TlsH1 => builder.http1_only(),
        Leg::TlsH2 => builder,
    };
    let builder = if leg.tls() {
        builder.tls_certs_merge(reqwest::Certificate::from_pem_bundle(ca_pem.as_bytes())?)
    } else {
        builder
    };
    Ok(builder
        .no_proxy()
        .tcp_nodelay(true)
        .pool_max_idle_per_host(pool)
        .pool_idle_timeout(Duration::from_secs(90))
        .build()?)
}

/// `POST url` with `body` (the bytes the orchestrator sent upstream); OK
/// when the status is 200 and the whole body has been read.
pub fn direct(client: reqwest::Client, url: String, body: Bytes) -> MakeRequest {
    Arc::new(move |i| {
        let request = client
            .post(&url)
            .header("content-type", "application/json")
            .header("authorization", "Bearer bench-dummy-key")
            .header("x-trace-id", format!("bench-direct-{i}"))
            .body(body.clone());
        Box::pin(async move {
            let response = request.send().await.map_err(|e| {
                if e.is_connect() {
                    "CONNECT"
                } else {
                    "TRANSPORT"
                }
                .to_owned()
            })?;
            let status = response.status();
            let body = response.bytes().await.map_err(|_| "BODY".to_owned())?;
            if status.is_success() && !body.is_empty() {
                Ok(())
            } else {
                Err(format!("HTTP_{}", status.as_u16()))
            }
        })
    })
}

#[cfg(test)]
mod tests {
    use super::{chat_outcome, random_trace_id};
    use reqwest::StatusCode;

    #[test]
    fn an_http_edge_answer_is_ok_only_with_text_and_its_error_code_otherwise() {
        let ok = br#"{"object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"Brief"}}],"usage":{"total_tokens":3}}"#;
        assert_eq!(chat_outcome(StatusCode::OK, ok), Ok(()));
        let empty = br#"{"choices":[{"message":{"role":"assistant","content":""}}]}"#;
        assert_eq!(
            chat_outcome(StatusCode::OK, empty),
            Err("EMPTY_CONTENT".to_owned())
        );
        assert_eq!(
            chat_outcome(StatusCode::OK, b"<html>"),
            Err("NOT_A_COMPLETION".to_owned())
        );
        let refused = br#"{"error":{"message":"cap","type":"rate_limit","code":"CAP_EXCEEDED","param":null}}"#;
        assert_eq!(
            chat_outcome(StatusCode::TOO_MANY_REQUESTS, refused),
            Err("CAP_EXCEEDED".to_owned())
        );
        assert_eq!(
            chat_outcome(StatusCode::BAD_GATEWAY, b""),
            Err("HTTP_502".to_owned())
        );
    }

    #[test]
    fn caller_trace_ids_are_distinct_shaped_as_the_servers_and_not_ordered() {
        let ids: Vec<String> = (0..1000).map(|_| random_trace_id()).collect();
        let distinct: std::collections::HashSet<&String> = ids.iter().collect();
        assert_eq!(distinct.len(), ids.len());
        for id in &ids {
            assert_eq!(id.len(), 32, "{id}");
            assert!(
                id.bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)),
                "{id}"
            );
        }
        // Spread, not time-ordered: about half of the neighbours descend.
        let descending = ids.windows(2).filter(|w| w[0] > w[1]).count();
        assert!((350..650).contains(&descending), "{descending}");
    }
}
