//! HTTP plumbing shared by every wire format: client construction, sending
//! with a deadline, and classifying failures (status, `Retry-After`,
//! transport errors) into [`ProviderError`].
//!
//! Error bodies are read only to pick out the provider's error *type/code*
//! (e.g. `rate_limit_error`, `overloaded_error`); the human-readable message
//! and the rest of the body are dropped here, so they can never reach logs
//! shown to clients or the client itself.

use super::{CompletionRequest, ProviderError};
use crate::config::ProviderConfig;
use reqwest::{RequestBuilder, Response, header::HeaderMap};
use serde::de::DeserializeOwned;
use std::time::{Duration, SystemTime};
use tokio::time::Instant;

/// Largest error body we read to find the error type.
const MAX_ERROR_BODY: usize = 16 * 1024;

/// Builds the HTTP client of one provider.
pub fn client(config: &ProviderConfig) -> Result<reqwest::Client, ProviderError> {
    let builder = reqwest::Client::builder();
    let builder = if config.http2_prior_knowledge {
        builder.http2_prior_knowledge()
    } else {
        builder
    };
    builder
        .connect_timeout(config.connect_timeout)
        // Nagle off upstream too: small request frames must not wait for ACKs.
        .tcp_nodelay(true)
        .pool_idle_timeout(Duration::from_secs(90))
        .pool_max_idle_per_host(config.max_concurrency.max(1))
        .user_agent(concat!("ai-orchestrator/", env!("CARGO_PKG_VERSION")))
        .build()
        .map_err(|e| ProviderError::Unsupported(format!("cannot build HTTP client: {e}")))
}

/// Adds the trace headers every provider call carries.
/// `traceparent` names the current span (the provider attempt) when trace
/// export is on, so the provider's spans nest under it; otherwise the
/// caller's own `traceparent` passes through.
pub fn with_trace(builder: RequestBuilder, req: &CompletionRequest) -> RequestBuilder {
    let builder = builder.header("x-trace-id", &req.trace_id);
    match crate::telemetry::otel::traceparent_of(&tracing::Span::current())
        .or_else(|| req.traceparent.clone())
    {
        Some(tp) => builder.header("traceparent", tp),
        None => builder,
    }
}

/// Sends a request, waiting at most until `deadline` for the response head.
/// A non-2xx status becomes [`ProviderError::Status`].
pub async fn send(builder: RequestBuilder, deadline: Instant) -> Result<Response, ProviderError> {
    let response = match tokio::time::timeout_at(deadline, builder.send()).await {
        Err(_) => return Err(ProviderError::Timeout),
        Ok(Err(e)) => return Err(transport_error(&e)),
        Ok(Ok(r)) => r,
    };
    if response.status().is_success() {
        return Ok(response);
    }
    let status = response.status().as_u16();
    let retry_after = retry_after(response.headers(), SystemTime::now());
    // The body only serves to name the error type; a slow or broken body
    // must not hold the attempt past its deadline.
    let body = tokio::time::timeout_at(deadline, read_capped(response))
        .await
        .unwrap_or_default();
    Err(ProviderError::Status {
        status,
        retry_after,
        summary: error_type(&body),
    })
}

async fn read_capped(mut response: Response) -> Vec<u8> {
    let mut body = Vec::new();
    while let Ok(Some(chunk)) = response.chunk().await {
        body.extend_from_slice(&chunk);
        if body.len() >= MAX_ERROR_BODY {
            break;
        }
    }
    body
}

/// Reads and decodes a JSON success body before `deadline`.
pub async fn json<T: DeserializeOwned>(
    response: Response,
    deadline: Instant,
) -> Result<T, ProviderError> {
    let bytes = match tokio::time::timeout_at(deadline, response.bytes()).await {
        Err(_) => return Err(ProviderError::Timeout),
        Ok(Err(e)) => return Err(transport_error(&e)),
        Ok(Ok(b)) => b,
    };
    serde_json::from_slice(&bytes).map_err(|e| malformed_json(&e))
}

/// A JSON decoding failure, described by its category and position only:
/// serde's own message can quote upstream text.
pub fn malformed_json(e: &serde_json::Error) -> ProviderError {
    ProviderError::Malformed(format!(
        "response JSON: {:?} error at line {} column {}",
        e.classify(),
        e.line(),
        e.column()
    ))
}

/// Maps a reqwest transport failure.
pub fn transport_error(e: &reqwest::Error) -> ProviderError {
    if e.is_timeout() {
        ProviderError::Timeout
    } else if e.is_decode() {
        ProviderError::Malformed("undecodable body".into())
    } else {
        // Connection refused/reset, TLS, DNS, broken body: all transport.
        ProviderError::Connect(if e.is_connect() {
            "connect".into()
        } else {
            "transport".into()
        })
    }
}

/// The provider's error type/code from a JSON error body, e.g.
/// `{"error":{"type":"rate_limit_error"}}` (OpenAI, Anthropic) or
/// `{"error":{"status":"RESOURCE_EXHAUSTED"}}` (Gemini). Never the message.
pub fn error_type(body: &[u8]) -> String {
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(body) else {
        return "non-JSON error body".into();
    };
    let err = v.get("error").unwrap_or(&v);
    let pick = |key: &str| err.get(key).and_then(|x| x.as_str()).map(str::to_owned);
    let kind = pick("type")
        .or_else(|| pick("status"))
        .or_else(|| pick("code"));
    let kind: String = kind
        .unwrap_or_else(|| "unknown".into())
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '_')
        .take(64)
        .collect();
    kind
}

/// Longest wait we take from a provider's `Retry-After`: the breaker's
/// cooldown cap (5 min), which would cut a longer 429 cooldown there anyway.
/// A larger value (`1e20`, a date decades ahead) is a broken or hostile
/// header, not advice; and no retry ever sleeps past the request deadline.
pub const MAX_RETRY_AFTER: Duration = crate::resilience::breaker::MAX_COOLDOWN;

/// How long the provider asked us to wait: `retry-after-ms` (OpenAI),
/// `retry-after` in seconds or as an HTTP-date; at most [`MAX_RETRY_AFTER`].
/// A negative, NaN, infinite or unparsable value is ignored (`None`), so a
/// header can never panic the request (`Duration::from_secs_f64` would).
pub fn retry_after(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    let get = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
    };
    if let Some(wait) = get("retry-after-ms")
        .and_then(|v| v.parse::<f64>().ok())
        .and_then(|ms| capped_secs(ms / 1000.0))
    {
        return Some(wait);
    }
    let value = get("retry-after")?;
    if let Ok(secs) = value.parse::<f64>() {
        return capped_secs(secs);
    }
    let at = chrono::DateTime::parse_from_rfc2822(value).ok()?;
    let at = SystemTime::UNIX_EPOCH
        .checked_add(Duration::from_secs(u64::try_from(at.timestamp()).ok()?))?;
    Some(
        at.duration_since(now)
            .unwrap_or(Duration::ZERO)
            .min(MAX_RETRY_AFTER),
    )
}

/// `secs` as a wait of at most [`MAX_RETRY_AFTER`]; `None` when it is not a
/// non-negative finite number.
fn capped_secs(secs: f64) -> Option<Duration> {
    if !secs.is_finite() || secs < 0.0 {
        return None;
    }
    // `+ 0.0` turns -0.0 into 0.0; what is left only fails when too large.
    Some(
        Duration::try_from_secs_f64(secs + 0.0).map_or(MAX_RETRY_AFTER, |d| d.min(MAX_RETRY_AFTER)),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::header::HeaderValue;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, HeaderValue::from_static(v));
        }
        h
    }

    #[test]
    fn retry_after_forms() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_445_412_480); // Wed, 21 Oct 2015 07:28:00 GMT
        assert_eq!(
            retry_after(&headers(&[("retry-after", "7")]), now),
            Some(Duration::from_secs(7))
        );
        assert_eq!(
            retry_after(&headers(&[("retry-after-ms", "1500")]), now),
            Some(Duration::from_millis(1500))
        );
        assert_eq!(
            retry_after(
                &headers(&[("retry-after-ms", "250"), ("retry-after", "9")]),
                now
            ),
            Some(Duration::from_millis(250)),
            "the precise header wins"
        );
        assert_eq!(
            retry_after(
                &headers(&[("retry-after", "Wed, 21 Oct 2015 07:28:30 GMT")]),
                now
            ),
            Some(Duration::from_secs(30))
        );
        assert_eq!(
            retry_after(
                &headers(&[("retry-after", "Wed, 21 Oct 2015 07:27:00 GMT")]),
                now
            ),
            Some(Duration::ZERO),
            "a date in the past means now"
        );
        assert_eq!(retry_after(&headers(&[("retry-after", "soon")]), now), None);
        assert_eq!(retry_after(&headers(&[("retry-after", "-3")]), now), None);
        assert_eq!(retry_after(&HeaderMap::new(), now), None);
    }

    #[test]
    fn absurd_retry_after_values_are_capped_or_ignored_never_a_panic() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_445_412_480);
        let one =
            |name: &'static str, value: &'static str| retry_after(&headers(&[(name, value)]), now);
        // Too large for a `Duration` (from_secs_f64 panics on these): capped.
        for huge in ["1e20", "1e300", "18446744073709551616", "1.8e19"] {
            assert_eq!(one("retry-after", huge), Some(MAX_RETRY_AFTER), "{huge}");
            assert_eq!(
                one("retry-after-ms", huge),
                Some(MAX_RETRY_AFTER),
                "{huge} ms"
            );
        }
        // Large but representable: capped too.
        assert_eq!(one("retry-after", "86400"), Some(MAX_RETRY_AFTER));
        assert_eq!(one("retry-after-ms", "3600000"), Some(MAX_RETRY_AFTER));
        assert_eq!(
            one("retry-after", "Fri, 31 Dec 9999 23:59:59 GMT"),
            Some(MAX_RETRY_AFTER),
            "a date far ahead"
        );
        // Just under the cap is kept as sent.
        assert_eq!(
            one("retry-after", "299.5"),
            Some(Duration::from_millis(299_500))
        );
        // Negative, NaN, infinite, garbage: ignored.
        for bad in [
            "-1", "-1e20", "-0.001", "NaN", "nan", "inf", "-inf", "infinity", "1e", "", "0x10",
            "5s",
        ] {
            assert_eq!(one("retry-after-ms", bad), None, "ms {bad:?}");
            assert_eq!(one("retry-after", bad), None, "{bad:?}");
        }
        // Zero (and negative zero) means now.
        assert_eq!(one("retry-after", "0"), Some(Duration::ZERO));
        assert_eq!(one("retry-after", "-0"), Some(Duration::ZERO));
        assert_eq!(one("retry-after-ms", "-0.0"), Some(Duration::ZERO));
        // An unusable precise header falls back to the seconds one.
        assert_eq!(
            retry_after(
                &headers(&[("retry-after-ms", "NaN"), ("retry-after", "2")]),
                now
            ),
            Some(Duration::from_secs(2))
        );
        assert_eq!(
            retry_after(
                &headers(&[("retry-after-ms", "1e30"), ("retry-after", "2")]),
                now
            ),
            Some(MAX_RETRY_AFTER),
            "a huge precise header is still the precise one, capped"
        );
    }

    #[test]
    fn error_type_never_keeps_the_message() {
        let body = br#"{"error":{"message":"Incorrect API key provided: sk-canary","type":"invalid_request_error","code":"invalid_api_key"}}"#;
        assert_eq!(error_type(body), "invalid_request_error");
        let anthropic =
            br#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#;
        assert_eq!(error_type(anthropic), "overloaded_error");
        let gemini = br#"{"error":{"code":429,"message":"Quota","status":"RESOURCE_EXHAUSTED"}}"#;
        assert_eq!(error_type(gemini), "RESOURCE_EXHAUSTED");
        assert_eq!(
            error_type(b"<html>502 Bad Gateway</html>"),
            "non-JSON error body"
        );
    }
}
