//! Saturation: `Execute` at 0 ms upstream (and `InvokeTool` of
//! `system.echo`, when asked), the rate raised ×1.25 per step until a step
//! fails the criteria, then bisected between the last passing and the
//! first failing rate. Each sweep runs `--saturation-repeats` times on the
//! same server, the RPCs taking turns so that their ratio is read within
//! one stretch of the host's noise, the server idle again before each step
//! that follows a failed one; the targets read the median of the sweeps.

use crate::{
    bench::{Bench, Live},
    report::{Saturation, Step},
    target::Rpc,
};
use std::time::Duration;

/// A step passes when it achieves at least this share of the offered rate,
const MIN_ACHIEVED_SHARE: f64 = 0.95;
/// at most this share of errors,
const MAX_ERROR_SHARE: f64 = 0.01;
/// and a p99 of at most this, µs.
const MAX_P99_US: f64 = 100_000.0;
/// Least pause after a step that overloaded the server,
const REFINE_PAUSE: Duration = Duration::from_secs(2);
/// then the server must have been idle this long (its CPU below
/// [`IDLE_CPU_SHARE`] of a core in each of [`IDLE_TICKS`] ticks):
const IDLE_TICK: Duration = Duration::from_millis(250);
const IDLE_TICKS: u32 = 4;
/// well above what an idle server spends (metrics upkeep, the WAL sync
/// thread of `"normal"` durability) and far below draining a queue;
const IDLE_CPU_SHARE: f64 = 0.05;
/// waiting at most this long.
const RECOVERY_MAX: Duration = Duration::from_secs(30);

/// Every sweep on `live`, an idle wait between them.
pub async fn sweeps(bench: &mut Bench, live: &Live, latency_ms: u64) -> anyhow::Result<()> {
    let rpcs = bench.settings.sat_rpcs.clone();
    for repeat in 0..bench.settings.sat_repeats {
        for (i, &rpc) in rpcs.iter().enumerate() {
            if repeat > 0 || i > 0 {
                // The previous sweep ended on overloaded steps.
                recover(live).await;
            }
            sweep(bench, live, latency_ms, rpc, repeat).await?;
        }
    }
    Ok(())
}

/// One sweep, recorded in the results.
async fn sweep(
    bench: &mut Bench,
    live: &Live,
    latency_ms: u64,
    rpc: Rpc,
    repeat: usize,
) -> anyhow::Result<()> {
    let (sat, steps) = measure(bench, live, latency_ms, rpc, repeat).await?;
    bench.results.saturation_steps.extend(steps);
    bench.results.saturation.push(sat);
    Ok(())
}

/// Raises the rate until a step fails, then bisects (geometrically)
/// `sat_refine` times: the ×1.25 ladder alone leaves the answer uncertain
/// by up to 25 %. The sweep and its steps, for the caller to record.
pub async fn measure(
    bench: &Bench,
    live: &Live,
    latency_ms: u64,
    rpc: Rpc,
    repeat: usize,
) -> anyhow::Result<(Saturation, Vec<Step>)> {
    let mut sat = Saturation {
        metering: live.mode(),
        repeat: u32::try_from(repeat).unwrap_or(u32::MAX),
        rpc: rpc.name().into(),
        upstream_latency_ms: latency_ms,
        ..Saturation::default()
    };
    let mut steps = Vec::new();
    let mut rate = bench.settings.sat_start;
    for _ in 0..bench.settings.sat_max_steps {
        if !step(bench, live, latency_ms, rpc, rate, &mut sat, &mut steps).await? {
            break;
        }
        rate = (rate * bench.settings.sat_factor).round();
    }
    for _ in 0..bench.settings.sat_refine {
        let (Some(lo), Some(hi)) = (sat.highest_passing_rps, sat.first_failing_rps) else {
            break;
        };
        let mid = (lo * hi).sqrt().round();
        if mid <= lo || mid >= hi {
            break;
        }
        // A step must not inherit the failed one's queue, and a fixed
        // pause cannot tell when that has drained: measure again only once
        // the server is idle.
        recover(live).await;
        step(bench, live, latency_ms, rpc, mid, &mut sat, &mut steps).await?;
    }
    Ok((sat, steps))
}

/// One step at `rate`, recorded in `sat` and `steps`: true when it passed.
async fn step(
    bench: &Bench,
    live: &Live,
    latency_ms: u64,
    rpc: Rpc,
    rate: f64,
    sat: &mut Saturation,
    steps: &mut Vec<Step>,
) -> anyhow::Result<bool> {
    let duration = bench.settings.sat_duration;
    let mut step = bench
        .grpc_step(live, rpc, latency_ms, "saturation", rate, duration)
        .await?;
    let why = failure(&step);
    step.passed = Some(why.is_none());
    let achieved = step.achieved_rps;
    steps.push(step);
    match why {
        None if sat.highest_passing_rps.is_none_or(|r| r < rate) => {
            sat.highest_passing_rps = Some(rate);
            sat.achieved_rps = Some(achieved);
        }
        None => {}
        Some(why) => {
            if sat.first_failing_rps.is_none_or(|r| r > rate) {
                sat.first_failing_rps = Some(rate);
                sat.failed_because = Some(why);
            }
            return Ok(false);
        }
    }
    Ok(true)
}

/// Why a step fails the criteria, if it does.
fn failure(step: &Step) -> Option<String> {
    let error_share = step.errors as f64 / step.sent.max(1) as f64;
    if step.achieved_rps < MIN_ACHIEVED_SHARE * step.offered_rps {
        Some(format!(
            "achieved {:.0} < 95 % of offered",
            step.achieved_rps
        ))
    } else if error_share > MAX_ERROR_SHARE {
        Some(format!(
            "{:.1} % errors {:?}",
            error_share * 100.0,
            step.errors_by_code
        ))
    } else if step.latency_us.p99 > MAX_P99_US {
        Some(format!(
            "p99 {:.0} ms > 100 ms",
            step.latency_us.p99 / 1000.0
        ))
    } else {
        None
    }
}

/// Waits [`REFINE_PAUSE`], then until the server has been idle for
/// [`IDLE_TICKS`] ticks in a row, or [`RECOVERY_MAX`] has passed.
pub async fn recover(live: &Live) {
    let started = tokio::time::Instant::now();
    tokio::time::sleep(REFINE_PAUSE).await;
    let Ok(mut last) = live.server.cpu_seconds() else {
        return;
    };
    let mut quiet = 0;
    while quiet < IDLE_TICKS && started.elapsed() < RECOVERY_MAX {
        tokio::time::sleep(IDLE_TICK).await;
        let Ok(now) = live.server.cpu_seconds() else {
            return;
        };
        let busy = (now - last) / IDLE_TICK.as_secs_f64();
        quiet = if busy < IDLE_CPU_SHARE { quiet + 1 } else { 0 };
        last = now;
    }
    tracing::info!(
        waited_s = started.elapsed().as_secs_f64(),
        idle = quiet >= IDLE_TICKS,
        "server recovered before the next saturation step"
    );
}
