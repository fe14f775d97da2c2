//! The long-calls scenario: LLM calls last seconds, so a gateway holds many
//! calls at once, and its memory per call in flight sizes a replica. The
//! fake upstream answers after a long fixed latency (1 s by default) and
//! `Execute` runs at a few rates: by Little's law each rate holds about
//! `rate × latency` calls in flight. The slope of resident memory between
//! the lowest and highest step is the memory a call in flight costs.

use crate::{
    bench::{Bench, Live},
    report::{InFlight, Step},
    server::Metering,
    target::Rpc,
};

/// Runs the scenario (SQLite metering, the default).
pub async fn run(bench: &mut Bench) -> anyhow::Result<()> {
    let latency_ms = bench.settings.inflight_latency_ms;
    let rates = bench.settings.inflight_rates.clone();
    let Some(live) = bench
        .start(Metering::Sqlite, latency_ms, "in flight", None)
        .await
    else {
        return Ok(());
    };
    let outcome = measure(bench, &live, latency_ms, &rates).await;
    bench.stop(live).await;
    bench.results.in_flight = Some(summarize(latency_ms, outcome?));
    Ok(())
}

async fn measure(
    bench: &Bench,
    live: &Live,
    latency_ms: u64,
    rates: &[f64],
) -> anyhow::Result<Vec<Step>> {
    bench.warm_up(live, &[Rpc::Execute]).await?;
    let mut steps = Vec::with_capacity(rates.len());
    for &rate in rates {
        let step = bench
            .grpc_step(
                live,
                Rpc::Execute,
                latency_ms,
                "in flight",
                rate,
                bench.settings.duration,
            )
            .await?;
        steps.push(step);
    }
    Ok(steps)
}

/// Calls in flight per step and the memory slope between the first and
/// last step.
pub fn summarize(latency_ms: u64, steps: Vec<Step>) -> InFlight {
    // Little's law in the steady state: the successful arrivals per second
    // (the offered rate, less failures) × seconds each. Not the achieved
    // rate: it spreads the answers over the send window plus the last
    // calls' latency, which a one-second call makes a large share.
    let calls_in_flight: Vec<f64> = steps
        .iter()
        .map(|s| {
            let ok_share = if s.sent == 0 {
                0.0
            } else {
                s.ok as f64 / s.sent as f64
            };
            s.offered_rps * ok_share * s.latency_us.mean / 1e6
        })
        .collect();
    let kib_per_call = match (
        steps.first().zip(calls_in_flight.first()),
        steps.last().zip(calls_in_flight.last()),
    ) {
        (Some((lo, n_lo)), Some((hi, n_hi))) if n_hi - n_lo >= 1.0 => lo
            .server_rss_mb
            .zip(hi.server_rss_mb)
            .map(|(m_lo, m_hi)| (m_hi - m_lo) * 1024.0 / (n_hi - n_lo)),
        _ => None,
    };
    InFlight {
        upstream_latency_ms: latency_ms,
        steps,
        calls_in_flight,
        kib_per_call,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::Quantiles;

    fn step(offered_rps: f64, mean_ms: f64, rss_mb: f64) -> Step {
        Step {
            offered_rps,
            sent: 1000,
            ok: 1000,
            latency_us: Quantiles {
                mean: mean_ms * 1000.0,
                ..Quantiles::default()
            },
            server_rss_mb: Some(rss_mb),
            ..Step::default()
        }
    }

    #[test]
    fn slope_of_memory_over_calls_in_flight() {
        let s = summarize(
            1000,
            vec![step(100.0, 1000.0, 20.0), step(800.0, 1005.0, 48.0)],
        );
        assert_eq!(s.calls_in_flight.len(), 2);
        assert!((s.calls_in_flight[1] - 804.0).abs() < 1e-9);
        // 28 MiB over 704 more calls.
        let kib = s.kib_per_call.unwrap();
        assert!((kib - 28.0 * 1024.0 / 704.0).abs() < 1e-9, "{kib}");
    }

    #[test]
    fn no_slope_without_a_spread() {
        assert_eq!(
            summarize(1000, vec![step(100.0, 1000.0, 20.0)]).kib_per_call,
            None
        );
        assert_eq!(summarize(1000, Vec::new()).kib_per_call, None);
    }
}
