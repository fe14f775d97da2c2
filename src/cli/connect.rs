//! How client commands reach the server, and a connection failure said once, with a hint.

use anyhow::Context;
use std::error::Error as _;

/// `addr` as a URL: `host:port` (as grpcurl and `serve --listen` write it) is plain HTTP.
pub(crate) fn url(addr: &str) -> String {
    if addr.contains("://") {
        addr.to_owned()
    } else {
        format!("http://{addr}")
    }
}

/// An endpoint for `addr` (TLS configured by the caller for `https://`).
pub(crate) fn endpoint(addr: &str) -> anyhow::Result<tonic::transport::Endpoint> {
    tonic::transport::Endpoint::from_shared(url(addr))
        .with_context(|| format!("bad --addr {addr}: write host:port or http(s)://host:port"))
}

/// A failed connection to `addr`: each distinct cause once (the transport repeats its
/// own), and how to start the server when nothing listens there.
pub(crate) fn failed(addr: &str, err: &tonic::transport::Error) -> anyhow::Error {
    let mut causes: Vec<String> = Vec::new();
    let mut refused = false;
    let mut cause: Option<&(dyn std::error::Error + 'static)> = err.source();
    while let Some(e) = cause {
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            refused |= io.kind() == std::io::ErrorKind::ConnectionRefused;
        }
        let text = e.to_string();
        if !causes.iter().any(|c| c == &text) {
            causes.push(text);
        }
        cause = e.source();
    }
    let why = if causes.is_empty() {
        err.to_string()
    } else {
        causes.join(": ")
    };
    if refused {
        anyhow::anyhow!(
            "cannot reach the server at {addr}: {why}. Is it running? Start it with `ai-orchestrator serve` (or point --addr at it)"
        )
    } else {
        anyhow::anyhow!("cannot reach the server at {addr}: {why}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bare_host_and_port_is_plain_http() {
        assert_eq!(url("127.0.0.1:50051"), "http://127.0.0.1:50051");
        assert_eq!(url("https://aio:443"), "https://aio:443");
        assert!(endpoint("localhost:50051").is_ok());
    }

    #[tokio::test]
    async fn a_refused_connection_is_said_once_with_a_hint() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .unwrap_or(1);
        let addr = format!("127.0.0.1:{port}");
        let Ok(endpoint) = endpoint(&addr) else {
            panic!("a host:port is an address");
        };
        let Err(err) = endpoint.connect().await else {
            panic!("nothing listens there");
        };
        let text = failed(&addr, &err).to_string();
        assert!(text.matches("tcp connect error").count() <= 1, "{text}");
        assert!(text.contains("Connection refused"), "{text}");
        assert!(text.contains("ai-orchestrator serve"), "{text}");
    }
}
