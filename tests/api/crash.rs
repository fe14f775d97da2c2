//! Crash durability: the real binary under load is killed with SIGKILL
//! several times; every call a client saw succeed has its usage record, and
//! after a restart no reservation stays open. Runs on SQLite and PostgreSQL.

use crate::{
    common::{connect, wait_for},
    metering::Db,
};
use ai_orchestrator::{
    api::pb::{self, orchestrator_client::OrchestratorClient},
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

/// A config for `addr` on `database_url`. Orphans are swept after 3 s (the
/// request timeout is 2 s): on PostgreSQL a reservation is an orphan only
/// once older than that, so a short value keeps the test quick.
fn write_config(
    dir: &std::path::Path,
    addr: SocketAddr,
    database_url: &str,
    sqlite_synchronous: &str,
) -> std::path::PathBuf {
    let toml = crate::common::config_toml_with(
        database_url,
        "latency = \"15ms\"",
        "latency = \"15ms\"",
        "[metering]\nsweep_after = \"3s\"\nsweep_interval = \"200ms\"\n",
    )
    .replace("listen = \"127.0.0.1:0\"", &format!("listen = \"{addr}\""))
    .replace("default_timeout = \"10s\"", "default_timeout = \"2s\"")
    .replace(
        &format!("url = \"{database_url}\""),
        &format!("url = \"{database_url}\"\nsqlite_synchronous = \"{sqlite_synchronous}\""),
    );
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

async fn every_acknowledged_call_survives_sigkill(postgres: bool, sqlite_synchronous: &str) {
    let db = Db::new(postgres).await;
    let dir = tempfile::tempdir().unwrap();
    let addr = free_addr();
    let config = write_config(dir.path(), addr, &db.url(), sqlite_synchronous);
    assert!(
        std::fs::read_to_string(&config)
            .unwrap()
            .contains(&format!("sqlite_synchronous = \"{sqlite_synchronous}\"")),
        "the durability setting is in the config"
    );
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

    // Restart: the sweeper charges what the crashes orphaned (on SQLite all
    // at start-up; on PostgreSQL once they are older than `sweep_after`).
    let mut server = start(&config, addr).await;
    let store = db.store().await;
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
    if !postgres {
        assert_eq!(
            sweeper::open_reservations(&store).await.unwrap(),
            0,
            "no reservation left open after the start-up sweep"
        );
    }
    wait_for(|| async { sweeper::open_reservations(&store).await.unwrap() == 0 }).await;
    store.close().await;
    server.start_kill().unwrap();
    server.wait().await.unwrap();
    db.cleanup().await;
}

#[tokio::test]
async fn every_acknowledged_call_survives_sigkill_sqlite() {
    every_acknowledged_call_survives_sigkill(false, "full").await;
}

/// `sqlite_synchronous = "normal"` skips the fsync per commit; a killed
/// process still loses nothing (the commit reached the OS before the reply).
#[tokio::test]
async fn every_acknowledged_call_survives_sigkill_sqlite_normal() {
    every_acknowledged_call_survives_sigkill(false, "normal").await;
}

#[tokio::test]
async fn every_acknowledged_call_survives_sigkill_postgres() {
    every_acknowledged_call_survives_sigkill(true, "full").await;
}
