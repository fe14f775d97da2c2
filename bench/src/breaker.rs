//! The breaker scenario: a chain whose primary answers 500 until its breaker
//! opens, then is skipped with no network call while the fallback serves.
//! Measured against a chain that goes straight to the healthy provider on
//! the same server, at the same rate: the difference is what the fast-fail
//! path adds.

use crate::{
    bench::{Bench, Live},
    report::{Breaker, Step},
    server::{BREAKER_TASK, BROKEN_PROVIDER, HEALTHY_TASK, Metering},
    target::{self, Expect, Rpc},
};
use ai_orchestrator::api::pb;
use std::time::Duration;

/// Most calls sent to open the breaker before giving up.
const MAX_TRIP_CALLS: u64 = 100;

/// Runs the scenario at `--breaker-rate` (SQLite metering).
pub async fn run(bench: &mut Bench) -> anyhow::Result<()> {
    let Some(live) = bench.start(Metering::Sqlite, 0, "breaker", None).await else {
        return Ok(());
    };
    let rate = bench.settings.breaker_rate;
    let outcome = measure(bench, &live, rate).await;
    bench.stop(live).await;
    bench.results.breaker = Some(outcome?);
    Ok(())
}

async fn measure(bench: &Bench, live: &Live, rate: f64) -> anyhow::Result<Breaker> {
    let timeout = bench.settings.timeout;
    let healthy = || {
        target::grpc(
            live.clients.clone(),
            Rpc::Execute,
            HEALTHY_TASK,
            Expect::Primary,
            timeout,
        )
    };
    let fast_fail = || {
        target::grpc(
            live.clients.clone(),
            Rpc::Execute,
            BREAKER_TASK,
            Expect::Degraded,
            timeout,
        )
    };
    crate::loadgen::run(
        bench.plan(rate.min(200.0), bench.settings.warmup),
        healthy(),
    )
    .await?;

    // Trip the breaker with sequential calls (each still served by the fallback).
    let broken_before = bench.upstream.error_calls();
    let mut calls = 0;
    let mut client = live.clients[0].clone();
    while !is_open(&mut client).await? {
        anyhow::ensure!(
            calls < MAX_TRIP_CALLS,
            "the breaker did not open after {calls} calls"
        );
        let request = pb::ExecuteRequest {
            context: Some(pb::RequestContext {
                team_id: "bench-breaker".into(),
                ..Default::default()
            }),
            task: BREAKER_TASK.into(),
            input: Some(pb::execute_request::Input::InputJson(
                target::BRIEF_INPUT.into(),
            )),
            budget: None,
        };
        // The fallback answers; a failure here is only counted.
        let _ = tokio::time::timeout(Duration::from_secs(30), client.execute(request)).await;
        calls += 1;
    }
    let broken_to_open = bench.upstream.error_calls() - broken_before;
    tracing::info!(calls, broken_to_open, "breaker OPEN");

    let step = |task: &str| Step {
        kind: "breaker".into(),
        rpc: Rpc::Execute.name().into(),
        via: "orchestrator".into(),
        metering: Metering::Sqlite.name().into(),
        task: task.into(),
        upstream_latency_ms: 0,
        ..Step::default()
    };
    let plan = bench.plan(rate, bench.settings.duration);
    let before = bench.upstream.error_calls();
    let healthy = bench
        .measure(Some(live), plan, healthy(), step(HEALTHY_TASK))
        .await?;
    let fast_fail = bench
        .measure(Some(live), plan, fast_fail(), step(BREAKER_TASK))
        .await?;
    let while_open = bench.upstream.error_calls() - before;
    Ok(Breaker {
        calls_to_open: calls,
        broken_upstream_calls_while_open: while_open,
        healthy: Some(healthy),
        fast_fail: Some(fast_fail),
    })
}

async fn is_open(client: &mut crate::target::Client) -> anyhow::Result<bool> {
    let health = client
        .get_provider_health(pb::GetProviderHealthRequest {})
        .await?
        .into_inner();
    Ok(health
        .providers
        .iter()
        .any(|p| p.provider == BROKEN_PROVIDER && p.state == pb::BreakerState::Open as i32))
}
