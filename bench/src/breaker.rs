//! The breaker scenario: what an open breaker costs a call.
//!
//! - *Fallback*: a chain whose primary answers 500 until its breaker opens,
//!   then is skipped with no network call while the fallback serves;
//!   measured against a chain straight to the healthy provider on the same
//!   server at the same rate (SQLite metering).
//! - *Refused*: a task whose only target is that open breaker, so every
//!   call is refused with UNAVAILABLE and no provider call at all; 200
//!   callers (closed loop), once with SQLite's full durability and once
//!   with metering off. Such a reply does not wait for the disk, so the
//!   two should be close.

use crate::{
    bench::{Bench, Live, Load},
    loadgen,
    report::{Breaker, Refused, Step},
    server::{BREAKER_ONLY_TASK, BREAKER_TASK, BROKEN_PROVIDER, HEALTHY_TASK, Metering},
    target::{self, Expect, Rpc},
};
use ai_orchestrator::api::pb;
use std::time::Duration;

/// Most calls sent to open the breaker before giving up.
const MAX_TRIP_CALLS: u64 = 100;

/// Runs the scenario: fallback and refused calls on a SQLite server,
/// refused calls on a server without metering.
pub async fn run(bench: &mut Bench) -> anyhow::Result<()> {
    if let Some(live) = bench.start(Metering::Sqlite, 0, "breaker", None).await {
        let outcome = async {
            let mut breaker = fallback(bench, &live).await?;
            breaker.refused.push(refused(bench, &live).await?);
            anyhow::Ok(breaker)
        }
        .await;
        bench.stop(live).await;
        bench.results.breaker = Some(outcome?);
    }
    let Some(live) = bench.start(Metering::Off, 0, "breaker", None).await else {
        return Ok(());
    };
    let outcome = async {
        warm_up(bench, &live).await?;
        trip(bench, &live).await?;
        refused(bench, &live).await
    }
    .await;
    bench.stop(live).await;
    let refused = outcome?;
    bench
        .results
        .breaker
        .get_or_insert_with(Breaker::default)
        .refused
        .push(refused);
    Ok(())
}

fn calls(bench: &Bench, live: &Live, task: &str, expect: Expect) -> loadgen::MakeRequest {
    let sending = bench.settings.sending();
    target::grpc(live.clients.clone(), Rpc::Execute, task, expect, sending)
}

fn step(kind: &str, live: &Live, task: &str) -> Step {
    Step {
        kind: kind.into(),
        rpc: Rpc::Execute.name().into(),
        via: "orchestrator".into(),
        metering: live.mode(),
        task: task.into(),
        ..Step::default()
    }
}

async fn warm_up(bench: &Bench, live: &Live) -> anyhow::Result<()> {
    let rate = bench.settings.breaker_rate.min(200.0);
    let make = calls(bench, live, HEALTHY_TASK, Expect::Primary);
    loadgen::run(bench.plan(rate, bench.settings.warmup), make).await?;
    Ok(())
}

/// The fallback past the open primary against the healthy chain.
async fn fallback(bench: &Bench, live: &Live) -> anyhow::Result<Breaker> {
    warm_up(bench, live).await?;
    let calls_to_open = trip(bench, live).await?;
    let plan = bench.plan(bench.settings.breaker_rate, bench.settings.duration);
    let before = bench.upstream.error_calls();
    let healthy = bench
        .measure(
            Some(live),
            plan,
            calls(bench, live, HEALTHY_TASK, Expect::Primary),
            step("breaker", live, HEALTHY_TASK),
        )
        .await?;
    let fast_fail = bench
        .measure(
            Some(live),
            plan,
            calls(bench, live, BREAKER_TASK, Expect::Degraded),
            step("breaker", live, BREAKER_TASK),
        )
        .await?;
    Ok(Breaker {
        calls_to_open,
        broken_upstream_calls_while_open: bench.upstream.error_calls() - before,
        healthy: Some(healthy),
        fast_fail: Some(fast_fail),
        refused: Vec::new(),
    })
}

/// `--breaker-callers` calls in flight to the task whose only target is
/// open, after an unmeasured warm-up of the same.
async fn refused(bench: &Bench, live: &Live) -> anyhow::Result<Refused> {
    let callers = bench.settings.breaker_callers;
    let refusals = || calls(bench, live, BREAKER_ONLY_TASK, Expect::Refused);
    let warm_up = Load::Closed {
        callers,
        duration: bench.settings.warmup,
    };
    let unmeasured = step("refused", live, BREAKER_ONLY_TASK);
    bench
        .measure(Some(live), warm_up, refusals(), unmeasured)
        .await?;
    let load = Load::Closed {
        callers,
        duration: bench.settings.duration,
    };
    let before = bench.upstream.error_calls();
    let step = bench
        .measure(
            Some(live),
            load,
            refusals(),
            step("refused", live, BREAKER_ONLY_TASK),
        )
        .await?;
    Ok(Refused {
        metering: live.mode(),
        broken_upstream_calls: bench.upstream.error_calls() - before,
        step,
    })
}

/// Opens the broken provider's breaker with sequential calls through the
/// fallback chain (each still served by the fallback); returns the calls
/// it took.
async fn trip(bench: &Bench, live: &Live) -> anyhow::Result<u64> {
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
            prompt_key: String::new(),
        };
        // The fallback answers; a failure here is only counted.
        let _ = tokio::time::timeout(Duration::from_secs(30), client.execute(request)).await;
        calls += 1;
    }
    let broken = bench.upstream.error_calls() - broken_before;
    tracing::info!(
        calls,
        broken,
        metering = %live.mode(),
        "breaker OPEN"
    );
    Ok(calls)
}

async fn is_open(client: &mut target::Client) -> anyhow::Result<bool> {
    let health = client
        .get_provider_health(pb::GetProviderHealthRequest {})
        .await?
        .into_inner();
    Ok(health
        .providers
        .iter()
        .any(|p| p.provider == BROKEN_PROVIDER && p.state == pb::BreakerState::Open as i32))
}
