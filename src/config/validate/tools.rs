//! Validation of `[tools]`, `[mcp_servers]`, `[mcp_endpoint]` and `[auth.roles]`: a bad
//! schema, a webhook without a URL or an unknown role stops start-up, naming the key.

use super::bounds::{MAX_WAIT, at_most};
use crate::config::{
    Config, McpServerConfig, ToolConfig, ToolKind,
    tools::{CostConfig, CostUnit, name_and_version},
};
use std::time::Duration;

/// The built-in tools (a `builtin` tool of the config must be one).
pub const BUILTINS: [&str; 3] = ["system.echo", "system.health", "sms.segments"];

/// Longest a workflow may take to call back.
const CALLBACK_MAX: Duration = Duration::from_secs(30 * 24 * 3600);

/// The roles a key may hold.
pub const ROLES: [&str; 3] = ["viewer", "caller", "admin"];

/// Most `mcp_endpoint.max_sessions`: each holds a worker task and buffers; more is no cap.
const MAX_MCP_SESSIONS: usize = 100_000;

/// A tool or server name: letters, digits, `_`, `-` and `.`, from 1 to 64.
fn valid_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
        && !name.starts_with('.')
        && !name.ends_with('.')
}

/// A JSON Schema's first problem, naming where in the schema it is.
fn schema_problem(schema: &serde_json::Value) -> Option<String> {
    if !schema.is_object() {
        return Some("must be a JSON Schema object".into());
    }
    match jsonschema::draft202012::options().build(schema) {
        Ok(_) => None,
        Err(e) => {
            let at = e.instance_path().to_string();
            let at = if at.is_empty() {
                "its root".to_owned()
            } else {
                at
            };
            Some(format!(
                "not a valid JSON Schema (draft 2020-12) at {at}: {}",
                e.kind().keyword()
            ))
        }
    }
}

fn cost_problems(
    cost: &CostConfig,
    at: &dyn Fn(&str) -> String,
    bad: &mut dyn FnMut(String, &str),
) {
    if !cost.fixed_usd.is_finite() || !(0.0..=1000.0).contains(&cost.fixed_usd) {
        bad(at("cost.fixed_usd"), "must be between 0 and 1000 USD");
    }
    if let Some(per) = &cost.per_unit {
        if !per.usd.is_finite() || !(0.0..=1000.0).contains(&per.usd) {
            bad(at("cost.per_unit.usd"), "must be between 0 and 1000 USD");
        }
        match (per.unit, &per.input_field) {
            (CostUnit::Second, Some(_)) => bad(
                at("cost.per_unit.input_field"),
                "not used with unit \"second\"",
            ),
            (CostUnit::Second, None) | (_, Some(_)) => {}
            (_, None) => bad(
                at("cost.per_unit.input_field"),
                "required: the input field the unit counts",
            ),
        }
    }
}

/// A timeout past `tool_limits.max_timeout` was capped at load; one left
/// past an hour means the cap itself was refused.
fn timeout_problem(timeout: Duration) -> Option<String> {
    if timeout.is_zero() {
        Some("must be greater than zero".into())
    } else if timeout > MAX_WAIT {
        Some(at_most(MAX_WAIT))
    } else {
        None
    }
}

/// Keys a built-in's section may not set: its code decides them (or they
/// are a webhook's), and a key accepted but ignored would mislead.
fn builtin_problems(
    t: &ToolConfig,
    version: Option<&str>,
    at: &dyn Fn(&str) -> String,
    bad: &mut dyn FnMut(String, &str),
) {
    let ours = "a built-in's own: it cannot be configured";
    // Not semver at all is refused as such, once.
    if version.is_some_and(|v| semver::Version::parse(v).is_ok() && v != "1.0.0") {
        bad(at("version"), "the built-ins are version 1.0.0");
    }
    if t.side_effects {
        bad(at("side_effects"), ours);
    }
    if t.tenant_scoped.is_some() {
        bad(at("tenant_scoped"), ours);
    }
    if t.input_schema != crate::config::tools::any_object() {
        bad(at("input_schema"), ours);
    }
    if t.output_schema.is_some() {
        bad(at("output_schema"), ours);
    }
    http_only(t, at, bad);
}

/// Refuses the keys only a webhook (kind http) has.
fn http_only(t: &ToolConfig, at: &dyn Fn(&str) -> String, bad: &mut dyn FnMut(String, &str)) {
    use crate::config::tools::{Completion, default_callback_timeout};
    use crate::config::tools::{
        ToolRetryConfig, default_execution_header, default_idempotency_window,
    };
    for (key, set) in [
        ("completion", t.completion != Completion::Response),
        ("callback_secret_env", t.callback_secret_env.is_some()),
        (
            "callback_timeout",
            t.callback_timeout != default_callback_timeout(),
        ),
        ("url", t.url.is_some()),
        ("auth_header", t.auth_header.is_some()),
        ("auth_env", t.auth_env.is_some()),
        ("retry", t.retry != ToolRetryConfig::default()),
        (
            "idempotency_window",
            t.idempotency_window != default_idempotency_window(),
        ),
        (
            "execution_id_header",
            t.execution_id_header != default_execution_header(),
        ),
    ] {
        if set {
            bad(at(key), "only for kind http");
        }
    }
}

/// A task tool (`kind = "task"`): a task of the config, run for a team,
/// costing what its model call costs.
fn task_problems(
    t: &ToolConfig,
    config: &Config,
    at: &dyn Fn(&str) -> String,
    bad: &mut dyn FnMut(String, &str),
) {
    match &t.task {
        None => bad(at("task"), "required for kind task"),
        Some(task) if !config.tasks.contains_key(task) => {
            bad(at("task"), &format!("no task `{task}` in [tasks]"));
        }
        Some(_) => {}
    }
    if t.tenant_scoped == Some(false) {
        bad(
            at("tenant_scoped"),
            "a task tool's model call is metered to a team: it is always tenant-scoped",
        );
    }
    if t.cost != CostConfig::default() {
        bad(
            at("cost"),
            "a task tool costs what its model call costs, metered under its task",
        );
    }
    http_only(t, at, bad);
}

fn url_ok(url: &str) -> bool {
    url.starts_with("http://") || url.starts_with("https://")
}

/// Every problem of the tool sections.
pub(super) fn check(config: &Config, bad: &mut dyn FnMut(String, &str)) {
    for (key, t) in &config.tools {
        tool(key, t, config, bad);
    }
    for (name, s) in &config.mcp_servers {
        server(name, s, bad);
    }
    let max = config.tool_limits.max_timeout;
    if max.is_zero() || max > MAX_WAIT {
        bad(
            "tool_limits.max_timeout".into(),
            &format!("must be more than 0 and {}", at_most(MAX_WAIT)),
        );
    }
    if let Some(e) = &config.mcp_endpoint {
        if !e.path.starts_with('/') {
            bad("mcp_endpoint.path".into(), "must start with /");
        }
        if !(1..=MAX_MCP_SESSIONS).contains(&e.max_sessions) {
            bad(
                "mcp_endpoint.max_sessions".into(),
                &format!("must be 1 to {MAX_MCP_SESSIONS}"),
            );
        }
    }
    for role in config.auth.roles.keys() {
        if !ROLES.contains(&role.as_str()) {
            bad(
                format!("auth.roles.{role}"),
                "unknown role (roles: viewer, caller, admin)",
            );
        }
    }
}

/// The problems of a tool registered at run time (SPEC §16) under `config`,
/// as `(config.<key>, why)`: the checks of a config file's tool, and a
/// name no built-in, config tool or MCP server holds.
pub fn runtime_tool(key: &str, t: &ToolConfig, config: &Config) -> Vec<(String, String)> {
    let mut problems = Vec::new();
    let prefix = format!("tools.\"{key}\"");
    tool(key, t, config, &mut |path, why| {
        let field = match path.strip_prefix(&prefix) {
            Some("") => "name".to_owned(),
            Some(rest) => format!("config{rest}"),
            None => path,
        };
        problems.push((field, why.to_owned()));
    });
    let (name, _) = name_and_version(key, None);
    if let Some((server, _)) = name.split_once('.')
        && config.mcp_servers.contains_key(server)
    {
        problems.push((
            "name".into(),
            format!("`{server}.` names the tools of the MCP server `{server}`"),
        ));
    }
    problems
}

fn tool(key: &str, t: &ToolConfig, config: &Config, bad: &mut dyn FnMut(String, &str)) {
    let at = |k: &str| format!("tools.\"{key}\".{k}");
    let (name, version) = name_and_version(key, t.version.as_deref());
    if !valid_name(&name) {
        bad(
            format!("tools.\"{key}\""),
            "a tool name is 1-64 letters, digits, `_`, `-` or `.`",
        );
    }
    if let Some(v) = &version
        && semver::Version::parse(v).is_err()
    {
        bad(at("version"), "must be a semantic version (1.2.0)");
    }
    if let Some(problem) = timeout_problem(t.timeout) {
        bad(at("timeout"), &problem);
    }
    if let Some(problem) = schema_problem(&t.input_schema) {
        bad(at("input_schema"), &problem);
    }
    if let Some(schema) = &t.output_schema
        && let Some(problem) = schema_problem(schema)
    {
        bad(at("output_schema"), &problem);
    }
    cost_problems(&t.cost, &at, bad);
    for (k, v) in [
        ("quota.max_per_hour", t.quota.max_per_hour),
        ("quota.max_concurrent", t.quota.max_concurrent),
    ] {
        if v == Some(0) {
            bad(at(k), "must be at least 1 (leave it out for no limit)");
        }
    }
    match t.kind {
        ToolKind::Builtin => {
            if !BUILTINS.contains(&name.as_str()) {
                bad(
                    format!("tools.\"{key}\".kind"),
                    &format!(
                        "no built-in tool `{name}` (built-ins: {})",
                        BUILTINS.join(", ")
                    ),
                );
            }
            builtin_problems(t, version.as_deref(), &at, bad);
        }
        ToolKind::Http => http_problems(t, &at, bad),
        ToolKind::Task => task_problems(t, config, &at, bad),
    }
    if t.task.is_some() && t.kind != ToolKind::Task {
        bad(at("task"), "only for kind task");
    }
}

/// The keys only a webhook (kind http) has.
fn http_problems(t: &ToolConfig, at: &dyn Fn(&str) -> String, bad: &mut dyn FnMut(String, &str)) {
    match &t.url {
        None => bad(at("url"), "required for kind http"),
        Some(url) if !url_ok(url) => bad(at("url"), "must start with http:// or https://"),
        Some(_) => {}
    }
    if t.auth_header.is_some() != t.auth_env.is_some() {
        bad(at("auth_env"), "auth_header and auth_env go together");
    }
    if t.retry.max_attempts == 0 {
        bad(at("retry.max_attempts"), "must be at least 1");
    }
    if t.retry.initial_backoff > t.retry.max_backoff {
        bad(
            at("retry.initial_backoff"),
            "must not exceed retry.max_backoff",
        );
    }
    // The retry loop's pause is a share of the cap (`Duration::mul_f64` panics near 2^64 s).
    if t.retry.initial_backoff.is_zero() {
        bad(
            at("retry.initial_backoff"),
            "must be greater than zero (zero retries without a pause)",
        );
    }
    if t.retry.max_backoff > MAX_WAIT {
        bad(at("retry.max_backoff"), &at_most(MAX_WAIT));
    }
    if let Some(problem) = t.retry.attempt_timeout.and_then(timeout_problem) {
        bad(at("retry.attempt_timeout"), &problem);
    }
    if t.idempotency_window.is_zero() {
        bad(at("idempotency_window"), "must be greater than zero");
    }
    callback_problems(t, at, bad);
}

/// A webhook that calls back: a key to check its signature, a time to wait.
fn callback_problems(
    t: &ToolConfig,
    at: &dyn Fn(&str) -> String,
    bad: &mut dyn FnMut(String, &str),
) {
    use crate::config::tools::{Completion, default_callback_timeout};
    if t.completion == Completion::Response {
        for (key, set) in [
            ("callback_secret_env", t.callback_secret_env.is_some()),
            (
                "callback_timeout",
                t.callback_timeout != default_callback_timeout(),
            ),
        ] {
            if set {
                bad(at(key), "only with completion = \"callback\"");
            }
        }
        return;
    }
    if t.callback_secret_env.is_none() {
        bad(
            at("callback_secret_env"),
            "required with completion = \"callback\": the callbacks are signed with it",
        );
    }
    if t.callback_timeout.is_zero() || t.callback_timeout > CALLBACK_MAX {
        bad(
            at("callback_timeout"),
            "must be more than 0 and at most 30 days",
        );
    }
}

fn server(name: &str, s: &McpServerConfig, bad: &mut dyn FnMut(String, &str)) {
    let at = |k: &str| format!("mcp_servers.{name}.{k}");
    if !valid_name(name) || name.contains('.') {
        bad(
            format!("mcp_servers.{name}"),
            "a server name is 1-64 letters, digits, `_` or `-`",
        );
    }
    match (&s.url, &s.command) {
        (Some(_), Some(_)) | (None, None) => bad(
            format!("mcp_servers.{name}"),
            "needs exactly one of url (Streamable HTTP) or command (stdio)",
        ),
        (Some(url), None) if !url_ok(url) => bad(at("url"), "must start with http:// or https://"),
        (None, Some(cmd)) if cmd.is_empty() => bad(at("command"), "needs the program to run"),
        _ => {}
    }
    if let Some(problem) = timeout_problem(s.timeout) {
        bad(at("timeout"), &problem);
    }
    if s.refresh_interval.is_zero() {
        bad(at("refresh_interval"), "must be greater than zero");
    }
    cost_problems(&s.cost, &at, bad);
}

#[cfg(test)]
mod tests {
    use crate::config::Config;
    use std::time::Duration;

    fn paths(toml: &str) -> Vec<String> {
        Config::from_toml_str(toml, |_| Some("x".into()))
            .err()
            .map(|e| e.paths())
            .unwrap_or_default()
    }

    #[test]
    fn a_tool_whose_schema_does_not_compile_is_refused_with_its_key() {
        let ok = r#"
[tools."crm.add_note"]
kind = "http"
version = "1.0.0"
url = "https://n8n.example.com/webhook/crm-add-note"
auth_header = "X-N8N-API-KEY"
auth_env = "N8N_API_KEY"
side_effects = true
input_schema = { type = "object", required = ["lead_id"], properties = { lead_id = { type = "string" } } }
cost = { fixed_usd = 0.001 }
quota = { max_per_hour = 1000, max_concurrent = 10 }
"#;
        assert!(paths(ok).is_empty(), "{:?}", paths(ok));
        let broken = ok.replace(r#"{ type = "string" }"#, r#"{ type = "strng" }"#);
        assert_eq!(paths(&broken), [r#"tools."crm.add_note".input_schema"#]);
        let as_json = r#"
[tools."crm.echo"]
kind = "http"
url = "https://n8n.example.com/hook"
input_schema = '{"type": "object", "properties": {"text": {"minLength": -1}}}'
"#;
        assert_eq!(paths(as_json), [r#"tools."crm.echo".input_schema"#]);
    }

    #[test]
    fn a_builtins_section_sets_only_what_applies_to_it() {
        let ok = r#"
[tools."system.echo"]
kind = "builtin"
enabled = false
timeout = "2s"
capability = "tool:echo"
description = "Echo."
cost = { fixed_usd = 0.001 }
quota = { max_per_hour = 10 }
"#;
        assert!(paths(ok).is_empty(), "{:?}", paths(ok));
        let ignored = r#"
[tools."system.echo@2.0.0"]
kind = "builtin"
side_effects = true
tenant_scoped = false
input_schema = { type = "object", required = ["x"] }
output_schema = { type = "object" }
url = "https://example.com"
retry = { max_attempts = 1 }
idempotency_window = "1m"
"#;
        let at = |k: &str| format!(r#"tools."system.echo@2.0.0".{k}"#);
        assert_eq!(
            paths(ignored),
            [
                at("version"),
                at("side_effects"),
                at("tenant_scoped"),
                at("input_schema"),
                at("output_schema"),
                at("url"),
                at("retry"),
                at("idempotency_window"),
            ]
        );
    }

    #[test]
    fn tool_and_server_settings_are_checked() {
        let toml = r#"
[tools."a b"]
kind = "http"
timeout = "0s"
cost = { per_unit = { unit = "token", usd = 0.1 } }
[tools."x@nope"]
kind = "builtin"
[mcp_servers.s]
[auth.roles.superuser]
capabilities = ["*"]
"#;
        assert_eq!(
            paths(toml),
            [
                r#"tools."a b""#,
                r#"tools."a b".timeout"#,
                r#"tools."a b".cost.per_unit.input_field"#,
                r#"tools."a b".url"#,
                r#"tools."x@nope".version"#,
                r#"tools."x@nope".kind"#,
                "mcp_servers.s",
                "auth.roles.superuser",
            ]
        );
    }

    #[test]
    fn timeouts_past_max_timeout_are_capped_with_a_note() {
        let toml = r#"
[tools."crm.slow"]
kind = "http"
url = "https://n8n.example.com/hook"
timeout = "90s"
[tools."crm.quick"]
kind = "http"
url = "https://n8n.example.com/hook"
timeout = "5s"
"#;
        let load =
            |toml: &str| Config::from_toml_str(toml, |_| None).unwrap_or_else(|e| panic!("{e}"));
        let config = load(toml);
        assert_eq!(config.tools["crm.slow"].timeout, Duration::from_secs(60));
        assert_eq!(config.tools["crm.quick"].timeout, Duration::from_secs(5));
        assert_eq!(
            config.notes,
            [r#"tools."crm.slow".timeout = 1m 30s is over tool_limits.max_timeout: capped to 1m"#]
        );
        let lower = load(&format!("[tool_limits]\nmax_timeout = \"2s\"\n{toml}"));
        assert_eq!(lower.tools["crm.slow"].timeout, Duration::from_secs(2));
        assert_eq!(lower.tools["crm.quick"].timeout, Duration::from_secs(2));
        assert_eq!(lower.notes.len(), 2);
        // The cap itself is bounded, and then nothing is capped by it.
        for cap in ["0s", "2h"] {
            assert_eq!(
                paths(&format!("[tool_limits]\nmax_timeout = \"{cap}\"\n{toml}")),
                ["tool_limits.max_timeout"]
            );
        }
    }

    #[test]
    fn a_webhooks_backoff_is_above_zero_and_bounded() {
        let tool = |retry: &str| {
            format!(
                "[tools.\"crm.add_note\"]\nkind = \"http\"\nurl = \"https://n8n.example.com/hook\"\n\
                 retry = {{ {retry} }}\n"
            )
        };
        let at = |k: &str| format!(r#"tools."crm.add_note".retry.{k}"#);
        assert!(paths(&tool(r#"initial_backoff = "1ms", max_backoff = "1h""#)).is_empty());
        // Where the retry loop's arithmetic would overflow.
        let huge = r#""18446744073709551615s""#;
        assert_eq!(
            paths(&tool(&format!(
                "initial_backoff = {huge}, max_backoff = {huge}"
            ))),
            [at("max_backoff")]
        );
        assert_eq!(
            paths(&tool(&format!("initial_backoff = {huge}"))),
            [at("initial_backoff")]
        );
        assert_eq!(paths(&tool(r#"max_backoff = "61m""#)), [at("max_backoff")]);
        assert_eq!(
            paths(&tool(r#"initial_backoff = "0s""#)),
            [at("initial_backoff")]
        );
    }

    #[test]
    fn a_task_tool_names_a_task_of_the_config_and_nothing_of_a_webhook() {
        let tasks = "[providers.p]\nkind = \"mock\"\n[pricing.m]\nprice = \"unknown\"\n[tasks.brief]\nchain = [{ provider = \"p\", model = \"m\" }]\n";
        let ok = format!(
            "{tasks}[tools.\"crm.brief\"]\nkind = \"task\"\ntask = \"brief\"\noutput_schema = {{ type = \"object\" }}\n"
        );
        assert!(paths(&ok).is_empty(), "{:?}", paths(&ok));
        let at = |k: &str| format!("tools.\"crm.brief\".{k}");
        let with = |line: &str| format!("{ok}{line}\n");
        assert_eq!(paths(&ok.replace("task = \"brief\"\n", "")), [at("task")]);
        assert_eq!(
            paths(&ok.replace("task = \"brief\"", "task = \"nope\"")),
            [at("task")]
        );
        assert_eq!(paths(&with("cost = { fixed_usd = 0.01 }")), [at("cost")]);
        assert_eq!(paths(&with("tenant_scoped = false")), [at("tenant_scoped")]);
        assert_eq!(paths(&with("url = \"https://example.com\"")), [at("url")]);
        let http = format!(
            "{tasks}[tools.\"crm.hook\"]\nkind = \"http\"\nurl = \"https://example.com\"\ntask = \"brief\"\n"
        );
        assert_eq!(paths(&http), ["tools.\"crm.hook\".task"]);
    }
}
