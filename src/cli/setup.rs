//! `check-config` and `migrate`: the config checked and described, the database set up.

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
    describe_tools_and_agents(config, &mut out);
    let _ = writeln!(out, "\ndatabase: {}", redact_url(&config.database.url));
    if !config.notes.is_empty() {
        out.push_str("\nnotes:\n");
        for note in &config.notes {
            let _ = writeln!(out, "  {note}");
        }
    }
    out
}

/// The configured tools, MCP servers and agents, with the values in force (a timeout after
/// its cap). No webhook URLs: their paths are often the webhook's only secret.
fn describe_tools_and_agents(config: &Config, out: &mut String) {
    use crate::config::tools::name_and_version;
    if !config.tools.is_empty() {
        out.push_str("\ntools:\n");
        for (key, t) in &config.tools {
            let (name, version) = name_and_version(key, t.version.as_deref());
            let _ = writeln!(
                out,
                "  {:<28} kind={:<7} enabled={} side_effects={} timeout={:?}",
                format!("{name}@{}", version.as_deref().unwrap_or("1.0.0")),
                t.kind.as_str(),
                t.enabled,
                t.side_effects,
                t.timeout,
            );
        }
    }
    if !config.mcp_servers.is_empty() {
        out.push_str("\nmcp servers:\n");
        for (name, s) in &config.mcp_servers {
            let transport = if s.url.is_some() { "http" } else { "stdio" };
            let _ = writeln!(
                out,
                "  {name:<16} transport={transport} timeout={:?} refresh={:?}",
                s.timeout, s.refresh_interval
            );
        }
    }
    if let Some(e) = &config.mcp_endpoint {
        let _ = writeln!(out, "\nmcp endpoint: http://{}{}", e.listen, e.path);
    }
    if !config.agents.is_empty() {
        out.push_str("\nagents:\n");
        for (name, a) in &config.agents {
            let chain: Vec<String> = a
                .chain
                .iter()
                .map(|c| format!("{}/{}", c.provider, c.model))
                .collect();
            let _ = writeln!(
                out,
                "  {name:<16} {} tools=[{}] tool_timeout={:?}",
                chain.join(" -> "),
                a.tools.join(", "),
                a.tool_timeout,
            );
        }
    }
}

/// Hides the passwords in a database URL: the user info's (up to the authority's last `@`,
/// as URL parsers read it) and secret query parameters (`password=`, `sslpassword=`).
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

#[cfg(test)]
mod tests {
    use super::check_config;
    use crate::config::Config;

    #[test]
    fn check_config_describes_tools_and_agents_and_says_what_it_capped() {
        let toml = r#"
[tools."crm.add_note@2.1.0"]
kind = "http"
url = "https://n8n.example.com/webhook/secret-path"
side_effects = true
timeout = "90s"

[providers.mock]
kind = "mock"

[pricing.m]
price = "unknown"

[agents.sdr]
chain = [{ provider = "mock", model = "m" }]
core_prompt = "You help."
tools = ["crm.*"]
"#;
        let config = Config::from_toml_str(toml, |_| None).unwrap_or_else(|e| panic!("{e}"));
        let out = check_config(&config);
        assert!(out.contains("crm.add_note@2.1.0"), "{out}");
        assert!(out.contains("kind=http"), "{out}");
        assert!(out.contains("timeout=60s"), "the capped value: {out}");
        assert!(!out.contains("secret-path"), "no webhook URL: {out}");
        assert!(out.contains("sdr"), "{out}");
        assert!(out.contains("mock/m tools=[crm.*]"), "{out}");
        assert!(
            out.contains("notes:\n  tools.\"crm.add_note@2.1.0\".timeout = 1m 30s is over"),
            "{out}"
        );
    }
}
