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
        "-1", "-1e20", "-0.001", "NaN", "nan", "inf", "-inf", "infinity", "1e", "", "0x10", "5s",
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

/// One answer from a raw HTTP/1.1 server: `head_and_body` as written, then
/// the connection closed (reset with `reset`).
async fn answer_once(head_and_body: &'static str, reset: bool) -> reqwest::Response {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let (mut tcp, _) = listener.accept().await.unwrap();
        let mut request = [0_u8; 1024];
        let _ = tcp.read(&mut request).await.unwrap();
        tcp.write_all(head_and_body.as_bytes()).await.unwrap();
        tcp.flush().await.unwrap();
        if reset {
            tcp.set_zero_linger().unwrap();
        }
    });
    reqwest::get(format!("http://{addr}/")).await.unwrap()
}

const CUT: &str = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 400\r\n\r\n{\"id\":\"chatcmpl-1\",";

/// reqwest reports a body cut by the connection as a decode error: it must
/// be a connection failure (counted once per connection event), never a
/// malformed answer (counted per call). A body that arrived whole but is
/// not JSON is still malformed.
#[tokio::test]
async fn a_body_cut_by_the_connection_is_a_connection_failure_not_malformed() {
    let deadline = Instant::now() + Duration::from_secs(10);
    for reset in [true, false] {
        let response = answer_once(CUT, reset).await;
        let e = json::<serde_json::Value>(response, deadline, 1 << 20)
            .await
            .unwrap_err();
        let failure = e.connection_failure();
        assert!(
            matches!(
                failure,
                Some(
                    ConnectFailure::ConnectionReset
                        | ConnectFailure::IncompleteMessage
                        | ConnectFailure::Body
                )
            ),
            "reset {reset}: {e:?}"
        );
        assert!(
            failure.is_some_and(|f| !f.unsent()),
            "it may have reached the provider"
        );
    }

    let whole = "HTTP/1.1 200 OK\r\ncontent-length: 9\r\n\r\nnot json!";
    let e = json::<serde_json::Value>(answer_once(whole, false).await, deadline, 1 << 20)
        .await
        .unwrap_err();
    assert!(matches!(e, ProviderError::Malformed(_)), "{e:?}");
}
