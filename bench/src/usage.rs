//! GetUsage over a big month: a team with `--usage-records` records this
//! month (1,000,000 in a full run), written straight into the server's
//! database (the rollup trigger runs for each, as for a served call), then
//! GetUsage timed one call at a time: the month's totals, and grouped by
//! task and day. On SQLite and PostgreSQL.

use crate::{bench::Bench, report::UsageRead, server::Metering};
use ai_orchestrator::api::pb;
use anyhow::Context;
use std::time::{Duration, Instant};

/// The team whose month is read.
const TEAM: &str = "usage-team";
/// Records per statement when seeding PostgreSQL.
const PG_SEED_SLICE: i64 = 10_000;

/// Runs the scenario on each backend the run meters with; a backend that
/// fails is noted and the run goes on.
pub async fn run(bench: &mut Bench) {
    for metering in [Metering::Sqlite, Metering::Postgres] {
        if !bench.settings.metering.contains(&metering) {
            continue;
        }
        let outcome = on(bench, metering).await;
        crate::run::noted(
            bench,
            &format!("GetUsage scenario ({})", metering.name()),
            outcome,
        );
    }
}

async fn on(bench: &mut Bench, metering: Metering) -> anyhow::Result<()> {
    let file = bench.settings.dir.join("usage.db");
    let sqlite_file = (metering == Metering::Sqlite).then(|| file.clone());
    let Some(live) = bench.start(metering, 0, "GetUsage", sqlite_file).await else {
        return Ok(());
    };
    let records = bench.settings.usage_records;
    let url = match &live.pg {
        Some(db) => db.url.clone(),
        None => format!("sqlite://{}", file.display()),
    };
    let seeded = seed(&url, records).await;
    let outcome = match seeded {
        Ok(seed_s) => {
            let mut reads = Vec::new();
            for (shape, group_by) in [
                ("totals", vec![]),
                (
                    "task,day",
                    vec![
                        pb::UsageDimension::Task as i32,
                        pb::UsageDimension::Day as i32,
                    ],
                ),
            ] {
                let client = live.clients.first().context("no connection")?.clone();
                let times =
                    time_calls(client, group_by, records, bench.settings.usage_calls).await?;
                reads.push(read(metering, records, seed_s, shape, &times));
            }
            bench.results.usage.extend(reads);
            Ok(())
        }
        Err(e) => Err(e),
    };
    bench.stop(live).await;
    outcome
}

/// Writes `n` records of [`TEAM`] spread over this month so far, in one
/// statement; returns the seconds it took.
async fn seed(url: &str, n: u64) -> anyhow::Result<f64> {
    use sqlx::Connection;
    let now = chrono::Utc::now();
    let month = chrono::NaiveDate::from_ymd_opt(
        chrono::Datelike::year(&now),
        chrono::Datelike::month(&now),
        1,
    )
    .and_then(|d| d.and_hms_opt(0, 0, 0))
    .context("the month's start")?
    .and_utc()
    .timestamp_millis();
    let span = (now.timestamp_millis() - month).max(1);
    let n = i64::try_from(n)?;
    // Realistic spreads: three tasks, a fallback served 2 % of calls, 1 %
    // failed, latencies 150 ms – 2.6 s, tokens and cost varying.
    let columns = "created_at_ms, team_id, task, provider, model, trace_id, input_tokens, \
                   output_tokens, cost_micros, latency_ms, outcome, attempts, degraded, channel, priority";
    let values = |i: &str, concat: &str| {
        format!(
            "$2 + ({i} * $3) / $1, '{TEAM}', \
             CASE {i} % 3 WHEN 0 THEN 'sms_classify' WHEN 1 THEN 'sms_generate' ELSE 'meeting_brief' END, \
             CASE WHEN {i} % 50 = 0 THEN 'fallback' ELSE 'primary' END, 'gpt-4o-mini', {concat}, \
             100 + {i} % 400, 20 + {i} % 80, 30 + {i} % 100, 150 + ({i} * 7919) % 2500, \
             CASE WHEN {i} % 97 = 0 THEN 'ALL_PROVIDERS_FAILED' ELSE 'ok' END, '[]', \
             CASE WHEN {i} % 50 = 0 THEN 1 ELSE 0 END, 'sms', 'interactive'"
        )
    };
    let started = Instant::now();
    if url.starts_with("sqlite:") {
        let sql = format!(
            "WITH RECURSIVE seq(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM seq WHERE i + 1 < $1) \
             INSERT INTO usage_records ({columns}) SELECT {} FROM seq",
            values("i", "'usage-' || i")
        );
        let mut conn = sqlx::SqliteConnection::connect(url).await?;
        sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(n)
            .bind(month)
            .bind(span)
            .execute(&mut conn)
            .await
            .context("writing the records (SQLite)")?;
        conn.close().await?;
    } else {
        // In slices, each its own transaction, as the ledger writes them:
        // the rollup trigger updates the same few rows for every record, and
        // within one transaction every update of a row lengthens the chain
        // of versions the next one walks (a single 1M-row statement takes
        // tens of minutes; 10,000-row slices take seconds).
        let sql = format!(
            "INSERT INTO usage_records ({columns}) \
             SELECT {} FROM generate_series($4::BIGINT, $5::BIGINT - 1) AS i",
            values("i", "'usage-' || i")
        );
        let mut conn = sqlx::PgConnection::connect(url).await?;
        let mut from = 0;
        while from < n {
            let to = (from + PG_SEED_SLICE).min(n);
            sqlx::query(sqlx::AssertSqlSafe(sql.clone()))
                .bind(n)
                .bind(month)
                .bind(span)
                .bind(from)
                .bind(to)
                .execute(&mut conn)
                .await
                .context("writing the records (PostgreSQL)")?;
            from = to;
        }
        conn.close().await?;
    }
    let seed_s = started.elapsed().as_secs_f64();
    tracing::info!(records = n, seed_s, "GetUsage scenario: records written");
    Ok(seed_s)
}

/// Times `calls` GetUsage calls of the month, one at a time, checking each
/// counts every record.
async fn time_calls(
    mut client: crate::target::Client,
    group_by: Vec<i32>,
    records: u64,
    calls: usize,
) -> anyhow::Result<Vec<Duration>> {
    let mut times = Vec::with_capacity(calls);
    for _ in 0..calls {
        let started = Instant::now();
        let reply = client
            .get_usage(pb::GetUsageRequest {
                team_id: TEAM.into(),
                group_by: group_by.clone(),
                ..Default::default()
            })
            .await
            .context("GetUsage")?
            .into_inner();
        times.push(started.elapsed());
        let counted = reply.totals.map_or(0, |t| t.requests);
        anyhow::ensure!(
            counted == records,
            "GetUsage counted {counted} requests of {records} records"
        );
    }
    Ok(times)
}

fn read(
    metering: Metering,
    records: u64,
    seed_s: f64,
    shape: &str,
    times: &[Duration],
) -> UsageRead {
    let mut ms: Vec<f64> = times.iter().map(|t| t.as_secs_f64() * 1000.0).collect();
    ms.sort_by(f64::total_cmp);
    let rank = |p: usize| {
        let i = (p * ms.len()).div_ceil(100).max(1) - 1;
        ms.get(i).copied().unwrap_or(0.0)
    };
    UsageRead {
        metering: metering.name().into(),
        records,
        seed_s,
        group_by: shape.into(),
        calls: ms.len() as u64,
        p50_ms: rank(50),
        p95_ms: rank(95),
        max_ms: ms.last().copied().unwrap_or(0.0),
    }
}
