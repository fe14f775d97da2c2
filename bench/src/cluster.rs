//! The fleet's shared limits (issue #44): two replicas behind one load, the
//! same config with `[cluster]` on one Redis and without, in alternated
//! rounds (off, on, on, off, …) so a drift of the host favours neither.
//! Each round: a warm-up, Execute at a fixed rate (latency, and CPU per
//! 1,000 calls over both replicas and Redis), and a saturation sweep, the
//! load spread over both replicas' connections. Metering is off, so what
//! differs is the shared limits alone: with `[cluster]`, every call's
//! `max_concurrency` lease is admitted and settled by the store's scripts.

use crate::{
    bench::{Bench, Live},
    report::ClusterRound,
    saturation,
    server::Metering,
    sys,
    target::Rpc,
};
use anyhow::Context;
use std::{process::Stdio, sync::Arc, time::Duration};
use tokio::process::{Child, Command};

/// Rounds: pairs of (off, on) in ABBA order.
const PAIRS: usize = 2;

/// A `redis-server` of the run's own, on a free port.
struct Redis {
    child: Child,
    port: u16,
}

impl Redis {
    async fn start(dir: &std::path::Path) -> anyhow::Result<Self> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .context("starting redis-server (Debian's redis-server package)")?;
        for _ in 0..200 {
            if tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .is_ok()
            {
                return Ok(Self { child, port });
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        anyhow::bail!("redis-server did not listen on port {port} within 5 s")
    }

    fn pid(&self) -> Option<i32> {
        self.child.id().and_then(|p| i32::try_from(p).ok())
    }

    /// Commands the store has processed (`INFO stats`, in RESP, on a
    /// connection of its own): what proves a round's calls went through it.
    async fn commands_processed(&self) -> anyhow::Result<u64> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut tcp = tokio::net::TcpStream::connect(("127.0.0.1", self.port)).await?;
        tcp.write_all(b"*2\r\n$4\r\nINFO\r\n$5\r\nstats\r\n")
            .await?;
        let mut answer = vec![0_u8; 8192];
        let n = tokio::time::timeout(Duration::from_secs(2), tcp.read(&mut answer)).await??;
        String::from_utf8_lossy(&answer[..n])
            .lines()
            .find_map(|l| l.strip_prefix("total_commands_processed:"))
            .and_then(|v| v.trim().parse().ok())
            .context("no total_commands_processed in INFO stats")
    }
}

/// Every round, then Redis stops.
pub async fn run(bench: &mut Bench) -> anyhow::Result<()> {
    let redis = Redis::start(&bench.settings.dir).await?;
    let order = (0..PAIRS).flat_map(|pair| {
        if pair % 2 == 0 {
            [false, true]
        } else {
            [true, false]
        }
    });
    let mut outcome = Ok(());
    for (round, on) in order.enumerate() {
        bench.config_extra = if on {
            format!(
                "\n[cluster]\nredis_url = \"redis://127.0.0.1:{}/0\"\nkey_prefix = \"bench{round}:\"\n",
                redis.port
            )
        } else {
            String::new()
        };
        outcome = one_round(bench, &redis, round, on).await;
        bench.config_extra.clear();
        if outcome.is_err() {
            break;
        }
    }
    drop(redis);
    outcome
}

async fn one_round(bench: &mut Bench, redis: &Redis, round: usize, on: bool) -> anyhow::Result<()> {
    let purpose = if on { "cluster-on" } else { "cluster-off" };
    let first = bench
        .start(Metering::Off, 0, purpose, None)
        .await
        .context("first replica")?;
    let Some(second) = bench.start(Metering::Off, 0, purpose, None).await else {
        bench.stop(first).await;
        anyhow::bail!("second replica not started");
    };
    let both = Live {
        clients: Arc::new(
            first
                .clients
                .iter()
                .chain(second.clients.iter())
                .cloned()
                .collect(),
        ),
        ..first
    };
    let measured = measure(bench, &both, &second, redis, round, on).await;
    bench.stop(both).await;
    bench.stop(second).await;
    bench.results.cluster.push(measured?);
    Ok(())
}

async fn measure(
    bench: &Bench,
    both: &Live,
    second: &Live,
    redis: &Redis,
    round: usize,
    on: bool,
) -> anyhow::Result<ClusterRound> {
    bench.warm_up(both, &[Rpc::Execute]).await?;
    let cpu = || -> anyhow::Result<(f64, f64)> {
        let replicas = both.server.cpu_seconds()? + second.server.cpu_seconds()?;
        let store = redis.pid().map_or(Ok(0.0), sys::cpu_seconds)?;
        Ok((replicas, store))
    };
    let rate = bench.settings.cluster_rate;
    let commands = redis.commands_processed().await?;
    let before = cpu()?;
    let step = bench
        .grpc_step(
            both,
            Rpc::Execute,
            0,
            "cluster",
            rate,
            bench.settings.duration,
        )
        .await?;
    let after = cpu()?;
    // Each call is admitted and settled by a script of the store's: a
    // round with `[cluster]` must show them, one without must not.
    let counted = redis.commands_processed().await?.saturating_sub(commands);
    anyhow::ensure!(
        if on {
            counted >= step.sent
        } else {
            counted < 10
        },
        "round {round}: the store processed {counted} commands for {} calls",
        step.sent
    );
    let sent = step.sent.max(1) as f64;
    let per_1k = |secs: f64| secs / (sent / 1000.0);
    saturation::recover(both).await;
    let (mut sat, _steps) = saturation::measure(bench, both, 0, Rpc::Execute, round).await?;
    sat.metering = if on { "cluster-on" } else { "cluster-off" }.into();
    Ok(ClusterRound {
        round: u32::try_from(round).unwrap_or(u32::MAX),
        cluster: on,
        step,
        cpu_s_per_1k_both: Some(per_1k(after.0 - before.0)),
        redis_cpu_s_per_1k: on.then(|| per_1k(after.1 - before.1)),
        saturation: sat,
    })
}
