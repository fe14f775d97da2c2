//! Results: the machine-readable shape (`results.json`), its validation
//! when read back, and the Markdown tables (`results.md`).

use crate::sys::Machine;
use anyhow::Context;
use serde::{Deserialize, Serialize};
use std::{collections::BTreeMap, fmt::Write as _};

/// Version of the JSON layout; bump on incompatible changes.
pub const SCHEMA_VERSION: u32 = 2;

/// Latency quantiles, microseconds.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq)]
pub struct Quantiles {
    /// Median.
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 99th percentile.
    pub p99: f64,
    /// 99.9th percentile.
    pub p999: f64,
    /// Largest.
    pub max: f64,
    /// Mean.
    pub mean: f64,
}

impl Quantiles {
    /// Quantiles of a histogram of microseconds.
    pub fn of(h: &hdrhistogram::Histogram<u64>) -> Self {
        if h.is_empty() {
            return Self::default();
        }
        Self {
            p50: h.value_at_quantile(0.5) as f64,
            p90: h.value_at_quantile(0.9) as f64,
            p99: h.value_at_quantile(0.99) as f64,
            p999: h.value_at_quantile(0.999) as f64,
            max: h.max() as f64,
            mean: h.mean(),
        }
    }

    /// `self - base`, quantile by quantile (the added latency).
    pub fn minus(&self, base: &Quantiles) -> Quantiles {
        Quantiles {
            p50: self.p50 - base.p50,
            p90: self.p90 - base.p90,
            p99: self.p99 - base.p99,
            p999: self.p999 - base.p999,
            max: self.max - base.max,
            mean: self.mean - base.mean,
        }
    }
}

/// The server-side overhead histogram over one step, microseconds.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq)]
pub struct ServerOverhead {
    /// Observations (calls that reached the router or a fast path).
    pub count: f64,
    /// Exact mean (`_sum / _count`).
    pub mean: f64,
    /// Estimated from buckets.
    pub p50: f64,
    /// Estimated from buckets.
    pub p90: f64,
    /// Estimated from buckets.
    pub p99: f64,
    /// Estimated from buckets.
    pub p999: f64,
}

/// The metering ledger's writer over one step, as the server measures it
/// (`usage_ledger_*`), microseconds; `None` parts had no observation.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq)]
pub struct LedgerView {
    /// How long a reservation's caller waited (before the provider call):
    /// on the writer, queue included; on a SQLite file, its admission in
    /// memory.
    pub reserve_wait_us: Option<ServerOverhead>,
    /// How long a settlement's caller waited (before the response), the
    /// WAL sync included with SQLite's full durability.
    pub settle_wait_us: Option<ServerOverhead>,
    /// One group commit's transaction.
    pub commit_us: Option<ServerOverhead>,
    /// One WAL `fdatasync` after a commit.
    pub sync_us: Option<ServerOverhead>,
    /// Mean operations per group commit.
    pub ops_per_commit: Option<f64>,
}

/// One step of constant-rate load.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Step {
    /// `load`, `saturation`, `breaker` or `in flight`.
    pub kind: String,
    /// `Execute`, `ClassifySms`, or the body the direct baseline replays.
    pub rpc: String,
    /// `orchestrator` or `direct` (straight to the fake upstream).
    pub via: String,
    /// `sqlite`, `postgres`, `off`; `none` for direct.
    pub metering: String,
    /// Task called (Execute).
    pub task: String,
    /// Fake upstream latency, ms.
    pub upstream_latency_ms: u64,
    /// Requests per second offered.
    pub offered_rps: f64,
    /// Seconds of sending.
    pub duration_s: f64,
    /// Requests scheduled.
    pub sent: u64,
    /// Successful responses.
    pub ok: u64,
    /// Failed requests.
    pub errors: u64,
    /// Failures by code.
    pub errors_by_code: BTreeMap<String, u64>,
    /// Successful responses per second.
    pub achieved_rps: f64,
    /// Latency of successful requests from their scheduled send time, µs.
    pub latency_us: Quantiles,
    /// How late the load generator sent, µs.
    pub pacer_lag_us: Quantiles,
    /// Orchestrator minus direct, per quantile, same rate and upstream latency, µs.
    pub added_latency_us: Option<Quantiles>,
    /// The server's `orchestrator_overhead_seconds` over the step, µs.
    pub server_overhead_us: Option<ServerOverhead>,
    /// The metering ledger's writer over the step (metered servers).
    #[serde(default)]
    pub ledger: Option<LedgerView>,
    /// Mean provider call time as the server measured it
    /// (`llm_response_time_seconds`) over the step, µs: well above the fake
    /// upstream's latency, calls queue on the provider leg.
    pub provider_time_mean_us: Option<f64>,
    /// Connections the fake upstream accepted during the step.
    pub upstream_connections: Option<u64>,
    /// Server CPU seconds per 1,000 requests sent.
    pub server_cpu_s_per_1k: Option<f64>,
    /// Server CPU use over the step, in cores.
    pub server_cores_used: Option<f64>,
    /// Server resident memory after the step, MiB.
    pub server_rss_mb: Option<f64>,
    /// Server peak resident memory so far (VmHWM), MiB.
    pub server_peak_rss_mb: Option<f64>,
    /// PostgreSQL backends' CPU seconds per 1,000 requests (postgres runs).
    pub db_cpu_s_per_1k: Option<f64>,
    /// This process (load generator + fake upstream) CPU seconds per 1,000.
    pub bench_cpu_s_per_1k: f64,
    /// Saturation steps: whether it met the pass criteria.
    pub passed: Option<bool>,
}

/// One server process of the run.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Group {
    /// Metering mode.
    pub metering: String,
    /// Fake upstream latency, ms (or `breaker`, `cold start` purpose below).
    pub upstream_latency_ms: u64,
    /// What it was started for.
    pub purpose: String,
    /// Process start → health SERVING, ms.
    pub cold_start_ms: Option<f64>,
    /// Peak RSS over its life, MiB.
    pub peak_rss_mb: Option<f64>,
    /// Exited 0 after SIGTERM.
    pub clean_exit: Option<bool>,
    /// Why it did not run, if it did not.
    pub skipped: Option<String>,
}

/// Highest rate that met the criteria, per metering mode and repeat.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Saturation {
    /// Metering mode.
    pub metering: String,
    /// Which sweep of this server (0-based): `--saturation-repeats` sweeps
    /// run one after another, an idle wait between them.
    pub repeat: u32,
    /// RPC.
    pub rpc: String,
    /// Fake upstream latency, ms.
    pub upstream_latency_ms: u64,
    /// Highest offered rate that passed.
    pub highest_passing_rps: Option<f64>,
    /// Achieved rate at that step.
    pub achieved_rps: Option<f64>,
    /// First offered rate that failed.
    pub first_failing_rps: Option<f64>,
    /// Why it failed.
    pub failed_because: Option<String>,
}

/// Start-up times, ms.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ColdStart {
    /// New SQLite file (created and migrated during start-up).
    pub fresh_db_ms: Vec<f64>,
    /// Restart on an existing SQLite file.
    pub existing_db_ms: Vec<f64>,
}

/// The fast-fail path: breaker open on the primary → fallback.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Breaker {
    /// Calls sent before the breaker was seen OPEN.
    pub calls_to_open: u64,
    /// Calls the failing upstream received before it opened.
    pub broken_upstream_calls_to_open: u64,
    /// Calls the failing upstream received while measuring (should be 0).
    pub broken_upstream_calls_while_open: u64,
    /// Chain straight to the healthy provider.
    pub healthy: Option<Step>,
    /// Chain whose open primary is skipped before the healthy fallback.
    pub fast_fail: Option<Step>,
    /// `fast_fail - healthy`, per quantile, µs.
    pub added_latency_us: Option<Quantiles>,
}

/// Long calls (as LLM calls are): memory per call in flight.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct InFlight {
    /// Fake upstream latency, ms.
    pub upstream_latency_ms: u64,
    /// Execute at each rate, SQLite metering.
    pub steps: Vec<Step>,
    /// Calls in flight at each step: offered rps × success share × mean
    /// latency (Little's law in the steady state).
    pub calls_in_flight: Vec<f64>,
    /// Resident memory per call in flight, KiB: the RSS slope from the first
    /// to the last step.
    pub kib_per_call: Option<f64>,
}

/// One target of issue #6 and what this run reached.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Target {
    /// What is measured.
    pub name: String,
    /// The goal.
    pub goal: String,
    /// What this run measured.
    pub reached: String,
    /// Met, missed, or not judged (null): not measured, or inconclusive.
    pub met: Option<bool>,
}

/// Everything a run measured.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Results {
    /// [`SCHEMA_VERSION`].
    pub schema_version: u32,
    /// Start, RFC 3339 UTC.
    pub started_at: String,
    /// End, RFC 3339 UTC.
    pub finished_at: String,
    /// Short CI mode (numbers meaningless).
    pub smoke: bool,
    /// `git rev-parse --short HEAD`, when available.
    pub git_commit: Option<String>,
    /// The server binary measured.
    pub server_bin: String,
    /// The machine.
    pub machine: Option<Machine>,
    /// Load average when the run ended.
    pub load_avg_at_end: [f64; 3],
    /// The settings used.
    pub settings: serde_json::Value,
    /// Server processes.
    pub groups: Vec<Group>,
    /// Load steps (fixed rates and direct baseline).
    pub steps: Vec<Step>,
    /// Saturation sweeps (steps included).
    pub saturation: Vec<Saturation>,
    /// Saturation steps.
    pub saturation_steps: Vec<Step>,
    /// Start-up times.
    pub cold_start: ColdStart,
    /// Breaker scenario.
    pub breaker: Option<Breaker>,
    /// Long-calls scenario (added after schema 2's first runs; absent there).
    #[serde(default)]
    pub in_flight: Option<InFlight>,
    /// `--wait-quiet`: the probes before each server's fixed-rate steps.
    #[serde(default)]
    pub quiet_waits: Vec<QuietWait>,
    /// Paired rounds (direct and orchestrator back to back), the p99
    /// target's measurement.
    #[serde(default)]
    pub paired: Vec<Pair>,
    /// Targets of issue #6.
    pub targets: Vec<Target>,
    /// Remarks (skipped parts, warnings).
    pub notes: Vec<String>,
}

/// One wait for a quiet host (`--wait-quiet`).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct QuietWait {
    /// The server group whose fixed-rate steps waited.
    pub before: String,
    /// Each probe's p99 (direct, 1,000 rps, 2 s), µs.
    pub probe_p99_us: Vec<f64>,
    /// Each probe's disk sync p99 (400 `fdatasync`s of 16 KiB rewrites in
    /// the scratch folder), µs; empty in runs made before the disk probe.
    #[serde(default)]
    pub probe_sync_p99_us: Vec<f64>,
    /// Whether the last probe was quiet (else the wait timed out).
    pub quiet: bool,
    /// Seconds spent probing and waiting.
    pub waited_s: f64,
}

/// One paired round: a direct step and an orchestrator step back to back.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Pair {
    /// Metering mode of the server.
    pub metering: String,
    /// RPC of this round.
    pub rpc: String,
    /// Round on this server, 0-based.
    pub round: u32,
    /// The direct step ran first (rounds alternate).
    pub direct_first: bool,
    /// Straight to the fake upstream.
    pub direct: Step,
    /// Through the orchestrator; its `added_latency_us` is against `direct`.
    pub orchestrator: Step,
}

/// The paired rounds of one metering mode, summarized.
#[derive(Debug, Clone, PartialEq)]
pub struct PairedSummary {
    /// Rounds.
    pub rounds: usize,
    /// Each round's added p99, µs, in round order.
    pub added_p99_us: Vec<f64>,
    /// Median of the rounds' added p99, µs.
    pub median_added_p99_us: f64,
    /// Rounds whose added p99 was at most the given limit.
    pub rounds_within: usize,
    /// Median of the rounds' added p50, µs.
    pub median_added_p50_us: f64,
    /// Lowest and highest direct p99 of the rounds, µs (how noisy the host was).
    pub direct_p99_us: (f64, f64),
    /// Lowest and highest p99 of one WAL sync over the rounds, µs (how slow
    /// the disk was; the direct steps do not see it), when the server
    /// synced.
    pub wal_sync_p99_us: Option<(f64, f64)>,
}

/// The paired rounds of `metering`, with how many added at most `limit_us`
/// at p99; `None` without rounds.
pub fn paired_summary(r: &Results, metering: &str, limit_us: f64) -> Option<PairedSummary> {
    let pairs: Vec<&Pair> = r.paired.iter().filter(|p| p.metering == metering).collect();
    let added: Vec<Quantiles> = pairs
        .iter()
        .filter_map(|p| p.orchestrator.added_latency_us)
        .collect();
    let p99: Vec<f64> = added.iter().map(|a| a.p99).collect();
    let p50: Vec<f64> = added.iter().map(|a| a.p50).collect();
    let direct: Vec<f64> = pairs.iter().map(|p| p.direct.latency_us.p99).collect();
    let (_, median_p99, _) = summary(&p99)?;
    let (_, median_p50, _) = summary(&p50)?;
    let (direct_lo, _, direct_hi) = summary(&direct)?;
    let syncs: Vec<f64> = pairs
        .iter()
        .filter_map(|p| p.orchestrator.ledger?.sync_us)
        .map(|s| s.p99)
        .collect();
    Some(PairedSummary {
        wal_sync_p99_us: summary(&syncs).map(|(lo, _, hi)| (lo, hi)),
        rounds: p99.len(),
        rounds_within: p99.iter().filter(|v| **v <= limit_us).count(),
        added_p99_us: p99,
        median_added_p99_us: median_p99,
        median_added_p50_us: median_p50,
        direct_p99_us: (direct_lo, direct_hi),
    })
}

/// The limit the Markdown report counts paired rounds against (the p99
/// target's), µs.
pub const PAIRED_LIMIT_US: f64 = 1000.0;

impl Results {
    /// Every step of the run, whatever its scenario.
    pub fn all_steps(&self) -> impl Iterator<Item = &Step> {
        let breaker = self
            .breaker
            .iter()
            .flat_map(|b| b.healthy.iter().chain(b.fast_fail.iter()));
        self.steps
            .iter()
            .chain(self.saturation_steps.iter())
            .chain(breaker)
            .chain(self.in_flight.iter().flat_map(|f| f.steps.iter()))
            .chain(
                self.paired
                    .iter()
                    .flat_map(|p| [&p.direct, &p.orchestrator]),
            )
    }
}

/// Checks a results file read back: it parses, has the required parts, and
/// some requests succeeded. With `strict`, every step must have successes.
pub fn validate(json: &str, strict: bool) -> anyhow::Result<Results> {
    let results: Results = serde_json::from_str(json)?;
    anyhow::ensure!(
        results.schema_version == SCHEMA_VERSION,
        "schema_version {} (expected {SCHEMA_VERSION})",
        results.schema_version
    );
    anyhow::ensure!(results.machine.is_some(), "no machine facts");
    let steps: Vec<&Step> = results.all_steps().collect();
    anyhow::ensure!(!steps.is_empty(), "no load steps were run");
    let mut ok_total = 0;
    for s in &steps {
        anyhow::ensure!(s.sent > 0, "a {} {} step sent nothing", s.via, s.rpc);
        anyhow::ensure!(
            s.ok + s.errors >= s.sent,
            "a {} {} step lost track of requests",
            s.via,
            s.rpc
        );
        let q = &s.latency_us;
        anyhow::ensure!(
            [q.p50, q.p90, q.p99, q.p999, s.achieved_rps]
                .iter()
                .all(|v| v.is_finite() && *v >= 0.0),
            "non-finite numbers in a {} {} step",
            s.via,
            s.rpc
        );
        anyhow::ensure!(
            q.p50 <= q.p90 && q.p90 <= q.p99 && q.p99 <= q.p999,
            "quantiles out of order"
        );
        if strict {
            anyhow::ensure!(
                s.ok > 0,
                "every request of a {} {} step ({} metering, {} rps) failed: {:?}",
                s.via,
                s.rpc,
                s.metering,
                s.offered_rps,
                s.errors_by_code
            );
            // A metered server's answered calls waited on its ledger
            // writer: no ledger figures means the scrape no longer reads
            // its `usage_ledger_*` series.
            let metered = s.via == "orchestrator" && s.metering != "off";
            anyhow::ensure!(
                !metered || s.ledger.is_some_and(|l| l.settle_wait_us.is_some()),
                "a {} {} step ({} metering) has no ledger figures",
                s.via,
                s.rpc,
                s.metering
            );
        }
        ok_total += s.ok;
    }
    anyhow::ensure!(ok_total > 0, "every request failed");
    // A mode that saturated at all ran every sweep it was asked for.
    if let Some(repeats) = results.settings["saturation"]["repeats"].as_u64() {
        for s in &results.saturation {
            let sweeps = saturation_rates(&results, &s.metering).len() as u64;
            anyhow::ensure!(
                sweeps == repeats,
                "{} metering ran {sweeps} saturation sweeps, not {repeats}",
                s.metering
            );
        }
    }
    // Asked to wait for a quiet host: every server that ran fixed rates
    // was probed first, and every wait holds its probes.
    if results.settings["wait_quiet"].is_object() {
        let fixed_rate_servers = results
            .groups
            .iter()
            .filter(|g| g.purpose == "load" && g.skipped.is_none())
            .count();
        anyhow::ensure!(
            results.quiet_waits.len() >= fixed_rate_servers,
            "{} quiet waits for {fixed_rate_servers} servers",
            results.quiet_waits.len()
        );
        anyhow::ensure!(
            results
                .quiet_waits
                .iter()
                .all(|w| !w.probe_p99_us.is_empty() && w.probe_p99_us.iter().all(|p| p.is_finite())),
            "a quiet wait without a valid probe"
        );
        // Runs since the disk probe: each probe of the cores has its disk
        // probe.
        if results.settings["wait_quiet"]["sync_p99_ms"].is_number() {
            anyhow::ensure!(
                results.quiet_waits.iter().all(|w| {
                    w.probe_sync_p99_us.len() == w.probe_p99_us.len()
                        && w.probe_sync_p99_us.iter().all(|p| p.is_finite())
                }),
                "a quiet wait without a valid disk probe"
            );
        }
    }
    // Asked for paired rounds: every server that ran them ran them all,
    // each with its added latency.
    if let Some(rounds) = results.settings["paired"]["rounds"].as_u64() {
        // Every server started at the lowest upstream latency for fixed
        // rates ran its rounds, so a run that skipped them all fails too.
        let lowest = results.settings["upstream_latency_ms"]
            .as_array()
            .and_then(|l| l.iter().filter_map(serde_json::Value::as_u64).min());
        let mut modes: Vec<&str> = results
            .groups
            .iter()
            .filter(|g| {
                g.purpose == "load" && g.skipped.is_none() && Some(g.upstream_latency_ms) == lowest
            })
            .map(|g| g.metering.as_str())
            .chain(results.paired.iter().map(|p| p.metering.as_str()))
            .collect();
        modes.sort_unstable();
        modes.dedup();
        for mode in modes {
            let n = results.paired.iter().filter(|p| p.metering == mode).count() as u64;
            anyhow::ensure!(
                n == rounds,
                "{mode} metering ran {n} paired rounds, not {rounds}"
            );
        }
        // A round is two steps of one RPC at one rate, and its added
        // latency is the difference of exactly those two.
        for p in &results.paired {
            let (d, o) = (&p.direct, &p.orchestrator);
            anyhow::ensure!(
                d.via == "direct" && o.via == "orchestrator",
                "paired round {} of {} metering is not a direct and an orchestrator step",
                p.round,
                p.metering
            );
            anyhow::ensure!(
                d.rpc == p.rpc && o.rpc == p.rpc && d.offered_rps == o.offered_rps,
                "paired round {} of {} metering mixes RPCs or rates",
                p.round,
                p.metering
            );
            let added = o.added_latency_us.with_context(|| {
                format!(
                    "paired round {} of {} metering without its added latency",
                    p.round, p.metering
                )
            })?;
            anyhow::ensure!(
                added == o.latency_us.minus(&d.latency_us),
                "paired round {} of {} metering: added latency is not orchestrator minus direct",
                p.round,
                p.metering
            );
        }
    }
    Ok(results)
}

fn ms(us: f64) -> String {
    if us.abs() >= 100_000.0 {
        format!("{:.0}", us / 1000.0)
    } else {
        format!("{:.2}", us / 1000.0)
    }
}

fn opt(v: Option<f64>, digits: usize) -> String {
    v.map_or_else(|| "–".to_owned(), |v| format!("{v:.digits$}"))
}

/// The Markdown report.
pub fn markdown(r: &Results) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "# ai-orchestrator benchmark results\n");
    if r.smoke {
        let _ = writeln!(
            out,
            "**Smoke run** (CI): seconds-long steps at low rates; the numbers only show that it runs.\n"
        );
    }
    if let Some(m) = &r.machine {
        let _ = writeln!(
            out,
            "Machine: {} cores, {}, {:.0} MiB RAM, Linux {}. Load average at start {:.2} / {:.2} / {:.2}, at end {:.2} / {:.2} / {:.2}. \
             The fake upstream, the load generator and the server share these cores.",
            m.cores,
            m.cpu_model,
            m.mem_total_mb,
            m.kernel,
            m.load_avg_at_start[0],
            m.load_avg_at_start[1],
            m.load_avg_at_start[2],
            r.load_avg_at_end[0],
            r.load_avg_at_end[1],
            r.load_avg_at_end[2],
        );
    }
    let _ = writeln!(
        out,
        "\nServer: `{}`{}. Run {} → {}.\n",
        r.server_bin,
        r.git_commit
            .as_ref()
            .map(|c| format!(" at commit `{c}`"))
            .unwrap_or_default(),
        r.started_at,
        r.finished_at
    );

    if !r.targets.is_empty() {
        let _ = writeln!(out, "## Targets (issue #6)\n");
        let _ = writeln!(out, "| target | goal | reached | met |");
        let _ = writeln!(out, "|---|---|---|---|");
        for t in &r.targets {
            let met = match t.met {
                Some(true) => "yes",
                Some(false) => "**no**",
                None => "not judged",
            };
            let _ = writeln!(out, "| {} | {} | {} | {} |", t.name, t.goal, t.reached, met);
        }
        out.push('\n');
    }

    if !r.steps.is_empty() {
        let _ = writeln!(
            out,
            "## Fixed rates\n\nLatency in ms from the scheduled send time (open loop). \
             *added* = orchestrator minus direct at the same quantile, rate and upstream latency; \
             *server overhead* = the server's `orchestrator_overhead_seconds` (mean exact, p99 from buckets); \
             *provider time* = the server's mean `llm_response_time_seconds` (the provider leg as the server sees it); \
             *upstream conns* = connections the fake upstream accepted during the step. \
             CPU is the server process's, per 1,000 requests.\n"
        );
        let _ = writeln!(
            out,
            "| via | rpc | metering | upstream ms | offered rps | achieved rps | errors | p50 | p90 | p99 | p99.9 | added p50 | added p99 | server overhead mean / p99 | provider time mean | upstream conns | CPU s/1k | peak RSS MiB |"
        );
        let _ = writeln!(
            out,
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
        );
        for s in &r.steps {
            step_row(&mut out, s);
        }
        out.push('\n');
    }

    let metered: Vec<&Step> = r.steps.iter().filter(|s| s.ledger.is_some()).collect();
    if !metered.is_empty() {
        let _ = writeln!(
            out,
            "## Metering ledger\n\nThe ledger writer over each fixed-rate step, from the server's `usage_ledger_*` \
             histograms (ms, p50 / p99 from buckets): how long a call waited for its reservation (before the \
             provider call) and for its settlement (before the response, the WAL sync included with full \
             durability), one group commit's transaction, one WAL sync, and operations per commit.\n"
        );
        let _ = writeln!(
            out,
            "| rpc | metering | upstream ms | offered rps | reservation wait | settlement wait | commit | WAL sync | ops per commit |"
        );
        let _ = writeln!(out, "|---|---|---|---|---|---|---|---|---|");
        for s in metered {
            ledger_row(&mut out, s);
        }
        out.push('\n');
    }

    if !r.paired.is_empty() {
        paired(&mut out, r);
    }

    if !r.saturation.is_empty() {
        let _ = writeln!(
            out,
            "## Saturation\n\nRate raised step by step until achieved < 95 % of offered, errors > 1 % or p99 > 100 ms, \
             then bisected; each sweep repeated on the same server after it is idle again. \
             Targets read the median of the sweeps.\n"
        );
        let mut modes: Vec<&str> = Vec::new();
        for s in &r.saturation {
            if !modes.contains(&s.metering.as_str()) {
                modes.push(&s.metering);
            }
        }
        let _ = writeln!(
            out,
            "| metering | sweeps | highest passing rps, median | min | max |\n|---|---|---|---|---|"
        );
        for m in modes {
            let rates = saturation_rates(r, m);
            if let Some((lo, median, hi)) = summary(&rates) {
                let _ = writeln!(
                    out,
                    "| {m} | {} | **{median:.0}** | {lo:.0} | {hi:.0} |",
                    rates.len()
                );
            }
        }
        out.push('\n');
        let _ = writeln!(
            out,
            "| rpc | metering | sweep | upstream ms | highest passing rps | achieved rps | first failing rps | why it failed |"
        );
        let _ = writeln!(out, "|---|---|---|---|---|---|---|---|");
        for s in &r.saturation {
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {} | {} | {} | {} |",
                s.rpc,
                s.metering,
                s.repeat + 1,
                s.upstream_latency_ms,
                opt(s.highest_passing_rps, 0),
                opt(s.achieved_rps, 0),
                opt(s.first_failing_rps, 0),
                s.failed_because.as_deref().unwrap_or("–")
            );
        }
        let _ = writeln!(out, "\n<details><summary>Saturation steps</summary>\n");
        let _ = writeln!(
            out,
            "| via | rpc | metering | upstream ms | offered rps | achieved rps | errors | p50 | p90 | p99 | p99.9 | added p50 | added p99 | server overhead mean / p99 | provider time mean | upstream conns | CPU s/1k | peak RSS MiB |"
        );
        let _ = writeln!(
            out,
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
        );
        for s in &r.saturation_steps {
            step_row(&mut out, s);
        }
        let _ = writeln!(out, "\n</details>\n");
    }

    if let Some(f) = &r.in_flight {
        in_flight(&mut out, f);
    }

    if let Some(b) = &r.breaker {
        let _ = writeln!(
            out,
            "## Breaker fast-fail path\n\nPrimary answers 500 until its breaker opens ({} calls, {} reached the failing upstream); \
             then every call skips it (no network call) and the fallback serves. \
             The failing upstream received {} calls while measuring.\n",
            b.calls_to_open, b.broken_upstream_calls_to_open, b.broken_upstream_calls_while_open
        );
        let _ = writeln!(
            out,
            "| chain | offered rps | achieved rps | errors | p50 | p90 | p99 | p99.9 | server overhead mean / p99 |"
        );
        let _ = writeln!(out, "|---|---|---|---|---|---|---|---|---|");
        for (name, s) in [
            ("healthy provider only", &b.healthy),
            ("open primary → fallback", &b.fast_fail),
        ] {
            if let Some(s) = s {
                let q = &s.latency_us;
                let _ = writeln!(
                    out,
                    "| {name} | {:.0} | {:.0} | {} | {} | {} | {} | {} | {} |",
                    s.offered_rps,
                    s.achieved_rps,
                    s.errors,
                    ms(q.p50),
                    ms(q.p90),
                    ms(q.p99),
                    ms(q.p999),
                    overhead(s)
                );
            }
        }
        if let Some(a) = &b.added_latency_us {
            let _ = writeln!(
                out,
                "\nAdded by the fast-fail path: p50 {} ms, p99 {} ms.",
                ms(a.p50),
                ms(a.p99)
            );
        }
        out.push('\n');
    }

    let c = &r.cold_start;
    if !c.fresh_db_ms.is_empty() || !c.existing_db_ms.is_empty() {
        let _ = writeln!(
            out,
            "## Cold start\n\nProcess start → first SERVING answer of `grpc.health.v1.Health/Check`, SQLite metering.\n"
        );
        let _ = writeln!(out, "| database | runs | min ms | median ms | max ms |");
        let _ = writeln!(out, "|---|---|---|---|---|");
        for (name, v) in [
            ("new file (created + migrated)", &c.fresh_db_ms),
            ("existing file", &c.existing_db_ms),
        ] {
            if let Some((min, med, max)) = summary(v) {
                let _ = writeln!(
                    out,
                    "| {name} | {} | {min:.1} | {med:.1} | {max:.1} |",
                    v.len()
                );
            }
        }
        out.push('\n');
    }

    if !r.groups.is_empty() {
        let _ = writeln!(out, "## Server processes\n");
        let _ = writeln!(
            out,
            "| purpose | metering | upstream ms | cold start ms | peak RSS MiB | clean exit | skipped |"
        );
        let _ = writeln!(out, "|---|---|---|---|---|---|---|");
        for g in &r.groups {
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {} | {} | {} |",
                g.purpose,
                g.metering,
                g.upstream_latency_ms,
                opt(g.cold_start_ms, 1),
                opt(g.peak_rss_mb, 1),
                g.clean_exit.map_or("–", |c| if c { "yes" } else { "no" }),
                g.skipped.as_deref().unwrap_or("")
            );
        }
        out.push('\n');
    }
    if !r.quiet_waits.is_empty() {
        let _ = writeln!(
            out,
            "## Quiet waits\n\nBefore each server's fixed-rate steps (`--wait-quiet`): 2 s probes at 1,000 rps \
             straight to the fake upstream, each followed by 400 `fdatasync`s of 16 KiB rewrites in the scratch \
             folder, until both p99s were at most their thresholds.\n"
        );
        let _ = writeln!(
            out,
            "| before | probe p99s (ms) | disk sync p99s (ms) | quiet | waited s |"
        );
        let _ = writeln!(out, "|---|---|---|---|---|");
        let list = |v: &[f64]| {
            if v.is_empty() {
                return "–".to_owned();
            }
            let cells: Vec<String> = v.iter().map(|p| ms(*p)).collect();
            cells.join(", ")
        };
        for w in &r.quiet_waits {
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {:.0} |",
                w.before,
                list(&w.probe_p99_us),
                list(&w.probe_sync_p99_us),
                if w.quiet { "yes" } else { "no (gave up)" },
                w.waited_s
            );
        }
        out.push('\n');
    }
    if !r.notes.is_empty() {
        let _ = writeln!(out, "## Notes\n");
        for n in &r.notes {
            let _ = writeln!(out, "- {n}");
        }
    }
    out
}

/// The paired rounds: one summary row per metering mode, then every round.
fn paired(out: &mut String, r: &Results) {
    let _ = writeln!(
        out,
        "## Paired rounds\n\nEach round: a step straight to the fake upstream and a step through the orchestrator, \
         back to back at the same rate with the same body (which runs first alternates); *added* = orchestrator \
         minus direct of that round. The p99 target reads the median of the rounds' added p99 (ms). \
         *WAL sync p99*: one WAL `fdatasync` of the server's ledger over each round (full durability), \
         the disk's share of the host's noise, which the direct steps do not see.\n"
    );
    let _ = writeln!(
        out,
        "| metering | rounds | added p99 per round | median added p99 | rounds ≤ {} ms | median added p50 | direct p99 | WAL sync p99 |",
        ms(PAIRED_LIMIT_US)
    );
    let _ = writeln!(out, "|---|---|---|---|---|---|---|---|");
    let mut modes: Vec<&str> = r.paired.iter().map(|p| p.metering.as_str()).collect();
    modes.dedup();
    for mode in modes {
        let Some(s) = paired_summary(r, mode, PAIRED_LIMIT_US) else {
            continue;
        };
        let each: Vec<String> = s.added_p99_us.iter().map(|v| ms(*v)).collect();
        let _ = writeln!(
            out,
            "| {mode} | {} | {} | **{}** | {} of {} | {} | {}–{} | {} |",
            s.rounds,
            each.join(", "),
            ms(s.median_added_p99_us),
            s.rounds_within,
            s.rounds,
            ms(s.median_added_p50_us),
            ms(s.direct_p99_us.0),
            ms(s.direct_p99_us.1),
            s.wal_sync_p99_us.map_or_else(
                || "–".to_owned(),
                |(lo, hi)| format!("{}–{}", ms(lo), ms(hi))
            ),
        );
    }
    let _ = writeln!(
        out,
        "\n| metering | round | rpc | first | offered rps | direct p50 / p99 | orchestrator p50 / p99 | added p50 / p99 | errors | server overhead mean / p99 |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|---|---|---|---|---|");
    for p in &r.paired {
        let (d, o) = (&p.direct.latency_us, &p.orchestrator.latency_us);
        let added = p.orchestrator.added_latency_us.unwrap_or_default();
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {:.0} | {} / {} | {} / {} | {} / {} | {} | {} |",
            p.metering,
            p.round,
            p.rpc,
            if p.direct_first {
                "direct"
            } else {
                "orchestrator"
            },
            p.orchestrator.offered_rps,
            ms(d.p50),
            ms(d.p99),
            ms(o.p50),
            ms(o.p99),
            ms(added.p50),
            ms(added.p99),
            p.direct.errors + p.orchestrator.errors,
            overhead(&p.orchestrator),
        );
    }
    out.push('\n');
}

fn overhead(s: &Step) -> String {
    s.server_overhead_us.map_or_else(
        || "–".to_owned(),
        |o| format!("{} / {}", ms(o.mean), ms(o.p99)),
    )
}

fn in_flight(out: &mut String, f: &InFlight) {
    let _ = writeln!(
        out,
        "## Long calls: memory per call in flight\n\nThe fake upstream answers after {} ms (LLM calls take seconds); \
         `Execute` with SQLite metering. Calls in flight = offered rps × share answered × mean latency (Little's law in the steady state); \
         RSS is the server's after each step.\n",
        f.upstream_latency_ms
    );
    let _ = writeln!(
        out,
        "| offered rps | achieved rps | errors | p50 | p99 | calls in flight | RSS MiB | upstream conns | CPU s/1k |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|---|---|---|---|");
    for (s, n) in f.steps.iter().zip(&f.calls_in_flight) {
        let _ = writeln!(
            out,
            "| {:.0} | {:.0} | {} | {} | {} | {n:.0} | {} | {} | {} |",
            s.offered_rps,
            s.achieved_rps,
            s.errors,
            ms(s.latency_us.p50),
            ms(s.latency_us.p99),
            opt(s.server_rss_mb, 1),
            s.upstream_connections
                .map_or_else(|| "–".to_owned(), |c| c.to_string()),
            opt(s.server_cpu_s_per_1k, 3),
        );
    }
    if let Some(kib) = f.kib_per_call {
        let _ = writeln!(
            out,
            "\nResident memory per call in flight: **{kib:.1} KiB** (slope from the first to the last step)."
        );
    }
    out.push('\n');
}

fn step_row(out: &mut String, s: &Step) {
    let q = &s.latency_us;
    let (a50, a99) = s
        .added_latency_us
        .map_or(("–".to_owned(), "–".to_owned()), |a| {
            (ms(a.p50), ms(a.p99))
        });
    let rpc = if s.task.is_empty() || s.rpc != "Execute" {
        s.rpc.clone()
    } else {
        format!("{} ({})", s.rpc, s.task)
    };
    let _ = writeln!(
        out,
        "| {} | {} | {} | {} | {:.0} | {:.0} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
        s.via,
        rpc,
        s.metering,
        s.upstream_latency_ms,
        s.offered_rps,
        s.achieved_rps,
        s.errors,
        ms(q.p50),
        ms(q.p90),
        ms(q.p99),
        ms(q.p999),
        a50,
        a99,
        overhead(s),
        s.provider_time_mean_us.map_or_else(|| "–".to_owned(), ms),
        s.upstream_connections
            .map_or_else(|| "–".to_owned(), |c| c.to_string()),
        opt(s.server_cpu_s_per_1k, 3),
        opt(s.server_peak_rss_mb, 1),
    );
}

fn ledger_row(out: &mut String, s: &Step) {
    let Some(l) = s.ledger else { return };
    let pair = |h: Option<ServerOverhead>| {
        h.map_or_else(
            || "–".to_owned(),
            |h| format!("{} / {}", ms(h.p50), ms(h.p99)),
        )
    };
    let _ = writeln!(
        out,
        "| {} | {} | {} | {:.0} | {} | {} | {} | {} | {} |",
        s.rpc,
        s.metering,
        s.upstream_latency_ms,
        s.offered_rps,
        pair(l.reserve_wait_us),
        pair(l.settle_wait_us),
        pair(l.commit_us),
        pair(l.sync_us),
        opt(l.ops_per_commit, 1),
    );
}

/// Highest passing rate of every Execute sweep with `metering`, in run
/// order; a sweep where no step passed counts as 0 (it saturated below its
/// first rate).
pub fn saturation_rates(r: &Results, metering: &str) -> Vec<f64> {
    r.saturation
        .iter()
        .filter(|s| s.metering == metering && s.rpc == "Execute")
        .map(|s| s.highest_passing_rps.unwrap_or(0.0))
        .collect()
}

/// `(min, median, max)`; for an even count the median is the mean of the
/// two middle values, so two sweeps do not report the better one.
pub fn summary(v: &[f64]) -> Option<(f64, f64, f64)> {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let (first, last) = (*s.first()?, *s.last()?);
    let mid = s.len() / 2;
    let median = if s.len().is_multiple_of(2) {
        (s[mid - 1] + s[mid]) / 2.0
    } else {
        s[mid]
    };
    Some((first, median, last))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_takes_the_middle_of_an_even_count() {
        assert_eq!(summary(&[]), None);
        assert_eq!(summary(&[3.0, 1.0, 2.0]), Some((1.0, 2.0, 3.0)));
        assert_eq!(summary(&[4000.0, 3000.0]), Some((3000.0, 3500.0, 4000.0)));
    }

    #[test]
    fn quiet_waits_are_reported_with_every_probe() {
        let r = Results {
            quiet_waits: vec![
                QuietWait {
                    before: "sqlite metering, 0 ms upstream".into(),
                    probe_p99_us: vec![1250.0, 480.0],
                    probe_sync_p99_us: vec![2100.0, 310.0],
                    quiet: true,
                    waited_s: 14.2,
                },
                QuietWait {
                    before: "off metering, 0 ms upstream".into(),
                    probe_p99_us: vec![900.0],
                    probe_sync_p99_us: vec![400.0],
                    quiet: false,
                    waited_s: 2.1,
                },
            ],
            ..Results::default()
        };
        let md = markdown(&r);
        assert!(
            md.contains("| sqlite metering, 0 ms upstream | 1.25, 0.48 | 2.10, 0.31 | yes | 14 |"),
            "{md}"
        );
        assert!(md.contains("| 0.90 | 0.40 | no (gave up) | 2 |"), "{md}");
        let back: Results = serde_json::from_str(&serde_json::to_string(&r).unwrap()).unwrap();
        assert_eq!(back.quiet_waits, r.quiet_waits);

        // Asked for, but a server's steps ran without a probe.
        let mut asked = Results {
            schema_version: SCHEMA_VERSION,
            machine: Some(crate::sys::machine()),
            settings: serde_json::json!({"wait_quiet": {"max_wait_s": 1, "p99_ms": 0.5, "sync_p99_ms": 0.5}}),
            steps: vec![Step {
                sent: 10,
                ok: 10,
                ..Step::default()
            }],
            groups: vec![
                Group {
                    purpose: "load".into(),
                    ..Group::default()
                };
                3
            ],
            quiet_waits: r.quiet_waits.clone(),
            ..Results::default()
        };
        let err = validate(&serde_json::to_string(&asked).unwrap(), true).unwrap_err();
        assert!(
            err.to_string().contains("2 quiet waits for 3 servers"),
            "{err}"
        );
        asked.groups.pop();
        validate(&serde_json::to_string(&asked).unwrap(), true).unwrap();
        // A probe of the cores without its disk probe.
        asked.quiet_waits[0].probe_sync_p99_us.pop();
        let err = validate(&serde_json::to_string(&asked).unwrap(), true).unwrap_err();
        assert!(err.to_string().contains("disk probe"), "{err}");
        // Runs from before the disk probe have none and still validate.
        asked.settings = serde_json::json!({"wait_quiet": {"max_wait_s": 1, "p99_ms": 0.5}});
        for w in &mut asked.quiet_waits {
            w.probe_sync_p99_us.clear();
        }
        validate(&serde_json::to_string(&asked).unwrap(), true).unwrap();
        let md = markdown(&asked);
        assert!(md.contains("| 1.25, 0.48 | – | yes |"), "{md}");
        asked.quiet_waits[1].probe_p99_us.clear();
        assert!(validate(&serde_json::to_string(&asked).unwrap(), true).is_err());
    }

    #[test]
    fn paired_rounds_are_summarized_per_metering_mode_and_validated() {
        let pair = |metering: &str, round: u32, direct_p99: f64, orchestrator_p99: f64| {
            let q = |p50: f64, p99: f64| Quantiles {
                p50,
                p90: p99,
                p99,
                p999: p99,
                ..Quantiles::default()
            };
            let step = |via: &str, latency_us: Quantiles| Step {
                kind: "paired".into(),
                rpc: "Execute".into(),
                via: via.into(),
                metering: metering.into(),
                offered_rps: 1000.0,
                sent: 5000,
                ok: 5000,
                latency_us,
                ..Step::default()
            };
            let direct = step("direct", q(200.0, direct_p99));
            let sync = |p99: f64| ServerOverhead {
                p99,
                ..ServerOverhead::default()
            };
            let mut orchestrator = step("orchestrator", q(500.0, orchestrator_p99));
            orchestrator.added_latency_us = Some(orchestrator.latency_us.minus(&direct.latency_us));
            if metering == "sqlite" {
                orchestrator.ledger = Some(LedgerView {
                    sync_us: Some(sync(200.0 + f64::from(round) * 100.0)),
                    ..LedgerView::default()
                });
            }
            Pair {
                metering: metering.into(),
                rpc: "Execute".into(),
                round,
                direct_first: round.is_multiple_of(2),
                direct,
                orchestrator,
            }
        };
        let mut r = Results {
            schema_version: SCHEMA_VERSION,
            machine: Some(crate::sys::machine()),
            settings: serde_json::json!({
                "paired": {"rounds": 3, "rate": 1000.0, "duration_s": 5.0},
                "upstream_latency_ms": [0, 50],
            }),
            groups: ["sqlite", "off", "postgres"]
                .into_iter()
                .flat_map(|metering| {
                    [0, 50].map(|upstream_latency_ms| Group {
                        purpose: "load".into(),
                        metering: metering.into(),
                        upstream_latency_ms,
                        // PostgreSQL was not there: no rounds expected.
                        skipped: (metering == "postgres").then(|| "no database".into()),
                        ..Group::default()
                    })
                })
                .collect(),
            paired: vec![
                pair("sqlite", 0, 400.0, 1300.0),
                pair("sqlite", 1, 2000.0, 2800.0),
                pair("sqlite", 2, 500.0, 2100.0),
                pair("off", 0, 400.0, 700.0),
                pair("off", 1, 400.0, 800.0),
                pair("off", 2, 300.0, 600.0),
            ],
            ..Results::default()
        };
        let s = paired_summary(&r, "sqlite", 1000.0).unwrap();
        assert_eq!(s.added_p99_us, vec![900.0, 800.0, 1600.0]);
        assert_eq!(s.median_added_p99_us, 900.0);
        assert_eq!(s.rounds_within, 2);
        assert_eq!(s.median_added_p50_us, 300.0);
        assert_eq!(s.direct_p99_us, (400.0, 2000.0));
        assert_eq!(s.wal_sync_p99_us, Some((200.0, 400.0)));
        assert_eq!(
            paired_summary(&r, "off", 1000.0).unwrap().wal_sync_p99_us,
            None
        );
        assert_eq!(paired_summary(&r, "postgres", 1000.0), None);

        let json = serde_json::to_string(&r).unwrap();
        // Not strict: these steps carry no ledger figures.
        let back = validate(&json, false).unwrap();
        let md = markdown(&back);
        assert!(
            md.contains("| sqlite | 3 | 0.90, 0.80, 1.60 | **0.90** | 2 of 3 | 0.30 | 0.40–2.00 | 0.20–0.40 |"),
            "{md}"
        );
        assert!(
            md.contains("| off | 1 | Execute | orchestrator | 1000 | 0.20 / 0.40 | 0.50 / 0.80 | 0.30 / 0.40 | 0 | – |"),
            "{md}"
        );

        // A mode that stopped early, or a round without its difference.
        r.paired.pop();
        let err = validate(&serde_json::to_string(&r).unwrap(), false).unwrap_err();
        assert!(
            err.to_string()
                .contains("off metering ran 2 paired rounds, not 3"),
            "{err}"
        );
        // A server that ran fixed rates but no rounds at all.
        let all = std::mem::take(&mut r.paired);
        r.paired = all
            .iter()
            .filter(|p| p.metering == "sqlite")
            .cloned()
            .collect();
        let err = validate(&serde_json::to_string(&r).unwrap(), false).unwrap_err();
        assert!(
            err.to_string()
                .contains("off metering ran 0 paired rounds, not 3"),
            "{err}"
        );
        r.paired = all;
        r.paired.push(pair("off", 2, 300.0, 600.0));
        validate(&serde_json::to_string(&r).unwrap(), false).unwrap();
        // Added latency against another step than the round's own.
        let honest = r.paired[0].orchestrator.added_latency_us;
        r.paired[0].orchestrator.added_latency_us = r.paired[1].orchestrator.added_latency_us;
        let err = validate(&serde_json::to_string(&r).unwrap(), false).unwrap_err();
        assert!(
            err.to_string().contains("not orchestrator minus direct"),
            "{err}"
        );
        r.paired[0].orchestrator.added_latency_us = honest;
        r.paired[0].direct.rpc = "ClassifySms".into();
        let err = validate(&serde_json::to_string(&r).unwrap(), false).unwrap_err();
        assert!(err.to_string().contains("mixes RPCs or rates"), "{err}");
        r.paired[0].direct.rpc = "Execute".into();
        r.paired[0].orchestrator.added_latency_us = None;
        let err = validate(&serde_json::to_string(&r).unwrap(), false).unwrap_err();
        assert!(
            err.to_string().contains("without its added latency"),
            "{err}"
        );
    }

    #[test]
    fn validation_rejects_runs_where_everything_failed() {
        let mut r = Results {
            schema_version: SCHEMA_VERSION,
            machine: Some(crate::sys::machine()),
            ..Results::default()
        };
        assert!(
            validate(&serde_json::to_string(&r).unwrap(), false).is_err(),
            "no steps"
        );
        r.steps.push(Step {
            sent: 10,
            errors: 10,
            ..Step::default()
        });
        assert!(
            validate(&serde_json::to_string(&r).unwrap(), false).is_err(),
            "all failed"
        );
        r.steps[0].ok = 5;
        r.steps[0].errors = 5;
        let back = validate(&serde_json::to_string(&r).unwrap(), true).unwrap();
        assert_eq!(back.steps.len(), 1);
        assert!(markdown(&back).contains("Fixed rates"));

        // A metered orchestrator step must carry what its ledger did.
        let mut metered = r.clone();
        metered.steps[0].via = "orchestrator".into();
        metered.steps[0].metering = "sqlite".into();
        let err = validate(&serde_json::to_string(&metered).unwrap(), true).unwrap_err();
        assert!(err.to_string().contains("no ledger figures"), "{err}");
        let wait = ServerOverhead {
            count: 5.0,
            mean: 400.0,
            p50: 300.0,
            p99: 1200.0,
            ..ServerOverhead::default()
        };
        metered.steps[0].ledger = Some(LedgerView {
            reserve_wait_us: Some(wait),
            settle_wait_us: Some(wait),
            ops_per_commit: Some(1.0),
            ..LedgerView::default()
        });
        let back = validate(&serde_json::to_string(&metered).unwrap(), true).unwrap();
        assert!(
            markdown(&back)
                .contains("| sqlite | 0 | 0 | 0.30 / 1.20 | 0.30 / 1.20 | – | – | 1.0 |"),
            "{}",
            markdown(&back)
        );
        metered.steps[0].metering = "off".into();
        metered.steps[0].ledger = None;
        validate(&serde_json::to_string(&metered).unwrap(), true).unwrap();
        assert!(validate("{\"schema_version\": 1}", false).is_err());

        // Two sweeps asked for, one recorded: the repeat did not run.
        r.settings = serde_json::json!({"saturation": {"repeats": 2}});
        let sweep = |repeat| Saturation {
            metering: "sqlite".into(),
            repeat,
            rpc: "Execute".into(),
            highest_passing_rps: Some(3000.0),
            ..Saturation::default()
        };
        r.saturation = vec![sweep(0)];
        let err = validate(&serde_json::to_string(&r).unwrap(), true).unwrap_err();
        assert!(
            err.to_string().contains("1 saturation sweeps, not 2"),
            "{err}"
        );
        r.saturation.push(sweep(1));
        let back = validate(&serde_json::to_string(&r).unwrap(), true).unwrap();
        assert!(markdown(&back).contains("| sqlite | 2 | **3000** |"));
    }
}
