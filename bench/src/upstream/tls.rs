//! The fake upstream over TLS, as production reaches providers: a CA and a
//! certificate for 127.0.0.1 made at start (rcgen), ALPN offering `h2` and
//! `http/1.1` (the client's choice decides the leg), each handshake on a
//! task of its own so a burst of new connections does not queue behind one.

use std::{net::SocketAddr, sync::Arc};
use tokio::{
    net::{TcpListener, TcpStream},
    sync::mpsc,
};
use tokio_rustls::{
    TlsAcceptor,
    rustls::{
        ServerConfig,
        crypto::aws_lc_rs,
        pki_types::{CertificateDer, PrivatePkcs8KeyDer},
    },
    server::TlsStream,
};

/// The upstream's CA (what the orchestrator and the direct baseline trust)
/// and its server config.
pub struct Pki {
    /// The CA certificate, PEM.
    pub ca_pem: String,
    /// The server side: the leaf certificate, its key, ALPN.
    pub config: Arc<ServerConfig>,
}

/// A fresh CA and a certificate for `127.0.0.1` and `localhost` it signed.
pub fn pki() -> anyhow::Result<Pki> {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
    let ca_key = KeyPair::generate()?;
    let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "ai-orchestrator bench CA");
    let ca_pem = ca_params.self_signed(&ca_key)?.pem();
    let issuer = Issuer::new(ca_params, ca_key);
    let key = KeyPair::generate()?;
    let leaf = CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()])?
        .signed_by(&key, &issuer)?;
    let chain: Vec<CertificateDer<'static>> = vec![leaf.der().clone()];
    let key = PrivatePkcs8KeyDer::from(key.serialize_der());
    let mut config = ServerConfig::builder_with_provider(Arc::new(aws_lc_rs::default_provider()))
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(chain, key.into())?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Pki {
        ca_pem,
        config: Arc::new(config),
    })
}

/// Connections that finished their handshake, for `axum::serve`.
pub struct TlsListener {
    ready: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    addr: SocketAddr,
}

/// Accepts on `tcp` (Nagle off, as on the plaintext port) and hands over
/// each connection once its handshake is done; a failed handshake is
/// dropped. Call inside the runtime that serves it.
pub fn listen(tcp: TcpListener, config: Arc<ServerConfig>) -> std::io::Result<TlsListener> {
    let addr = tcp.local_addr()?;
    let (tx, ready) = mpsc::channel(1024);
    let acceptor = TlsAcceptor::from(config);
    tokio::spawn(async move {
        loop {
            let Ok((stream, peer)) = tcp.accept().await else {
                continue;
            };
            let _ = stream.set_nodelay(true);
            if tx.is_closed() {
                return;
            }
            let (acceptor, tx) = (acceptor.clone(), tx.clone());
            tokio::spawn(async move {
                if let Ok(tls) = acceptor.accept(stream).await {
                    let _ = tx.send((tls, peer)).await;
                }
            });
        }
    });
    Ok(TlsListener { ready, addr })
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.ready.recv().await {
            Some(conn) => conn,
            // The accept loop only ends once this listener is gone.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.addr)
    }
}
