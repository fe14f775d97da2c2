//! The HTTP edge (SPEC §13) end to end, driven by clients nobody here
//! wrote: OpenAI's official Python and Node SDKs (chat, streams, tools,
//! errors, retries, fallback, models), an SSE client library for agent
//! turns, and a browser's CORS preflight. Our own client would agree with
//! our own server on any mistake; these are what callers really run. The
//! real server with auth listens on a free port, fake providers (OpenAI,
//! Anthropic, a broken one) are real HTTP servers, each app on its own
//! SQLite file.

mod cors;
mod fakes;
mod limits;
mod same_records;
mod sdk;
mod shutdown;
mod sse;

use crate::{
    common::{TestApp, wait_for},
    observability::free_port,
};
use ai_orchestrator::auth::keys::hash_hex;
use fakes::{Fakes, SLOW_MODEL, base_url};
use serde_json::Value;
use std::time::Duration;

/// The one API key, of team t1.
pub const KEY: &str = "aio_test_http_edge_sdk_key";
/// The browser origin the edge allows.
pub const ORIGIN: &str = "https://app.example.com";

/// A running server with its HTTP edge and the fakes behind it.
pub struct Edge {
    pub app: TestApp,
    pub port: u16,
    pub fakes: Fakes,
}

impl Edge {
    /// Starts the fakes and the server (`server` lines added to `[server]`),
    /// and waits until the HTTP port accepts connections.
    pub async fn start(server: &str) -> Self {
        let fakes = Fakes::start().await;
        let port = free_port();
        let dir = tempfile::tempdir().unwrap();
        let db = format!("sqlite://{}", dir.path().join("http_edge.db").display());
        let mut app = TestApp::spawn_toml_env(&toml(&db, port, &fakes, server), env).await;
        app.keep(dir);
        wait_for(|| async {
            tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .is_ok()
        })
        .await;
        Self { app, port, fakes }
    }

    /// The OpenAI-style base URL (`http://127.0.0.1:PORT/v1`).
    pub fn base_url(&self) -> String {
        format!("http://127.0.0.1:{}/v1", self.port)
    }

    pub async fn stop(self) {
        self.app.stop().await;
    }
}

/// The environment the config reads.
fn env(name: &str) -> Option<String> {
    match name {
        "TEST_OPENAI_KEY" => Some("sk-test-openai".into()),
        "TEST_ANTHROPIC_KEY" => Some("sk-ant-test".into()),
        _ => None,
    }
}

/// The config: tasks over the fakes (`chat`, `chat_tools`, `down`, `slow`,
/// `fallback`), an agent, one key, the edge on `port`.
fn toml(database_url: &str, port: u16, fakes: &Fakes, server: &str) -> String {
    format!(
        r#"
[server]
listen = "127.0.0.1:0"
default_timeout = "10s"
health_probe_interval = "1s"
{server}

[database]
url = "{database_url}"
max_connections = 4

[http]
listen = "127.0.0.1:{port}"
cors_origins = ["{ORIGIN}"]

[auth]
enabled = true
[[auth.keys]]
name = "sdk"
sha256 = "{key}"
teams = ["t1"]

[providers.openai]
kind = "openai"
base_url = "{openai}"
api_key_env = "TEST_OPENAI_KEY"
timeout = "5s"

[providers.anthropic]
kind = "anthropic"
base_url = "{anthropic}"
api_key_env = "TEST_ANTHROPIC_KEY"
timeout = "5s"

[providers.broken]
kind = "openai"
base_url = "{broken}"
api_key_env = "TEST_OPENAI_KEY"
timeout = "5s"

# A failed target is left at once for the next (no waits in these tests).
[retry]
base_backoff = "20ms"
max_backoff = "80ms"
interactive_max_wait = "0ms"

[tasks.chat]
chain = [{{ provider = "openai", model = "gpt-4o-mini" }}]
[tasks.chat_tools]
chain = [{{ provider = "openai", model = "gpt-4o-mini" }}]
[tasks.down]
chain = [{{ provider = "broken", model = "gpt-4o-mini" }}]
[tasks.slow]
chain = [{{ provider = "openai", model = "{SLOW_MODEL}" }}]
[tasks.fallback]
chain = [{{ provider = "broken", model = "gpt-4o-mini" }}, {{ provider = "anthropic", model = "claude-3-haiku-20240307" }}]

[agents.helper]
chain = [{{ provider = "openai", model = "gpt-4o-mini" }}]
core_prompt = "You are the test agent."

[pricing."gpt-4o-mini"]
input_per_mtok = 0.15
output_per_mtok = 0.60
[pricing."{SLOW_MODEL}"]
input_per_mtok = 0.15
output_per_mtok = 0.60
[pricing."claude-3-haiku-20240307"]
input_per_mtok = 0.25
output_per_mtok = 1.25
"#,
        key = hash_hex(KEY),
        openai = base_url(&fakes.openai),
        anthropic = base_url(&fakes.anthropic),
        broken = base_url(&fakes.broken),
    )
}

/// A script of this folder, by file name.
pub fn script(name: &str) -> String {
    format!("{}/tests/api/web/{name}", env!("CARGO_MANIFEST_DIR"))
}

/// Runs a counterpart to its end (a minute at most) and parses the one
/// JSON object it prints; its output is the failure message otherwise.
pub async fn report(command: &mut tokio::process::Command) -> Value {
    let out = tokio::time::timeout(Duration::from_secs(60), command.kill_on_drop(true).output())
        .await
        .expect("the counterpart finishes within a minute")
        .expect("the counterpart starts");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{}\n{stdout}\n{stderr}", out.status);
    serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("not one JSON object ({e}):\n{stdout}\n{stderr}"))
}
