//! A provider reached over TLS, as real ones are: `tls_ca` trusts a private
//! CA, HTTP/1.1 is the default and `http_version = "2"` negotiates HTTP/2
//! by ALPN, and an upstream whose certificate nobody vouches for is a
//! connection error, never a call.

use crate::common::TestApp;
use ai_orchestrator::api::pb;
use axum::{
    extract::State,
    http::Version,
    response::{IntoResponse, Response},
};
use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
use std::{
    net::SocketAddr,
    sync::{Arc, Mutex},
};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::{
    TlsAcceptor,
    rustls::{
        ServerConfig,
        crypto::aws_lc_rs,
        pki_types::{CertificateDer, PrivatePkcs8KeyDer},
    },
    server::TlsStream,
};
use tonic_types::StatusExt;

/// A CA (PEM) and a server config for 127.0.0.1 it signed, ALPN h2 and
/// http/1.1.
fn pki() -> (String, Arc<ServerConfig>) {
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_pem = ca_params.self_signed(&ca_key).unwrap().pem();
    let issuer = Issuer::new(ca_params, ca_key);
    let key = KeyPair::generate().unwrap();
    let leaf = CertificateParams::new(vec!["127.0.0.1".to_owned()])
        .unwrap()
        .signed_by(&key, &issuer)
        .unwrap();
    let chain: Vec<CertificateDer<'static>> = vec![leaf.der().clone()];
    let mut config = ServerConfig::builder_with_provider(Arc::new(aws_lc_rs::default_provider()))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(chain, PrivatePkcs8KeyDer::from(key.serialize_der()).into())
        .unwrap();
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    (ca_pem, Arc::new(config))
}

/// Accepts TLS connections, handshakes inline (a test makes few).
struct Tls {
    tcp: TcpListener,
    acceptor: TlsAcceptor,
}

impl axum::serve::Listener for Tls {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            let Ok((tcp, peer)) = self.tcp.accept().await else {
                continue;
            };
            // A client that does not trust us fails here; keep serving.
            if let Ok(tls) = self.acceptor.accept(tcp).await {
                return (tls, peer);
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        self.tcp.local_addr()
    }
}

type Versions = Arc<Mutex<Vec<Version>>>;

async fn chat(State(seen): State<Versions>, version: Version) -> Response {
    seen.lock().unwrap().push(version);
    let body = serde_json::json!({
        "id": "chatcmpl-AbC123", "object": "chat.completion", "created": 1_732_000_000,
        "model": "gpt-4o-mini-2024-07-18",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "brief", "refusal": null},
                     "logprobs": null, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 120, "completion_tokens": 18, "total_tokens": 138}
    });
    ([("content-type", "application/json")], body.to_string()).into_response()
}

#[tokio::test]
async fn tls_ca_is_trusted_and_alpn_picks_the_http_version() {
    let (ca_pem, server_config) = pki();
    let seen: Versions = Arc::default();
    let tcp = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = tcp.local_addr().unwrap();
    let app = axum::Router::new()
        .route("/v1/chat/completions", axum::routing::post(chat))
        .with_state(seen.clone());
    let tls = Tls {
        tcp,
        acceptor: TlsAcceptor::from(server_config),
    };
    tokio::spawn(async move { axum::serve(tls, app).await });

    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("upstream-ca.pem");
    std::fs::write(&ca, &ca_pem).unwrap();
    let provider = |name: &str, extra: &str| {
        format!(
            "[providers.{name}]\nkind = \"openai\"\nbase_url = \"https://{addr}/v1\"\napi_key_env = \"TEST_OPENAI_KEY\"\ntimeout = \"5s\"\n{extra}\n"
        )
    };
    let toml = format!(
        r#"
[database]
url = "sqlite://{db}"
{alpn}{h1}{untrusted}
[tasks.over_h2]
chain = [{{ provider = "alpn", model = "gpt-4o-mini" }}]
[tasks.over_h1]
chain = [{{ provider = "h1", model = "gpt-4o-mini" }}]
[tasks.untrusted]
chain = [{{ provider = "untrusted", model = "gpt-4o-mini" }}]
[pricing."gpt-4o-mini"]
input_per_mtok = 0.15
output_per_mtok = 0.60
"#,
        db = dir.path().join("tls.db").display(),
        alpn = provider(
            "alpn",
            &format!("tls_ca = \"{}\"\nhttp_version = \"2\"", ca.display())
        ),
        h1 = provider("h1", &format!("tls_ca = \"{}\"", ca.display())),
        untrusted = provider("untrusted", ""),
    );
    let app = TestApp::spawn_toml_env(&toml, |name| {
        (name == "TEST_OPENAI_KEY").then(|| "sk-test".into())
    })
    .await;
    let execute = |task: &str| pb::ExecuteRequest {
        context: crate::common::ctx(),
        task: task.into(),
        ..Default::default()
    };
    let mut client = app.client.clone();
    client.execute(execute("over_h2")).await.unwrap();
    client.execute(execute("over_h1")).await.unwrap();
    assert_eq!(*seen.lock().unwrap(), [Version::HTTP_2, Version::HTTP_11]);

    let refused = client.execute(execute("untrusted")).await.unwrap_err();
    let info = refused.get_details_error_info().unwrap();
    assert_eq!(info.reason, "ALL_PROVIDERS_FAILED");
    assert!(
        info.metadata["attempts"].contains("CONNECTION_ERROR"),
        "{:?}",
        info.metadata
    );
    assert_eq!(seen.lock().unwrap().len(), 2, "no request without trust");
    app.stop().await;
}
