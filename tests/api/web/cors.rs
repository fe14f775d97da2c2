//! CORS as a browser exercises it: the preflight exactly as Chrome sends
//! it before a cross-site `fetch` with a bearer key (no credentials on the
//! preflight itself), from a listed origin and from another one, then the
//! actual requests, whose headers the page's script may only read when
//! they are exposed.

use super::{Edge, KEY, ORIGIN};
use reqwest::{Method, RequestBuilder, StatusCode, header::HeaderMap};
use serde_json::json;

const CHROME: &str = "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) \
                      Chrome/131.0.0.0 Safari/537.36";

/// A browser's preflight of a JSON `POST` with `Authorization` from `origin`.
fn preflight(http: &reqwest::Client, url: &str, origin: &str) -> RequestBuilder {
    http.request(Method::OPTIONS, url)
        .header("Accept", "*/*")
        .header("Accept-Encoding", "gzip, deflate, br, zstd")
        .header("Accept-Language", "en-US,en;q=0.9")
        .header(
            "Access-Control-Request-Headers",
            "authorization,content-type",
        )
        .header("Access-Control-Request-Method", "POST")
        .header("Origin", origin)
        .header("Referer", format!("{origin}/"))
        .header("Sec-Fetch-Dest", "empty")
        .header("Sec-Fetch-Mode", "cors")
        .header("Sec-Fetch-Site", "cross-site")
        .header("User-Agent", CHROME)
}

/// The comma-separated values of `name`, lowercased.
fn listed(headers: &HeaderMap, name: &str) -> Vec<String> {
    headers
        .get_all(name)
        .iter()
        .flat_map(|v| v.to_str().unwrap_or_default().split(','))
        .map(|v| v.trim().to_ascii_lowercase())
        .filter(|v| !v.is_empty())
        .collect()
}

fn allowed_origin(headers: &HeaderMap) -> Option<&str> {
    headers
        .get("access-control-allow-origin")
        .map(|v| v.to_str().unwrap())
}

#[tokio::test]
async fn a_browser_preflight_is_answered_for_a_listed_origin_only() {
    let edge = Edge::start("").await;
    let http = reqwest::Client::new();
    let url = format!("{}/chat/completions", edge.base_url());

    let answered = preflight(&http, &url, ORIGIN).send().await.unwrap();
    assert!(answered.status().is_success(), "{}", answered.status());
    let headers = answered.headers();
    assert_eq!(allowed_origin(headers), Some(ORIGIN), "{headers:?}");
    // Answered before any handler, and still traceable.
    assert!(headers.contains_key("x-trace-id"), "{headers:?}");
    let methods = listed(headers, "access-control-allow-methods");
    assert!(methods.iter().any(|m| m == "post"), "{methods:?}");
    let allowed = listed(headers, "access-control-allow-headers");
    for header in ["authorization", "content-type"] {
        assert!(allowed.iter().any(|h| h == header), "{header}: {allowed:?}");
    }

    let other = preflight(&http, &url, "https://evil.example")
        .send()
        .await
        .unwrap();
    assert_eq!(
        allowed_origin(other.headers()),
        None,
        "{:?}",
        other.headers()
    );
    edge.stop().await;
}

#[tokio::test]
async fn the_actual_request_exposes_the_trace_id_and_errors_stay_readable() {
    let edge = Edge::start("").await;
    let http = reqwest::Client::new();
    let url = format!("{}/chat/completions", edge.base_url());
    let body = json!({"model": "chat", "messages": [{"role": "user", "content": "Hi"}]});

    let answered = http
        .post(&url)
        .bearer_auth(KEY)
        .header("Origin", ORIGIN)
        .header("Sec-Fetch-Mode", "cors")
        .header("Sec-Fetch-Site", "cross-site")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(answered.status(), StatusCode::OK);
    let headers = answered.headers();
    assert_eq!(allowed_origin(headers), Some(ORIGIN), "{headers:?}");
    assert!(headers.contains_key("x-trace-id"), "{headers:?}");
    let exposed = listed(headers, "access-control-expose-headers");
    assert!(exposed.iter().any(|h| h == "x-trace-id"), "{exposed:?}");

    // A refusal carries the headers too, or the page could not read why.
    let refused = http
        .post(&url)
        .header("Origin", ORIGIN)
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(
        allowed_origin(refused.headers()),
        Some(ORIGIN),
        "{:?}",
        refused.headers()
    );
    let error: serde_json::Value = refused.json().await.unwrap();
    assert_eq!(error["error"]["code"], "API_KEY_MISSING", "{error}");
    edge.stop().await;
}
