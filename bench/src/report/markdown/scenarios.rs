//! The report's sections beside the fixed rates' table: the two edges
//! compared, long calls, the breaker, cold start, and the run's own
//! bookkeeping (server processes, quiet waits).

use super::{ms, opt, overhead, section, table};
use crate::report::{Results, Step, edge_cpu_ratio, edge_pairs, summary};
use std::fmt::Write as _;

/// The same call through each edge of one server, step by step, and the
/// median ratio of their CPU per request.
pub fn edges(out: &mut String, r: &Results) {
    let pairs = edge_pairs(r);
    if pairs.is_empty() {
        return;
    }
    let added = |s: &Step| {
        s.added_latency_us.map_or_else(
            || "–".to_owned(),
            |a| format!("{} / {}", ms(a.p50), ms(a.p99)),
        )
    };
    let rows = pairs.iter().map(|&(grpc, http)| {
        vec![
            grpc.metering.clone(),
            grpc.upstream_latency_ms.to_string(),
            format!("{:.0}", grpc.offered_rps),
            opt(grpc.server_cpu_s_per_1k, 3),
            opt(http.server_cpu_s_per_1k, 3),
            opt(edge_cpu_ratio(grpc, http), 2),
            added(grpc),
            added(http),
            format!("{} / {}", grpc.errors, http.errors),
        ]
    });
    section(
        out,
        "HTTP edge vs gRPC edge",
        "The same task and input through each edge of one server, the RPCs taking turns at each rate: \
         `Execute` of `meeting_brief` over gRPC (HTTP/2), and `POST /v1/chat/completions` with `model` \
         `meeting_brief` over HTTP/1.1 keep-alive, the input as its one user message. CPU is the server \
         process's per 1,000 requests; *added* = the step minus the direct step that replays that edge's \
         own upstream body (same rate and upstream latency), ms, p50 / p99.",
        "metering | upstream ms | offered rps | gRPC CPU s/1k | HTTP CPU s/1k | HTTP / gRPC | \
         gRPC added p50 / p99 | HTTP added p50 / p99 | errors gRPC / HTTP",
        rows.collect(),
    );
    let ratios: Vec<f64> = pairs
        .iter()
        .filter_map(|&(grpc, http)| edge_cpu_ratio(grpc, http))
        .collect();
    if let Some((lo, median, hi)) = summary(&ratios) {
        let _ = writeln!(
            out,
            "HTTP edge / gRPC edge CPU per request: **{median:.2}×** (median of {} steps, \
             {lo:.2}–{hi:.2}×).\n",
            ratios.len()
        );
    }
}

pub fn in_flight(out: &mut String, r: &Results) {
    let Some(f) = &r.in_flight else { return };
    let rows = f.steps.iter().zip(&f.calls_in_flight).map(|(s, n)| {
        vec![
            format!("{:.0}", s.offered_rps),
            format!("{:.0}", s.achieved_rps),
            s.errors.to_string(),
            ms(s.latency_us.p50),
            ms(s.latency_us.p99),
            format!("{n:.0}"),
            opt(s.server_rss_mb, 1),
            opt(s.server_cpu_s_per_1k, 3),
        ]
    });
    section(
        out,
        "Long calls: memory per call in flight",
        &format!(
            "The fake upstream answers after {} ms (LLM calls take seconds); `Execute` with SQLite \
             metering. Calls in flight = offered rps × share answered × mean latency (Little's law); RSS is \
             the server's after each step.",
            f.upstream_latency_ms
        ),
        "offered rps | achieved rps | errors | p50 | p99 | calls in flight | RSS MiB | CPU s/1k",
        rows.collect(),
    );
    if let Some(kib) = f.kib_per_call {
        let _ = writeln!(
            out,
            "Resident memory per call in flight: **{kib:.1} KiB** (slope from the first to the last step).\n"
        );
    }
}

pub fn breaker(out: &mut String, r: &Results) {
    let Some(b) = &r.breaker else { return };
    let rows = [
        ("healthy provider only", &b.healthy),
        ("open primary → fallback", &b.fast_fail),
    ]
    .into_iter()
    .filter_map(|(name, s)| {
        let s = s.as_ref()?;
        let q = &s.latency_us;
        Some(vec![
            name.to_owned(),
            format!("{:.0}", s.offered_rps),
            format!("{:.0}", s.achieved_rps),
            s.errors.to_string(),
            ms(q.p50),
            ms(q.p99),
            ms(q.p999),
            overhead(s),
        ])
    });
    section(
        out,
        "Breaker fast-fail path",
        &format!(
            "The primary answers 500 until its breaker opens ({} calls); then every call skips it (no \
             network call) and the fallback serves. The failing upstream received {} calls while measuring. \
             SQLite metering, latency in ms.",
            b.calls_to_open, b.broken_upstream_calls_while_open
        ),
        "chain | offered rps | achieved rps | errors | p50 | p99 | p99.9 | server overhead mean / p99",
        rows.collect(),
    );
    if let (Some(h), Some(f)) = (&b.healthy, &b.fast_fail) {
        let a = f.latency_us.minus(&h.latency_us);
        let _ = writeln!(
            out,
            "Added by skipping the open primary: p50 {} ms, p99 {} ms.\n",
            ms(a.p50),
            ms(a.p99)
        );
    }
    if b.refused.is_empty() {
        return;
    }
    let rows = b.refused.iter().map(|x| {
        let (s, q) = (&x.step, &x.step.latency_us);
        vec![
            x.metering.clone(),
            s.callers.to_string(),
            s.ok.to_string(),
            format!("{:.0}", s.achieved_rps),
            s.errors.to_string(),
            ms(q.p50),
            format!("**{}**", ms(q.p99)),
            ms(q.p999),
            overhead(s),
            x.broken_upstream_calls.to_string(),
        ]
    });
    let _ = writeln!(
        out,
        "### Refused at once: the only target's breaker open\n\n\
         A task whose only target is the open breaker: every call is refused with UNAVAILABLE and no \
         provider call. Closed loop (each caller sends its next call when the last one is answered), \
         latency in ms from each send; `sqlite` is full durability, whose refusals do not wait for the disk.\n"
    );
    table(
        out,
        "metering | callers | refused calls | refused/s | errors | p50 | p99 | p99.9 | \
         server overhead mean / p99 | provider calls",
        rows.collect(),
    );
}

pub fn cold_start(out: &mut String, r: &Results) {
    let c = &r.cold_start;
    let rows: Vec<Vec<String>> = [
        ("new file (created + migrated)", &c.fresh_db_ms),
        ("existing file", &c.existing_db_ms),
    ]
    .into_iter()
    .filter_map(|(name, v)| {
        let (min, med, max) = summary(v)?;
        Some(vec![
            name.to_owned(),
            v.len().to_string(),
            format!("{min:.1}"),
            format!("{med:.1}"),
            format!("{max:.1}"),
        ])
    })
    .collect();
    if rows.is_empty() {
        return;
    }
    section(
        out,
        "Cold start",
        "Process start → first SERVING answer of `grpc.health.v1.Health/Check`, SQLite metering.",
        "database | runs | min ms | median ms | max ms",
        rows,
    );
}

pub fn usage(out: &mut String, r: &Results) {
    if r.usage.is_empty() {
        return;
    }
    let rows = r
        .usage
        .iter()
        .map(|u| {
            vec![
                u.metering.clone(),
                u.records.to_string(),
                format!("{:.1}", u.seed_s),
                u.group_by.clone(),
                u.calls.to_string(),
                format!("{:.1}", u.p50_ms),
                format!("{:.1}", u.p95_ms),
                format!("{:.1}", u.max_ms),
            ]
        })
        .collect();
    section(
        out,
        "GetUsage",
        "A team's records this month written straight into the database (the rollup trigger runs for each), \
         then GetUsage of the month called one at a time, client-side latency.",
        "backend | records | write s | group by | calls | p50 ms | p95 ms | max ms",
        rows,
    );
}

/// The cluster scenario: each round, then `[cluster]` on against off by
/// the medians of their rounds.
pub fn cluster(out: &mut String, r: &Results) {
    if r.cluster.is_empty() {
        return;
    }
    let rows = r
        .cluster
        .iter()
        .map(|c| {
            let q = &c.step.latency_us;
            vec![
                (c.round + 1).to_string(),
                if c.cluster { "on" } else { "off" }.into(),
                format!("{:.0}", c.step.achieved_rps),
                format!("{:.2}", q.p50 / 1000.0),
                format!("{:.2}", q.p99 / 1000.0),
                opt(c.cpu_s_per_1k_both, 3),
                opt(c.redis_cpu_s_per_1k, 3),
                opt(c.saturation.highest_passing_rps, 0),
            ]
        })
        .collect();
    let median = |on: bool, f: &dyn Fn(&crate::report::ClusterRound) -> Option<f64>| {
        let v: Vec<f64> = r
            .cluster
            .iter()
            .filter(|c| c.cluster == on)
            .filter_map(f)
            .collect();
        summary(&v).map(|(_, m, _)| m)
    };
    let sat = |c: &crate::report::ClusterRound| c.saturation.highest_passing_rps.or(Some(0.0));
    let p50 = |c: &crate::report::ClusterRound| Some(c.step.latency_us.p50);
    let verdict = match (
        median(true, &sat),
        median(false, &sat),
        median(true, &p50),
        median(false, &p50),
    ) {
        (Some(s_on), Some(s_off), Some(l_on), Some(l_off)) if s_off > 0.0 => format!(
            "Medians: saturation with `[cluster]` **{:.2}×** without (goal ≥ 0.8×); p50 at the fixed rate **{:+.2} ms** (goal ≤ +0.3 ms).",
            s_on / s_off,
            (l_on - l_off) / 1000.0
        ),
        _ => "Medians: not enough rounds on both sides to compare.".into(),
    };
    section(
        out,
        "Cluster: two replicas, one Redis (issue #44)",
        &format!(
            "Two servers (metering off) share the load; `[cluster]` on one Redis or not, in alternated rounds. `Execute` at a fixed rate, then a saturation sweep. CPU is both replicas' per 1,000 calls, and Redis's. {verdict}"
        ),
        "round | cluster | achieved rps | p50 ms | p99 ms | CPU s/1k (both) | Redis CPU s/1k | saturation rps",
        rows,
    );
}

pub fn processes(out: &mut String, r: &Results) {
    if r.groups.is_empty() {
        return;
    }
    let rows = r.groups.iter().map(|g| {
        vec![
            g.purpose.clone(),
            g.metering.clone(),
            g.upstream_latency_ms.to_string(),
            opt(g.cold_start_ms, 1),
            opt(g.peak_rss_mb, 1),
            g.clean_exit
                .map_or("–", |c| if c { "yes" } else { "no" })
                .into(),
            g.skipped.clone().unwrap_or_default(),
        ]
    });
    let _ = writeln!(out, "## Server processes\n");
    table(
        out,
        "purpose | metering | upstream ms | cold start ms | peak RSS MiB | clean exit | skipped",
        rows.collect(),
    );
}

pub fn quiet_waits(out: &mut String, r: &Results) {
    if r.quiet_waits.is_empty() {
        return;
    }
    let list = |v: &[f64]| {
        let cells: Vec<String> = v.iter().map(|p| ms(*p)).collect();
        cells.join(", ")
    };
    let rows = r.quiet_waits.iter().map(|w| {
        vec![
            w.before.clone(),
            list(&w.probe_p99_us),
            list(&w.probe_sync_p99_us),
            if w.quiet { "yes" } else { "no (gave up)" }.into(),
            format!("{:.0}", w.waited_s),
        ]
    });
    section(
        out,
        "Quiet waits",
        "Before each server's fixed-rate steps (`--wait-quiet`): 2 s probes at 1,000 rps straight to the \
         fake upstream, each followed by 400 `fdatasync`s of 16 KiB rewrites in the scratch folder, until \
         both p99s were at most their thresholds.",
        "before | probe p99s (ms) | disk sync p99s (ms) | quiet | waited s",
        rows.collect(),
    );
}
