//! The command line. Unset numbers take the full-run or the smoke default
//! ([`crate::settings`] picks them).

use clap::Parser;
use std::path::PathBuf;

/// Command line. Unset numbers take the full-run or the smoke default.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "bench",
    about = "Load benchmark of ai-orchestrator (docs/benchmarks.md)"
)]
pub struct Args {
    /// CI mode: a few seconds at low rates; checks that it runs, not how fast.
    #[arg(long)]
    pub smoke: bool,
    /// Orchestrator binary [default: `ai-orchestrator` next to this binary].
    #[arg(long)]
    pub server_bin: Option<PathBuf>,
    /// Folder for results.json and results.md.
    #[arg(long, default_value = "bench-results")]
    pub out: PathBuf,
    /// Scenarios: load, direct, paired, saturation, breaker, inflight,
    /// coldstart, usage; and cluster (two replicas with and without a
    /// shared Redis; needs `redis-server`), not in the defaults.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "load,direct,paired,saturation,breaker,inflight,coldstart,usage"
    )]
    pub scenarios: Vec<String>,
    /// RPCs at fixed rates: execute, classify, tool (`InvokeTool` of
    /// `system.echo`), agent (`Converse`: three model calls and two tool
    /// calls a turn); tool and agent are also swept at saturation beside
    /// `Execute`. chat-http (`POST /v1/chat/completions` on the HTTP edge,
    /// `Execute`'s twin; not in the defaults) starts every server with
    /// `[http]`, which a build without the HTTP edge refuses.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "execute,classify,tool,agent"
    )]
    pub rpcs: Vec<String>,
    /// Metering modes: sqlite (fsync per commit, the default durability),
    /// sqlite-normal (`sqlite_synchronous = "normal"`), postgres, off.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "sqlite,sqlite-normal,postgres,off"
    )]
    pub metering: Vec<String>,
    /// `[audit] calls` modes: on (the default: every model call leaves an
    /// audit event in its usage record's transaction) and off. The fixed
    /// rates, paired rounds and saturation run once per metering mode and
    /// audit mode; off is named `<metering>/audit-calls-off` in results.
    #[arg(long, value_delimiter = ',', default_value = "on")]
    pub audit_calls: Vec<String>,
    /// Fixed rates, requests/s [default: 200,1000,3000; smoke: 50].
    #[arg(long, value_delimiter = ',')]
    pub rates: Option<Vec<f64>>,
    /// Fake upstream latencies, ms [default: 0,50; smoke: 0].
    #[arg(long, value_delimiter = ',')]
    pub upstream_latency_ms: Option<Vec<u64>>,
    /// Seconds of load per fixed-rate step [default: 10; smoke: 0.5].
    #[arg(long)]
    pub duration: Option<f64>,
    /// Seconds of unmeasured load per RPC on each new server [default: 2; smoke: 0.3].
    #[arg(long)]
    pub warmup: Option<f64>,
    /// HTTP/2 connections to the server.
    #[arg(long, default_value_t = 4)]
    pub connections: usize,
    /// Requests in flight at most; more are dropped and counted as errors.
    #[arg(long, default_value_t = 20_000)]
    pub max_inflight: usize,
    /// First saturation rate [default: 1000; smoke: 50].
    #[arg(long)]
    pub saturation_start: Option<f64>,
    /// Rate multiplier between saturation steps.
    #[arg(long, default_value_t = 1.25)]
    pub saturation_factor: f64,
    /// Most saturation steps [default: 25; smoke: 2].
    #[arg(long)]
    pub saturation_steps: Option<usize>,
    /// Bisection steps between the last passing and first failing rate [default: 3; smoke: 0].
    #[arg(long)]
    pub saturation_refine: Option<usize>,
    /// Saturation sweeps per metering mode; targets read their median [default: 3; smoke: 2].
    #[arg(long)]
    pub saturation_repeats: Option<usize>,
    /// Seconds per saturation step [default: 5; smoke: 0.5].
    #[arg(long)]
    pub saturation_duration: Option<f64>,
    /// Paired rounds per server (a direct and an orchestrator step back to
    /// back; the p99 target reads their median) [default: 6; smoke: 2].
    #[arg(long)]
    pub paired_rounds: Option<usize>,
    /// Offered rate of the paired rounds [default: 1000; smoke: 50].
    #[arg(long)]
    pub paired_rate: Option<f64>,
    /// Seconds per step of a paired round [default: 5; smoke: 0.5].
    #[arg(long)]
    pub paired_duration: Option<f64>,
    /// Rate of the breaker scenario [default: 1000; smoke: 50].
    #[arg(long)]
    pub breaker_rate: Option<f64>,
    /// Callers of the breaker scenario's refused calls, one call in flight
    /// each (closed loop).
    #[arg(long, default_value_t = 200)]
    pub breaker_callers: usize,
    /// Fake upstream latency of the long-calls scenario, ms [default: 1000; smoke: 100].
    #[arg(long)]
    pub inflight_latency_ms: Option<u64>,
    /// Rates of the long-calls scenario [default: 100,400,800; smoke: 20,60].
    #[arg(long, value_delimiter = ',')]
    pub inflight_rates: Option<Vec<f64>>,
    /// Rate of the cluster scenario's fixed-rate step [default: 1000; smoke: 50].
    #[arg(long)]
    pub cluster_rate: Option<f64>,
    /// Cold-start launches (each: new database, then a restart) [default: 5; smoke: 1].
    #[arg(long)]
    pub coldstart_runs: Option<usize>,
    /// Usage records of the GetUsage scenario's team this month [default: 1000000; smoke: 2000].
    #[arg(long)]
    pub usage_records: Option<u64>,
    /// GetUsage calls timed per query shape [default: 20; smoke: 3].
    #[arg(long)]
    pub usage_calls: Option<usize>,
    /// PostgreSQL admin URL; a database is created (and dropped) per server.
    #[arg(
        long,
        env = "AIO_TEST_POSTGRES_URL",
        default_value = "postgres://postgres@127.0.0.1:5432/postgres"
    )]
    pub postgres_url: String,
    /// Wait up to this many seconds for the 1-minute load average to fall below 0.5.
    #[arg(long, default_value_t = 0)]
    pub wait_idle: u64,
    /// Before each server's fixed-rate steps, wait up to this many seconds
    /// for a quiet host: a 2 s probe at 1,000 rps straight to the fake
    /// upstream must have a p99 of at most --quiet-p99-ms (the load average
    /// only sees this VM, not its neighbours; the probe sees both), and 400
    /// `fdatasync`s of 16 KiB rewrites in the scratch folder a p99 of at
    /// most --quiet-sync-p99-ms (the disk's neighbours come and go apart
    /// from the cores').
    #[arg(long, default_value_t = 0)]
    pub wait_quiet: u64,
    /// The direct p99 at 1,000 rps that counts as quiet, ms.
    #[arg(long, default_value_t = 0.5)]
    pub quiet_p99_ms: f64,
    /// The disk probe's `fdatasync` p99 that counts as quiet, ms.
    #[arg(long, default_value_t = 0.5)]
    pub quiet_sync_p99_ms: f64,
    /// Keep the scratch folder (configs, databases, server logs) after the run.
    #[arg(long)]
    pub keep_scratch: bool,
    /// Worker threads of the fake upstream.
    #[arg(long, default_value_t = 2)]
    pub upstream_threads: usize,
    /// Worker threads of the load generator's runtime (its gRPC and HTTP
    /// clients).
    #[arg(long, default_value_t = 2)]
    pub client_threads: usize,
    /// The leg between the orchestrator (and the direct baseline) and the
    /// fake upstream: `tls-1.1` (TLS, HTTP/1.1: a provider's default, ADR
    /// 0019), `tls-2` (TLS, HTTP/2 by ALPN), `1.1` (plaintext, pooled) or
    /// `2` (plaintext HTTP/2 with prior knowledge). TLS trusts a CA the
    /// bench makes at start.
    #[arg(long, default_value = "tls-1.1", value_parser = ["1.1", "2", "tls-1.1", "tls-2"])]
    pub upstream_http: String,
    /// Send each call with its own random `x-trace-id`, as callers that
    /// carry their own trace do. Without it the server makes a
    /// time-ordered trace ID for each call.
    #[arg(long)]
    pub caller_trace_ids: bool,
    /// A second server binary (B) to compare with `--server-bin` (A): the
    /// run becomes `--pairs` pairs of whole runs in the order A B B A A B
    /// …, each in its own folder under `--out`, then `ab.md` and `ab.json`
    /// with every figure's rounds, medians and B / A.
    #[arg(long)]
    pub compare_bin: Option<PathBuf>,
    /// Pairs of rounds of an A/B run (`--compare-bin`); an even number
    /// has each side go first as often as second.
    #[arg(long, default_value_t = 4)]
    pub pairs: usize,
    /// The folder name of an A/B run's round, set by the run itself: the
    /// round gets a scratch folder of its own, so no round opens another's
    /// database, and its results name no commit, since the bench's
    /// checkout need not be the source of the server it ran.
    #[arg(skip)]
    pub ab_round: Option<String>,
}
