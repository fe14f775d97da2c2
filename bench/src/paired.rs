//! Paired rounds: the p99 target's own measurement. Each round runs a step
//! straight to the fake upstream and a step through the orchestrator back
//! to back, at the same rate and with the same body, and the round's added
//! latency is the difference of those two steps.
//!
//! Why: the fixed-rate table compares a server's step with the direct step
//! run minutes earlier, at the start of the run. On a shared VM the
//! neighbours come and go by the minute, and at 1,000 rps they, not the
//! gateway, decide a 10 s step's p99; a noisy minute on either side moved
//! the added p99 by milliseconds. A round's two steps are seconds apart, the
//! order alternates between rounds (so neither side always runs on a
//! warmer or a later host), and several rounds give a median and a share
//! of rounds under the goal instead of one draw.

use crate::{
    bench::{Bench, Live},
    report::Pair,
    target::Rpc,
};
use std::time::Duration;

/// How the rounds run (`--paired-rounds`, `--paired-rate`,
/// `--paired-duration`).
#[derive(Debug, Clone, Copy)]
pub struct Rounds {
    /// Rounds per server; they take turns over the RPCs under test.
    pub rounds: usize,
    /// Offered rate of both steps, requests/s.
    pub rate: f64,
    /// Sending time of each step.
    pub duration: Duration,
}

/// Runs `plan.rounds` rounds against `live` (already warmed up for `rpcs`),
/// `rpcs` taking turns.
pub async fn run(
    bench: &Bench,
    live: &Live,
    latency_ms: u64,
    rpcs: &[Rpc],
    plan: Rounds,
) -> anyhow::Result<Vec<Pair>> {
    let mut pairs = Vec::with_capacity(plan.rounds);
    for (round, &rpc) in rpcs.iter().cycle().take(plan.rounds).enumerate() {
        let direct_first = round.is_multiple_of(2);
        let direct_step = || bench.direct_step(rpc, latency_ms, "paired", plan.rate, plan.duration);
        let server_step =
            || bench.grpc_step(live, rpc, latency_ms, "paired", plan.rate, plan.duration);
        let (direct, mut orchestrator) = if direct_first {
            let direct = direct_step().await?;
            (direct, server_step().await?)
        } else {
            let orchestrator = server_step().await?;
            (direct_step().await?, orchestrator)
        };
        orchestrator.added_latency_us = Some(orchestrator.latency_us.minus(&direct.latency_us));
        pairs.push(Pair {
            metering: live.mode(),
            rpc: rpc.name().into(),
            round: u32::try_from(round).unwrap_or(u32::MAX),
            direct_first,
            direct,
            orchestrator,
        });
    }
    Ok(pairs)
}
