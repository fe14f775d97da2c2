//! `--wait-quiet`: before a server's fixed-rate steps, probe the host until
//! a direct step at 1,000 rps has a p99 of at most `--quiet-p99-ms` and the
//! disk's sync p99 ([`disk`]) is at most `--quiet-sync-p99-ms`, or the wait
//! runs out. The neighbours of a shared VM come and go by the minute, and
//! the p99 target is judged at a rate where they decide the tail; the load
//! average only sees this VM.

use crate::{
    bench::Bench,
    disk,
    report::{Quantiles, QuietWait, Step},
    settings::Quiet,
    target::{self, Rpc},
    upstream::Kind,
};
use anyhow::Context;
use std::time::{Duration, Instant};

/// Rate and length of one probe: the rate the p99 target is judged at,
/// long enough for a p99 of 2,000 calls.
const PROBE_RPS: f64 = 1000.0;
const PROBE: Duration = Duration::from_secs(2);
/// Pause between probes while the host is busy.
const PAUSE: Duration = Duration::from_secs(10);

/// Probes until quiet or `quiet.max_wait` has passed; records the probes.
pub async fn wait(bench: &mut Bench, quiet: Quiet, before: &str) -> anyhow::Result<()> {
    let url = format!(
        "{}/chat/completions",
        bench.upstream.base_url("ok-0", bench.settings.upstream)
    );
    let Some(body) = bench.upstream.sample(Kind::Execute) else {
        bench.results.notes.push(format!(
            "no quiet probe before {before}: no request to replay"
        ));
        return Ok(());
    };
    let started = Instant::now();
    let mut wait = QuietWait {
        before: before.to_owned(),
        ..QuietWait::default()
    };
    loop {
        let make = target::direct(bench.direct_http.clone(), url.clone(), body.clone());
        let probe = Step {
            kind: "quiet-probe".into(),
            rpc: Rpc::Execute.name().into(),
            via: "direct".into(),
            metering: "none".into(),
            ..Step::default()
        };
        let probe = bench
            .measure(None, bench.plan(PROBE_RPS, PROBE), make, probe)
            .await?;
        wait.probe_p99_us.push(probe.latency_us.p99);
        let dir = bench.settings.dir.clone();
        let syncs =
            tokio::task::spawn_blocking(move || disk::sync_probe(&dir, disk::SYNCS, disk::PAUSE))
                .await?
                .context("disk probe in the scratch folder")?;
        let sync_p99 = Quantiles::of(&syncs).p99;
        wait.probe_sync_p99_us.push(sync_p99);
        wait.quiet = probe.errors == 0
            && probe.latency_us.p99 <= quiet.p99_us
            && sync_p99 <= quiet.sync_p99_us;
        if wait.quiet || started.elapsed() + PAUSE > quiet.max_wait {
            break;
        }
        tracing::info!(
            p99_ms = probe.latency_us.p99 / 1000.0,
            sync_p99_ms = sync_p99 / 1000.0,
            "waiting for a quiet host"
        );
        tokio::time::sleep(PAUSE).await;
    }
    wait.waited_s = started.elapsed().as_secs_f64();
    bench.results.quiet_waits.push(wait);
    Ok(())
}
