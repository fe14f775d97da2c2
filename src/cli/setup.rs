//! `check-config` and `migrate`: a config checked and described, and the
//! database created or upgraded.

use crate::{config::Config, store::Store};
use anyhow::Context;
use std::fmt::Write as _;

/// Validates the config file and describes it.
pub fn check_config(config: &Config) -> String {
    let mut out = String::from("config OK\n\nserver:\n");
    let _ = writeln!(
        out,
        "  listen={} metrics={} database={} metering={} max_concurrent_requests={}",
        config.server.listen,
        config
            .server
            .metrics_listen
            .map_or_else(|| "off".to_string(), |a| a.to_string()),
        if config.database.url.starts_with("postgres") {
            "postgres"
        } else {
            "sqlite"
        },
        if config.metering.enabled { "on" } else { "off" },
        config.server.max_concurrent_requests,
    );
    out.push_str("\nproviders:\n");
    for (name, p) in &config.providers {
        let _ = writeln!(
            out,
            "  {name:<12} kind={:<17} base_url={} key={} timeout={:?}",
            p.kind.as_str(),
            config.base_url(name).unwrap_or_else(|| "-".into()),
            if p.api_key.is_some() { "[set]" } else { "-" },
            p.timeout,
        );
    }
    out.push_str("\ntasks:\n");
    for (name, t) in &config.tasks {
        let chain: Vec<String> = t
            .chain
            .iter()
            .map(|c| format!("{}/{}", c.provider, c.model))
            .collect();
        let _ = writeln!(out, "  {name:<16} {}", chain.join(" -> "));
    }
    let _ = writeln!(out, "\ndatabase: {}", redact_url(&config.database.url));
    if !config.notes.is_empty() {
        out.push_str("\nnotes:\n");
        for note in &config.notes {
            let _ = writeln!(out, "  {note}");
        }
    }
    out
}

/// Hides the passwords in a database URL: the user info's (up to the last
/// `@` of the authority, as URL parsers read it) and any query parameter
/// naming a secret (`password=`, `sslpassword=`).
pub(super) fn redact_url(url: &str) -> String {
    let Some(scheme_end) = url.find("://").map(|i| i + 3) else {
        return url.to_owned();
    };
    let (head, rest) = url.split_at(scheme_end);
    let (authority, tail) = rest.split_at(rest.find(['/', '?', '#']).unwrap_or(rest.len()));
    let authority = match authority.rfind('@') {
        Some(at) => {
            let (creds, host) = authority.split_at(at);
            match creds.split_once(':') {
                Some((user, _)) => format!("{user}:[REDACTED]{host}"),
                None => authority.to_owned(),
            }
        }
        None => authority.to_owned(),
    };
    let tail = match tail.split_once('?') {
        Some((path, query)) => {
            let query: Vec<String> = query
                .split('&')
                .map(|pair| match pair.split_once('=') {
                    Some((k, _)) if crate::audit::digest::is_sensitive(k) || k == "pass" => {
                        format!("{k}=[REDACTED]")
                    }
                    _ => pair.to_owned(),
                })
                .collect();
            format!("{path}?{}", query.join("&"))
        }
        None => tail.to_owned(),
    };
    format!("{head}{authority}{tail}")
}

/// Applies migrations and lists the tables.
pub async fn migrate(config: &Config) -> anyhow::Result<String> {
    let store = Store::connect(&config.database)
        .await
        .context("connecting to the database")?;
    store.migrate().await.context("migrating")?;
    let tables = store.tables().await?;
    store.close().await;
    Ok(format!(
        "migrated {} database; tables: {}\n",
        store.backend(),
        tables.join(", ")
    ))
}
