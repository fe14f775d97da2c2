//! `[http]`: the HTTP edge (SPEC §13), an OpenAI-compatible API and agent
//! turns over Server-Sent Events beside the gRPC port; off when absent.

use serde::Deserialize;
use std::net::SocketAddr;

/// `[http]`: where the HTTP edge listens and which browser origins may call it.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpConfig {
    /// Where to listen (HTTP/1.1 and HTTP/2 cleartext).
    pub listen: SocketAddr,
    /// Browser origins allowed by CORS, exactly as a browser sends them
    /// (`https://app.example.com`); `"*"` allows any. Empty: no CORS headers,
    /// so browsers on other origins are refused; servers are unaffected.
    #[serde(default)]
    pub cors_origins: Vec<String>,
    /// The edge's address as workflows reach it (`https://ai.internal`):
    /// with it, a webhook that calls back is sent `X-Callback-Url`.
    #[serde(default)]
    pub public_url: Option<String>,
}

/// Whether `origin` is one a browser sends: `scheme://host[:port]`, nothing after.
pub(super) fn is_origin(origin: &str) -> bool {
    let Some((scheme, rest)) = origin.split_once("://") else {
        return false;
    };
    matches!(scheme, "http" | "https")
        && !rest.is_empty()
        && !rest.contains(['/', '?', '#', ' ', '*'])
        && http::HeaderValue::from_str(origin).is_ok()
}
