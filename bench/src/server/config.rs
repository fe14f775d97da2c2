//! The config each server runs with: the seed task shapes on an `openai`
//! provider pointed at the fake upstream, metering as asked, the breaker
//! scenario's tasks, and limits generous enough that the server, not a
//! limit, saturates.

use crate::upstream::{Leg, Upstream};
use std::{net::SocketAddr, path::Path};

/// Environment variable carrying the (dummy) upstream API key.
pub const KEY_ENV: &str = "AIO_BENCH_UPSTREAM_KEY";

/// How usage is metered in a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Metering {
    /// Metering on, SQLite file, `synchronous = FULL` (the default: fsync per commit).
    Sqlite,
    /// Metering on, SQLite file, `sqlite_synchronous = "normal"` (no fsync per commit).
    SqliteNormal,
    /// Metering on, PostgreSQL database.
    Postgres,
    /// Metering off (SQLite file for prompts only).
    Off,
}

impl Metering {
    /// Name in results.
    pub fn name(self) -> &'static str {
        match self {
            Metering::Sqlite => "sqlite",
            Metering::SqliteNormal => "sqlite-normal",
            Metering::Postgres => "postgres",
            Metering::Off => "off",
        }
    }

    /// Parses a CLI name.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "sqlite" => Some(Metering::Sqlite),
            "sqlite-normal" => Some(Metering::SqliteNormal),
            "postgres" | "pg" => Some(Metering::Postgres),
            "off" => Some(Metering::Off),
            _ => None,
        }
    }
}

/// Whether a run's servers audit every model call (`[audit] calls`, SPEC
/// §14.3): an event per call, in the same transaction as its usage record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuditCalls {
    /// The product default: `call.completed` / `call.failed` for every call.
    On,
    /// `[audit] calls = false`.
    Off,
}

impl AuditCalls {
    /// Name in results.
    pub fn name(self) -> &'static str {
        match self {
            AuditCalls::On => "on",
            AuditCalls::Off => "off",
        }
    }

    /// Parses a CLI name.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "on" | "true" => Some(AuditCalls::On),
            "off" | "false" => Some(AuditCalls::Off),
            _ => None,
        }
    }

    /// What a server's config gets: nothing for the default, so a server
    /// built before `[audit]` existed (an A/B run's older side) still starts.
    pub fn toml(self) -> &'static str {
        match self {
            AuditCalls::On => "",
            AuditCalls::Off => "\n[audit]\ncalls = false\n",
        }
    }

    /// A server's mode in results: its metering mode's name, marked when
    /// calls are not audited (`sqlite/audit-calls-off`), so the default
    /// runs keep the names every report and target reads.
    pub fn label(self, metering: Metering) -> String {
        match self {
            AuditCalls::On => metering.name().to_owned(),
            AuditCalls::Off => format!("{}/audit-calls-off", metering.name()),
        }
    }
}

/// Tasks of the breaker scenario: primary always 500 → healthy fallback,
/// the healthy provider alone, and the failing provider alone (once its
/// breaker is open, every call is refused with no provider call).
pub const BREAKER_TASK: &str = "bench_breaker";
/// See [`BREAKER_TASK`].
pub const HEALTHY_TASK: &str = "bench_healthy";
/// See [`BREAKER_TASK`].
pub const BREAKER_ONLY_TASK: &str = "breaker_only";
/// The agent of the agent-turn scenario.
pub const AGENT: &str = "bench_agent";
/// Name of the failing provider.
pub const BROKEN_PROVIDER: &str = "broken";

/// The server's config: seed task shapes (`sms_classify`, `meeting_brief`)
/// on an `openai` provider pointed at the fake upstream, metering as asked,
/// and limits generous enough that the server, not a limit, saturates.
/// With an `http` address, the HTTP edge (`[http]`, SPEC §13) listens
/// there too; a build without it refuses the key, so it is only set when
/// asked for.
pub fn config_toml(
    metering: Metering,
    database_url: &str,
    (grpc, metrics, http): (SocketAddr, SocketAddr, Option<SocketAddr>),
    upstream: &Upstream,
    latency_ms: u64,
    leg: Leg,
    ca_file: &Path,
) -> String {
    let ok = upstream.base_url(&format!("ok-{latency_ms}"), leg);
    let ok_fast = upstream.base_url("ok-0", leg);
    let broken = upstream.base_url("err-500", leg);
    let unused = upstream.base_url("unused", leg);
    // Every provider reaches the upstream over the same leg.
    let http_version = if matches!(leg, Leg::H2c | Leg::TlsH2) {
        "2"
    } else {
        "1.1"
    };
    let tls_ca = if leg.tls() {
        format!("tls_ca = \"{}\"", ca_file.display())
    } else {
        String::new()
    };
    let http = http.map_or_else(String::new, |addr| {
        format!("# The HTTP edge, beside gRPC (--rpcs chat-http).\n[http]\nlisten = \"{addr}\"\n")
    });
    let enabled = metering != Metering::Off;
    let synchronous = if metering == Metering::SqliteNormal {
        "normal"
    } else {
        "full"
    };
    format!(
        r#"# Generated by the bench binary (docs/benchmarks.md).
[server]
listen = "{grpc}"
metrics_listen = "{metrics}"
default_timeout = "30s"
health_probe_interval = "5s"
shutdown_grace = "5s"
# server.max_concurrent_requests keeps the product default (1024): in
# overload the server sheds with RESOURCE_EXHAUSTED (counted as errors)
# instead of holding thousands of calls in memory, as it would in production.

{http}
[database]
url = "{database_url}"
sqlite_synchronous = "{synchronous}"

[providers.openai]
kind = "openai"
base_url = "{ok}"
api_key_env = "{KEY_ENV}"
timeout = "10s"
max_concurrency = 20000
http_version = "{http_version}"
{tls_ca}

# The seed fallback of sms_classify / meeting_brief; never called here.
[providers.anthropic]
kind = "anthropic"
base_url = "{unused}"
api_key_env = "{KEY_ENV}"
timeout = "10s"
max_concurrency = 20000
http_version = "{http_version}"
{tls_ca}

# Breaker scenario: always 500, stays open once opened.
[providers.{BROKEN_PROVIDER}]
kind = "openai"
base_url = "{broken}"
api_key_env = "{KEY_ENV}"
timeout = "10s"
max_concurrency = 20000
http_version = "{http_version}"
{tls_ca}
[providers.{BROKEN_PROVIDER}.breaker]
failure_threshold = 5
open_for = "1h"

[providers.healthy]
kind = "openai"
base_url = "{ok_fast}"
api_key_env = "{KEY_ENV}"
timeout = "10s"
max_concurrency = 20000
http_version = "{http_version}"
{tls_ca}

[tasks.sms_classify]
chain = [
  {{ provider = "openai", model = "gpt-4o-mini" }},
  {{ provider = "anthropic", model = "claude-3-haiku-20240307" }},
]
max_tokens = 150
temperature = 0.0

[tasks.meeting_brief]
chain = [
  {{ provider = "openai", model = "gpt-4o-mini" }},
  {{ provider = "anthropic", model = "claude-3-haiku-20240307" }},
]
max_tokens = 600
temperature = 0.3

[tasks.{BREAKER_TASK}]
chain = [
  {{ provider = "{BROKEN_PROVIDER}", model = "gpt-4o-mini" }},
  {{ provider = "healthy", model = "gpt-4o-mini" }},
]
max_tokens = 600

[tasks.{HEALTHY_TASK}]
chain = [{{ provider = "healthy", model = "gpt-4o-mini" }}]
max_tokens = 600

[tasks.{BREAKER_ONLY_TASK}]
chain = [{{ provider = "{BROKEN_PROVIDER}", model = "gpt-4o-mini" }}]
max_tokens = 600

# The agent-turn scenario: three model calls and two tool calls a turn
# (the fake upstream scripts them), each turn a new conversation.
[agents.{AGENT}]
chain = [{{ provider = "openai", model = "gpt-4o-mini" }}]
core_prompt = "You are the bench agent. Echo what the user asks you to, one call at a time, then sum up."
tools = ["system.echo"]
max_tokens = 300

[metering]
enabled = {enabled}
# Caps are checked on every call (set, but never reached here).
[metering.default_limits]
max_cost_usd = 1000000.0
max_requests = 1000000000

[pricing."gpt-4o-mini"]
input_per_mtok = 0.15
output_per_mtok = 0.60

[pricing."claude-3-haiku-20240307"]
input_per_mtok = 0.25
output_per_mtok = 1.25
"#
    )
}

/// Three free loopback ports, for gRPC, metrics and the HTTP edge (bound
/// together so they differ, then released).
pub fn free_ports() -> anyhow::Result<(SocketAddr, SocketAddr, SocketAddr)> {
    let a = std::net::TcpListener::bind("127.0.0.1:0")?;
    let b = std::net::TcpListener::bind("127.0.0.1:0")?;
    let c = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok((a.local_addr()?, b.local_addr()?, c.local_addr()?))
}
