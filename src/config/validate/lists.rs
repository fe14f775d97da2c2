//! Bounds on how many entries each list and table may hold, checked before per-entry work:
//! 20,000 chain targets get one error naming the key, not 20,000 errors each walking the list.
//! Each bound is far above any real deployment (docs/configuration.md, *Limits*).

use crate::config::Config;

/// Largest config file read, in bytes: a thousand tools with schemas fit in a fraction.
pub const MAX_FILE_BYTES: u64 = 4 * 1024 * 1024;

/// Providers: each gets HTTP client pools, a breaker and maybe a probe loop.
pub const MAX_PROVIDERS: usize = 64;
/// Tasks.
pub const MAX_TASKS: usize = 1_000;
/// Targets of one chain: a walk past a handful of providers outlives any deadline.
pub const MAX_CHAIN_TARGETS: usize = 16;
/// Prices.
pub const MAX_PRICES: usize = 10_000;
/// Tools declared in the file (each compiles its schemas at start).
pub const MAX_TOOLS: usize = 1_000;
/// MCP servers (each holds a connection or a child process).
pub const MAX_MCP_SERVERS: usize = 64;
/// Program and arguments of an MCP server's `command`.
pub const MAX_COMMAND_ARGS: usize = 256;
/// `mcp_endpoint.allowed_hosts`, `http.cors_origins`.
pub const MAX_ALLOWED_HOSTS: usize = 256;
/// Agents.
pub const MAX_AGENTS: usize = 1_000;
/// Tool names or patterns one agent lists.
pub const MAX_AGENT_TOOLS: usize = 1_000;
/// API keys in the file (more belong in the database: `keys create`).
pub const MAX_KEYS: usize = 10_000;
/// Teams one key may act for.
pub const MAX_KEY_TEAMS: usize = 10_000;
/// Roles.
pub const MAX_ROLES: usize = 256;
/// Capabilities of one role.
pub const MAX_CAPABILITIES: usize = 1_000;
/// Answers of a mock's `tool_script`, and tool calls in one answer.
pub const MAX_SCRIPT_STEPS: usize = 100;

/// Every list past its bound, each naming its key. When this finds any,
/// nothing else is checked.
pub(super) fn check(config: &Config, bad: &mut dyn FnMut(String, &str)) {
    let mut over = |path: String, len: usize, max: usize| {
        if len > max {
            bad(path, &format!("holds {len} entries; at most {max} allowed"));
        }
    };
    over("providers".into(), config.providers.len(), MAX_PROVIDERS);
    over("tasks".into(), config.tasks.len(), MAX_TASKS);
    over("pricing".into(), config.pricing.len(), MAX_PRICES);
    over("tools".into(), config.tools.len(), MAX_TOOLS);
    over(
        "mcp_servers".into(),
        config.mcp_servers.len(),
        MAX_MCP_SERVERS,
    );
    over("agents".into(), config.agents.len(), MAX_AGENTS);
    over("auth.keys".into(), config.auth.keys.len(), MAX_KEYS);
    over("auth.roles".into(), config.auth.roles.len(), MAX_ROLES);
    // Entries are looked into only when their table is within bounds.
    for (name, p) in config.providers.iter().take(MAX_PROVIDERS) {
        let script = &p.mock.tool_script;
        over(
            format!("providers.{name}.mock.tool_script"),
            script.len(),
            MAX_SCRIPT_STEPS,
        );
        for (i, step) in script.iter().enumerate().take(MAX_SCRIPT_STEPS) {
            let path = format!("providers.{name}.mock.tool_script[{i}]");
            over(path, step.len(), MAX_SCRIPT_STEPS);
        }
    }
    for (name, t) in config.tasks.iter().take(MAX_TASKS) {
        let path = format!("tasks.{name}.chain");
        over(path, t.chain.len(), MAX_CHAIN_TARGETS);
    }
    for (name, a) in config.agents.iter().take(MAX_AGENTS) {
        let path = format!("agents.{name}.chain");
        over(path, a.chain.len(), MAX_CHAIN_TARGETS);
        over(
            format!("agents.{name}.tools"),
            a.tools.len(),
            MAX_AGENT_TOOLS,
        );
    }
    for (name, s) in config.mcp_servers.iter().take(MAX_MCP_SERVERS) {
        let args = s.command.as_ref().map_or(0, Vec::len);
        over(
            format!("mcp_servers.{name}.command"),
            args,
            MAX_COMMAND_ARGS,
        );
    }
    if let Some(endpoint) = &config.mcp_endpoint {
        over(
            "mcp_endpoint.allowed_hosts".into(),
            endpoint.allowed_hosts.len(),
            MAX_ALLOWED_HOSTS,
        );
    }
    if let Some(http) = &config.http {
        over(
            "http.cors_origins".into(),
            http.cors_origins.len(),
            MAX_ALLOWED_HOSTS,
        );
    }
    for (i, key) in config.auth.keys.iter().enumerate().take(MAX_KEYS) {
        let path = format!("auth.keys[{i}].teams");
        over(path, key.teams.len(), MAX_KEY_TEAMS);
    }
    for (name, role) in config.auth.roles.iter().take(MAX_ROLES) {
        let path = format!("auth.roles.{name}.capabilities");
        over(path, role.capabilities.len(), MAX_CAPABILITIES);
    }
}

#[cfg(test)]
mod tests {
    use crate::config::{Config, ConfigError};
    use std::fmt::Write;

    const BASE: &str = "[providers.p]\nkind = \"mock\"\n[pricing.m]\nprice = \"unknown\"\n";

    fn chain(n: usize, provider: &str) -> String {
        let targets: Vec<String> = (0..n)
            .map(|i| format!("{{ provider = \"{provider}{i}\", model = \"m\" }}"))
            .collect();
        format!("chain = [{}]\n", targets.join(", "))
    }

    #[test]
    fn a_list_past_its_bound_is_the_only_error() {
        let toml = format!("{BASE}[tasks.t]\n{}", chain(20_000, "nope"));
        let err = Config::from_toml_str(&toml, |_| None).err().unwrap();
        assert_eq!(err.paths(), ["tasks.t.chain"]);
        assert!(
            err.to_string()
                .contains("holds 20000 entries; at most 16 allowed"),
            "{err}"
        );
    }

    #[test]
    fn every_bounded_list_names_its_key() {
        let mut toml = String::from(BASE);
        let _ = writeln!(toml, "[agents.a]\ncore_prompt = \"x\"\n{}", chain(17, "p"));
        let tools: Vec<String> = (0..1001).map(|i| format!("\"t{i}\"")).collect();
        let _ = writeln!(toml, "tools = [{}]", tools.join(","));
        let _ = writeln!(toml, "[auth.roles.r]\ncapabilities = [{}]", tools.join(","));
        let args: Vec<String> = (0..257).map(|i| format!("\"a{i}\"")).collect();
        let _ = writeln!(toml, "[mcp_servers.s]\ncommand = [{}]", args.join(","));
        let err = Config::from_toml_str(&toml, |_| None).err().unwrap();
        assert_eq!(
            err.paths(),
            [
                "agents.a.chain",
                "agents.a.tools",
                "mcp_servers.s.command",
                "auth.roles.r.capabilities",
            ]
        );
    }

    /// Within the bounds, thousands of bad entries get every error, each with its origin, at once.
    #[test]
    fn thousands_of_errors_within_the_bounds_are_all_reported() {
        let mut toml = String::from(BASE);
        for t in 0..1000 {
            let _ = write!(toml, "[tasks.t{t}]\n{}", chain(16, "nope"));
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("big.toml");
        std::fs::write(&path, toml).unwrap();
        let err = Config::load_with_env(&path, |_| None).err().unwrap();
        let ConfigError::Invalid(problems) = &err else {
            panic!("{err}");
        };
        assert_eq!(problems.len(), 16_000);
        assert!(
            problems
                .iter()
                .all(|p| p.origin.as_deref() == Some(&*path.display().to_string()))
        );
        // The message lists the first problems and counts the rest.
        let shown = err.to_string();
        assert_eq!(shown.lines().count(), 1 + 100 + 1, "{shown}");
        assert!(shown.ends_with("… and 15900 more problems"), "{shown}");
    }

    #[test]
    fn a_file_past_the_size_bound_is_refused_before_parsing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("huge.toml");
        let size = usize::try_from(super::MAX_FILE_BYTES).unwrap() + 1;
        std::fs::write(&path, "#".repeat(size)).unwrap();
        let err = Config::load_with_env(&path, |_| None).err().unwrap();
        assert!(
            err.to_string()
                .contains("is 4194305 bytes; at most 4194304"),
            "{err}"
        );
    }
}
