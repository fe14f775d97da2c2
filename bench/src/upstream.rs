//! The fake OpenAI-format upstream: `POST /{mode}/v1/chat/completions`.
//!
//! `mode` is `ok-<ms>` (answer 200 after a fixed latency) or `err-500`
//! (answer 500 with OpenAI's error body at once). Answers are recorded Chat
//! Completions bodies, rendered once at start: an `sms_classify` request (its
//! prompt lists the intents) gets a valid classification, any other request a
//! meeting brief. The first request body of each kind is kept so the direct
//! baseline can send exactly the bytes the orchestrator sent (a call of the
//! HTTP edge apart from `Execute`'s: its messages are the caller's).
//!
//! It runs on its own runtime and threads, so a burst of load-generator
//! tasks never queues in front of its accept loop. It listens twice: in
//! plaintext (HTTP/1.1, or HTTP/2 with prior knowledge) and over TLS
//! ([`tls`]: ALPN offers both), so each provider leg of [`Leg`] can be
//! measured against the same answers.

mod tls;

use axum::{
    Router,
    body::Bytes,
    extract::{Path, State},
    http::{StatusCode, header},
    response::{IntoResponse, Response},
    routing::post,
    serve::ListenerExt,
};
use std::{
    collections::HashMap,
    net::SocketAddr,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};
use tokio::sync::watch;

/// How the orchestrator (and the direct baseline) reach the upstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Leg {
    /// Plaintext HTTP/1.1, pooled: a connection per call in flight.
    H1,
    /// Plaintext HTTP/2 with prior knowledge (h2c), multiplexed.
    H2c,
    /// TLS, HTTP/1.1: what a provider gets by default.
    TlsH1,
    /// TLS, HTTP/2 negotiated by ALPN (`http_version = "2"`).
    TlsH2,
}

impl Leg {
    /// Parses `--upstream-http`.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "1.1" => Some(Leg::H1),
            "2" => Some(Leg::H2c),
            "tls-1.1" => Some(Leg::TlsH1),
            "tls-2" => Some(Leg::TlsH2),
            _ => None,
        }
    }

    /// Over TLS.
    pub fn tls(self) -> bool {
        matches!(self, Leg::TlsH1 | Leg::TlsH2)
    }
}

/// Which kind of request the orchestrator sent (chosen from the prompt).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// `ClassifySms` → task `sms_classify`.
    Classify,
    /// `Execute` → a generic task (`meeting_brief`).
    Execute,
    /// The HTTP edge's `/v1/chat/completions` of that task: the caller's
    /// messages as given (no template), so a body of its own.
    Chat,
    /// An agent's model call (streamed, with tools): it calls
    /// `system.echo` twice, one call per answer, then answers.
    Agent,
}

/// A recorded gpt-4o-mini answer, `{content}` replaced by the escaped text.
const COMPLETION: &str = r#"{"id":"chatcmpl-B9MBs8CjcvOU2jLn4n570S5qMJKcT","object":"chat.completion","created":1741569952,"model":"gpt-4o-mini-2024-07-18","choices":[{"index":0,"message":{"role":"assistant","content":{content},"refusal":null,"annotations":[]},"logprobs":null,"finish_reason":"stop"}],"usage":{"prompt_tokens":{prompt},"completion_tokens":{completion},"total_tokens":{total},"prompt_tokens_details":{"cached_tokens":0,"audio_tokens":0},"completion_tokens_details":{"reasoning_tokens":0,"audio_tokens":0,"accepted_prediction_tokens":0,"rejected_prediction_tokens":0}},"service_tier":"default","system_fingerprint":"fp_06737a9306"}"#;

const CLASSIFICATION: &str = r#"{"intent":"INTERESTED","confidence":0.92,"reason":"Lead says yes and asks for a call tomorrow afternoon."}"#;

const BRIEF: &str = "**Meeting brief: Acme Corp (second call)**\n\n\
**Who:** Ann Lee, VP Sales (economic buyer); Bob Diaz, CTO (technical evaluator).\n\n\
**Context:** Second call. On the first call they confirmed 40 reps use the current tool and \
renewal is in Q3. They asked about SSO and volume pricing.\n\n\
**Open questions:**\n1. Which identity provider do they use for SSO (Okta, Azure AD)?\n\
2. Expected seat count at renewal, and who signs off on budget?\n\
3. Any data-residency requirements?\n\n\
**Talking points:**\n- SSO is included from the Team plan; walk Bob through SAML setup.\n\
- Volume pricing starts at 50 seats; tie it to their Q3 renewal.\n\
- Offer a 2-week pilot with 5 reps to de-risk the switch.";

/// OpenAI's body for an internal error.
const SERVER_ERROR: &str = r#"{"error":{"message":"The server had an error while processing your request. Sorry about that!","type":"server_error","param":null,"code":null}}"#;

fn completion(content: &str, prompt: u32, completion: u32) -> Bytes {
    let content = serde_json::Value::String(content.to_owned()).to_string();
    Bytes::from(
        COMPLETION
            .replace("{content}", &content)
            .replace("{prompt}", &prompt.to_string())
            .replace("{completion}", &completion.to_string())
            .replace("{total}", &(prompt + completion).to_string()),
    )
}

/// One `chat.completion.chunk` frame of a recorded gpt-4o-mini stream.
fn chunk(delta: &str, finish: &str) -> String {
    format!(
        "data: {{\"id\":\"chatcmpl-B9MHDbslfkBeAs8l4bebGdFOJ6PeG\",\"object\":\"chat.completion.chunk\",\"created\":1741570283,\"model\":\"gpt-4o-mini-2024-07-18\",\"service_tier\":\"default\",\"system_fingerprint\":\"fp_06737a9306\",\"choices\":[{{\"index\":0,\"delta\":{delta},\"logprobs\":null,\"finish_reason\":{finish}}}]}}\n\n"
    )
}

/// The end of a stream: the finish reason, the usage chunk, `[DONE]`.
fn stream_end(finish: &str, prompt: u32, completion: u32) -> String {
    format!(
        "{}data: {{\"id\":\"chatcmpl-B9MHDbslfkBeAs8l4bebGdFOJ6PeG\",\"object\":\"chat.completion.chunk\",\"created\":1741570283,\"model\":\"gpt-4o-mini-2024-07-18\",\"service_tier\":\"default\",\"system_fingerprint\":\"fp_06737a9306\",\"choices\":[],\"usage\":{{\"prompt_tokens\":{prompt},\"completion_tokens\":{completion},\"total_tokens\":{}}}}}\n\ndata: [DONE]\n\n",
        chunk("{}", &format!("\"{finish}\"")),
        prompt + completion
    )
}

/// A streamed answer calling `system.echo` (call `id`), its arguments in
/// two pieces split inside the value, as OpenAI streams them.
fn agent_tool_call(id: &str, text: &str) -> Bytes {
    let args = serde_json::json!({ "text": text }).to_string();
    let (a, b) = args.split_at(args.len() / 2);
    let piece = |p: &str| {
        let quoted = serde_json::Value::String(p.to_owned());
        chunk(
            &format!(
                "{{\"tool_calls\":[{{\"index\":0,\"function\":{{\"arguments\":{quoted}}}}}]}}"
            ),
            "null",
        )
    };
    Bytes::from(
        [
            chunk("{\"role\":\"assistant\",\"content\":null,\"refusal\":null}", "null"),
            chunk(
                &format!("{{\"tool_calls\":[{{\"index\":0,\"id\":\"{id}\",\"type\":\"function\",\"function\":{{\"name\":\"system__echo\",\"arguments\":\"\"}}}}]}}"),
                "null",
            ),
            piece(a),
            piece(b),
            stream_end("tool_calls", 240, 21),
        ]
        .concat(),
    )
}

/// A streamed final answer in a few deltas.
fn agent_answer() -> Bytes {
    let mut frames = vec![chunk(
        "{\"role\":\"assistant\",\"content\":\"\",\"refusal\":null}",
        "null",
    )];
    for piece in [
        "Both echoes ",
        "came back: ",
        "\\\"call me tomorrow\\\" ",
        "and \\\"Acme Corp\\\".",
    ] {
        frames.push(chunk(&format!("{{\"content\":\"{piece}\"}}"), "null"));
    }
    frames.push(stream_end("stop", 320, 18));
    Bytes::from(frames.concat())
}

struct Shared {
    classify: Bytes,
    execute: Bytes,
    /// An agent's three answers: two tool calls, then the text.
    agent: [Bytes; 3],
    /// First request body seen per kind (the direct baseline replays it).
    samples: Mutex<HashMap<Kind, Bytes>>,
    error_calls: AtomicU64,
}

/// A running fake upstream. Stops when dropped.
pub struct Upstream {
    /// Where it listens in plaintext.
    pub addr: SocketAddr,
    /// Where it listens over TLS.
    pub tls_addr: SocketAddr,
    /// The CA its TLS certificate chains to, PEM.
    pub ca_pem: String,
    shared: Arc<Shared>,
    stop: watch::Sender<bool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Upstream {
    /// Starts the server on 127.0.0.1 on its own runtime (`threads` workers).
    pub fn start(threads: usize) -> anyhow::Result<Self> {
        let shared = Arc::new(Shared {
            classify: completion(CLASSIFICATION, 187, 24),
            execute: completion(BRIEF, 412, 168),
            agent: [
                agent_tool_call("call_uG6dRVsBWdkhzUqYyArsMyfv", "call me tomorrow"),
                agent_tool_call("call_8lKFpO4rTPqZxHgYa1sWbNcE", "Acme Corp"),
                agent_answer(),
            ],
            samples: Mutex::new(HashMap::new()),
            error_calls: AtomicU64::new(0),
        });
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads.max(1))
            .thread_name("fake-upstream")
            .enable_all()
            .build()?;
        // Bound here (no runtime needed) so the addresses are known at once.
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let tls_listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        tls_listener.set_nonblocking(true)?;
        let tls_addr = tls_listener.local_addr()?;
        let pki = tls::pki()?;
        let (stop, stopped) = watch::channel(false);
        let app = Router::new()
            .route("/{mode}/v1/chat/completions", post(chat))
            .with_state(shared.clone());
        let thread = std::thread::Builder::new()
            .name("fake-upstream".into())
            .spawn(move || {
                runtime.block_on(async move {
                    let (Ok(listener), Ok(tls_tcp)) = (
                        tokio::net::TcpListener::from_std(listener),
                        tokio::net::TcpListener::from_std(tls_listener),
                    ) else {
                        return;
                    };
                    // Nagle off, as on the orchestrator's sockets (SPEC §8).
                    let listener = listener.tap_io(|tcp| {
                        let _ = tcp.set_nodelay(true);
                    });
                    let Ok(tls_listener) = tls::listen(tls_tcp, pki.config) else {
                        return;
                    };
                    let until = |mut stopped: watch::Receiver<bool>| async move {
                        let _ = stopped.wait_for(|s| *s).await;
                    };
                    let plain = axum::serve(listener, app.clone())
                        .with_graceful_shutdown(until(stopped.clone()));
                    let tls = axum::serve(tls_listener, app).with_graceful_shutdown(until(stopped));
                    let _ = tokio::join!(plain, tls);
                });
                runtime.shutdown_timeout(Duration::from_secs(1));
            })?;
        Ok(Self {
            addr,
            tls_addr,
            ca_pem: pki.ca_pem,
            shared,
            stop,
            thread: Some(thread),
        })
    }

    /// Base URL of a mode over `leg`, as configured for a provider
    /// (`.../v1`).
    pub fn base_url(&self, mode: &str, leg: Leg) -> String {
        if leg.tls() {
            format!("https://{}/{mode}/v1", self.tls_addr)
        } else {
            format!("http://{}/{mode}/v1", self.addr)
        }
    }

    /// The first body the orchestrator sent for `kind`, if any yet.
    pub fn sample(&self, kind: Kind) -> Option<Bytes> {
        self.shared
            .samples
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&kind)
            .cloned()
    }

    /// Calls answered 500 so far.
    pub fn error_calls(&self) -> u64 {
        self.shared.error_calls.load(Ordering::Relaxed)
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn count(body: &[u8], needle: &[u8]) -> usize {
    body.windows(needle.len()).filter(|w| *w == needle).count()
}

/// A user message that is `Execute`'s input itself, as the HTTP edge's
/// calls send it; `Execute`'s prompt template puts it after a heading.
const CHAT_MARKER: &[u8] = br#""content":"{\"company\""#;

fn kind_of(body: &[u8]) -> Kind {
    if count(body, b"\"tools\":[") > 0 {
        Kind::Agent
    } else if count(body, b"APPOINTMENT_REQUEST") > 0 {
        Kind::Classify
    } else if count(body, CHAT_MARKER) > 0 {
        Kind::Chat
    } else {
        Kind::Execute
    }
}

async fn chat(
    State(shared): State<Arc<Shared>>,
    Path(mode): Path<String>,
    body: Bytes,
) -> Response {
    if mode == "err-500" {
        shared.error_calls.fetch_add(1, Ordering::Relaxed);
        return (
            StatusCode::INTERNAL_SERVER_ERROR,
            [(header::CONTENT_TYPE, "application/json")],
            SERVER_ERROR,
        )
            .into_response();
    }
    let Some(ms) = mode.strip_prefix("ok-").and_then(|m| m.parse::<u64>().ok()) else {
        return (StatusCode::NOT_FOUND, "unknown mode").into_response();
    };
    let kind = kind_of(&body);
    let body_for_agent = if kind == Kind::Agent {
        body.clone()
    } else {
        Bytes::new()
    };
    {
        let mut samples = shared.samples.lock().unwrap_or_else(|e| e.into_inner());
        samples.entry(kind).or_insert(body);
    }
    if ms > 0 {
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
    let answer = match kind {
        Kind::Classify => shared.classify.clone(),
        Kind::Execute | Kind::Chat => shared.execute.clone(),
        Kind::Agent => {
            // The turn so far: one tool result per earlier answer.
            let results = count(&body_for_agent, b"\"role\":\"tool\"");
            let answer = shared.agent[results.min(2)].clone();
            return (
                StatusCode::OK,
                [(header::CONTENT_TYPE, "text/event-stream")],
                answer,
            )
                .into_response();
        }
    };
    (
        StatusCode::OK,
        [
            (header::CONTENT_TYPE, "application/json"),
            (
                header::HeaderName::from_static("openai-processing-ms"),
                "312",
            ),
        ],
        answer,
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_valid_chat_completions() {
        for (body, total) in [
            (completion(CLASSIFICATION, 1, 2), 3),
            (completion(BRIEF, 3, 4), 7),
        ] {
            let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
            assert!(v["choices"][0]["message"]["content"].is_string());
            assert_eq!(v["usage"]["total_tokens"], total);
        }
        assert_eq!(kind_of(b"... APPOINTMENT_REQUEST, ..."), Kind::Classify);
        assert_eq!(kind_of(b"meeting"), Kind::Execute);
        // The HTTP edge sends the caller's message as given; `Execute` the
        // same input inside its template.
        let message = |content: &str| {
            serde_json::json!({"messages": [{"role": "user", "content": content}]}).to_string()
        };
        let input = crate::target::BRIEF_INPUT;
        assert_eq!(kind_of(message(input).as_bytes()), Kind::Chat);
        let templated = format!("Meeting details (JSON):\n<input>\n{input}\n</input>");
        assert_eq!(
            kind_of(message(templated.as_str()).as_bytes()),
            Kind::Execute
        );
        assert_eq!(kind_of(br#"{"tools":[{"type":"function"}]}"#), Kind::Agent);
    }

    #[test]
    fn agent_answers_are_chat_completion_streams() {
        let frames = |b: &Bytes| -> Vec<serde_json::Value> {
            std::str::from_utf8(b)
                .unwrap()
                .split("\n\n")
                .filter_map(|f| f.strip_prefix("data: "))
                .filter(|d| *d != "[DONE]")
                .map(|d| serde_json::from_str(d).unwrap())
                .collect()
        };
        let call = frames(&agent_tool_call("call_1", "call me tomorrow"));
        let args: String = call
            .iter()
            .filter_map(|f| {
                f["choices"][0]["delta"]["tool_calls"][0]["function"]["arguments"].as_str()
            })
            .collect();
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(&args).unwrap(),
            serde_json::json!({"text": "call me tomorrow"})
        );
        assert_eq!(
            call[call.len() - 2]["choices"][0]["finish_reason"],
            "tool_calls"
        );
        assert_eq!(call.last().unwrap()["usage"]["total_tokens"], 261);
        let answer = frames(&agent_answer());
        let text: String = answer
            .iter()
            .filter_map(|f| f["choices"][0]["delta"]["content"].as_str())
            .collect();
        assert_eq!(
            text,
            "Both echoes came back: \"call me tomorrow\" and \"Acme Corp\"."
        );
    }
}
