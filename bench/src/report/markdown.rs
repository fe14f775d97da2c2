//! The Markdown report (`results.md`): one section per scenario, tables
//! only of the figures docs/benchmarks.md explains.

mod scenarios;

use super::{
    Results, Step, paired_summary, saturation_rates_of, summary, targets::ADDED_P99_MAX_US,
};
use std::fmt::Write as _;

/// The whole report.
pub fn markdown(r: &Results) -> String {
    let mut out = String::from("# ai-orchestrator benchmark results\n\n");
    if r.smoke {
        out.push_str(
            "**Smoke run** (CI): seconds-long steps at low rates; the numbers only show that it runs.\n\n",
        );
    }
    if let Some(m) = &r.machine {
        let (a, b) = (m.load_avg_at_start, r.load_avg_at_end);
        let _ = writeln!(
            out,
            "Machine: {} cores, {}, {:.0} MiB RAM, Linux {}. Load average at start {:.2} / {:.2} / {:.2}, \
             at end {:.2} / {:.2} / {:.2}. The fake upstream, the load generator and the server share these cores.\n",
            m.cores, m.cpu_model, m.mem_total_mb, m.kernel, a[0], a[1], a[2], b[0], b[1], b[2],
        );
    }
    let commit = r.git_commit.as_ref().map(|c| format!(" at commit `{c}`"));
    let _ = writeln!(
        out,
        "Server: `{}`{}. Run {} → {}.\n",
        r.server_bin,
        commit.unwrap_or_default(),
        r.started_at,
        r.finished_at
    );
    targets(&mut out, r);
    fixed_rates(&mut out, r);
    scenarios::edges(&mut out, r);
    ledger(&mut out, r);
    paired(&mut out, r);
    saturation(&mut out, r);
    scenarios::in_flight(&mut out, r);
    scenarios::breaker(&mut out, r);
    scenarios::cold_start(&mut out, r);
    scenarios::usage(&mut out, r);
    scenarios::cluster(&mut out, r);
    scenarios::processes(&mut out, r);
    scenarios::quiet_waits(&mut out, r);
    if !r.notes.is_empty() {
        out.push_str("## Notes\n\n");
        for n in &r.notes {
            let _ = writeln!(out, "- {n}");
        }
    }
    out
}

/// A section: heading, what its figures are, then one table.
fn section(out: &mut String, title: &str, intro: &str, header: &str, rows: Vec<Vec<String>>) {
    let _ = writeln!(out, "## {title}\n\n{intro}\n");
    table(out, header, rows);
}

/// `header` is the columns' names joined by ` | `.
fn table(out: &mut String, header: &str, rows: Vec<Vec<String>>) {
    let _ = writeln!(out, "| {header} |");
    let _ = writeln!(out, "|{}", "---|".repeat(header.split(" | ").count()));
    for row in rows {
        let _ = writeln!(out, "| {} |", row.join(" | "));
    }
    out.push('\n');
}

/// Microseconds as milliseconds: two decimals below 100 ms.
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

/// The server's overhead over a step: mean / p99, ms.
fn overhead(s: &Step) -> String {
    s.server_overhead_us.map_or_else(
        || "–".to_owned(),
        |o| format!("{} / {}", ms(o.mean), ms(o.p99)),
    )
}

fn targets(out: &mut String, r: &Results) {
    if r.targets.is_empty() {
        return;
    }
    let rows = r.targets.iter().map(|t| {
        let met = match t.met {
            Some(true) => "yes",
            Some(false) => "**no**",
            None => "not judged",
        };
        vec![
            t.name.clone(),
            t.goal.clone(),
            t.reached.clone(),
            met.into(),
        ]
    });
    section(
        out,
        "Targets (issue #6)",
        "Reported, never asserted: a run fails only when it is broken.",
        "target | goal | reached | met",
        rows.collect(),
    );
}

fn fixed_rates(out: &mut String, r: &Results) {
    if r.steps.is_empty() {
        return;
    }
    let rows = r.steps.iter().map(|s| {
        let q = &s.latency_us;
        let added = |f: fn(&super::Quantiles) -> f64| {
            s.added_latency_us
                .map_or_else(|| "–".to_owned(), |a| ms(f(&a)))
        };
        let rpc = if s.task.is_empty() || s.rpc != "Execute" {
            s.rpc.clone()
        } else {
            format!("{} ({})", s.rpc, s.task)
        };
        vec![
            s.via.clone(),
            rpc,
            s.metering.clone(),
            s.upstream_latency_ms.to_string(),
            format!("{:.0}", s.offered_rps),
            format!("{:.0}", s.achieved_rps),
            s.errors.to_string(),
            ms(q.p50),
            ms(q.p99),
            ms(q.p999),
            added(|a| a.p50),
            added(|a| a.p99),
            overhead(s),
            opt(s.server_cpu_s_per_1k, 3),
            opt(s.server_peak_rss_mb, 1),
        ]
    });
    section(
        out,
        "Fixed rates",
        "Latency in ms from the scheduled send time (open loop). *added* = orchestrator minus direct at the \
         same quantile, rate and upstream latency; *server overhead* = the server's \
         `orchestrator_overhead_seconds` (mean exact, p99 from buckets). CPU is the server process's, per \
         1,000 requests.",
        "via | rpc | metering | upstream ms | offered rps | achieved rps | errors | p50 | p99 | p99.9 | added p50 | added p99 | server overhead mean / p99 | CPU s/1k | peak RSS MiB",
        rows.collect(),
    );
}

fn ledger(out: &mut String, r: &Results) {
    let rows: Vec<Vec<String>> = r
        .steps
        .iter()
        .filter_map(|s| Some((s, s.ledger?)))
        .map(|(s, l)| {
            let pair = |h: Option<super::ServerHistogram>| {
                h.map_or_else(
                    || "–".to_owned(),
                    |h| format!("{} / {}", ms(h.p50), ms(h.p99)),
                )
            };
            vec![
                s.rpc.clone(),
                s.metering.clone(),
                s.upstream_latency_ms.to_string(),
                format!("{:.0}", s.offered_rps),
                pair(l.reserve_wait_us),
                pair(l.settle_wait_us),
                pair(l.commit_us),
                pair(l.sync_us),
                opt(l.ops_per_commit, 1),
            ]
        })
        .collect();
    if rows.is_empty() {
        return;
    }
    section(
        out,
        "Metering ledger",
        "The ledger writer over each fixed-rate step, from the server's `usage_ledger_*` histograms (ms, \
         p50 / p99 from buckets): how long a call waited for its reservation (before the provider call) and \
         for its settlement (before the response, the WAL sync included with full durability), one group \
         commit's transaction, one WAL sync, and operations per commit.",
        "rpc | metering | upstream ms | offered rps | reservation wait | settlement wait | commit | WAL sync | ops per commit",
        rows,
    );
}

/// One row per metering mode; every round's figures are in the JSON.
fn paired(out: &mut String, r: &Results) {
    let mut modes: Vec<&str> = r.paired.iter().map(|p| p.metering.as_str()).collect();
    modes.dedup();
    let rows = modes.into_iter().filter_map(|mode| {
        let s = paired_summary(r, mode, ADDED_P99_MAX_US)?;
        let each: Vec<String> = s.added_p99_us.iter().map(|v| ms(*v)).collect();
        let range = |(lo, hi): (f64, f64)| format!("{}–{}", ms(lo), ms(hi));
        Some(vec![
            mode.to_owned(),
            s.rounds.to_string(),
            each.join(", "),
            format!("**{}**", ms(s.median_added_p99_us)),
            format!("{} of {}", s.rounds_within, s.rounds),
            ms(s.median_added_p50_us),
            range(s.direct_p99_us),
            s.wal_sync_p99_us.map_or_else(|| "–".to_owned(), range),
        ])
    });
    let rows: Vec<Vec<String>> = rows.collect();
    if rows.is_empty() {
        return;
    }
    section(
        out,
        "Paired rounds",
        "Each round: a step straight to the fake upstream and a step through the orchestrator, back to back \
         at the same rate with the same body (which runs first alternates); *added* = orchestrator minus \
         direct of that round, ms. The p99 target reads the median of the rounds' added p99. *WAL sync p99*: \
         one WAL `fdatasync` of the server's ledger over each round, the disk's share of the host's noise, \
         which the direct steps do not see.",
        &format!(
            "metering | rounds | added p99 per round | median added p99 | rounds ≤ {} ms | \
             median added p50 | direct p99 | WAL sync p99",
            ms(ADDED_P99_MAX_US)
        ),
        rows,
    );
}

fn saturation(out: &mut String, r: &Results) {
    let mut series: Vec<(&str, &str)> = Vec::new();
    for s in &r.saturation {
        if !series.contains(&(s.metering.as_str(), s.rpc.as_str())) {
            series.push((s.metering.as_str(), s.rpc.as_str()));
        }
    }
    let rows = series.into_iter().filter_map(|(mode, rpc)| {
        let rates = saturation_rates_of(r, mode, rpc);
        let (_, median, _) = summary(&rates)?;
        let each: Vec<String> = rates.iter().map(|v| format!("{v:.0}")).collect();
        let stops: Vec<String> = r
            .saturation
            .iter()
            .filter(|s| s.metering == mode && s.rpc == rpc)
            .map(|s| match (s.first_failing_rps, &s.failed_because) {
                (Some(rps), Some(why)) => format!("{rps:.0}: {why}"),
                _ => "none failed".into(),
            })
            .collect();
        Some(vec![
            mode.to_owned(),
            rpc.to_owned(),
            each.join(", "),
            format!("**{median:.0}**"),
            stops.join("; "),
        ])
    });
    let rows: Vec<Vec<String>> = rows.collect();
    if rows.is_empty() {
        return;
    }
    section(
        out,
        "Saturation",
        "`Execute` (and `InvokeTool` of `system.echo`, and `Converse` turns of three model calls and two \
         tool calls, taking turns) at 0 ms upstream, the rate raised step \
         by step until achieved < 95 % of offered, errors > 1 % or p99 > 100 ms, then bisected; each sweep \
         repeated on the same server once it is idle again. Targets read the median of the sweeps (a sweep \
         where nothing passed counts as 0).",
        "metering | rpc | highest passing rps per sweep | median | first failing rps of each sweep: why",
        rows,
    );
}
