//! One run from start to end: the scenarios in order, then `results.json`
//! and `results.md` written to `--out`, the JSON read back and validated.
//! A scenario that fails is noted and the run goes on; only a broken
//! results file fails the run.

use crate::{
    bench::Bench,
    breaker,
    cli::Args,
    cluster, coldstart, fixed, inflight,
    report::{self, Results},
    settings::Settings,
    sys, upstream, usage,
};
use anyhow::Context;
use std::{
    io::Write,
    time::{Duration, Instant},
};

/// The whole run; its results as read back from `results.json`.
pub async fn run(args: Args) -> anyhow::Result<Results> {
    if args.wait_idle > 0 {
        wait_for_idle(Duration::from_secs(args.wait_idle)).await;
    }
    let pid = std::process::id();
    let dir = std::env::temp_dir().join(match &args.ab_round {
        Some(round) => format!("aio-bench-{pid}-{round}"),
        None => format!("aio-bench-{pid}"),
    });
    std::fs::create_dir_all(&dir).context("creating the scratch folder")?;
    let settings = Settings::new(&args, dir.clone())?;
    let mut results = Results {
        schema_version: report::SCHEMA_VERSION,
        started_at: now(),
        smoke: args.smoke,
        git_commit: args.ab_round.is_none().then(git_commit).flatten(),
        server_bin: settings.server_bin.display().to_string(),
        settings: settings.to_json(&args),
        machine: Some(sys::machine()),
        ..Results::default()
    };
    let load = results
        .machine
        .as_ref()
        .map_or(0.0, |m| m.load_avg_at_start[0]);
    if load >= 0.5 {
        results.notes.push(format!(
            "the 1-minute load average was {load:.2} at start: other work shared the CPU"
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
    tracing::info!(server = %settings.server_bin.display(), dir = %dir.display(), "starting");

    let upstream = upstream::Upstream::start(args.upstream_threads)?;
    let mut bench = Bench::new(settings, upstream, results)?;
    let scenario = |name: &str| args.scenarios.iter().any(|s| s == name);
    if scenario("coldstart") {
        coldstart::run(&mut bench).await;
    }
    fixed::run(&mut bench).await;
    if scenario("breaker") {
        let outcome = breaker::run(&mut bench).await;
        noted(&mut bench, "breaker scenario", outcome);
    }
    if scenario("inflight") {
        let outcome = inflight::run(&mut bench).await;
        noted(&mut bench, "long-calls scenario", outcome);
    }
    if scenario("usage") {
        usage::run(&mut bench).await;
    }
    if scenario("cluster") {
        let outcome = cluster::run(&mut bench).await;
        noted(&mut bench, "cluster scenario", outcome);
    }

    let mut results = bench.results;
    fixed::add_baselines(&mut results);
    results.targets = report::targets::evaluate(&results);
    results.finished_at = now();
    results.load_avg_at_end = sys::load_avg();
    let checked = write(&args, &results)?;
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
    Ok(checked)
}

/// Notes a failed scenario in the results; the run goes on.
pub fn noted(bench: &mut Bench, what: &str, outcome: anyhow::Result<()>) {
    if let Err(e) = outcome {
        tracing::error!(error = %format!("{e:#}"), "{what} failed");
        bench.results.notes.push(format!("{what} failed: {e:#}"));
    }
}

fn now() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

/// Writes results.json and results.md, then reads the JSON back and checks
/// it: what was read back is returned.
fn write(args: &Args, results: &Results) -> anyhow::Result<Results> {
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
    Ok(checked)
}

/// `git rev-parse --short HEAD`, `-dirty` when tracked files changed.
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
