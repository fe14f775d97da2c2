//! TLS and mTLS on the gRPC port, with certificates made for the test.

use crate::common::{config_toml_with, ctx};
use ai_orchestrator::api::pb::{self, orchestrator_client::OrchestratorClient};
use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
use std::{path::Path, time::Duration};
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};

struct Pki {
    ca_pem: String,
    server: (String, String),
    client: (String, String),
}

fn pki() -> Pki {
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_pem = ca_params.self_signed(&ca_key).unwrap().pem();
    let issuer = Issuer::new(ca_params, ca_key);
    let leaf = |name: &str| {
        let key = KeyPair::generate().unwrap();
        let cert = CertificateParams::new(vec![name.to_owned()])
            .unwrap()
            .signed_by(&key, &issuer)
            .unwrap();
        (cert.pem(), key.serialize_pem())
    };
    Pki {
        server: leaf("localhost"),
        client: leaf("billing-service"),
        ca_pem,
    }
}

fn write(dir: &Path, name: &str, pem: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, pem).unwrap();
    path.display().to_string()
}

async fn start(
    dir: &Path,
    pki: &Pki,
    mtls: bool,
) -> (std::net::SocketAddr, tokio::sync::oneshot::Sender<()>) {
    let cert = write(dir, "server.crt", &pki.server.0);
    let key = write(dir, "server.key", &pki.server.1);
    let ca = write(dir, "ca.crt", &pki.ca_pem);
    let client_ca = if mtls {
        format!("client_ca = \"{ca}\"\n")
    } else {
        String::new()
    };
    let toml = config_toml_with(
        &format!("sqlite://{}", dir.join("tls.db").display()),
        "latency = \"1ms\"",
        "latency = \"1ms\"",
        "",
    )
    .replace(
        "[database]",
        &format!("[server.tls]\ncert = \"{cert}\"\nkey = \"{key}\"\n{client_ca}\n[database]"),
    );
    let config = ai_orchestrator::config::Config::from_toml_str(&toml, |_| None).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(ai_orchestrator::serve(listener, config, async {
        let _ = rx.await;
    }));
    (addr, tx)
}

async fn classify(
    addr: std::net::SocketAddr,
    tls: Option<ClientTlsConfig>,
) -> Result<pb::ClassifySmsResponse, String> {
    let scheme = if tls.is_some() { "https" } else { "http" };
    let mut endpoint = Endpoint::from_shared(format!("{scheme}://localhost:{}", addr.port()))
        .unwrap()
        .connect_timeout(Duration::from_secs(2))
        .timeout(Duration::from_secs(5));
    if let Some(tls) = tls {
        endpoint = endpoint.tls_config(tls).map_err(|e| e.to_string())?;
    }
    // The server finishes starting (migrations) after bind: retry a little.
    let mut last = String::new();
    for _ in 0..40 {
        match endpoint.connect().await {
            Ok(channel) => {
                return OrchestratorClient::new(channel)
                    .classify_sms(pb::ClassifySmsRequest {
                        context: ctx(),
                        message: "Is the offer still on?".into(),
                        ..Default::default()
                    })
                    .await
                    .map(tonic::Response::into_inner)
                    .map_err(|s| format!("{s:?}"));
            }
            Err(e) => last = format!("{e:?}"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Err(last)
}

#[tokio::test]
async fn tls_serves_clients_that_trust_the_ca_and_refuses_plaintext() {
    let dir = tempfile::tempdir().unwrap();
    let pki = pki();
    let (addr, stop) = start(dir.path(), &pki, false).await;
    let trusting = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(&pki.ca_pem))
        .domain_name("localhost");
    let reply = classify(addr, Some(trusting))
        .await
        .expect("TLS call works");
    assert!(reply.meta.is_some());
    assert!(
        classify(addr, None).await.is_err(),
        "plaintext is not served on a TLS port"
    );
    let _ = stop.send(());
}

#[tokio::test]
async fn mtls_refuses_clients_without_a_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let pki = pki();
    let (addr, stop) = start(dir.path(), &pki, true).await;
    let base = || {
        ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(&pki.ca_pem))
            .domain_name("localhost")
    };
    assert!(
        classify(addr, Some(base())).await.is_err(),
        "no client certificate: refused"
    );
    let with_cert = base().identity(Identity::from_pem(&pki.client.0, &pki.client.1));
    let reply = classify(addr, Some(with_cert))
        .await
        .expect("mTLS call works");
    assert!(reply.meta.is_some());
    let _ = stop.send(());
}

#[tokio::test]
async fn a_missing_certificate_file_fails_start_up_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let toml = config_toml_with(
        &format!("sqlite://{}", dir.path().join("x.db").display()),
        "latency = \"1ms\"",
        "latency = \"1ms\"",
        "",
    )
    .replace(
        "[database]",
        "[server.tls]\ncert = \"/nonexistent/server.crt\"\nkey = \"/nonexistent/server.key\"\n\n[database]",
    );
    let config = ai_orchestrator::config::Config::from_toml_str(&toml, |_| None).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let err = ai_orchestrator::serve(listener, config, std::future::pending())
        .await
        .unwrap_err();
    assert!(format!("{err:#}").contains("server.tls.cert"), "{err:#}");
}
