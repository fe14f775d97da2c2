//! `bench`: the load benchmark of issue #6 (see docs/benchmarks.md).
//!
//! In one run it starts a fake OpenAI-format upstream (in this process, on
//! its own threads) and the orchestrator binary as a child process, then
//! drives open-loop gRPC load at fixed rates and up to saturation, the same
//! rates straight at the fake upstream (the baseline the added latency is
//! measured against), a breaker fast-fail scenario, long calls (memory per
//! call in flight) and cold starts, with
//! SQLite, PostgreSQL and no metering. It writes `results.json` and
//! `results.md` to `--out`, reads the JSON back to validate it, and never
//! fails on timing: only on a broken run or malformed results.
//!
//! `--smoke` is the CI mode: seconds long, low rates, any build.

mod breaker;
mod disk;
mod inflight;
mod loadgen;
mod paired;

mod prom;
mod report;
mod run;
mod server;
mod sys;
mod target;
mod targets;
mod upstream;

use anyhow::Context;
use clap::Parser;
use report::Results;
use run::{Bench, Settings};
use server::Metering;
use std::{
    io::Write,
    path::PathBuf,
    process::ExitCode,
    time::{Duration, Instant},
};
use target::Rpc;

/// Command line. Unset numbers take the full-run or the smoke default.
#[derive(Debug, Parser)]
#[command(
    name = "bench",
    about = "Load benchmark of ai-orchestrator (docs/benchmarks.md)"
)]
struct Args {
    /// CI mode: a few seconds at low rates; checks that it runs, not how fast.
    #[arg(long)]
    smoke: bool,
    /// Orchestrator binary [default: `ai-orchestrator` next to this binary].
    #[arg(long)]
    server_bin: Option<PathBuf>,
    /// Folder for results.json and results.md.
    #[arg(long, default_value = "bench-results")]
    out: PathBuf,
    /// Scenarios: load, direct, paired, saturation, breaker, inflight, coldstart.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "load,direct,paired,saturation,breaker,inflight,coldstart"
    )]
    scenarios: Vec<String>,
    /// RPCs at fixed rates: execute, classify.
    #[arg(long, value_delimiter = ',', default_value = "execute,classify")]
    rpcs: Vec<String>,
    /// Metering modes: sqlite (fsync per commit, the default durability),
    /// sqlite-normal (`sqlite_synchronous = "normal"`), postgres, off.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "sqlite,sqlite-normal,postgres,off"
    )]
    metering: Vec<String>,
    /// Fixed rates, requests/s [default: 200,1000,3000; smoke: 50].
    #[arg(long, value_delimiter = ',')]
    rates: Option<Vec<f64>>,
    /// Fake upstream latencies, ms [default: 0,50; smoke: 0].
    #[arg(long, value_delimiter = ',')]
    upstream_latency_ms: Option<Vec<u64>>,
    /// Seconds of load per fixed-rate step [default: 10; smoke: 0.5].
    #[arg(long)]
    duration: Option<f64>,
    /// Seconds of unmeasured load per RPC on each new server [default: 2; smoke: 0.3].
    #[arg(long)]
    warmup: Option<f64>,
    /// HTTP/2 connections to the server.
    #[arg(long, default_value_t = 4)]
    connections: usize,
    /// Requests in flight at most; more are dropped and counted as errors.
    #[arg(long, default_value_t = 20_000)]
    max_inflight: usize,
    /// First saturation rate [default: 1000; smoke: 50].
    #[arg(long)]
    saturation_start: Option<f64>,
    /// Rate multiplier between saturation steps.
    #[arg(long, default_value_t = 1.25)]
    saturation_factor: f64,
    /// Most saturation steps [default: 25; smoke: 2].
    #[arg(long)]
    saturation_steps: Option<usize>,
    /// Bisection steps between the last passing and first failing rate [default: 3; smoke: 0].
    #[arg(long)]
    saturation_refine: Option<usize>,
    /// Saturation sweeps per metering mode; targets read their median [default: 3; smoke: 2].
    #[arg(long)]
    saturation_repeats: Option<usize>,
    /// Seconds per saturation step [default: 5; smoke: 0.5].
    #[arg(long)]
    saturation_duration: Option<f64>,
    /// Paired rounds per server (a direct and an orchestrator step back to
    /// back; the p99 target reads their median) [default: 6; smoke: 2].
    #[arg(long)]
    paired_rounds: Option<usize>,
    /// Offered rate of the paired rounds [default: 1000; smoke: 50].
    #[arg(long)]
    paired_rate: Option<f64>,
    /// Seconds per step of a paired round [default: 5; smoke: 0.5].
    #[arg(long)]
    paired_duration: Option<f64>,
    /// Rate of the breaker scenario [default: 1000; smoke: 50].
    #[arg(long)]
    breaker_rate: Option<f64>,
    /// Fake upstream latency of the long-calls scenario, ms [default: 1000; smoke: 100].
    #[arg(long)]
    inflight_latency_ms: Option<u64>,
    /// Rates of the long-calls scenario [default: 100,400,800; smoke: 20,60].
    #[arg(long, value_delimiter = ',')]
    inflight_rates: Option<Vec<f64>>,
    /// Cold-start launches (each: new database, then a restart) [default: 5; smoke: 1].
    #[arg(long)]
    coldstart_runs: Option<usize>,
    /// PostgreSQL admin URL; a database is created (and dropped) per server.
    #[arg(
        long,
        env = "AIO_TEST_POSTGRES_URL",
        default_value = "postgres://postgres@127.0.0.1:5432/postgres"
    )]
    postgres_url: String,
    /// Wait up to this many seconds for the 1-minute load average to fall below 0.5.
    #[arg(long, default_value_t = 0)]
    wait_idle: u64,
    /// Before each server's fixed-rate steps, wait up to this many seconds
    /// for a quiet host: a 2 s probe at 1,000 rps straight to the fake
    /// upstream must have a p99 of at most --quiet-p99-ms (the load average
    /// only sees this VM, not its neighbours; the probe sees both), and 400
    /// `fdatasync`s of 16 KiB rewrites in the scratch folder a p99 of at
    /// most --quiet-sync-p99-ms (the disk's neighbours come and go apart
    /// from the cores').
    #[arg(long, default_value_t = 0)]
    wait_quiet: u64,
    /// The direct p99 at 1,000 rps that counts as quiet, ms.
    #[arg(long, default_value_t = 0.5)]
    quiet_p99_ms: f64,
    /// The disk probe's `fdatasync` p99 that counts as quiet, ms.
    #[arg(long, default_value_t = 0.5)]
    quiet_sync_p99_ms: f64,
    /// Keep the scratch folder (configs, databases, server logs) after the run.
    #[arg(long)]
    keep_scratch: bool,
    /// Worker threads of the fake upstream.
    #[arg(long, default_value_t = 2)]
    upstream_threads: usize,
    /// Worker threads of the load generator's runtime (its gRPC and HTTP
    /// clients).
    #[arg(long, default_value_t = 2)]
    client_threads: usize,
    /// HTTP version between the orchestrator (and the direct baseline) and
    /// the fake upstream: `1.1` (pooled, a connection per concurrent call)
    /// or `2` (plaintext HTTP/2 with prior knowledge, multiplexed).
    #[arg(long, default_value = "2", value_parser = ["1.1", "2"])]
    upstream_http: String,
}

fn main() -> ExitCode {
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(args.client_threads.max(1))
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn pick<T>(value: Option<T>, smoke: bool, smoke_default: T, full_default: T) -> T {
    value.unwrap_or(if smoke { smoke_default } else { full_default })
}

fn settings(args: &Args, dir: PathBuf) -> anyhow::Result<Settings> {
    let s = args.smoke;
    let server_bin = match &args.server_bin {
        Some(p) => p.clone(),
        None => std::env::current_exe()?.with_file_name("ai-orchestrator"),
    };
    anyhow::ensure!(
        server_bin.is_file(),
        "no server binary at {} (build it: cargo build --release --workspace --bins, or pass --server-bin)",
        server_bin.display()
    );
    let metering = args
        .metering
        .iter()
        .map(|m| Metering::parse(m).with_context(|| format!("--metering: unknown mode `{m}`")))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let rpcs = args
        .rpcs
        .iter()
        .map(|r| match r.as_str() {
            "execute" => Ok(Rpc::Execute),
            "classify" | "classify-sms" => Ok(Rpc::ClassifySms),
            other => Err(anyhow::anyhow!("--rpcs: unknown rpc `{other}`")),
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let secs = |v: f64| Duration::from_secs_f64(v.max(0.05));
    let rates = pick(
        args.rates.clone(),
        s,
        vec![50.0],
        vec![200.0, 1000.0, 3000.0],
    );
    let inflight_rates = pick(
        args.inflight_rates.clone(),
        s,
        vec![20.0, 60.0],
        vec![100.0, 400.0, 800.0],
    );
    for (flag, rates) in [("--rates", &rates), ("--inflight-rates", &inflight_rates)] {
        anyhow::ensure!(rates.iter().all(|r| *r > 0.0), "{flag} must be positive");
    }
    Ok(Settings {
        server_bin,
        rates,
        duration: secs(pick(args.duration, s, 0.5, 10.0)),
        warmup: secs(pick(args.warmup, s, 0.3, 2.0)),
        latencies: pick(args.upstream_latency_ms.clone(), s, vec![0], vec![0, 50]),
        metering,
        rpcs: if args.scenarios.iter().any(|x| x == "load") {
            rpcs
        } else {
            Vec::new()
        },
        direct: args.scenarios.iter().any(|x| x == "direct"),
        saturation: args.scenarios.iter().any(|x| x == "saturation"),
        upstream_http2: args.upstream_http == "2",
        connections: args.connections.max(1),
        max_inflight: args.max_inflight.max(1),
        timeout: Duration::from_secs(10),
        sat_start: pick(args.saturation_start, s, 50.0, 1000.0),
        sat_factor: args.saturation_factor.max(1.01),
        sat_max_steps: pick(args.saturation_steps, s, 2, 25),
        sat_refine: pick(args.saturation_refine, s, 0, 3),
        // Smoke runs two so CI goes through the repeat and its idle wait.
        sat_repeats: pick(args.saturation_repeats, s, 2, 3).max(1),
        sat_duration: secs(pick(args.saturation_duration, s, 0.5, 5.0)),
        inflight_latency_ms: pick(args.inflight_latency_ms, s, 100, 1000),
        inflight_rates,
        postgres_url: args.postgres_url.clone(),
        paired: args
            .scenarios
            .iter()
            .any(|x| x == "paired")
            .then(|| paired::Rounds {
                rounds: pick(args.paired_rounds, s, 2, 6).max(1),
                rate: pick(args.paired_rate, s, 50.0, 1000.0).max(1.0),
                duration: secs(pick(args.paired_duration, s, 0.5, 5.0)),
            }),
        quiet: (args.wait_quiet > 0).then(|| run::Quiet {
            max_wait: Duration::from_secs(args.wait_quiet),
            p99_us: args.quiet_p99_ms * 1000.0,
            sync_p99_us: args.quiet_sync_p99_ms * 1000.0,
        }),
        dir,
    })
}

fn git_commit() -> Option<String> {
    let out = std::process::Command::new("git")
        .args(["rev-parse", "--short", "HEAD"])
        .output()
        .ok()?;
    let commit = String::from_utf8(out.stdout).ok()?.trim().to_owned();
    if commit.is_empty() {
        return None;
    }
    let dirty = std::process::Command::new("git")
        .args(["status", "--porcelain", "--untracked-files=no"])
        .output()
        .ok()
        .is_some_and(|o| !o.stdout.is_empty());
    Some(if dirty {
        format!("{commit}-dirty")
    } else {
        commit
    })
}

async fn wait_for_idle(max: Duration) {
    let until = Instant::now() + max;
    while sys::load_avg()[0] >= 0.5 && Instant::now() < until {
        tracing::info!(
            load = sys::load_avg()[0],
            "waiting for the machine to be idle"
        );
        tokio::time::sleep(Duration::from_secs(10)).await;
    }
}

async fn run(args: Args) -> anyhow::Result<()> {
    if args.wait_idle > 0 {
        wait_for_idle(Duration::from_secs(args.wait_idle)).await;
    }
    let dir = std::env::temp_dir().join(format!("aio-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).context("creating the scratch folder")?;
    let settings = settings(&args, dir.clone())?;
    let machine = sys::machine();
    let mut results = Results {
        schema_version: report::SCHEMA_VERSION,
        started_at: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        smoke: args.smoke,
        git_commit: git_commit(),
        server_bin: settings.server_bin.display().to_string(),
        settings: serde_json::json!({
            "rates": settings.rates,
            "duration_s": settings.duration.as_secs_f64(),
            "warmup_s": settings.warmup.as_secs_f64(),
            "upstream_latency_ms": settings.latencies,
            "metering": settings.metering.iter().map(|m| m.name()).collect::<Vec<_>>(),
            "scenarios": args.scenarios,
            "connections": settings.connections,
            "max_inflight": settings.max_inflight,
            "request_timeout_s": settings.timeout.as_secs_f64(),
            "saturation": {"start_rps": settings.sat_start, "factor": settings.sat_factor,
                "max_steps": settings.sat_max_steps, "refine_steps": settings.sat_refine, "repeats": settings.sat_repeats, "duration_s": settings.sat_duration.as_secs_f64(),
                "criteria": "achieved >= 95% of offered, errors <= 1%, p99 <= 100 ms"},
            "upstream_threads": args.upstream_threads,
            "client_threads": args.client_threads,
            "upstream_http": args.upstream_http,
            "in_flight": {"upstream_latency_ms": settings.inflight_latency_ms, "rates": settings.inflight_rates},
            "paired": settings.paired.map(|p| serde_json::json!({"rounds": p.rounds, "rate": p.rate, "duration_s": p.duration.as_secs_f64()})),
            "wait_quiet": settings.quiet.map(|q| serde_json::json!({"max_wait_s": q.max_wait.as_secs(), "p99_ms": q.p99_us / 1000.0, "sync_p99_ms": q.sync_p99_us / 1000.0})),
        }),
        ..Results::default()
    };
    if machine.load_avg_at_start[0] >= 0.5 {
        results.notes.push(format!(
            "the 1-minute load average was {:.2} at start: other work shared the CPU",
            machine.load_avg_at_start[0]
        ));
    }
    // Only a path under a `debug` profile folder is known to be a debug
    // build: a release binary copied elsewhere for an A/B run is not one.
    let debug_build = settings
        .server_bin
        .components()
        .any(|c| c.as_os_str() == "debug");
    if !args.smoke && debug_build {
        results.notes.push(
            "the server binary is not a release build: numbers are not representative".into(),
        );
    }
    results.machine = Some(machine);
    tracing::info!(server = %settings.server_bin.display(), dir = %dir.display(), "starting");

    let upstream = upstream::Upstream::start(args.upstream_threads)?;
    let mut bench = Bench::new(settings.clone(), upstream, results)?;
    let scenario = |name: &str| args.scenarios.iter().any(|s| s == name);
    if scenario("coldstart") {
        bench
            .cold_starts(pick(args.coldstart_runs, args.smoke, 1, 5))
            .await;
    }
    let lowest = settings.latencies.iter().copied().min();
    if !settings.rpcs.is_empty()
        || settings.direct
        || settings.saturation
        || settings.paired.is_some()
    {
        for &metering in &settings.metering {
            for &latency in &settings.latencies {
                if let Err(e) = bench
                    .group(metering, latency, Some(latency) == lowest)
                    .await
                {
                    tracing::error!(error = %format!("{e:#}"), "run failed");
                    bench.results.notes.push(format!(
                        "{} metering at {latency} ms failed: {e:#}",
                        metering.name()
                    ));
                }
            }
        }
    }
    if scenario("breaker") {
        let rate = pick(args.breaker_rate, args.smoke, 50.0, 1000.0);
        if let Err(e) = breaker::run(&mut bench, rate).await {
            tracing::error!(error = %format!("{e:#}"), "breaker scenario failed");
            bench
                .results
                .notes
                .push(format!("breaker scenario failed: {e:#}"));
        }
    }

    if scenario("inflight")
        && let Err(e) = inflight::run(
            &mut bench,
            settings.inflight_latency_ms,
            &settings.inflight_rates,
        )
        .await
    {
        tracing::error!(error = %format!("{e:#}"), "long-calls scenario failed");
        bench
            .results
            .notes
            .push(format!("long-calls scenario failed: {e:#}"));
    }

    let mut results = bench.results;
    run::add_baselines(&mut results);
    results.targets = targets::evaluate(&results);
    results.finished_at = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    results.load_avg_at_end = sys::load_avg();
    write(&args, &results)?;
    let keep = args.keep_scratch
        || results
            .groups
            .iter()
            .any(|g| g.skipped.is_some() || g.clean_exit == Some(false));
    if keep {
        tracing::warn!(dir = %dir.display(), "kept the scratch folder (server logs) for inspection");
    } else {
        let _ = std::fs::remove_dir_all(&dir);
    }
    Ok(())
}

/// Writes results.json and results.md, then reads the JSON back and checks it.
fn write(args: &Args, results: &Results) -> anyhow::Result<()> {
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    let json_path = args.out.join("results.json");
    std::fs::write(&json_path, serde_json::to_string_pretty(results)?)?;
    let back = std::fs::read_to_string(&json_path)?;
    let checked = report::validate(&back, args.smoke)
        .with_context(|| format!("{} is not a valid run", json_path.display()))?;
    let markdown = report::markdown(&checked);
    std::fs::write(args.out.join("results.md"), &markdown)?;
    let _ = std::io::stdout().lock().write_all(markdown.as_bytes());
    tracing::info!(out = %args.out.display(), "results written");
    Ok(())
}
