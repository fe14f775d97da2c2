//! Figures read across several steps: min / median / max, the saturation
//! sweeps of a mode, the paired rounds of a mode, the two edges' steps.

use super::{Pair, Quantiles, Results, Step};

/// `(min, median, max)`; for an even count the median is the mean of the
/// two middle values, so two sweeps do not report the better one.
pub fn summary(v: &[f64]) -> Option<(f64, f64, f64)> {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let (first, last) = (*s.first()?, *s.last()?);
    let mid = s.len() / 2;
    let median = if s.len().is_multiple_of(2) {
        (s[mid - 1] + s[mid]) / 2.0
    } else {
        s[mid]
    };
    Some((first, median, last))
}

/// Highest passing rate of every Execute sweep with `metering`, in run
/// order; a sweep where no step passed counts as 0 (it saturated below its
/// first rate).
pub fn saturation_rates(r: &Results, metering: &str) -> Vec<f64> {
    saturation_rates_of(r, metering, "Execute")
}

/// Like [`saturation_rates`], for the sweeps of `rpc`.
pub fn saturation_rates_of(r: &Results, metering: &str, rpc: &str) -> Vec<f64> {
    r.saturation
        .iter()
        .filter(|s| s.metering == metering && s.rpc == rpc)
        .map(|s| s.highest_passing_rps.unwrap_or(0.0))
        .collect()
}

/// The paired rounds of one metering mode, summarized.
#[derive(Debug, Clone, PartialEq)]
pub struct PairedSummary {
    /// Rounds.
    pub rounds: usize,
    /// Each round's added p99, µs, in round order.
    pub added_p99_us: Vec<f64>,
    /// Median of the rounds' added p99, µs.
    pub median_added_p99_us: f64,
    /// Rounds whose added p99 was at most the given limit.
    pub rounds_within: usize,
    /// Median of the rounds' added p50, µs.
    pub median_added_p50_us: f64,
    /// Lowest and highest direct p99 of the rounds, µs (how noisy the host
    /// was).
    pub direct_p99_us: (f64, f64),
    /// Lowest and highest p99 of one WAL sync over the rounds, µs (how slow
    /// the disk was; the direct steps do not see it), when the server
    /// synced.
    pub wal_sync_p99_us: Option<(f64, f64)>,
}

/// The paired rounds of `metering`, with how many added at most `limit_us`
/// at p99; `None` without rounds.
pub fn paired_summary(r: &Results, metering: &str, limit_us: f64) -> Option<PairedSummary> {
    let pairs: Vec<&Pair> = r.paired.iter().filter(|p| p.metering == metering).collect();
    let added: Vec<Quantiles> = pairs
        .iter()
        .filter_map(|p| p.orchestrator.added_latency_us)
        .collect();
    let p99: Vec<f64> = added.iter().map(|a| a.p99).collect();
    let p50: Vec<f64> = added.iter().map(|a| a.p50).collect();
    let direct: Vec<f64> = pairs.iter().map(|p| p.direct.latency_us.p99).collect();
    let (_, median_p99, _) = summary(&p99)?;
    let (_, median_p50, _) = summary(&p50)?;
    let (direct_lo, _, direct_hi) = summary(&direct)?;
    let syncs: Vec<f64> = pairs
        .iter()
        .filter_map(|p| p.orchestrator.ledger?.sync_us)
        .map(|s| s.p99)
        .collect();
    Some(PairedSummary {
        wal_sync_p99_us: summary(&syncs).map(|(lo, _, hi)| (lo, hi)),
        rounds: p99.len(),
        rounds_within: p99.iter().filter(|v| **v <= limit_us).count(),
        added_p99_us: p99,
        median_added_p99_us: median_p99,
        median_added_p50_us: median_p50,
        direct_p99_us: (direct_lo, direct_hi),
    })
}

/// `Execute` over gRPC and its HTTP twin (`ChatCompletionsHttp`) at the
/// same metering, upstream latency and rate: the fixed-rate steps of the
/// two edges, `(grpc, http)`, in run order.
pub fn edge_pairs(r: &Results) -> Vec<(&Step, &Step)> {
    load_steps(r, "Execute")
        .filter_map(|grpc| {
            let http = load_steps(r, "ChatCompletionsHttp").find(|h| {
                h.metering == grpc.metering
                    && h.upstream_latency_ms == grpc.upstream_latency_ms
                    && h.offered_rps == grpc.offered_rps
            })?;
            Some((grpc, http))
        })
        .collect()
}

/// The fixed-rate steps of `rpc` through the orchestrator.
fn load_steps<'a>(r: &'a Results, rpc: &'a str) -> impl Iterator<Item = &'a Step> {
    r.steps
        .iter()
        .filter(move |s| s.kind == "load" && s.via == "orchestrator" && s.rpc == rpc)
}

/// The HTTP edge's server CPU per request over the gRPC edge's, for one
/// pair of [`edge_pairs`].
pub fn edge_cpu_ratio(grpc: &Step, http: &Step) -> Option<f64> {
    let (g, h) = (grpc.server_cpu_s_per_1k?, http.server_cpu_s_per_1k?);
    (g > 0.0).then(|| h / g)
}
