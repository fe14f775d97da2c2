//! Crash durability: the real binary under load is killed with SIGKILL
//! several times; every call a client saw succeed has its usage record, and
//! after a restart no reservation stays open.

use crate::common::connect;
use ai_orchestrator::{
    api::pb::{self, orchestrator_client::OrchestratorClient},
    config::DatabaseConfig,
    store::Store,
    usage::{record, sweeper},
};
use std::{
    net::SocketAddr,
    process::Stdio,
    sync::{Arc, Mutex},
    time::Duration,
};
use tokio::process::{Child, Command};

fn free_addr() -> SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap()
}

fn write_config(dir: &std::path::Path, addr: SocketAddr) -> std::path::PathBuf {
    let db = dir.join("crash.db");
    let toml = crate::common::config_toml(
        &format!("sqlite://{}", db.display()),
        "latency = \"15ms\"",
        "latency = \"15ms\"",
    )
    .replace("listen = \"127.0.0.1:0\"", &format!("listen = \"{addr}\""));
    let path = dir.join("config.toml");
    std::fs::write(&path, toml).unwrap();
    path
}

async fn start(config: &std::path::Path, addr: SocketAddr) -> Child {
    let child = Command::new(env!("CARGO_BIN_EXE_ai-orchestrator"))
        .args(["--config", config.to_str().unwrap(), "serve"])
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("start the server binary");
    connect(addr).await; // waits for health SERVING (start-up sweep done)
    child
}

#[tokio::test]
async fn every_acknowledged_call_survives_sigkill() {
    let dir = tempfile::tempdir().unwrap();
    let addr = free_addr();
    let config = write_config(dir.path(), addr);
    let acked: Arc<Mutex<Vec<String>>> = Arc::default();

    for round in 0..3 {
        let mut server = start(&config, addr).await;
        let channel = connect(addr).await;
        let mut workers = Vec::new();
        for worker in 0..8 {
            let mut client = OrchestratorClient::new(channel.clone());
            let acked = acked.clone();
            workers.push(tokio::spawn(async move {
                for i in 0.. {
                    let trace = format!("crash-{round}-{worker}-{i}");
                    let mut request = tonic::Request::new(pb::ClassifySmsRequest {
                        context: Some(pb::RequestContext {
                            team_id: "t1".into(),
                            ..Default::default()
                        }),
                        message: "Are you open on Sunday?".into(),
                        ..Default::default()
                    });
                    request
                        .metadata_mut()
                        .insert("x-trace-id", trace.parse().unwrap());
                    match client.classify_sms(request).await {
                        Ok(_) => acked.lock().unwrap().push(trace),
                        Err(_) => return, // the server died under us
                    }
                }
            }));
        }
        // Kill mid-load, once this round has made progress.
        let before = acked.lock().unwrap().len();
        for _ in 0..600 {
            if acked.lock().unwrap().len() >= before + 30 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        server.start_kill().unwrap(); // SIGKILL: no drain, no flush
        server.wait().await.unwrap();
        for w in workers {
            tokio::time::timeout(Duration::from_secs(10), w)
                .await
                .expect("client notices the crash")
                .unwrap();
        }
    }

    // Restart: the start-up sweep charges what the crashes orphaned.
    let mut server = start(&config, addr).await;
    let store = Store::connect(&DatabaseConfig {
        url: format!("sqlite://{}", dir.path().join("crash.db").display()),
        ..DatabaseConfig::default()
    })
    .await
    .unwrap();
    let acked = acked.lock().unwrap().clone();
    assert!(
        acked.len() >= 90,
        "each round must have made progress: {} calls",
        acked.len()
    );
    for trace in &acked {
        let records = record::by_trace(&store, trace).await.unwrap();
        assert_eq!(
            records.len(),
            1,
            "acknowledged call {trace} must have exactly one record"
        );
        assert_eq!(records[0].outcome, "ok");
    }
    assert_eq!(
        sweeper::open_reservations(&store).await.unwrap(),
        0,
        "no reservation left open"
    );
    store.close().await;
    server.start_kill().unwrap();
    server.wait().await.unwrap();
}
