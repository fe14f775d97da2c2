//! The run: one server process per (metering mode, upstream latency), each
//! warmed up then driven at the fixed rates (and, at 0 ms upstream, up to
//! saturation); the direct baseline; start-up times. Every number of a step
//! is taken as a before/after difference around that step alone.

use crate::{
    disk,
    loadgen::{self, MakeRequest, Plan},
    paired, prom,
    report::{
        ColdStart, Group, LedgerView, Quantiles, QuietWait, Results, Saturation, ServerOverhead,
        Step,
    },
    server::{self, Metering, PgDatabase, Server},
    sys,
    target::{self, Expect, Rpc},
    upstream::{Kind, Upstream},
};
use anyhow::Context;
use std::{
    collections::BTreeSet,
    path::PathBuf,
    sync::Arc,
    time::{Duration, Instant},
};

/// What to run and how hard.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Orchestrator binary.
    pub server_bin: PathBuf,
    /// Fixed rates, requests/s.
    pub rates: Vec<f64>,
    /// Sending time of a fixed-rate step.
    pub duration: Duration,
    /// Load before measuring, per RPC, on each new server.
    pub warmup: Duration,
    /// Fake upstream latencies, ms.
    pub latencies: Vec<u64>,
    /// Metering modes.
    pub metering: Vec<Metering>,
    /// RPCs at fixed rates.
    pub rpcs: Vec<Rpc>,
    /// Run the direct baseline.
    pub direct: bool,
    /// Run the saturation sweep (Execute, lowest upstream latency).
    pub saturation: bool,
    /// Speak plaintext HTTP/2 (prior knowledge) to the fake upstream, from
    /// the orchestrator and from the direct baseline.
    pub upstream_http2: bool,
    /// HTTP/2 connections to the server.
    pub connections: usize,
    /// In-flight cap of the load generator.
    pub max_inflight: usize,
    /// Client-side timeout of one request.
    pub timeout: Duration,
    /// First saturation rate.
    pub sat_start: f64,
    /// Rate multiplier between saturation steps.
    pub sat_factor: f64,
    /// Most saturation steps.
    pub sat_max_steps: usize,
    /// Bisection steps between the last passing and the first failing rate.
    pub sat_refine: usize,
    /// Sweeps per server: one run on a shared host cannot judge a target,
    /// so targets read the median of these.
    pub sat_repeats: usize,
    /// Sending time of a saturation step.
    pub sat_duration: Duration,
    /// Fake upstream latency of the long-calls scenario, ms.
    pub inflight_latency_ms: u64,
    /// Rates of the long-calls scenario.
    pub inflight_rates: Vec<f64>,
    /// PostgreSQL admin URL (a database is created per server).
    pub postgres_url: String,
    /// Wait for a quiet host before each server's fixed-rate steps.
    pub quiet: Option<Quiet>,
    /// Paired rounds on each server at the lowest upstream latency.
    pub paired: Option<paired::Rounds>,
    /// Scratch folder (configs, SQLite files, server logs).
    pub dir: PathBuf,
}

/// When the host counts as quiet (`--wait-quiet`).
#[derive(Debug, Clone, Copy)]
pub struct Quiet {
    /// Longest wait before each server's fixed-rate steps.
    pub max_wait: Duration,
    /// A probe's direct p99 at 1,000 rps must be at most this, µs.
    pub p99_us: f64,
    /// And the disk probe's sync p99 at most this, µs ([`disk`]).
    pub sync_p99_us: f64,
}

/// Rate and length of one quiet probe: the rate the p99 target is judged
/// at, long enough for a p99 of 2,000 calls.
const QUIET_PROBE_RPS: f64 = 1000.0;
const QUIET_PROBE: Duration = Duration::from_secs(2);
/// Pause between probes while the host is busy.
const QUIET_PAUSE: Duration = Duration::from_secs(10);

/// Saturation criteria (see docs/benchmarks.md).
const MIN_ACHIEVED_SHARE: f64 = 0.95;
const MAX_ERROR_SHARE: f64 = 0.01;
const MAX_P99_US: f64 = 100_000.0;
/// Least pause before a bisection step, after a step that overloaded the
/// server.
const REFINE_PAUSE: Duration = Duration::from_secs(2);
/// Then the server must have been idle this long (its CPU below
/// [`IDLE_CPU_SHARE`] of a core in each of [`IDLE_TICKS`] ticks)...
const IDLE_TICK: Duration = Duration::from_millis(250);
const IDLE_TICKS: u32 = 4;
/// ...well above what an idle server spends (metrics upkeep, the WAL sync
/// thread of `"normal"` durability) and far below draining a queue.
const IDLE_CPU_SHARE: f64 = 0.05;
/// ...waiting at most this long.
const RECOVERY_MAX: Duration = Duration::from_secs(30);

/// A run in progress.
pub struct Bench {
    /// Settings.
    pub settings: Settings,
    /// The fake upstream.
    pub upstream: Upstream,
    /// Client for `/metrics`.
    pub http: reqwest::Client,
    /// Client of the direct baseline (the orchestrator's HTTP version).
    pub direct_http: reqwest::Client,
    /// What has been measured so far.
    pub results: Results,
    direct_done: BTreeSet<u64>,
    servers: usize,
}

/// A started server with what a step needs around it.
pub struct Live {
    /// The process.
    pub server: Server,
    /// Connections to it.
    pub clients: Arc<Vec<target::Client>>,
    /// Metering mode.
    pub metering: Metering,
    /// PostgreSQL database, for its backends' CPU.
    pub pg: Option<PgDatabase>,
    /// Index in `results.groups`.
    pub group: usize,
}

impl Bench {
    /// A run over `upstream` with `settings`.
    pub fn new(settings: Settings, upstream: Upstream, results: Results) -> anyhow::Result<Self> {
        let http = target::http_client(settings.max_inflight.min(4096), false)?;
        let direct_http =
            target::http_client(settings.max_inflight.min(4096), settings.upstream_http2)?;
        Ok(Self {
            settings,
            upstream,
            http,
            direct_http,
            results,
            direct_done: BTreeSet::new(),
            servers: 0,
        })
    }

    /// Starts a server; on failure the group is recorded as skipped.
    pub async fn start(
        &mut self,
        metering: Metering,
        latency_ms: u64,
        purpose: &str,
        sqlite_file: Option<PathBuf>,
    ) -> Option<Live> {
        self.servers += 1;
        let n = self.servers;
        let mut group = Group {
            metering: metering.name().into(),
            upstream_latency_ms: latency_ms,
            purpose: purpose.into(),
            ..Group::default()
        };
        match self.try_start(metering, latency_ms, n, sqlite_file).await {
            Ok((server, clients, pg)) => {
                group.cold_start_ms = Some(server.cold_start.as_secs_f64() * 1000.0);
                tracing::info!(
                    purpose,
                    metering = metering.name(),
                    latency_ms,
                    cold_start_ms = group.cold_start_ms,
                    "server SERVING"
                );
                self.results.groups.push(group);
                Some(Live {
                    server,
                    clients,
                    metering,
                    pg,
                    group: self.results.groups.len() - 1,
                })
            }
            Err(e) => {
                tracing::error!(purpose, metering = metering.name(), error = %format!("{e:#}"), "server not started; skipping");
                self.results.notes.push(format!(
                    "{purpose} with {} metering at {latency_ms} ms skipped: {e:#}",
                    metering.name()
                ));
                group.skipped = Some(format!("{e:#}").lines().next().unwrap_or("").to_owned());
                self.results.groups.push(group);
                None
            }
        }
    }

    async fn try_start(
        &self,
        metering: Metering,
        latency_ms: u64,
        n: usize,
        sqlite_file: Option<PathBuf>,
    ) -> anyhow::Result<(Server, Arc<Vec<target::Client>>, Option<PgDatabase>)> {
        let dir = &self.settings.dir;
        let (pg, url) = match metering {
            Metering::Postgres => {
                let db = PgDatabase::create(&self.settings.postgres_url, n).await?;
                let url = db.url.clone();
                (Some(db), url)
            }
            Metering::Sqlite | Metering::SqliteNormal | Metering::Off => {
                let file = sqlite_file.unwrap_or_else(|| dir.join(format!("server-{n}.db")));
                (None, format!("sqlite://{}", file.display()))
            }
        };
        let (grpc, metrics) = server::free_ports()?;
        let config = dir.join(format!("server-{n}.toml"));
        std::fs::write(
            &config,
            server::config_toml(
                metering,
                &url,
                grpc,
                metrics,
                &self.upstream,
                latency_ms,
                self.settings.upstream_http2,
            ),
        )?;
        let log = dir.join(format!("server-{n}.log"));
        let started = Server::start(&self.settings.server_bin, &config, grpc, metrics, &log).await;
        let server = match started {
            Ok(s) => s,
            Err(e) => {
                if let Some(db) = &pg {
                    db.drop_now().await;
                }
                return Err(e);
            }
        };
        let clients = target::connect(server.grpc, self.settings.connections).await?;
        Ok((server, clients, pg))
    }

    /// Stops a server and records its peak memory and exit.
    pub async fn stop(&mut self, live: Live) {
        let peak = live.server.memory_mb().ok().map(|(_, hwm)| hwm);
        let clean = live.server.stop().await;
        if let Some(db) = &live.pg {
            db.drop_now().await;
        }
        if let Some(g) = self.results.groups.get_mut(live.group) {
            g.peak_rss_mb = peak;
            g.clean_exit = Some(clean);
        }
    }

    /// Load that is not measured: connections, caches, tokenizer tables.
    pub async fn warm_up(&self, live: &Live, rpcs: &[Rpc]) -> anyhow::Result<()> {
        for &rpc in rpcs {
            let make = target::grpc(
                live.clients.clone(),
                rpc,
                "meeting_brief",
                Expect::Primary,
                self.settings.timeout,
            );
            let rate = self
                .settings
                .rates
                .first()
                .copied()
                .unwrap_or(200.0)
                .min(200.0);
            loadgen::run(self.plan(rate, self.settings.warmup), make).await?;
        }
        Ok(())
    }

    /// A plan at `rate` for `duration` with the run's limits.
    pub fn plan(&self, rate: f64, duration: Duration) -> Plan {
        Plan {
            rate,
            duration,
            max_inflight: self.settings.max_inflight,
            timeout: self.settings.timeout,
        }
    }

    /// Runs one step and measures it, on the server when there is one.
    pub async fn measure(
        &self,
        live: Option<&Live>,
        plan: Plan,
        make: MakeRequest,
        mut step: Step,
    ) -> anyhow::Result<Step> {
        let pg = live.and_then(|l| l.pg.as_ref()).map(|db| db.name.clone());
        let before = match live {
            Some(l) => Some((l.server.cpu_seconds()?, l.server.scrape(&self.http).await?)),
            None => None,
        };
        let connections_before = self.upstream.connections();
        let pg_before = pg.as_deref().map(sys::postgres_backends_cpu);
        let bench_before = sys::cpu_seconds(sys::Pid::This)?;
        let started = Instant::now();
        let m = loadgen::run(plan, make).await?;
        let wall = started.elapsed().as_secs_f64();
        let per_1k = |secs: f64| secs / (m.sent as f64 / 1000.0);
        step.offered_rps = plan.rate;
        step.duration_s = plan.duration.as_secs_f64();
        step.sent = m.sent;
        step.ok = m.ok;
        step.errors = m.error_count();
        step.achieved_rps = m.achieved_rps();
        step.latency_us = Quantiles::of(&m.latency);
        step.pacer_lag_us = Quantiles::of(&m.lag);
        step.bench_cpu_s_per_1k = per_1k(sys::cpu_seconds(sys::Pid::This)? - bench_before);
        step.errors_by_code = m.errors;
        step.upstream_connections = Some(self.upstream.connections() - connections_before);
        if let (Some(l), Some((cpu, scrape))) = (live, before) {
            let cpu = l.server.cpu_seconds()? - cpu;
            step.server_cpu_s_per_1k = Some(per_1k(cpu));
            step.server_cores_used = Some(cpu / wall);
            let after = l.server.scrape(&self.http).await?;
            step.server_overhead_us = overhead_us(&after.overhead.since(&scrape.overhead));
            step.ledger = ledger_view(&after.ledger.since(&scrape.ledger));
            step.provider_time_mean_us = after.provider_time_since(&scrape).map(|s| s * 1e6);
            let (rss, peak) = l.server.memory_mb()?;
            step.server_rss_mb = Some(rss);
            step.server_peak_rss_mb = Some(peak);
        }
        if let (Some(db), Some(before)) = (pg.as_deref(), pg_before) {
            step.db_cpu_s_per_1k = Some(per_1k(sys::postgres_backends_cpu(db) - before));
        }
        let q = &step.latency_us;
        tracing::info!(
            via = %step.via, rpc = %step.rpc, metering = %step.metering, upstream_ms = step.upstream_latency_ms,
            offered = step.offered_rps, achieved = format!("{:.0}", step.achieved_rps), errors = step.errors,
            p50_ms = q.p50 / 1000.0, p99_ms = q.p99 / 1000.0, "step"
        );
        Ok(step)
    }

    /// A server group: warm-up, direct baseline (once per upstream latency),
    /// fixed rates for each RPC, then, at the `lowest` upstream latency, the
    /// paired rounds and saturation when asked.
    pub async fn group(
        &mut self,
        metering: Metering,
        latency_ms: u64,
        lowest: bool,
    ) -> anyhow::Result<()> {
        let Some(live) = self.start(metering, latency_ms, "load", None).await else {
            return Ok(());
        };
        let outcome = self.drive(&live, latency_ms, lowest).await;
        self.stop(live).await;
        outcome
    }

    async fn drive(&mut self, live: &Live, latency_ms: u64, lowest: bool) -> anyhow::Result<()> {
        let saturation = self.settings.saturation && lowest;
        let rounds = self.settings.paired.filter(|_| lowest);
        let rpcs = self.settings.rpcs.clone();
        // The paired rounds take turns over the fixed rates' RPCs, or run
        // Execute alone.
        let paired_rpcs = if rpcs.is_empty() {
            vec![Rpc::Execute]
        } else {
            rpcs.clone()
        };
        let mut warm = rpcs.clone();
        if rounds.is_some() {
            for &rpc in &paired_rpcs {
                if !warm.contains(&rpc) {
                    warm.push(rpc);
                }
            }
        }
        if self.settings.direct && !warm.contains(&Rpc::ClassifySms) {
            warm.push(Rpc::ClassifySms);
        }
        if (self.settings.direct || saturation) && !warm.contains(&Rpc::Execute) {
            warm.push(Rpc::Execute);
        }
        self.warm_up(live, &warm).await?;
        if let Some(quiet) = self.settings.quiet {
            self.wait_quiet(
                quiet,
                &format!(
                    "{} metering, {latency_ms} ms upstream",
                    live.metering.name()
                ),
            )
            .await?;
        }
        if self.settings.direct && self.direct_done.insert(latency_ms) {
            self.direct(latency_ms).await?;
        }
        for &rpc in &rpcs {
            for &rate in &self.settings.rates.clone() {
                let step = self
                    .grpc_step(live, rpc, latency_ms, "load", rate, self.settings.duration)
                    .await?;
                self.results.steps.push(step);
            }
        }
        if let Some(rounds) = rounds {
            let pairs = paired::run(self, live, latency_ms, &paired_rpcs, rounds).await?;
            self.results.paired.extend(pairs);
        }
        if saturation {
            for repeat in 0..self.settings.sat_repeats {
                if repeat > 0 {
                    // The previous sweep ended on overloaded steps.
                    recover(live).await;
                }
                self.saturate(live, latency_ms, repeat).await?;
            }
        }
        Ok(())
    }

    pub async fn grpc_step(
        &self,
        live: &Live,
        rpc: Rpc,
        latency_ms: u64,
        kind: &str,
        rate: f64,
        duration: Duration,
    ) -> anyhow::Result<Step> {
        let task = if rpc == Rpc::Execute {
            "meeting_brief"
        } else {
            ""
        };
        let make = target::grpc(
            live.clients.clone(),
            rpc,
            "meeting_brief",
            Expect::Primary,
            self.settings.timeout,
        );
        let step = Step {
            kind: kind.into(),
            rpc: rpc.name().into(),
            via: "orchestrator".into(),
            metering: live.metering.name().into(),
            task: task.into(),
            upstream_latency_ms: latency_ms,
            ..Step::default()
        };
        self.measure(Some(live), self.plan(rate, duration), make, step)
            .await
    }

    /// Probes the host until a direct step at 1,000 rps has a p99 of at
    /// most `quiet.p99_us` and the disk's sync p99 is at most
    /// `quiet.sync_p99_us` ([`disk`]), or `quiet.max_wait` has passed;
    /// records the probes. The neighbours of a shared VM come and go by
    /// the minute, and the p99 target is judged at a rate where they decide
    /// the tail.
    async fn wait_quiet(&mut self, quiet: Quiet, before: &str) -> anyhow::Result<()> {
        let url = format!("{}/chat/completions", self.upstream.base_url("ok-0"));
        let Some(body) = self.upstream.sample(Kind::Execute) else {
            self.results.notes.push(format!(
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
            let make = target::direct(self.direct_http.clone(), url.clone(), body.clone());
            let probe = Step {
                kind: "quiet-probe".into(),
                rpc: Rpc::Execute.name().into(),
                via: "direct".into(),
                metering: "none".into(),
                ..Step::default()
            };
            let probe = self
                .measure(None, self.plan(QUIET_PROBE_RPS, QUIET_PROBE), make, probe)
                .await?;
            wait.probe_p99_us.push(probe.latency_us.p99);
            let dir = self.settings.dir.clone();
            let syncs = tokio::task::spawn_blocking(move || {
                disk::sync_probe(&dir, disk::SYNCS, disk::PAUSE)
            })
            .await?
            .context("disk probe in the scratch folder")?;
            let sync_p99 = Quantiles::of(&syncs).p99;
            wait.probe_sync_p99_us.push(sync_p99);
            wait.quiet = probe.errors == 0
                && probe.latency_us.p99 <= quiet.p99_us
                && sync_p99 <= quiet.sync_p99_us;
            if wait.quiet || started.elapsed() + QUIET_PAUSE > quiet.max_wait {
                break;
            }
            tracing::info!(
                p99_ms = probe.latency_us.p99 / 1000.0,
                sync_p99_ms = sync_p99 / 1000.0,
                "waiting for a quiet host"
            );
            tokio::time::sleep(QUIET_PAUSE).await;
        }
        wait.waited_s = started.elapsed().as_secs_f64();
        self.results.quiet_waits.push(wait);
        Ok(())
    }

    /// The same bodies straight to the fake upstream, at every fixed rate.
    async fn direct(&mut self, latency_ms: u64) -> anyhow::Result<()> {
        for rpc in [Rpc::Execute, Rpc::ClassifySms] {
            if !self.settings.rpcs.contains(&rpc) {
                continue;
            }
            for &rate in &self.settings.rates.clone() {
                let step = self
                    .direct_step(rpc, latency_ms, "load", rate, self.settings.duration)
                    .await?;
                self.results.steps.push(step);
            }
        }
        Ok(())
    }

    /// One step straight to the fake upstream (at `latency_ms`), replaying
    /// the last body the orchestrator sent it for `rpc`.
    pub async fn direct_step(
        &self,
        rpc: Rpc,
        latency_ms: u64,
        kind: &str,
        rate: f64,
        duration: Duration,
    ) -> anyhow::Result<Step> {
        let url = format!(
            "{}/chat/completions",
            self.upstream.base_url(&format!("ok-{latency_ms}"))
        );
        let sample = match rpc {
            Rpc::Execute => Kind::Execute,
            Rpc::ClassifySms => Kind::Classify,
        };
        let body = self.upstream.sample(sample).with_context(|| {
            format!("the fake upstream saw no {} request to replay", rpc.name())
        })?;
        let make = target::direct(self.direct_http.clone(), url, body);
        let step = Step {
            kind: kind.into(),
            rpc: rpc.name().into(),
            via: "direct".into(),
            metering: "none".into(),
            upstream_latency_ms: latency_ms,
            ..Step::default()
        };
        self.measure(None, self.plan(rate, duration), make, step)
            .await
    }

    /// Raises the Execute rate until a step fails the criteria, then
    /// bisects (geometrically) between the last passing and the first
    /// failing rate `sat_refine` times: the ×1.25 ladder alone leaves the
    /// answer uncertain by up to 25 %.
    async fn saturate(
        &mut self,
        live: &Live,
        latency_ms: u64,
        repeat: usize,
    ) -> anyhow::Result<()> {
        let mut sat = Saturation {
            metering: live.metering.name().into(),
            repeat: u32::try_from(repeat).unwrap_or(u32::MAX),
            rpc: Rpc::Execute.name().into(),
            upstream_latency_ms: latency_ms,
            ..Saturation::default()
        };
        let mut rate = self.settings.sat_start;
        for _ in 0..self.settings.sat_max_steps {
            if !self
                .saturation_step(live, latency_ms, rate, &mut sat)
                .await?
            {
                break;
            }
            rate = (rate * self.settings.sat_factor).round();
        }
        for _ in 0..self.settings.sat_refine {
            let (Some(lo), Some(hi)) = (sat.highest_passing_rps, sat.first_failing_rps) else {
                break;
            };
            let mid = (lo * hi).sqrt().round();
            if mid <= lo || mid >= hi {
                break;
            }
            // A step must not inherit the failed one's queue, and a fixed
            // pause cannot tell when that has drained: measure again only
            // once the server is idle.
            recover(live).await;
            self.saturation_step(live, latency_ms, mid, &mut sat)
                .await?;
        }
        self.results.saturation.push(sat);
        Ok(())
    }

    /// One saturation step at `rate`, recorded in `sat`: true when it passed.
    async fn saturation_step(
        &mut self,
        live: &Live,
        latency_ms: u64,
        rate: f64,
        sat: &mut Saturation,
    ) -> anyhow::Result<bool> {
        let mut step = self
            .grpc_step(
                live,
                Rpc::Execute,
                latency_ms,
                "saturation",
                rate,
                self.settings.sat_duration,
            )
            .await?;
        let why = failure(&step);
        step.passed = Some(why.is_none());
        let achieved = step.achieved_rps;
        self.results.saturation_steps.push(step);
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

    /// Start-up times: a new SQLite file each time, then a restart on it.
    pub async fn cold_starts(&mut self, runs: usize) {
        let mut times = ColdStart::default();
        for i in 0..runs {
            let file = self.settings.dir.join(format!("coldstart-{i}.db"));
            for fresh in [true, false] {
                let purpose = if fresh {
                    "cold start (new db)"
                } else {
                    "cold start (existing db)"
                };
                let Some(live) = self
                    .start(Metering::Sqlite, 0, purpose, Some(file.clone()))
                    .await
                else {
                    continue;
                };
                let ms = live.server.cold_start.as_secs_f64() * 1000.0;
                if fresh {
                    times.fresh_db_ms.push(ms);
                } else {
                    times.existing_db_ms.push(ms);
                }
                self.stop(live).await;
            }
        }
        self.results.cold_start = times;
    }
}

/// Why a saturation step fails the criteria, if it does.
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

/// The ledger's histograms over a step; `None` when nothing was metered.
fn ledger_view(l: &prom::Ledger) -> Option<LedgerView> {
    let view = LedgerView {
        reserve_wait_us: overhead_us(&l.reserve_wait),
        settle_wait_us: overhead_us(&l.settle_wait),
        commit_us: overhead_us(&l.commit),
        sync_us: overhead_us(&l.sync),
        ops_per_commit: l.batch.mean(),
    };
    (view != LedgerView::default()).then_some(view)
}

fn overhead_us(h: &prom::Histogram) -> Option<ServerOverhead> {
    let us = |s: Option<f64>| s.map_or(0.0, |v| v * 1e6);
    Some(ServerOverhead {
        count: h.count,
        mean: us(Some(h.mean()?)),
        p50: us(h.quantile(0.5)),
        p90: us(h.quantile(0.9)),
        p99: us(h.quantile(0.99)),
        p999: us(h.quantile(0.999)),
    })
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

/// Waits [`REFINE_PAUSE`], then until the server has been idle for
/// [`IDLE_TICKS`] ticks in a row, or [`RECOVERY_MAX`] has passed.
async fn recover(live: &Live) {
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
        "server recovered before the bisection step"
    );
}
