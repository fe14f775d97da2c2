//! A run in progress: the fake upstream, the servers it starts, and the
//! one way a step is measured. Every number of a step is a before/after
//! difference around that step alone. The scenarios (`fixed`, `paired`,
//! `saturation`, `breaker`, `inflight`, `coldstart`) are built on this.

use crate::{
    loadgen::{self, MakeRequest, Plan},
    prom,
    report::{Group, LedgerView, Quantiles, Results, ServerHistogram, Step},
    server::{self, AuditCalls, Metering, PgDatabase, Server},
    settings::Settings,
    sys,
    target::{self, Expect, Rpc},
    upstream::{Kind, Upstream},
};
use anyhow::Context;
use std::{path::PathBuf, sync::Arc, time::Duration};

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
    /// Upstream latencies whose direct baseline has run.
    pub direct_done: Vec<u64>,
    /// TOML appended to the config of the servers started next (the
    /// cluster scenario's `[cluster]`); empty otherwise.
    pub config_extra: String,
    /// `[audit] calls` of the servers started next (`--audit-calls` in the
    /// fixed-rate groups; the product default elsewhere).
    pub audit_calls: AuditCalls,
    servers: usize,
}

/// How a step offers its load.
#[derive(Debug, Clone, Copy)]
pub enum Load {
    /// At a fixed rate, whatever the answers (latency from the due time).
    Open(Plan),
    /// `callers` calls in flight for `duration`, each sent when the last
    /// one of its caller is answered (latency from the send).
    Closed {
        /// Calls in flight.
        callers: usize,
        /// Sending time.
        duration: Duration,
    },
}

impl From<Plan> for Load {
    fn from(plan: Plan) -> Self {
        Load::Open(plan)
    }
}

/// A started server with what a step needs around it.
pub struct Live {
    /// The process.
    pub server: Server,
    /// Connections to it.
    pub clients: Arc<Vec<target::Client>>,
    /// Metering mode.
    pub metering: Metering,
    /// Whether it audits every model call.
    pub audit_calls: AuditCalls,
    /// PostgreSQL database, for its backends' CPU.
    pub pg: Option<PgDatabase>,
    /// Index in `results.groups`.
    pub group: usize,
}

impl Live {
    /// Its mode's name in results (see [`AuditCalls::label`]).
    pub fn mode(&self) -> String {
        self.audit_calls.label(self.metering)
    }
}

impl Bench {
    /// A run over `upstream` with `settings`.
    pub fn new(settings: Settings, upstream: Upstream, results: Results) -> anyhow::Result<Self> {
        let pool = settings.max_inflight.min(4096);
        Ok(Self {
            http: target::http_client(pool, crate::upstream::Leg::H1, &upstream.ca_pem)?,
            direct_http: target::http_client(pool, settings.upstream, &upstream.ca_pem)?,
            settings,
            upstream,
            results,
            direct_done: Vec::new(),
            config_extra: String::new(),
            audit_calls: AuditCalls::On,
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
        let mode = self.audit_calls.label(metering);
        let mut group = Group {
            metering: mode.clone(),
            upstream_latency_ms: latency_ms,
            purpose: purpose.into(),
            ..Group::default()
        };
        let started = self
            .try_start(metering, latency_ms, self.servers, sqlite_file)
            .await;
        match started {
            Ok((server, clients, pg)) => {
                group.cold_start_ms = Some(server.cold_start.as_secs_f64() * 1000.0);
                tracing::info!(purpose, metering = %mode, latency_ms, "server SERVING");
                self.results.groups.push(group);
                Some(Live {
                    server,
                    clients,
                    metering,
                    audit_calls: self.audit_calls,
                    pg,
                    group: self.results.groups.len() - 1,
                })
            }
            Err(e) => {
                tracing::error!(purpose, metering = %mode, error = %format!("{e:#}"), "server not started; skipping");
                self.results.notes.push(format!(
                    "{purpose} with {mode} metering at {latency_ms} ms skipped: {e:#}"
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
        let (grpc, metrics, http) = server::free_ports()?;
        // The HTTP edge only when a step calls it: a build without one
        // refuses `[http]`.
        let http = self.settings.rpcs.contains(&Rpc::ChatHttp).then_some(http);
        let ca_file = dir.join("upstream-ca.pem");
        std::fs::write(&ca_file, &self.upstream.ca_pem)?;
        let config = dir.join(format!("server-{n}.toml"));
        let toml = server::config_toml(
            metering,
            &url,
            (grpc, metrics, http),
            &self.upstream,
            latency_ms,
            self.settings.upstream,
            &ca_file,
        );
        std::fs::write(&config, toml + self.audit_calls.toml() + &self.config_extra)?;
        let log = dir.join(format!("server-{n}.log"));
        let started = Server::start(&self.settings.server_bin, &config, grpc, metrics, &log).await;
        let server = match started {
            Ok(s) => s,
            Err(e) => {
                if let Some(db) = &pg {
                    db.drop_now().await;
                }
                return Err(match http {
                    Some(_) => e.context(
                        "its config has [http] for --rpcs chat-http: a build without the HTTP edge (SPEC §13) refuses it",
                    ),
                    None => e,
                });
            }
        };
        let edge = match http {
            Some(addr) => {
                let pool = self.settings.max_inflight.min(4096);
                Some(target::HttpEdge::connect(addr, pool).await?)
            }
            None => None,
        };
        let clients = target::connect(server.grpc, self.settings.connections, edge).await?;
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
        let rate = self.settings.rates.first().copied().unwrap_or(200.0);
        for &rpc in rpcs {
            let make = target::grpc(
                live.clients.clone(),
                rpc,
                "meeting_brief",
                Expect::Primary,
                self.settings.sending(),
            );
            loadgen::run(self.plan(rate.min(200.0), self.settings.warmup), make).await?;
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
        load: impl Into<Load>,
        make: MakeRequest,
        mut step: Step,
    ) -> anyhow::Result<Step> {
        let pg = live.and_then(|l| l.pg.as_ref()).map(|db| db.name.clone());
        let before = match live {
            Some(l) => Some((l.server.cpu_seconds()?, l.server.scrape(&self.http).await?)),
            None => None,
        };
        let pg_before = pg.as_deref().map(sys::postgres_backends_cpu);
        let m = match load.into() {
            Load::Open(plan) => {
                step.offered_rps = plan.rate;
                step.duration_s = plan.duration.as_secs_f64();
                loadgen::run(plan, make).await?
            }
            Load::Closed { callers, duration } => {
                step.callers = callers as u64;
                step.duration_s = duration.as_secs_f64();
                loadgen::closed(callers, duration, self.settings.timeout, make).await?
            }
        };
        let per_1k = |secs: f64| secs / (m.sent.max(1) as f64 / 1000.0);
        step.sent = m.sent;
        step.ok = m.ok;
        step.errors = m.error_count();
        step.achieved_rps = m.achieved_rps();
        step.latency_us = Quantiles::of(&m.latency);
        step.errors_by_code = m.errors;
        if let (Some(l), Some((cpu, scrape))) = (live, before) {
            step.server_cpu_s_per_1k = Some(per_1k(l.server.cpu_seconds()? - cpu));
            let after = l.server.scrape(&self.http).await?;
            step.server_overhead_us = histogram(&after.overhead.since(&scrape.overhead));
            step.ledger = ledger_view(&after.ledger.since(&scrape.ledger));
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

    /// One step of `rpc` through the orchestrator (`Execute`, and
    /// `ChatHttp` on the HTTP edge, call the `meeting_brief` task).
    pub async fn grpc_step(
        &self,
        live: &Live,
        rpc: Rpc,
        latency_ms: u64,
        kind: &str,
        rate: f64,
        duration: Duration,
    ) -> anyhow::Result<Step> {
        let make = target::grpc(
            live.clients.clone(),
            rpc,
            "meeting_brief",
            Expect::Primary,
            self.settings.sending(),
        );
        let step = Step {
            kind: kind.into(),
            rpc: rpc.name().into(),
            via: "orchestrator".into(),
            metering: live.mode(),
            task: if matches!(rpc, Rpc::Execute | Rpc::ChatHttp) {
                "meeting_brief".into()
            } else {
                String::new()
            },
            upstream_latency_ms: latency_ms,
            ..Step::default()
        };
        self.measure(Some(live), self.plan(rate, duration), make, step)
            .await
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
            self.upstream
                .base_url(&format!("ok-{latency_ms}"), self.settings.upstream)
        );
        let sample = match rpc {
            Rpc::Execute => Kind::Execute,
            Rpc::ClassifySms => Kind::Classify,
            Rpc::ChatHttp => Kind::Chat,
            Rpc::InvokeTool | Rpc::Converse => {
                anyhow::bail!("{} has no direct baseline", rpc.name())
            }
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
}

/// The ledger's histograms over a step; `None` when nothing was metered.
fn ledger_view(l: &prom::Ledger) -> Option<LedgerView> {
    let view = LedgerView {
        reserve_wait_us: histogram(&l.reserve_wait),
        settle_wait_us: histogram(&l.settle_wait),
        commit_us: histogram(&l.commit),
        sync_us: histogram(&l.sync),
        ops_per_commit: l.batch.mean(),
    };
    (view != LedgerView::default()).then_some(view)
}

/// A scraped histogram's delta in µs; `None` without observations.
fn histogram(h: &prom::Histogram) -> Option<ServerHistogram> {
    let us = |s: Option<f64>| s.map_or(0.0, |v| v * 1e6);
    Some(ServerHistogram {
        count: h.count,
        mean: us(Some(h.mean()?)),
        p50: us(h.quantile(0.5)),
        p99: us(h.quantile(0.99)),
    })
}
