//! Checks a results file read back: it parses, has the parts the run was
//! asked for, and its numbers hold together. A broken run fails here (the
//! bench exits non-zero); a slow one never does.

use super::{Results, SCHEMA_VERSION, Step, saturation_rates_of};
use anyhow::{Context, ensure};

/// Validates `json`. With `strict` (smoke runs), every step must have
/// successes and every metered step its ledger figures.
pub fn validate(json: &str, strict: bool) -> anyhow::Result<Results> {
    let r: Results = serde_json::from_str(json)?;
    ensure!(
        r.schema_version == SCHEMA_VERSION,
        "schema_version {} (expected {SCHEMA_VERSION})",
        r.schema_version
    );
    ensure!(r.machine.is_some(), "no machine facts");
    let steps: Vec<&Step> = r.all_steps().collect();
    // A run of scenarios without steps (`--scenarios usage`) measured
    // something else; a run with none of anything measured nothing.
    ensure!(
        !steps.is_empty()
            || !r.usage.is_empty()
            || !r.cold_start.fresh_db_ms.is_empty()
            || !r.cluster.is_empty(),
        "no load steps were run"
    );
    for s in steps
        .iter()
        .copied()
        .chain(r.cluster.iter().map(|c| &c.step))
    {
        step(s, strict)?;
    }
    ensure!(
        steps.is_empty() || steps.iter().any(|s| s.ok > 0),
        "every request failed"
    );
    sweeps(&r)?;
    quiet_waits(&r)?;
    paired(&r)?;
    breaker(&r)?;
    Ok(r)
}

fn step(s: &Step, strict: bool) -> anyhow::Result<()> {
    ensure!(s.sent > 0, "a {} {} step sent nothing", s.via, s.rpc);
    ensure!(
        s.ok + s.errors >= s.sent,
        "a {} {} step lost track of requests",
        s.via,
        s.rpc
    );
    let q = &s.latency_us;
    ensure!(
        [q.p50, q.p90, q.p99, q.p999, s.achieved_rps]
            .iter()
            .all(|v| v.is_finite() && *v >= 0.0),
        "non-finite numbers in a {} {} step",
        s.via,
        s.rpc
    );
    ensure!(
        q.p50 <= q.p90 && q.p90 <= q.p99 && q.p99 <= q.p999,
        "quantiles out of order"
    );
    if strict {
        ensure!(
            s.ok > 0,
            "every request of a {} {} step ({} metering, {} rps) failed: {:?}",
            s.via,
            s.rpc,
            s.metering,
            s.offered_rps,
            s.errors_by_code
        );
        // A metered server's calls went through its ledger writer: no
        // ledger figures means the scrape no longer reads its
        // `usage_ledger_*` series. A refused call's reply does not wait for
        // its settlement, nor do an agent turn's calls (its end does, ADR
        // 0018), but their records are committed.
        // `off/audit-calls-off` is metering off too.
        let unmetered = s.metering.split('/').next() == Some("off");
        let metered = s.via == "orchestrator" && !unmetered;
        let queued = s.kind == "refused" || s.rpc == "Converse";
        let figures = s.ledger.is_some_and(|l| {
            let waited = l.settle_wait_us.is_some();
            waited || (queued && l.commit_us.is_some())
        });
        ensure!(
            !metered || figures,
            "a {} {} step ({} metering) has no ledger figures",
            s.via,
            s.rpc,
            s.metering
        );
    }
    Ok(())
}

/// A mode that saturated at all ran every sweep it was asked for.
fn sweeps(r: &Results) -> anyhow::Result<()> {
    let Some(repeats) = r.settings["saturation"]["repeats"].as_u64() else {
        return Ok(());
    };
    for s in &r.saturation {
        let sweeps = saturation_rates_of(r, &s.metering, &s.rpc).len() as u64;
        ensure!(
            sweeps == repeats,
            "{} metering ran {sweeps} {} saturation sweeps, not {repeats}",
            s.metering,
            s.rpc
        );
    }
    Ok(())
}

/// Asked to wait for a quiet host: every server that ran fixed rates was
/// probed first, and every probe of the cores has its disk probe.
fn quiet_waits(r: &Results) -> anyhow::Result<()> {
    if !r.settings["wait_quiet"].is_object() {
        return Ok(());
    }
    let servers = r
        .groups
        .iter()
        .filter(|g| g.purpose == "load" && g.skipped.is_none())
        .count();
    ensure!(
        r.quiet_waits.len() >= servers,
        "{} quiet waits for {servers} servers",
        r.quiet_waits.len()
    );
    for w in &r.quiet_waits {
        ensure!(
            !w.probe_p99_us.is_empty() && w.probe_p99_us.iter().all(|p| p.is_finite()),
            "a quiet wait without a valid probe"
        );
        ensure!(
            w.probe_sync_p99_us.len() == w.probe_p99_us.len()
                && w.probe_sync_p99_us.iter().all(|p| p.is_finite()),
            "a quiet wait without a valid disk probe"
        );
    }
    Ok(())
}

/// Asked for paired rounds: every server started at the lowest upstream
/// latency for fixed rates ran them all (so a run that skipped them all
/// fails too), and each round's added latency is the difference of its
/// own two steps.
fn paired(r: &Results) -> anyhow::Result<()> {
    let Some(rounds) = r.settings["paired"]["rounds"].as_u64() else {
        return Ok(());
    };
    let lowest = r.settings["upstream_latency_ms"]
        .as_array()
        .and_then(|l| l.iter().filter_map(serde_json::Value::as_u64).min());
    let mut modes: Vec<&str> = r
        .groups
        .iter()
        .filter(|g| {
            g.purpose == "load" && g.skipped.is_none() && Some(g.upstream_latency_ms) == lowest
        })
        .map(|g| g.metering.as_str())
        .chain(r.paired.iter().map(|p| p.metering.as_str()))
        .collect();
    modes.sort_unstable();
    modes.dedup();
    for mode in modes {
        let n = r.paired.iter().filter(|p| p.metering == mode).count() as u64;
        ensure!(
            n == rounds,
            "{mode} metering ran {n} paired rounds, not {rounds}"
        );
    }
    for p in &r.paired {
        let (d, o) = (&p.direct, &p.orchestrator);
        let round = format!("paired round {} of {} metering", p.round, p.metering);
        ensure!(
            d.via == "direct" && o.via == "orchestrator",
            "{round} is not a direct and an orchestrator step"
        );
        ensure!(
            d.rpc == p.rpc && o.rpc == p.rpc && d.offered_rps == o.offered_rps,
            "{round} mixes RPCs or rates"
        );
        let added = o
            .added_latency_us
            .with_context(|| format!("{round} without its added latency"))?;
        ensure!(
            added == o.latency_us.minus(&d.latency_us),
            "{round}: added latency is not orchestrator minus direct"
        );
    }
    Ok(())
}

/// The breaker scenario: no call past an open breaker reached the broken
/// provider, and every server it started measured its refused calls.
fn breaker(r: &Results) -> anyhow::Result<()> {
    let refused = r.breaker.iter().flat_map(|b| &b.refused);
    for x in refused.clone() {
        ensure!(
            x.broken_upstream_calls == 0 && x.step.callers > 0,
            "refused calls with {} metering: {} provider calls, {} callers",
            x.metering,
            x.broken_upstream_calls,
            x.step.callers
        );
    }
    if let Some(b) = &r.breaker {
        ensure!(
            b.broken_upstream_calls_while_open == 0,
            "the broken provider was called {} times while its breaker was open",
            b.broken_upstream_calls_while_open
        );
    }
    for g in r
        .groups
        .iter()
        .filter(|g| g.purpose == "breaker" && g.skipped.is_none())
    {
        ensure!(
            refused.clone().any(|x| x.metering == g.metering),
            "the breaker scenario's {} server measured no refused calls",
            g.metering
        );
    }
    Ok(())
}
