//! Workflow webhooks (SPEC §9.4): the validated input POSTed as JSON to the
//! tool's URL with its auth header, `x-trace-id` and `Idempotency-Key`,
//! retried with backoff and full jitter on a timeout, a connection error, a
//! 5xx or a 429 (honouring `Retry-After`), never past the deadline.

use super::{Failure, HttpTool};
use rand::RngExt;
use reqwest::{StatusCode, header::HeaderMap};
use serde_json::Value;
use std::time::{Duration, SystemTime};
use tokio::time::Instant;

/// Most bytes of a webhook's answer kept.
pub const MAX_RESPONSE_BYTES: usize = 4 * 1024 * 1024;

/// A webhook's answer.
#[derive(Debug, Clone, PartialEq)]
pub struct Answer {
    /// Its JSON body (`{}` for an empty one).
    pub output: Value,
    pub execution_id: Option<String>,
    pub attempts: u32,
}

/// Why a webhook call failed.
#[derive(Debug, Clone, PartialEq)]
pub struct Failed {
    pub failure: Failure,
    pub attempts: u32,
    /// The last execution ID seen: a failed run is still one to look up.
    pub execution_id: Option<String>,
}

/// The longest `Retry-After` taken as given: past any tool's deadline
/// (`tool_limits.max_timeout` is at most an hour), and no clock overflow.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(3600);

enum Tried {
    Done(Answer),
    /// Worth another POST, after at least this long (a `Retry-After`).
    Retry(Failure, Option<Duration>),
    Fatal(Failure),
}

/// `Retry-After` as a delay: seconds, or an HTTP date.
fn retry_after(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    let value = headers
        .get(reqwest::header::RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim();
    let wait = match value.parse::<u64>() {
        Ok(secs) => Duration::from_secs(secs),
        Err(_) => {
            let at = chrono::DateTime::parse_from_rfc2822(value).ok()?;
            let at = SystemTime::UNIX_EPOCH
                .checked_add(Duration::from_secs(u64::try_from(at.timestamp()).ok()?))?;
            at.duration_since(now).unwrap_or_default()
        }
    };
    Some(wait.min(MAX_RETRY_AFTER))
}

/// Reads a body up to [`MAX_RESPONSE_BYTES`].
async fn body(mut response: reqwest::Response) -> Result<Vec<u8>, Failure> {
    let mut out = Vec::new();
    loop {
        match response.chunk().await {
            Ok(Some(chunk)) => {
                if out.len() + chunk.len() > MAX_RESPONSE_BYTES {
                    return Err(Failure::new(
                        "RESPONSE_TOO_LARGE",
                        format!("the webhook answered more than {MAX_RESPONSE_BYTES} bytes"),
                    ));
                }
                out.extend_from_slice(&chunk);
            }
            Ok(None) => return Ok(out),
            Err(_) => {
                return Err(Failure::new(
                    "CONNECTION_ERROR",
                    "the webhook's answer was cut off",
                ));
            }
        }
    }
}

/// One invocation's POST: its body and headers, until `deadline`.
#[derive(Debug, Clone, Copy)]
pub struct Post<'a> {
    pub input: &'a Value,
    pub idempotency_key: &'a str,
    pub trace_id: &'a str,
    pub deadline: Instant,
    /// The invocation a workflow that calls back reports on, sent as
    /// `X-Tool-Invocation-Id` (and in `X-Callback-Url` with a public URL).
    pub invocation_id: Option<&'a str>,
    /// `[http] public_url`: where the callback goes.
    pub public_url: Option<&'a str>,
}

/// POSTs once, until `deadline`.
async fn send(
    client: &reqwest::Client,
    tool: &HttpTool,
    body_bytes: &[u8],
    post: &Post<'_>,
    deadline: Instant,
) -> Result<reqwest::Response, Tried> {
    let mut request = client
        .post(&tool.url)
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .header("idempotency-key", post.idempotency_key)
        .header("x-trace-id", post.trace_id)
        .body(body_bytes.to_vec());
    if let Some((header, secret)) = &tool.auth {
        request = request.header(header.as_str(), secret.expose());
    }
    if let (Some(_), Some(id)) = (&tool.callback, post.invocation_id) {
        request = request.header("x-tool-invocation-id", id);
        if let Some(base) = post.public_url {
            let url = format!(
                "{}/v1/tool-invocations/{id}/complete",
                base.trim_end_matches('/')
            );
            request = request.header("x-callback-url", url);
        }
    }
    let timed_out = || {
        Tried::Retry(
            Failure::new("TIMED_OUT", "the webhook did not answer in time"),
            None,
        )
    };
    match tokio::time::timeout_at(deadline, request.send()).await {
        Err(_) => Err(timed_out()),
        Ok(Err(e)) if e.is_timeout() => Err(timed_out()),
        Ok(Err(_)) => Err(Tried::Retry(
            Failure::new("CONNECTION_ERROR", "the webhook could not be reached"),
            None,
        )),
        Ok(Ok(r)) => Ok(r),
    }
}

/// What the webhook's `response` to POST number `attempt` comes to; a
/// workflow that calls back only accepts the work (its body is not read
/// as an output, which is `null` until the callback).
async fn answered(
    response: reqwest::Response,
    execution_id: Option<String>,
    deadline: Instant,
    attempt: u32,
    accept_only: bool,
) -> Tried {
    let status = response.status();
    let wait = retry_after(response.headers(), SystemTime::now());
    let read = tokio::time::timeout_at(deadline, body(response)).await;
    let bytes = match read {
        Err(_) => {
            return Tried::Retry(
                Failure::new("TIMED_OUT", "the webhook did not answer in time"),
                None,
            );
        }
        Ok(Err(f)) => return Tried::Fatal(f),
        Ok(Ok(b)) => b,
    };
    let code = format!("HTTP_{}", status.as_u16());
    if status == StatusCode::TOO_MANY_REQUESTS || status.is_server_error() {
        return Tried::Retry(
            Failure::new(&code, format!("the webhook answered {status}")),
            wait,
        );
    }
    if status == StatusCode::REQUEST_TIMEOUT {
        return Tried::Retry(Failure::new(&code, "the webhook timed out"), wait);
    }
    if !status.is_success() {
        return Tried::Fatal(Failure::new(
            &code,
            format!("the webhook answered {status}"),
        ));
    }
    let output = if accept_only {
        Value::Null
    } else if bytes.iter().all(u8::is_ascii_whitespace) {
        Value::Object(Default::default())
    } else {
        match serde_json::from_slice(&bytes) {
            Ok(v) => v,
            Err(_) => {
                return Tried::Fatal(Failure::new(
                    "OUTPUT_INVALID",
                    "the webhook's answer is not JSON",
                ));
            }
        }
    };
    Tried::Done(Answer {
        output,
        execution_id,
        attempts: attempt,
    })
}

/// POSTs `post.input` with retries until `post.deadline`; `retrying` is told before each.
pub async fn call(
    client: &reqwest::Client,
    tool: &HttpTool,
    post: &Post<'_>,
    retrying: impl Fn(),
) -> Result<Answer, Failed> {
    let deadline = post.deadline;
    let bytes = post.input.to_string().into_bytes();
    let mut cap = tool.retry.initial_backoff;
    let mut attempt = 0;
    let mut execution_id = None;
    loop {
        attempt += 1;
        // A POST past `attempt_timeout` is given up and retried while time allows.
        let attempt_deadline = tool
            .retry
            .attempt_timeout
            .and_then(|t| Instant::now().checked_add(t))
            .map_or(deadline, |d| d.min(deadline));
        let sent = send(client, tool, &bytes, post, attempt_deadline).await;
        let tried = match sent {
            Err(tried) => tried,
            Ok(response) => {
                if let Some(id) = response
                    .headers()
                    .get(tool.execution_id_header.as_str())
                    .and_then(|v| v.to_str().ok())
                {
                    execution_id = Some(id.to_owned());
                }
                let accept_only = tool.callback.is_some();
                answered(
                    response,
                    execution_id.clone(),
                    attempt_deadline,
                    attempt,
                    accept_only,
                )
                .await
            }
        };
        let failed = |failure| Failed {
            failure,
            attempts: attempt,
            execution_id: execution_id.clone(),
        };
        let (failure, wait) = match tried {
            Tried::Done(answer) => return Ok(answer),
            Tried::Fatal(f) => return Err(failed(f)),
            Tried::Retry(f, wait) => (f, wait),
        };
        if attempt >= tool.retry.max_attempts {
            return Err(failed(failure));
        }
        // Full jitter under the doubling cap; a Retry-After is a floor.
        let jitter = cap.mul_f64(rand::rng().random::<f64>());
        let pause = wait.map_or(jitter, |w| w.max(jitter));
        cap = cap.saturating_mul(2).min(tool.retry.max_backoff);
        if Instant::now()
            .checked_add(pause)
            .is_none_or(|resume| resume >= deadline)
        {
            return Err(failed(failure));
        }
        retrying();
        tokio::time::sleep(pause).await;
    }
}

/// The executor of workflow webhooks, retried by the tool's policy; out of
/// time is TIMED_OUT, whatever the last POST said.
#[derive(Debug, Clone)]
pub struct Webhooks {
    /// The webhooks' HTTP client (redirects not followed).
    pub client: reqwest::Client,
    /// `[http] public_url`, for the callbacks' `X-Callback-Url`.
    pub public_url: Option<String>,
}

#[async_trait::async_trait]
impl super::executor::Executor for Webhooks {
    async fn run(&self, run: super::executor::Run<'_>) -> super::executor::Ran {
        use super::executor::{Ran, wrong_kind};
        let super::Kind::Http(http) = &run.tool.kind else {
            return wrong_kind(run.tool, "http");
        };
        let key = run.idempotency_key.unwrap_or_default();
        let name = &run.tool.name;
        let retrying = || crate::telemetry::metrics::workflow_retry(name);
        let post = Post {
            input: run.input,
            idempotency_key: key,
            trace_id: run.trace_id,
            deadline: run.deadline,
            invocation_id: run.invocation_id,
            public_url: self.public_url.as_deref(),
        };
        let called = call(&self.client, http, &post, retrying).await;
        match called {
            Ok(a) => Ran {
                result: Ok(a.output),
                attempts: a.attempts,
                execution_id: a.execution_id,
                cost_micros: None,
            },
            Err(f) => Ran {
                result: Err(if Instant::now() >= run.deadline {
                    Failure::new("TIMED_OUT", "the tool did not finish within its timeout")
                } else {
                    f.failure
                }),
                attempts: f.attempts,
                execution_id: f.execution_id,
                cost_micros: None,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn post(input: &Value, deadline: Instant) -> Post<'_> {
        Post {
            input,
            idempotency_key: "k",
            trace_id: "t",
            deadline,
            invocation_id: None,
            public_url: None,
        }
    }

    #[test]
    fn retry_after_in_seconds_or_as_a_date() {
        let mut h = HeaderMap::new();
        h.insert(
            "retry-after",
            "3".parse().unwrap_or_else(|_| unreachable!()),
        );
        assert_eq!(
            retry_after(&h, SystemTime::now()),
            Some(Duration::from_secs(3))
        );
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_445_412_480);
        h.insert(
            "retry-after",
            "Wed, 21 Oct 2015 07:28:30 GMT"
                .parse()
                .unwrap_or_else(|_| unreachable!()),
        );
        assert_eq!(retry_after(&h, now), Some(Duration::from_secs(30)));
        h.insert(
            "retry-after",
            "soon".parse().unwrap_or_else(|_| unreachable!()),
        );
        assert_eq!(retry_after(&h, now), None);
        // An absurd value is a long wait, not an overflow.
        h.insert(
            "retry-after",
            "18446744073709551615"
                .parse()
                .unwrap_or_else(|_| unreachable!()),
        );
        assert_eq!(retry_after(&h, now), Some(MAX_RETRY_AFTER));
        h.insert(
            "retry-after",
            "Fri, 31 Dec 9999 23:59:59 GMT"
                .parse()
                .unwrap_or_else(|_| unreachable!()),
        );
        assert_eq!(retry_after(&h, now), Some(MAX_RETRY_AFTER));
    }

    /// A webhook that refuses connections, on a paused clock: full jitter under
    /// a doubling cap, stopping at `max_attempts`, never waiting past the deadline.
    #[tokio::test(start_paused = true)]
    async fn retries_back_off_under_the_cap_and_stop_before_the_deadline() {
        use crate::config::tools::ToolRetryConfig;
        use std::sync::atomic::{AtomicU32, Ordering};
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .unwrap_or_else(|e| panic!("{e}"));
        let tool = HttpTool {
            url: format!("http://127.0.0.1:{port}/hook"),
            auth: None,
            retry: ToolRetryConfig {
                max_attempts: 4,
                initial_backoff: Duration::from_secs(1),
                max_backoff: Duration::from_secs(3),
                attempt_timeout: None,
            },
            idempotency_window: Duration::from_secs(300),
            execution_id_header: "x-n8n-execution-id".into(),
            callback: None,
        };
        let client = reqwest::Client::new();
        let input = serde_json::json!({});
        let retries = AtomicU32::new(0);
        let count = || {
            retries.fetch_add(1, Ordering::Relaxed);
        };
        let started = Instant::now();
        let far = started + Duration::from_secs(60);
        let Err(Failed {
            failure, attempts, ..
        }) = call(&client, &tool, &post(&input, far), count).await
        else {
            panic!("nothing listens there");
        };
        assert_eq!(failure.code, "CONNECTION_ERROR");
        assert_eq!((attempts, retries.load(Ordering::Relaxed)), (4, 3));
        // Pauses of at most 1 s, 2 s, then 3 s (the cap).
        assert!(started.elapsed() <= Duration::from_secs(6));

        let started = Instant::now();
        let near = started + Duration::from_millis(1500);
        let Err(Failed { attempts, .. }) = call(&client, &tool, &post(&input, near), || {}).await
        else {
            panic!("nothing listens there");
        };
        assert!(attempts >= 1);
        assert!(Instant::now() < near, "no pause runs past the deadline");
    }
}
