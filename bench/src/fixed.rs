//! The fixed rates: one server per (metering mode, upstream latency),
//! warmed up, then driven at each rate for each RPC; the direct baseline
//! (the same bodies straight to the fake upstream) once per upstream
//! latency; and, at the lowest upstream latency, the paired rounds and the
//! saturation sweeps on the same server.

use crate::{
    bench::{Bench, Live},
    paired, quiet,
    report::{Results, Step},
    run::noted,
    saturation,
    server::{AuditCalls, Metering},
    target::Rpc,
};

/// Every server group the settings ask for.
pub async fn run(bench: &mut Bench) {
    let s = &bench.settings;
    if s.rpcs.is_empty() && !s.direct && !s.saturation && s.paired.is_none() {
        return;
    }
    let lowest = s.latencies.iter().copied().min();
    for metering in s.metering.clone() {
        for audit in bench.settings.audit_calls.clone() {
            bench.audit_calls = audit;
            for latency in bench.settings.latencies.clone() {
                let outcome = group(bench, metering, latency, Some(latency) == lowest).await;
                let what = format!("{} metering at {latency} ms", audit.label(metering));
                noted(bench, &what, outcome);
            }
        }
    }
    // The other scenarios run the product default.
    bench.audit_calls = AuditCalls::On;
}

/// One server: warm-up, quiet wait, direct baseline (once per upstream
/// latency), fixed rates for each RPC, then at the `lowest` upstream
/// latency the paired rounds and saturation when asked.
async fn group(
    bench: &mut Bench,
    metering: Metering,
    latency_ms: u64,
    lowest: bool,
) -> anyhow::Result<()> {
    let Some(live) = bench.start(metering, latency_ms, "load", None).await else {
        return Ok(());
    };
    let outcome = drive(bench, &live, latency_ms, lowest).await;
    bench.stop(live).await;
    outcome
}

async fn drive(
    bench: &mut Bench,
    live: &Live,
    latency_ms: u64,
    lowest: bool,
) -> anyhow::Result<()> {
    let saturation = bench.settings.saturation && lowest;
    let rounds = bench.settings.paired.filter(|_| lowest);
    let rpcs = bench.settings.rpcs.clone();
    // The paired rounds take turns over the fixed rates' RPCs, or run
    // Execute alone. InvokeTool has no upstream and a Converse turn
    // streams several calls, so neither has a direct step to pair; the
    // HTTP edge has one, but the rounds are the gRPC edge's p99 target.
    let with_upstream: Vec<Rpc> = rpcs
        .iter()
        .copied()
        .filter(|r| r.has_direct_baseline() && *r != Rpc::ChatHttp)
        .collect();
    let paired_rpcs = if with_upstream.is_empty() {
        vec![Rpc::Execute]
    } else {
        with_upstream
    };
    let mut warm = rpcs.clone();
    let mut need = |rpc: Rpc, when: bool| {
        if when && !warm.contains(&rpc) {
            warm.push(rpc);
        }
    };
    for &rpc in &paired_rpcs {
        need(rpc, rounds.is_some());
    }
    // The direct baseline replays bodies the orchestrator sent.
    need(Rpc::ClassifySms, bench.settings.direct);
    need(Rpc::Execute, bench.settings.direct || saturation);
    for &rpc in &bench.settings.sat_rpcs.clone() {
        need(rpc, saturation);
    }
    bench.warm_up(live, &warm).await?;
    if let Some(q) = bench.settings.quiet {
        let before = format!("{} metering, {latency_ms} ms upstream", live.mode());
        quiet::wait(bench, q, &before).await?;
    }
    if bench.settings.direct && !bench.direct_done.contains(&latency_ms) {
        bench.direct_done.push(latency_ms);
        direct(bench, latency_ms).await?;
    }
    // The RPCs take turns at each rate, so steps compared across RPCs
    // (the HTTP edge against gRPC's) are seconds apart on the host.
    for rate in bench.settings.rates.clone() {
        for &rpc in &rpcs {
            let duration = bench.settings.duration;
            let step = bench
                .grpc_step(live, rpc, latency_ms, "load", rate, duration)
                .await?;
            bench.results.steps.push(step);
        }
    }
    if let Some(rounds) = rounds {
        let pairs = paired::run(bench, live, latency_ms, &paired_rpcs, rounds).await?;
        bench.results.paired.extend(pairs);
    }
    if saturation {
        saturation::sweeps(bench, live, latency_ms).await?;
    }
    Ok(())
}

/// The same bodies straight to the fake upstream, at every fixed rate.
async fn direct(bench: &mut Bench, latency_ms: u64) -> anyhow::Result<()> {
    for rpc in [Rpc::Execute, Rpc::ClassifySms, Rpc::ChatHttp] {
        if !bench.settings.rpcs.contains(&rpc) {
            continue;
        }
        for rate in bench.settings.rates.clone() {
            let duration = bench.settings.duration;
            let step = bench
                .direct_step(rpc, latency_ms, "load", rate, duration)
                .await?;
            bench.results.steps.push(step);
        }
    }
    Ok(())
}

/// Fills `added_latency_us` of orchestrator steps from the direct step at
/// the same RPC, rate and upstream latency.
pub fn add_baselines(results: &mut Results) {
    let direct: Vec<Step> = results
        .steps
        .iter()
        .filter(|s| s.via == "direct")
        .cloned()
        .collect();
    let all = results
        .steps
        .iter_mut()
        .chain(results.saturation_steps.iter_mut());
    for s in all.filter(|s| s.via == "orchestrator") {
        s.added_latency_us = direct
            .iter()
            .find(|d| {
                d.rpc == s.rpc
                    && d.upstream_latency_ms == s.upstream_latency_ms
                    && d.offered_rps == s.offered_rps
            })
            .map(|d| s.latency_us.minus(&d.latency_us));
    }
}
