//! The targets of issue #6, checked against a run's results. Reported, never
//! asserted: the benchmark measures, it does not pass or fail on timing.

use crate::report::{Results, Target, paired_summary, saturation_rates, summary};

/// Added p99 at this rate, SQLite metering.
const ADDED_P99_RATE: f64 = 1000.0;
const ADDED_P99_MAX_US: f64 = 1000.0;
const SATURATION_MIN_RPS: f64 = 5000.0;
const METERING_COST_MAX: f64 = 0.20;
const PEAK_RSS_MAX_MB: f64 = 64.0;
const MIB: f64 = 1024.0 * 1024.0;
const COLD_START_MAX_MS: f64 = 100.0;

/// Every target with what `r` reached.
pub fn evaluate(r: &Results) -> Vec<Target> {
    vec![
        added_p99(r),
        saturation(r),
        metering_cost(r),
        peak_rss(r),
        cold_start(r),
    ]
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::Group;

    fn with_peak(mib: f64) -> Results {
        Results {
            groups: vec![Group {
                metering: "sqlite".into(),
                purpose: "load".into(),
                peak_rss_mb: Some(mib),
                ..Group::default()
            }],
            ..Results::default()
        }
    }

    fn with_saturation(off: f64, sqlite: f64) -> Results {
        let best = |metering: &str, rps: f64| crate::report::Saturation {
            metering: metering.into(),
            rpc: "Execute".into(),
            highest_passing_rps: Some(rps),
            ..Default::default()
        };
        Results {
            saturation: vec![best("off", off), best("sqlite", sqlite)],
            ..Results::default()
        }
    }

    #[test]
    fn saturation_targets_read_the_median_of_the_sweeps() {
        let sweep = |metering: &str, repeat: u32, rps: Option<f64>| crate::report::Saturation {
            metering: metering.into(),
            repeat,
            rpc: "Execute".into(),
            highest_passing_rps: rps,
            ..Default::default()
        };
        let r = Results {
            saturation: vec![
                sweep("off", 0, Some(3500.0)),
                sweep("off", 1, Some(5300.0)),
                sweep("off", 2, Some(5000.0)),
                sweep("sqlite", 0, Some(5200.0)),
                sweep("sqlite", 1, None),
                sweep("sqlite", 2, Some(4000.0)),
            ],
            ..Results::default()
        };
        // One lucky sweep does not meet the goal; the sweep where nothing
        // passed counts as 0.
        let sat = saturation(&r);
        assert_eq!(sat.met, Some(false), "{}", sat.reached);
        assert!(
            sat.reached
                .starts_with("median 4000 rps of 3 sweeps (0–5200)"),
            "{}",
            sat.reached
        );
        // (5000 - 4000) / 5000 on the medians, not the first sweeps' −49 %.
        let cost = metering_cost(&r);
        assert!(cost.reached.starts_with("SQLite 20 %"), "{}", cost.reached);
        assert_eq!(cost.met, Some(true), "{}", cost.reached);
    }

    #[test]
    fn metering_cost_is_judged_only_when_metering_costs_something() {
        let cost = metering_cost(&with_saturation(5000.0, 4200.0));
        assert_eq!(cost.met, Some(true), "{}", cost.reached);
        let cost = metering_cost(&with_saturation(5000.0, 3500.0));
        assert_eq!(cost.met, Some(false), "{}", cost.reached);
        // Metered faster than unmetered: the run was noisy, not judged.
        let cost = metering_cost(&with_saturation(3500.0, 3700.0));
        assert_eq!(cost.met, None, "{}", cost.reached);
        assert!(cost.reached.contains("host noise"), "{}", cost.reached);
    }

    fn round(metering: &str, round: u32, direct_p99: f64, added_p99: f64) -> crate::report::Pair {
        use crate::report::{Quantiles, Step};
        let q = |p99: f64| Quantiles {
            p50: 100.0,
            p90: 200.0,
            p99,
            p999: p99,
            ..Quantiles::default()
        };
        let step = |via: &str, p99: f64| Step {
            via: via.into(),
            metering: metering.into(),
            offered_rps: ADDED_P99_RATE,
            sent: 5000,
            ok: 5000,
            latency_us: q(p99),
            ..Step::default()
        };
        let mut orchestrator = step("orchestrator", direct_p99 + added_p99);
        orchestrator.added_latency_us = Some(orchestrator.latency_us.minus(&q(direct_p99)));
        crate::report::Pair {
            metering: metering.into(),
            rpc: "Execute".into(),
            round,
            direct_first: round.is_multiple_of(2),
            direct: step("direct", direct_p99),
            orchestrator,
        }
    }

    #[test]
    fn added_p99_reads_the_median_of_the_paired_rounds() {
        // Two noisy rounds of five do not decide it; the fixed-rate step
        // (against a direct step of another minute) is shown, not judged.
        let added = [700.0, 4000.0, 900.0, 950.0, 2500.0];
        let mut r = Results {
            paired: added
                .iter()
                .zip(0..)
                .map(|(a, i)| round("sqlite", i, 400.0, *a))
                .collect(),
            steps: vec![crate::report::Step {
                via: "orchestrator".into(),
                rpc: "Execute".into(),
                metering: "sqlite".into(),
                offered_rps: ADDED_P99_RATE,
                added_latency_us: Some(crate::report::Quantiles {
                    p99: 3100.0,
                    ..Default::default()
                }),
                ..Default::default()
            }],
            ..Results::default()
        };
        let t = added_p99(&r);
        assert_eq!(t.met, Some(true), "{}", t.reached);
        assert!(
            t.reached
                .starts_with("paired rounds: median 0.95 ms, 3 of 5 ≤ 1 ms; fixed-rate steps: Execute @ 0 ms upstream: 3.10 ms"),
            "{}",
            t.reached
        );
        r.paired[0] = round("sqlite", 0, 400.0, 1200.0);
        // The disk's state is given with the rounds.
        for (p, sync_p99) in r.paired.iter_mut().zip([250.0, 900.0, 300.0, 260.0, 400.0]) {
            p.orchestrator.ledger = Some(crate::report::LedgerView {
                sync_us: Some(crate::report::ServerOverhead {
                    p99: sync_p99,
                    ..Default::default()
                }),
                ..Default::default()
            });
        }
        let t = added_p99(&r);
        assert_eq!(t.met, Some(false), "{}", t.reached);
        assert!(
            t.reached.starts_with(
                "paired rounds: median 1.20 ms, 2 of 5 ≤ 1 ms (WAL sync p99 0.25–0.90 ms)"
            ),
            "{}",
            t.reached
        );

        // Without rounds, every fixed-rate step must be within the goal.
        r.paired.clear();
        let t = added_p99(&r);
        assert_eq!(t.met, Some(false), "{}", t.reached);
        assert_eq!(t.goal, "≤ 1 ms");
    }

    /// The goal is 64 MB; the process reports MiB (1 MiB = 1.048576 MB).
    #[test]
    fn peak_rss_is_judged_in_megabytes() {
        let under = peak_rss(&with_peak(61.0));
        assert_eq!(under.met, Some(true), "{}", under.reached);
        let over = peak_rss(&with_peak(62.0));
        assert_eq!(over.met, Some(false), "{}", over.reached);
        assert!(
            over.reached.starts_with("65.0 MB (62.0 MiB)"),
            "{}",
            over.reached
        );
    }
}
