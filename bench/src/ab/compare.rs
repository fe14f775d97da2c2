//! The figures an A/B run compares, read from each round's results: one
//! row per figure, each side's values in round order, their medians, and
//! B's median over A's. Medians, because a shared machine's outliers come
//! one round at a time.

use crate::report::{Results, edge_cpu_ratio, edge_pairs, summary};
use serde::Serialize;
use std::fmt;

/// Which build a round ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Side {
    /// `--server-bin`.
    A,
    /// `--compare-bin`.
    B,
}

impl fmt::Display for Side {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Side::A => "A",
            Side::B => "B",
        })
    }
}

/// One figure across the rounds.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Row {
    /// What was measured, and where (RPC, metering, upstream latency, rate).
    pub figure: String,
    /// A's rounds, in run order; none where a round did not measure it.
    pub a: Vec<Option<f64>>,
    /// B's rounds, in run order; none where a round did not measure it.
    pub b: Vec<Option<f64>>,
    /// Median of `a`.
    pub a_median: Option<f64>,
    /// Median of `b`.
    pub b_median: Option<f64>,
    /// `b_median / a_median`.
    pub b_over_a: Option<f64>,
}

/// Every figure any round measured, in the order first measured.
pub fn compare(rounds: &[(Side, Results)]) -> Vec<Row> {
    let count = |side| rounds.iter().filter(|(s, _)| *s == side).count();
    let (a_rounds, b_rounds) = (count(Side::A), count(Side::B));
    let mut rows: Vec<Row> = Vec::new();
    let (mut a_seen, mut b_seen) = (0, 0);
    for (side, results) in rounds {
        // This round's place among its side's rounds.
        let nth = match side {
            Side::A => &mut a_seen,
            Side::B => &mut b_seen,
        };
        let n = *nth;
        *nth += 1;
        for (figure, value) in figures(results) {
            let i = match rows.iter().position(|r| r.figure == figure) {
                Some(i) => i,
                None => {
                    rows.push(Row {
                        figure,
                        a: vec![None; a_rounds],
                        b: vec![None; b_rounds],
                        a_median: None,
                        b_median: None,
                        b_over_a: None,
                    });
                    rows.len() - 1
                }
            };
            let values = match side {
                Side::A => &mut rows[i].a,
                Side::B => &mut rows[i].b,
            };
            if let Some(slot) = values.get_mut(n) {
                *slot = Some(value);
            }
        }
    }
    let median = |v: &[Option<f64>]| {
        let present: Vec<f64> = v.iter().flatten().copied().collect();
        summary(&present).map(|(_, m, _)| m)
    };
    for row in &mut rows {
        row.a_median = median(&row.a);
        row.b_median = median(&row.b);
        row.b_over_a = match (row.a_median, row.b_median) {
            (Some(a), Some(b)) if a != 0.0 => Some(b / a),
            _ => None,
        };
    }
    rows
}

/// One round's figures: CPU, latency and the ledger's batching of each
/// fixed-rate step, the HTTP edge's CPU per request over the gRPC edge's
/// at each step of both (issue #46), and each saturation sweep's highest
/// passing rate with its ratio to the unmetered one (issue #30's metering
/// figure). Several sweeps of one server give their median; a sweep that
/// passed no step counts as 0, as in the run's own report.
fn figures(r: &Results) -> Vec<(String, f64)> {
    let mut out = Vec::new();
    for s in r
        .steps
        .iter()
        .filter(|s| s.kind == "load" && s.via == "orchestrator")
    {
        let at = format!(
            "{}, {} metering, {} ms upstream, {} rps",
            s.rpc, s.metering, s.upstream_latency_ms, s.offered_rps
        );
        if let Some(cpu) = s.server_cpu_s_per_1k {
            out.push((format!("{at}: server CPU s per 1,000 calls"), cpu));
        }
        if let Some(db) = s.db_cpu_s_per_1k {
            out.push((format!("{at}: PostgreSQL CPU s per 1,000 calls"), db));
        }
        if s.ok > 0 {
            out.push((format!("{at}: p50 ms"), s.latency_us.p50 / 1000.0));
            out.push((format!("{at}: p99 ms"), s.latency_us.p99 / 1000.0));
        }
        out.push((format!("{at}: errors"), s.errors as f64));
        if let Some(ops) = s.ledger.and_then(|l| l.ops_per_commit) {
            out.push((format!("{at}: ledger operations per commit"), ops));
        }
    }
    for (grpc, http) in edge_pairs(r) {
        if let Some(times) = edge_cpu_ratio(grpc, http) {
            let at = format!(
                "{} metering, {} ms upstream, {} rps",
                grpc.metering, grpc.upstream_latency_ms, grpc.offered_rps
            );
            out.push((
                format!("{at}: HTTP edge / gRPC edge CPU per request"),
                times,
            ));
        }
    }
    let mut sweeps: Vec<(&str, &str, u64)> = Vec::new();
    for s in &r.saturation {
        let key = (s.rpc.as_str(), s.metering.as_str(), s.upstream_latency_ms);
        if !sweeps.contains(&key) {
            sweeps.push(key);
        }
    }
    let saturation = |rpc: &str, metering: &str, upstream: u64| {
        let rates: Vec<f64> = r
            .saturation
            .iter()
            .filter(|s| s.rpc == rpc && s.metering == metering && s.upstream_latency_ms == upstream)
            .map(|s| s.highest_passing_rps.unwrap_or(0.0))
            .collect();
        summary(&rates).map(|(_, median, _)| median)
    };
    for &(rpc, metering, upstream) in &sweeps {
        let Some(rate) = saturation(rpc, metering, upstream) else {
            continue;
        };
        let at = format!("{rpc}, {metering} metering, {upstream} ms upstream");
        out.push((format!("{at}: saturation rps"), rate));
        if metering != "off"
            && let Some(off) = saturation(rpc, "off", upstream).filter(|off| *off > 0.0)
        {
            out.push((format!("{at}: saturation / off metering's"), rate / off));
        }
    }
    out
}

/// `ab.md`: the rounds, then one table row per figure.
pub fn markdown(a: &str, b: &str, order: &[String], rows: &[Row]) -> String {
    let mut md = format!(
        "# A/B run\n\nA: {a}\n\nB: {b}\n\nRounds, in order: {}.\n\n\
         | figure | A, each round | B, each round | A median | B median | B / A |\n\
         |---|---|---|---|---|---|\n",
        order.join(", ")
    );
    let maybe = |v: Option<f64>| v.map_or_else(|| "–".to_owned(), number);
    let each = |v: &[Option<f64>]| v.iter().map(|x| maybe(*x)).collect::<Vec<_>>().join(", ");
    for r in rows {
        md.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} |\n",
            r.figure,
            each(&r.a),
            each(&r.b),
            maybe(r.a_median),
            maybe(r.b_median),
            r.b_over_a
                .map_or_else(|| "–".to_owned(), |x| format!("{x:.3}")),
        ));
    }
    md
}

/// Three significant figures or so, without a trail of zeros on rates.
fn number(x: f64) -> String {
    if x.abs() >= 100.0 {
        format!("{x:.0}")
    } else if x.abs() >= 10.0 {
        format!("{x:.1}")
    } else {
        format!("{x:.3}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::{Quantiles, Saturation, Step};

    fn sweep(metering: &str, rps: Option<f64>) -> Saturation {
        Saturation {
            metering: metering.into(),
            rpc: "Execute".into(),
            highest_passing_rps: rps,
            ..Saturation::default()
        }
    }

    fn round(cpu: f64, p99_us: f64, off_rps: f64, sqlite_rps: f64) -> Results {
        let load = Step {
            kind: "load".into(),
            rpc: "Execute".into(),
            via: "orchestrator".into(),
            metering: "sqlite".into(),
            offered_rps: 1200.0,
            sent: 100,
            ok: 100,
            latency_us: Quantiles {
                p50: 1000.0,
                p99: p99_us,
                ..Quantiles::default()
            },
            server_cpu_s_per_1k: Some(cpu),
            ..Step::default()
        };
        // The direct baseline's step is not a figure of the server.
        let direct = Step {
            via: "direct".into(),
            ..load.clone()
        };
        Results {
            steps: vec![load, direct],
            saturation: vec![
                sweep("off", Some(off_rps)),
                sweep("sqlite", Some(sqlite_rps)),
            ],
            ..Results::default()
        }
    }

    fn row<'a>(rows: &'a [Row], name: &str) -> &'a Row {
        rows.iter()
            .find(|r| r.figure == name)
            .unwrap_or_else(|| panic!("no {name} in {rows:#?}"))
    }

    const CPU: &str =
        "Execute, sqlite metering, 0 ms upstream, 1200 rps: server CPU s per 1,000 calls";
    const SATURATION: &str = "Execute, sqlite metering, 0 ms upstream: saturation rps";

    #[test]
    fn each_figure_gets_its_sides_rounds_and_the_ratio_of_medians() {
        let rounds = [
            (Side::A, round(0.50, 2000.0, 6000.0, 4800.0)),
            (Side::B, round(0.40, 2500.0, 6000.0, 5400.0)),
            (Side::B, round(0.44, 2400.0, 5000.0, 5000.0)),
            (Side::A, round(0.54, 2200.0, 5000.0, 4000.0)),
        ];
        let rows = compare(&rounds);
        let cpu = row(&rows, CPU);
        assert_eq!(cpu.a, [Some(0.50), Some(0.54)]);
        assert_eq!(cpu.b, [Some(0.40), Some(0.44)]);
        assert!((cpu.a_median.unwrap() - 0.52).abs() < 1e-9);
        assert!((cpu.b_over_a.unwrap() - 0.42 / 0.52).abs() < 1e-9);
        let p99 = row(
            &rows,
            "Execute, sqlite metering, 0 ms upstream, 1200 rps: p99 ms",
        );
        assert_eq!(p99.b, [Some(2.5), Some(2.4)]);
        let errors = row(
            &rows,
            "Execute, sqlite metering, 0 ms upstream, 1200 rps: errors",
        );
        assert_eq!(errors.a, [Some(0.0), Some(0.0)]);
        assert_eq!(errors.b_over_a, None, "no ratio over a zero");
        // Each round's metered saturation over its own unmetered one.
        let ratio = row(
            &rows,
            "Execute, sqlite metering, 0 ms upstream: saturation / off metering's",
        );
        assert_eq!(ratio.a, [Some(0.8), Some(0.8)]);
        assert_eq!(ratio.b, [Some(0.9), Some(1.0)]);
        assert!(
            !rows.iter().any(|r| r
                .figure
                .starts_with("Execute, off metering, 0 ms upstream: saturation /")),
            "no ratio of the unmetered sweep to itself"
        );
        assert_eq!(
            rows.iter()
                .filter(|r| r.figure.ends_with("CPU s per 1,000 calls"))
                .count(),
            1,
            "only the orchestrator's step"
        );

        let md = markdown(
            "`a`",
            "`b`",
            &["round-01-A".into(), "round-02-B".into()],
            &rows,
        );
        assert!(
            md.contains("Rounds, in order: round-01-A, round-02-B."),
            "{md}"
        );
        assert!(
            md.contains(&format!(
                "| {SATURATION} | 4800, 4000 | 5400, 5000 | 4400 | 5200 | 1.182 |"
            )),
            "{md}"
        );
    }

    #[test]
    fn a_round_that_did_not_measure_a_figure_leaves_a_gap_in_its_place() {
        let mut skipped = round(0.45, 2000.0, 6000.0, 5000.0);
        skipped.steps.clear();
        skipped.saturation.clear();
        let rounds = [
            (Side::A, round(0.5, 2000.0, 6000.0, 4000.0)),
            (Side::B, skipped),
            (Side::B, round(0.4, 2000.0, 6000.0, 4500.0)),
            (Side::A, round(0.6, 2000.0, 6000.0, 5000.0)),
        ];
        let rows = compare(&rounds);
        let cpu = row(&rows, CPU);
        assert_eq!(cpu.b, [None, Some(0.4)], "B's second round stays second");
        assert_eq!(cpu.b_median, Some(0.4));
        let md = markdown("a", "b", &[], &rows);
        assert!(
            md.contains(&format!(
                "| {CPU} | 0.500, 0.600 | –, 0.400 | 0.550 | 0.400 |"
            )),
            "{md}"
        );

        // A side with no round of a figure has no median and no ratio.
        let mut none = round(0.4, 2000.0, 6000.0, 5000.0);
        none.saturation.clear();
        let rows = compare(&[
            (Side::A, round(0.5, 2000.0, 6000.0, 5000.0)),
            (Side::B, none),
        ]);
        let sat = row(&rows, SATURATION);
        assert_eq!(sat.b, [None]);
        assert_eq!((sat.b_median, sat.b_over_a), (None, None));
        assert!(
            markdown("a", "b", &[], &rows)
                .contains(&format!("| {SATURATION} | 5000 | – | 5000 | – | – |"))
        );
    }

    #[test]
    fn a_round_with_both_edges_gives_their_cpu_ratio() {
        let with_http = |http_cpu: f64| {
            let mut r = round(0.5, 2000.0, 6000.0, 5000.0);
            let mut http = r.steps[0].clone();
            http.rpc = "ChatCompletionsHttp".into();
            http.server_cpu_s_per_1k = Some(http_cpu);
            r.steps.push(http);
            r
        };
        let rows = compare(&[(Side::A, with_http(0.6)), (Side::B, with_http(0.55))]);
        let ratio = row(
            &rows,
            "sqlite metering, 0 ms upstream, 1200 rps: HTTP edge / gRPC edge CPU per request",
        );
        assert!((ratio.a[0].unwrap() - 1.2).abs() < 1e-9, "{ratio:?}");
        assert!((ratio.b[0].unwrap() - 1.1).abs() < 1e-9, "{ratio:?}");
    }

    #[test]
    fn several_sweeps_of_a_round_give_their_median_and_one_that_never_passed_counts_as_zero() {
        let mut r = round(0.5, 2000.0, 6000.0, 5000.0);
        r.saturation
            .extend([sweep("sqlite", Some(4000.0)), sweep("sqlite", None)]);
        let rows = compare(&[(Side::A, r)]);
        assert_eq!(
            row(&rows, SATURATION).a,
            [Some(4000.0)],
            "median of 5000, 4000 and 0"
        );
    }
}
