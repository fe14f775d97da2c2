//! Semantic checks that serde cannot express, each naming the offending key.

use super::{Config, Invalid, ProviderKind};
use std::time::Duration;

/// Largest price, USD per 1M tokens: the dearest cost a few hundred; more is a per-token typo.
pub const MAX_PRICE_PER_MTOK: f64 = 10_000.0;

/// Largest task `max_tokens`: above every model's output window; bounds plausible output.
pub const MAX_OUTPUT_TOKENS: u32 = 1_000_000;

/// Checks a database URL names a SQLite file or a PostgreSQL database, not in-memory SQLite:
/// the ledger's writer has its own connection, and usage must outlive the process.
fn database_url(url: &str) -> Result<(), &'static str> {
    if let Some(rest) = url.strip_prefix("sqlite:") {
        let rest = rest.strip_prefix("//").unwrap_or(rest);
        let path = rest.split('?').next().unwrap_or_default();
        if path.is_empty() {
            return Err("names no SQLite file: use sqlite://path/to/file.db");
        }
        if path == ":memory:" || url.contains("mode=memory") {
            return Err("is an in-memory SQLite database: use a file (sqlite://path/to/file.db)");
        }
        return Ok(());
    }
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        let Ok(parsed) = reqwest::Url::parse(url) else {
            return Err("is not a valid postgres:// URL");
        };
        if parsed.host_str().unwrap_or_default().is_empty() {
            return Err("names no host: use postgres://user@host:5432/database");
        }
        if parsed.path().trim_start_matches('/').is_empty() {
            return Err("names no database: use postgres://user@host:5432/database");
        }
        return Ok(());
    }
    Err("must start with sqlite:, postgres:// or postgresql://")
}

/// The checks of one `[providers.<name>]`.
fn provider(
    config: &Config,
    name: &str,
    p: &super::ProviderConfig,
    bad: &mut dyn FnMut(String, &str),
) {
    let at = |key: &str| format!("providers.{name}.{key}");
    if p.kind == ProviderKind::OpenaiCompatible && p.base_url.is_none() {
        bad(at("base_url"), "required for kind openai_compatible");
    }
    if let Some(url) = &p.base_url
        && !(url.starts_with("http://") || url.starts_with("https://"))
    {
        bad(at("base_url"), "must start with http:// or https://");
    }
    for (key, d) in [
        ("timeout", p.timeout),
        ("connect_timeout", p.connect_timeout),
        ("stream_idle_timeout", p.stream_idle_timeout),
    ] {
        if d == Duration::ZERO {
            bad(at(key), "must be greater than zero");
        }
    }
    if p.rpm == Some(0) {
        bad(at("rpm"), "must be at least 1 (omit it for no limit)");
    }
    if p.tpm == Some(0) {
        bad(at("tpm"), "must be at least 1 (omit it for no limit)");
    }
    if p.max_concurrency == Some(0) {
        bad(at("max_concurrency"), "must be at least 1");
    }
    if p.streams_per_connection == 0 {
        bad(at("streams_per_connection"), "must be at least 1");
    }
    if p.http_version == Some(super::HttpVersion::Http1) && p.http2_prior_knowledge {
        bad(
            at("http_version"),
            "\"1.1\" contradicts http2_prior_knowledge = true",
        );
    }
    if let Some(path) = &p.tls_ca {
        match std::fs::read_to_string(path) {
            Ok(pem) if pem.contains("-----BEGIN CERTIFICATE-----") => {}
            Ok(_) => bad(at("tls_ca"), "holds no PEM certificate"),
            Err(e) => bad(at("tls_ca"), &format!("cannot be read: {e}")),
        }
    }
    // Smaller would refuse ordinary answers; the bound is what matters.
    if p.max_response_bytes < 1024 {
        bad(at("max_response_bytes"), "must be at least 1024");
    }
    let b = &p.breaker;
    for (key, v) in [
        ("breaker.failure_threshold", b.failure_threshold),
        ("breaker.success_threshold", b.success_threshold),
        ("breaker.half_open_max_probes", b.half_open_max_probes),
    ] {
        if v == 0 {
            bad(at(key), "must be at least 1");
        }
    }
    if !(b.error_rate > 0.0 && b.error_rate <= 1.0) {
        bad(at("breaker.error_rate"), "must be above 0 and at most 1");
    }
    if b.min_requests == 0 {
        bad(at("breaker.min_requests"), "must be at least 1");
    }
    if b.window.is_zero() {
        bad(at("breaker.window"), "must be greater than zero");
    }
    if let Some(probe) = &p.probe {
        // Below a second a probe loop is a load generator.
        if probe.interval < Duration::from_secs(1) {
            bad(at("probe.interval"), "must be at least 1s");
        }
        if probe.timeout.is_zero() || probe.timeout > probe.interval {
            bad(
                at("probe.timeout"),
                "must be greater than zero and at most probe.interval",
            );
        }
        let routed = (config.tasks.values().map(|t| &t.chain))
            .chain(config.agents.values().map(|a| &a.chain))
            .flatten()
            .any(|t| t.provider == name);
        if p.kind == ProviderKind::Perplexity && !routed {
            bad(
                at("probe"),
                "Perplexity has no model list: its probe is a one-token completion \
                 of a model a task or agent routes to it, and none does",
            );
        }
    }
    if !(0.0..=1.0).contains(&p.mock.failure_rate) {
        bad(at("mock.failure_rate"), "must be between 0 and 1");
    }
}

/// `[cluster]`: a store URL redis-rs can open, a share, live timeouts.
fn cluster_check(c: &super::cluster::ClusterConfig, bad: &mut dyn FnMut(String, &str)) {
    // Parsed as the client will; its error would quote the URL (and a
    // password in it), so only the expected form is said.
    if redis::IntoConnectionInfo::into_connection_info(c.redis_url.expose()).is_err() {
        bad(
            "cluster.redis_url".into(),
            "must be a redis://host:6379/0 URL (rediss:// for TLS; valkey://, unix:// too)",
        );
    }
    if !(c.fallback_share > 0.0 && c.fallback_share <= 1.0) {
        bad(
            "cluster.fallback_share".into(),
            "must be above 0 and at most 1",
        );
    }
    for (key, value) in [
        ("connect_timeout", c.connect_timeout),
        ("command_timeout", c.command_timeout),
        ("recheck_interval", c.recheck_interval),
    ] {
        if value.is_zero() || value > bounds::MAX_WAIT {
            bad(
                format!("cluster.{key}"),
                "must be greater than zero and at most 1h",
            );
        }
    }
    if c.lease_slack > bounds::MAX_WAIT {
        bad("cluster.lease_slack".into(), "must be at most 1h");
    }
}

pub mod agents;
pub mod bounds;
pub mod lists;
pub mod tools;

/// Most teams `telemetry.team_labels` may list.
const MAX_TEAM_LABELS: usize = 200;

/// Every problem, in a stable order; a list past its bound is all that is reported.
pub(super) fn check(config: &Config) -> Vec<Invalid> {
    let mut out = Vec::new();
    lists::check(config, &mut |path, message| {
        out.push(Invalid {
            origin: None,
            path,
            message: message.to_owned(),
        })
    });
    if !out.is_empty() {
        return out;
    }
    let mut bad = |path: String, message: &str| {
        out.push(Invalid {
            origin: None,
            path,
            message: message.to_owned(),
        })
    };
    for (name, p) in &config.providers {
        provider(config, name, p, &mut bad);
    }
    tasks(config, &mut bad);
    pricing(config, &mut bad);
    unpriced_targets(config, &mut bad);
    auth(config, &mut bad);
    telemetry(config, &mut bad);
    metering(config, &mut bad);
    super::triggers::check(config, &mut bad);
    super::console::check(config, &mut bad);
    if config.database.sqlite_wal_autocheckpoint == 0 {
        bad(
            "database.sqlite_wal_autocheckpoint".into(),
            "must be at least 1 (0 would let the WAL grow without bound)",
        );
    }
    retry(config, &mut bad);
    server(config, &mut bad);
    database(config, &mut bad);
    if let Some(cluster) = &config.cluster {
        cluster_check(cluster, &mut bad);
    }
    http_edge(config, &mut bad);
    let lists: Vec<(String, &[String])> = (config.tasks.iter())
        .map(|(n, t)| (format!("tasks.{n}.guardrails"), t.guardrails.as_slice()))
        .chain(
            (config.agents.iter())
                .map(|(n, a)| (format!("agents.{n}.guardrails"), a.guardrails.as_slice())),
        )
        .collect();
    super::guardrails::check(&config.guardrails, &config.tasks, &lists, &mut bad);
    let masks = (config.tasks.iter())
        .map(|(n, t)| (format!("tasks.{n}.pii.mask"), t.pii.as_ref()))
        .chain(
            (config.agents.iter()).map(|(n, a)| (format!("agents.{n}.pii.mask"), a.pii.as_ref())),
        );
    for (path, pii) in masks {
        if pii.is_some_and(|p| p.mask.is_empty()) {
            bad(path, "must name at least one kind");
        }
    }
    tools::check(config, &mut bad);
    agents::check(config, &mut bad);
    bounds::check(config, &mut bad);
    out
}

/// `[http]`: CORS origins a browser could send, and a port of its own.
fn http_edge(config: &Config, bad: &mut dyn FnMut(String, &str)) {
    let Some(http) = &config.http else { return };
    for (i, origin) in http.cors_origins.iter().enumerate() {
        if origin != "*" && !super::http::is_origin(origin) {
            bad(
                format!("http.cors_origins[{i}]"),
                "must be `*` or an origin as browsers send it: scheme://host[:port], no path",
            );
        }
    }
    if let Some(url) = &http.public_url
        && !(url.starts_with("http://") || url.starts_with("https://"))
    {
        bad(
            "http.public_url".into(),
            "must start with http:// or https://",
        );
    }
    let taken = [Some(config.server.listen), config.server.metrics_listen]
        .into_iter()
        .chain([config.mcp_endpoint.as_ref().map(|e| e.listen)]);
    for addr in taken.flatten() {
        if addr == http.listen && addr.port() != 0 {
            bad(
                "http.listen".into(),
                &format!("{addr} is already another listener's"),
            );
        }
    }
}

fn tasks(config: &Config, bad: &mut dyn FnMut(String, &str)) {
    for (name, t) in &config.tasks {
        let at = |key: &str| format!("tasks.{name}.{key}");
        if t.chain.is_empty() {
            bad(at("chain"), "needs at least one target");
        }
        for (i, target) in t.chain.iter().enumerate() {
            if !config.providers.contains_key(&target.provider) {
                bad(
                    at(&format!("chain[{i}].provider")),
                    &format!("unknown provider `{}`", target.provider),
                );
            }
            if target.model.trim().is_empty() {
                bad(at(&format!("chain[{i}].model")), "must not be empty");
            }
        }
        if t.max_tokens == 0 {
            bad(at("max_tokens"), "must be at least 1");
        } else if t.max_tokens > MAX_OUTPUT_TOKENS {
            bad(
                at("max_tokens"),
                &format!("must be at most {MAX_OUTPUT_TOKENS}"),
            );
        }
        if let Some(temp) = t.temperature
            && !(0.0..=2.0).contains(&temp)
        {
            bad(at("temperature"), "must be between 0 and 2");
        }
        if let Some(schema) = &t.output_schema
            && let Err(e) = jsonschema::validator_for(schema)
        {
            bad(
                at("output_schema"),
                &format!("not a valid JSON schema: {e}"),
            );
        }
        if !(0.0..=1.0).contains(&t.review_threshold) {
            bad(at("review_threshold"), "must be between 0 and 1");
        }
    }
}

fn pricing(config: &Config, bad: &mut dyn FnMut(String, &str)) {
    for (model, price) in &config.pricing {
        let at = |key: &str| format!("pricing.\"{model}\".{key}");
        match (&price.price, price.input_per_mtok, price.output_per_mtok) {
            (Some(p), None, None) if p == "unknown" => {}
            (Some(_), None, None) => bad(at("price"), "the only allowed value is \"unknown\""),
            (Some(_), _, _) => bad(
                at("price"),
                "give either price = \"unknown\" or the per-token prices, not both",
            ),
            (None, Some(i), Some(o)) => {
                for (key, v) in [("input_per_mtok", i), ("output_per_mtok", o)] {
                    if !v.is_finite() || v < 0.0 {
                        bad(at(key), "must be a non-negative number");
                    } else if v > MAX_PRICE_PER_MTOK {
                        bad(
                            at(key),
                            &format!(
                                "must be at most {MAX_PRICE_PER_MTOK} (USD per 1M tokens); a larger price is a typo"
                            ),
                        );
                    }
                }
            }
            (None, None, _) => bad(at("input_per_mtok"), "is required (or price = \"unknown\")"),
            (None, _, None) => bad(
                at("output_per_mtok"),
                "is required (or price = \"unknown\")",
            ),
        }
    }
}

/// With metering on, every task target needs a price (or an explicit "unknown").
fn unpriced_targets(config: &Config, bad: &mut dyn FnMut(String, &str)) {
    if config.metering.enabled {
        for (name, t) in &config.tasks {
            for (i, target) in t.chain.iter().enumerate() {
                if !config.priced(&target.provider, &target.model) {
                    bad(
                        format!("tasks.{name}.chain[{i}].model"),
                        &format!(
                            "no price for `{}`: add [pricing.\"{}\"] (or price = \"unknown\")",
                            target.model, target.model
                        ),
                    );
                }
            }
        }
    }
}

fn auth(config: &Config, bad: &mut dyn FnMut(String, &str)) {
    let mut names = std::collections::BTreeSet::new();
    for (i, key) in config.auth.keys.iter().enumerate() {
        let at = |k: &str| format!("auth.keys[{i}].{k}");
        if key.name.trim().is_empty() {
            bad(at("name"), "must not be empty");
        } else if !names.insert(key.name.as_str()) {
            bad(at("name"), &format!("duplicate key name `{}`", key.name));
        }
        if crate::domain::parse_hash(&key.sha256).is_none() {
            bad(
                at("sha256"),
                "must be the 64-character hex SHA-256 of the key (printf %s \"$KEY\" | sha256sum)",
            );
        }
        if key.teams.iter().all(|t| t.trim().is_empty()) {
            bad(at("teams"), "needs at least one team ID, or \"*\" for all");
        }
    }
    let refresh = config.tool_registry.refresh_interval;
    if refresh.is_zero() || refresh > Duration::from_secs(3600) {
        bad(
            "tool_registry.refresh_interval".into(),
            "must be more than 0 and at most 1h",
        );
    }
    if config.auth.refresh_interval == Duration::ZERO {
        bad("auth.refresh_interval".into(), "must be greater than zero");
    }
}

fn telemetry(config: &Config, bad: &mut dyn FnMut(String, &str)) {
    if !(0.0..=1.0).contains(&config.telemetry.sample_ratio) {
        bad("telemetry.sample_ratio".into(), "must be between 0 and 1");
    }
    // Each listed team is a label value of its own: a bounded list bounds a scrape's series.
    if config.telemetry.team_labels.len() > MAX_TEAM_LABELS {
        bad(
            "telemetry.team_labels".into(),
            &format!("at most {MAX_TEAM_LABELS} teams get their own label"),
        );
    }
    if config.telemetry.team_labels.iter().any(|t| t == "other") {
        bad(
            "telemetry.team_labels".into(),
            "`other` is the label of every unlisted team",
        );
    }
    if let Some(endpoint) = &config.telemetry.otlp_endpoint
        && !(endpoint.starts_with("http://") || endpoint.starts_with("https://"))
    {
        bad(
            "telemetry.otlp_endpoint".into(),
            "must start with http:// or https://",
        );
    }
}

fn metering(config: &Config, bad: &mut dyn FnMut(String, &str)) {
    let m = &config.metering;
    for (table, limits) in [
        ("default_limits", &m.default_limits),
        ("user_limits", &m.user_limits),
    ] {
        for (key, cost) in [
            ("max_cost_usd", limits.max_cost_usd),
            ("max_cost_usd_per_day", limits.max_cost_usd_per_day),
        ] {
            if cost.is_some_and(|c| !c.is_finite() || c < 0.0) {
                bad(
                    format!("metering.{table}.{key}"),
                    "must be a non-negative number",
                );
            }
        }
    }
    if m.batch_max == 0 {
        bad("metering.batch_max".into(), "must be at least 1");
    }
    if m.ledger_writers == 0 {
        bad("metering.ledger_writers".into(), "must be at least 1");
    }
    if m.sweep_after <= config.server.default_timeout {
        bad(
            "metering.sweep_after".into(),
            "must be longer than server.default_timeout (no live request may be swept)",
        );
    }
    if m.sweep_interval == Duration::ZERO {
        bad(
            "metering.sweep_interval".into(),
            "must be greater than zero",
        );
    }
}

fn retry(config: &Config, bad: &mut dyn FnMut(String, &str)) {
    if config.retry.max_attempts == 0 {
        bad(
            "retry.max_attempts".into(),
            "must be at least 1 (1 disables retries)",
        );
    }
    if config.retry.max_backoff < config.retry.base_backoff {
        bad(
            "retry.max_backoff".into(),
            "must be at least retry.base_backoff",
        );
    }
}

fn server(config: &Config, bad: &mut dyn FnMut(String, &str)) {
    if config.server.max_concurrent_requests == 0 {
        bad(
            "server.max_concurrent_requests".into(),
            "must be at least 1",
        );
    }
    for (key, value) in [
        ("max_message_bytes", config.server.max_message_bytes),
        ("max_sms_message_bytes", config.server.max_sms_message_bytes),
        (
            "max_research_message_bytes",
            config.server.max_research_message_bytes,
        ),
    ] {
        if value < config.server.max_input_bytes {
            bad(
                format!("server.{key}"),
                "must be at least server.max_input_bytes",
            );
        }
    }
    for (key, value) in [
        ("max_input_bytes", config.server.max_input_bytes),
        ("max_input_depth", config.server.max_input_depth),
        ("max_prompt_bytes", config.server.max_prompt_bytes),
    ] {
        if value == 0 {
            bad(format!("server.{key}"), "must be at least 1");
        }
    }
    if config.server.default_timeout == Duration::ZERO {
        bad("server.default_timeout".into(), "must be greater than zero");
    }
    // Zero streams would refuse every call; a zero keepalive period would
    // ping without pause (or never wait for the answer).
    if config.server.max_concurrent_streams == 0 {
        bad("server.max_concurrent_streams".into(), "must be at least 1");
    }
    for (key, value) in [
        (
            "server.http2_keepalive_interval",
            config.server.http2_keepalive_interval,
        ),
        (
            "server.http2_keepalive_timeout",
            config.server.http2_keepalive_timeout,
        ),
    ] {
        if value == Duration::ZERO {
            bad(key.into(), "must be greater than zero");
        }
    }
}

fn database(config: &Config, bad: &mut dyn FnMut(String, &str)) {
    if let Err(why) = database_url(&config.database.url) {
        bad("database.url".into(), why);
    }
    if config.database.max_connections == 0 {
        bad("database.max_connections".into(), "must be at least 1");
    }
}

#[cfg(test)]
mod tests;
