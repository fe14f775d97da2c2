//! The targets of issue #6, checked against a run's results. Reported, never
//! asserted: the benchmark measures, it does not pass or fail on timing.

use super::{
    Results, Target, edge_cpu_ratio, edge_pairs, paired_summary, saturation_rates,
    saturation_rates_of, summary,
};

/// Added p99 at this rate, SQLite metering.
const ADDED_P99_RATE: f64 = 1000.0;
/// The added p99 goal, µs (also what the report counts paired rounds against).
pub const ADDED_P99_MAX_US: f64 = 1000.0;
const SATURATION_MIN_RPS: f64 = 5000.0;
const METERING_COST_MAX: f64 = 0.20;
const PEAK_RSS_MAX_MB: f64 = 64.0;
const MIB: f64 = 1024.0 * 1024.0;
const COLD_START_MAX_MS: f64 = 100.0;
/// GetUsage's goal (issue #29): this many records of a team this month...
const USAGE_RECORDS: u64 = 1_000_000;
/// ... read within this, ms (p95, every backend and shape).
const USAGE_MAX_MS: f64 = 200.0;
/// The tools' entry point (issue #27): `InvokeTool` of `system.echo` at
/// saturation, at least this share of `Execute`'s on the same server.
const TOOL_SATURATION_MIN_SHARE: f64 = 0.8;
/// The agent runtime (issue #28): the server's CPU per `Converse` turn
/// (three model calls, two tool calls) at most this many times its CPU
/// per `Execute`.
const AGENT_TURN_MAX_CPU_RATIO: f64 = 3.0;
/// The HTTP edge (issue #46): the server's CPU per `/v1/chat/completions`
/// call at most this many times its CPU per `Execute` of the same task.
const HTTP_EDGE_MAX_CPU_RATIO: f64 = 1.2;

/// Every target with what `r` reached. A smoke run (debug build, half a
/// second a step, low rates) measures none of them: its figures are shown
/// but not judged.
pub fn evaluate(r: &Results) -> Vec<Target> {
    let mut targets = vec![
        added_p99(r),
        saturation(r),
        metering_cost(r),
        peak_rss(r),
        cold_start(r),
        usage(r),
        tool_saturation(r),
        agent_turn(r),
        http_edge(r),
    ];
    if r.smoke {
        for t in &mut targets {
            t.met = None;
            t.reached = if t.reached == "not measured" {
                "smoke run: not measured".to_owned()
            } else {
                format!("smoke run, not judged: {}", t.reached)
            };
        }
    }
    targets
}

fn added_p99(r: &Results) -> Target {
    let mut parts = Vec::new();
    let mut worst: Option<f64> = None;
    // Judged on the default durability; `sqlite-normal` is shown beside it.
    for s in r.steps.iter().filter(|s| {
        s.via == "orchestrator"
            && (s.metering == "sqlite" || s.metering == "sqlite-normal")
            && s.offered_rps == ADDED_P99_RATE
    }) {
        if let Some(a) = s.added_latency_us {
            let label = if s.metering == "sqlite" {
                ""
            } else {
                " (normal)"
            };
            parts.push(format!(
                "{}{label} @ {} ms upstream: {:.2} ms",
                s.rpc,
                s.upstream_latency_ms,
                a.p99 / 1000.0
            ));
            if s.metering == "sqlite" {
                worst = Some(worst.map_or(a.p99, |w: f64| w.max(a.p99)));
            }
        }
    }
    let rounds_at_rate = r
        .paired
        .iter()
        .all(|p| p.orchestrator.offered_rps == ADDED_P99_RATE);
    let paired = paired_summary(r, "sqlite", ADDED_P99_MAX_US).filter(|_| rounds_at_rate);
    let name = "added p99 latency at 1,000 rps (SQLite metering)".into();
    let Some(paired) = paired else {
        // Without paired rounds, the fixed-rate steps against the direct
        // steps of the run's start, all of them within the goal.
        return Target {
            name,
            goal: "≤ 1 ms".into(),
            reached: if parts.is_empty() {
                "not measured".into()
            } else {
                parts.join("; ")
            },
            met: worst.map(|w| w <= ADDED_P99_MAX_US),
        };
    };
    let mut reached = format!(
        "paired rounds: median {:.2} ms, {} of {} ≤ 1 ms",
        paired.median_added_p99_us / 1000.0,
        paired.rounds_within,
        paired.rounds
    );
    if let Some((lo, hi)) = paired.wal_sync_p99_us {
        // The disk's part of the host's noise, which the direct steps miss.
        reached.push_str(&format!(
            " (WAL sync p99 {:.2}–{:.2} ms)",
            lo / 1000.0,
            hi / 1000.0
        ));
    }
    if let Some(normal) = paired_summary(r, "sqlite-normal", ADDED_P99_MAX_US) {
        reached.push_str(&format!(
            "; normal: median {:.2} ms",
            normal.median_added_p99_us / 1000.0
        ));
    }
    if !parts.is_empty() {
        reached.push_str(&format!("; fixed-rate steps: {}", parts.join("; ")));
    }
    Target {
        name,
        goal: "≤ 1 ms (median of the paired rounds)".into(),
        reached,
        met: Some(paired.median_added_p99_us <= ADDED_P99_MAX_US),
    }
}

/// Median saturation of `metering` over the run's sweeps: one sweep on a
/// shared host moves by a third between identical runs.
fn saturation_of(r: &Results, metering: &str) -> Option<f64> {
    summary(&saturation_rates(r, metering)).map(|(_, median, _)| median)
}

/// "4,100 rps", or "median 4,100 rps of 3 sweeps (3,900–4,800)".
fn saturation_text(r: &Results, metering: &str) -> Option<String> {
    let rates = saturation_rates(r, metering);
    let (lo, median, hi) = summary(&rates)?;
    Some(if rates.len() == 1 {
        format!("{median:.0} rps")
    } else {
        format!(
            "median {median:.0} rps of {} sweeps ({lo:.0}–{hi:.0})",
            rates.len()
        )
    })
}

fn saturation(r: &Results) -> Target {
    let sqlite = saturation_of(r, "sqlite");
    let mut reached = saturation_text(r, "sqlite").unwrap_or_else(|| "not measured".into());
    if let Some(v) = saturation_text(r, "sqlite-normal") {
        reached.push_str(&format!("; normal: {v}"));
    }
    if let Some(v) = saturation_text(r, "off") {
        reached.push_str(&format!("; metering off: {v}"));
    }
    Target {
        name: "saturation, Execute, 0 ms upstream, SQLite metering".into(),
        goal: "≥ 5,000 rps".into(),
        reached,
        met: sqlite.map(|v| v >= SATURATION_MIN_RPS),
    }
}

fn metering_cost(r: &Results) -> Target {
    let off = saturation_of(r, "off");
    let cost = |m: &str| {
        let (off, on) = (off?, saturation_of(r, m)?);
        (off > 0.0).then(|| (off - on) / off)
    };
    let (sqlite, pg) = (cost("sqlite"), cost("postgres"));
    let mut reached = Vec::new();
    if let Some(c) = sqlite {
        reached.push(format!("SQLite {:.0} %", c * 100.0));
    }
    // Metering only adds work, so a metered server out-running the
    // unmetered one means the unmetered steps met noise (another tenant of
    // the host, a stall of the load generator): nothing to judge.
    let noisy = sqlite.is_some_and(|c| c < 0.0);
    if noisy {
        reached.push(
            "metering off saturated below SQLite in this run: host noise, re-run to judge".into(),
        );
    }
    if let Some(c) = cost("sqlite-normal") {
        reached.push(format!("SQLite normal {:.0} %", c * 100.0));
    }
    if let Some(c) = pg {
        reached.push(format!("PostgreSQL {:.0} %", c * 100.0));
    }
    Target {
        name: "metering cost (median saturation throughput lost vs metering off)".into(),
        goal: "≤ 20 %".into(),
        reached: if reached.is_empty() {
            "not measured".into()
        } else {
            reached.join("; ")
        },
        met: sqlite.filter(|_| !noisy).map(|c| c <= METERING_COST_MAX),
    }
}

fn peak_rss(r: &Results) -> Target {
    let peak = r
        .groups
        .iter()
        .filter(|g| g.metering == "sqlite" && g.purpose == "load")
        .filter_map(|g| g.peak_rss_mb)
        .fold(None, |acc: Option<f64>, v| {
            Some(acc.map_or(v, |a| a.max(v)))
        });
    // The goal is in MB (10^6 bytes); the process reports MiB.
    let mb = |mib: f64| mib * MIB / 1e6;
    Target {
        name: "peak RSS under load (SQLite metering)".into(),
        goal: "≤ 64 MB".into(),
        reached: peak.map_or_else(
            || "not measured".into(),
            |v| format!("{:.1} MB ({v:.1} MiB)", mb(v)),
        ),
        met: peak.map(|v| mb(v) <= PEAK_RSS_MAX_MB),
    }
}

fn cold_start(r: &Results) -> Target {
    let fresh = summary(&r.cold_start.fresh_db_ms);
    let existing = summary(&r.cold_start.existing_db_ms);
    let mut reached = Vec::new();
    if let Some((_, med, max)) = fresh {
        reached.push(format!("new db: median {med:.1} ms, max {max:.1} ms"));
    }
    if let Some((_, med, max)) = existing {
        reached.push(format!("existing db: median {med:.1} ms, max {max:.1} ms"));
    }
    Target {
        name: "cold start (process start → health SERVING)".into(),
        goal: "≤ 100 ms".into(),
        reached: if reached.is_empty() {
            "not measured".into()
        } else {
            reached.join("; ")
        },
        met: fresh.map(|(_, med, _)| med <= COLD_START_MAX_MS),
    }
}

fn usage(r: &Results) -> Target {
    let full: Vec<_> = r
        .usage
        .iter()
        .filter(|u| u.records >= USAGE_RECORDS)
        .collect();
    let backends = |m: &str| full.iter().any(|u| u.metering == m);
    let reached = if r.usage.is_empty() {
        "not measured".to_owned()
    } else {
        r.usage
            .iter()
            .map(|u| {
                format!(
                    "{} {}: p95 {:.0} ms ({} records)",
                    u.metering, u.group_by, u.p95_ms, u.records
                )
            })
            .collect::<Vec<_>>()
            .join("; ")
    };
    Target {
        name: "GetUsage, a team's month of 1,000,000 records".into(),
        goal: "≤ 200 ms (p95, SQLite and PostgreSQL)".into(),
        reached,
        met: (backends("sqlite") && backends("postgres"))
            .then(|| full.iter().all(|u| u.p95_ms <= USAGE_MAX_MS)),
    }
}

/// `InvokeTool` of `system.echo` against `Execute` at saturation, on the
/// same servers (the sweeps take turns): the ratio of the medians, judged
/// with SQLite metering and its default durability.
fn tool_saturation(r: &Results) -> Target {
    let ratio = |m: &str| {
        let tool = summary(&saturation_rates_of(r, m, "InvokeTool"))?.1;
        let execute = summary(&saturation_rates_of(r, m, "Execute"))?.1;
        (execute > 0.0).then(|| (tool, execute, tool / execute))
    };
    let mut reached = Vec::new();
    for mode in ["sqlite", "sqlite-normal", "postgres", "off"] {
        if let Some((tool, execute, share)) = ratio(mode) {
            reached.push(format!(
                "{mode}: {tool:.0} / {execute:.0} rps = {:.2}×",
                share
            ));
        }
    }
    Target {
        name: "InvokeTool (system.echo) saturation vs Execute, 0 ms upstream, SQLite metering"
            .into(),
        goal: format!("≥ {TOOL_SATURATION_MIN_SHARE}× Execute's"),
        reached: if reached.is_empty() {
            "not measured".into()
        } else {
            reached.join("; ")
        },
        met: ratio("sqlite").map(|(_, _, share)| share >= TOOL_SATURATION_MIN_SHARE),
    }
}

/// The server's CPU seconds per 1,000 calls of `rpc` near saturation: the
/// median over the passing saturation steps offered at least half the
/// median saturation rate (CPU per call falls as the fixed upkeep is
/// shared by more calls, so low steps would flatter neither side).
fn cpu_near_saturation(r: &Results, metering: &str, rpc: &str) -> Option<f64> {
    let rate = summary(&saturation_rates_of(r, metering, rpc))?.1;
    let cpu: Vec<f64> = r
        .saturation_steps
        .iter()
        .filter(|s| {
            s.metering == metering
                && s.rpc == rpc
                && s.passed == Some(true)
                && s.offered_rps >= rate / 2.0
        })
        .filter_map(|s| s.server_cpu_s_per_1k)
        .collect();
    summary(&cpu).map(|(_, median, _)| median)
}

/// One `Converse` turn's server CPU against one `Execute`'s, on the same
/// servers (the sweeps take turns), with turns/s at saturation.
fn agent_turn(r: &Results) -> Target {
    let ratio = |m: &str| {
        let turn = cpu_near_saturation(r, m, "Converse")?;
        let execute = cpu_near_saturation(r, m, "Execute")?;
        let turns = summary(&saturation_rates_of(r, m, "Converse"))?.1;
        (execute > 0.0).then(|| (turns, turn, execute, turn / execute))
    };
    let mut reached = Vec::new();
    for mode in ["sqlite", "sqlite-normal", "postgres", "off"] {
        if let Some((turns, turn, execute, times)) = ratio(mode) {
            reached.push(format!(
                "{mode}: {turns:.0} turns/s; CPU {turn:.3} / {execute:.3} s per 1k = {times:.2}×"
            ));
        }
    }
    Target {
        name: "Converse turn (3 model calls, 2 tools) CPU vs one Execute, 0 ms upstream, SQLite metering"
            .into(),
        goal: format!("≤ {AGENT_TURN_MAX_CPU_RATIO}× Execute's CPU"),
        reached: if reached.is_empty() {
            "not measured".into()
        } else {
            reached.join("; ")
        },
        met: ratio("sqlite").map(|(_, _, _, times)| times <= AGENT_TURN_MAX_CPU_RATIO),
    }
}

/// The HTTP edge's server CPU per call against the gRPC edge's for the
/// same task and input, step by step (the RPCs take turns at each rate);
/// judged on the median of the steps' ratios.
fn http_edge(r: &Results) -> Target {
    let mut reached = Vec::new();
    let mut ratios = Vec::new();
    for (grpc, http) in edge_pairs(r) {
        let (Some(times), Some(g), Some(h)) = (
            edge_cpu_ratio(grpc, http),
            grpc.server_cpu_s_per_1k,
            http.server_cpu_s_per_1k,
        ) else {
            continue;
        };
        ratios.push(times);
        reached.push(format!(
            "{} @ {:.0} rps, {} ms upstream: {h:.3} / {g:.3} s per 1k = {times:.2}×",
            grpc.metering, grpc.offered_rps, grpc.upstream_latency_ms
        ));
    }
    let median = summary(&ratios).map(|(_, median, _)| median);
    if let Some(m) = median.filter(|_| ratios.len() > 1) {
        reached.push(format!("median {m:.2}×"));
    }
    Target {
        name: "HTTP edge (/v1/chat/completions) CPU per request vs the gRPC edge (Execute)".into(),
        goal: format!("≤ {HTTP_EDGE_MAX_CPU_RATIO}× the gRPC edge's (median of the steps)"),
        reached: if reached.is_empty() {
            "not measured".into()
        } else {
            reached.join("; ")
        },
        met: median.map(|m| m <= HTTP_EDGE_MAX_CPU_RATIO),
    }
}

#[cfg(test)]
mod tests;
