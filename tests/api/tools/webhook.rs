//! A fake workflow webhook (n8n-like) on 127.0.0.1:0 that records every
//! POST and answers from a script, then with a default success; it counts
//! the POSTs it is answering at once, and the most it ever answered at once.

use axum::{
    body::Bytes,
    http::{HeaderMap, StatusCode},
    response::IntoResponse,
};
use std::{
    collections::VecDeque,
    net::SocketAddr,
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};
use tokio::time::Instant;

/// One POST as received.
#[derive(Debug, Clone)]
pub struct Received {
    pub path: String,
    pub headers: HeaderMap,
    pub body: serde_json::Value,
    pub at: Instant,
}

/// One scripted answer.
#[derive(Debug, Clone)]
pub struct Answer {
    pub status: u16,
    pub headers: Vec<(&'static str, String)>,
    pub body: String,
    pub delay: Duration,
}

impl Answer {
    pub fn status(status: u16) -> Self {
        Self {
            status,
            headers: Vec::new(),
            body: String::new(),
            delay: Duration::ZERO,
        }
    }

    pub fn header(mut self, name: &'static str, value: &str) -> Self {
        self.headers.push((name, value.to_owned()));
        self
    }

    pub fn body(mut self, body: &str) -> Self {
        self.body = body.to_owned();
        self
    }

    pub fn after(mut self, delay: Duration) -> Self {
        self.delay = delay;
        self
    }
}

#[derive(Default)]
struct State {
    received: Vec<Received>,
    script: VecDeque<Answer>,
    default_delay: Duration,
    in_flight: usize,
    peak_in_flight: usize,
}

/// One POST being answered; counted out when its answer is sent (or its
/// caller gave up).
struct InFlight(Arc<Mutex<State>>);

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut s = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        s.in_flight -= 1;
    }
}

/// The running webhook.
#[derive(Clone)]
pub struct Webhook {
    pub addr: SocketAddr,
    state: Arc<Mutex<State>>,
}

impl Webhook {
    /// Starts it.
    pub async fn start() -> Self {
        let state = Arc::new(Mutex::new(State::default()));
        let shared = state.clone();
        let app = axum::Router::new().fallback(
            move |uri: axum::http::Uri, headers: HeaderMap, body: Bytes| {
                let state = shared.clone();
                async move {
                    let answer = {
                        let mut s = state.lock().unwrap();
                        s.received.push(Received {
                            path: uri.path().to_owned(),
                            headers,
                            body: serde_json::from_slice(&body).unwrap_or_default(),
                            at: Instant::now(),
                        });
                        s.in_flight += 1;
                        s.peak_in_flight = s.peak_in_flight.max(s.in_flight);
                        let n = s.received.len();
                        let default = Answer::status(200)
                            .header("x-n8n-execution-id", &format!("exec-{n}"))
                            .body(r#"{"ok": true, "note_id": "N-1"}"#)
                            .after(s.default_delay);
                        s.script.pop_front().unwrap_or(default)
                    };
                    let _answering = InFlight(state.clone());
                    tokio::time::sleep(answer.delay).await;
                    let mut response = (
                        StatusCode::from_u16(answer.status).unwrap(),
                        answer.body.clone(),
                    )
                        .into_response();
                    for (name, value) in &answer.headers {
                        response.headers_mut().insert(*name, value.parse().unwrap());
                    }
                    response
                }
            },
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        Self { addr, state }
    }

    /// Its base URL.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Answers the next POSTs with `answers`, in order.
    pub fn script(&self, answers: impl IntoIterator<Item = Answer>) {
        self.state.lock().unwrap().script.extend(answers);
    }

    /// Delays every default answer by `delay`.
    pub fn slow(&self, delay: Duration) {
        self.state.lock().unwrap().default_delay = delay;
    }

    /// The POSTs so far.
    pub fn received(&self) -> Vec<Received> {
        self.state.lock().unwrap().received.clone()
    }

    /// How many POSTs so far.
    pub fn count(&self) -> usize {
        self.state.lock().unwrap().received.len()
    }

    /// The most POSTs it was answering at once.
    pub fn peak_in_flight(&self) -> usize {
        self.state.lock().unwrap().peak_in_flight
    }
}
