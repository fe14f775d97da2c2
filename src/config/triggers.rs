//! `[triggers.<name>]`: platform events that start a tool (SPEC §16).

use serde::Deserialize;

/// The events a trigger can follow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub enum TriggerEvent {
    /// A tool invocation ended FAILED or TIMED_OUT (`tool.result` or `workflow.result` `error`).
    #[serde(rename = "tool.invocation.failed")]
    ToolFailed,
    /// A tool invocation ended SUCCEEDED.
    #[serde(rename = "tool.invocation.succeeded")]
    ToolSucceeded,
    /// An agent turn completed (`agent.turn.complete`).
    #[serde(rename = "agent.turn.completed")]
    AgentTurnCompleted,
    /// A tool call is held for a person's decision (`approval.requested`).
    #[serde(rename = "approval.requested")]
    ApprovalRequested,
    /// A team's or user's settled spend reached 80 % of one of its caps (`usage.cap.warning`).
    #[serde(rename = "usage.cap.warning")]
    CapWarning,
    /// A team's or user's settled spend reached one of its caps (`usage.cap.reached`).
    #[serde(rename = "usage.cap.reached")]
    CapReached,
    /// A provider's circuit breaker opened on a replica (`breaker.opened`).
    #[serde(rename = "breaker.opened")]
    BreakerOpened,
}

impl TriggerEvent {
    /// The event's name, as configured and shown.
    pub fn as_str(self) -> &'static str {
        match self {
            TriggerEvent::ToolFailed => "tool.invocation.failed",
            TriggerEvent::ToolSucceeded => "tool.invocation.succeeded",
            TriggerEvent::AgentTurnCompleted => "agent.turn.completed",
            TriggerEvent::ApprovalRequested => "approval.requested",
            TriggerEvent::CapWarning => "usage.cap.warning",
            TriggerEvent::CapReached => "usage.cap.reached",
            TriggerEvent::BreakerOpened => "breaker.opened",
        }
    }

    /// Whether the event is about a tool (`filter.tool` applies).
    pub fn is_about_a_tool(self) -> bool {
        matches!(
            self,
            TriggerEvent::ToolFailed
                | TriggerEvent::ToolSucceeded
                | TriggerEvent::ApprovalRequested
        )
    }

    /// Whether the event is about a spending cap.
    pub fn is_about_a_cap(self) -> bool {
        matches!(self, TriggerEvent::CapWarning | TriggerEvent::CapReached)
    }
}

/// `filter = { team, tool, task }`: globs (`*` any run) the event must match.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TriggerFilter {
    #[serde(default)]
    pub team: Option<String>,
    /// The tool the event is about (tool and approval events).
    #[serde(default)]
    pub tool: Option<String>,
    /// The task or agent the event is about (agent events: the agent's name).
    #[serde(default)]
    pub task: Option<String>,
}

/// One `[triggers.<name>]`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TriggerConfig {
    /// The event followed.
    pub on: TriggerEvent,
    #[serde(default)]
    pub filter: TriggerFilter,
    /// The tool started: `name` or `name@version`.
    pub tool: String,
    /// The tool's input: a table whose strings may hold `{{event.<field>}}`.
    #[serde(default = "empty_object")]
    pub input: serde_json::Value,
    /// The role whose capabilities the trigger's principal (`trigger:<name>`) has.
    #[serde(default = "default_role")]
    pub role: String,
    /// The team the started tool runs for (and is metered to); by default
    /// the event's. Required for `breaker.opened`, which is no team's.
    #[serde(default)]
    pub team: Option<String>,
    #[serde(default = "yes")]
    pub enabled: bool,
}

fn empty_object() -> serde_json::Value {
    serde_json::json!({})
}

fn default_role() -> String {
    "caller".into()
}

fn yes() -> bool {
    true
}

/// The fields `{{event.<field>}}` may name.
pub const EVENT_FIELDS: [&str; 17] = [
    "event",
    "trigger",
    "team",
    "tool",
    "version",
    "subject",
    "decision",
    "reason",
    "trace_id",
    "principal",
    "at_ms",
    "audit_id",
    "user",
    "cap",
    "limit",
    "spent",
    "provider",
];

/// `[trigger_relay]`: how fired triggers leave the outbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RelayConfig {
    /// How often each replica looks for triggers to start.
    #[serde(with = "humantime_serde", default = "default_poll")]
    pub poll_interval: std::time::Duration,
}

impl Default for RelayConfig {
    fn default() -> Self {
        Self {
            poll_interval: default_poll(),
        }
    }
}

fn default_poll() -> std::time::Duration {
    std::time::Duration::from_millis(500)
}

/// Every problem of the trigger sections, as `(key, why)`.
pub(super) fn check(config: &super::Config, bad: &mut dyn FnMut(String, &str)) {
    for (name, t) in &config.triggers {
        let at = |k: &str| format!("triggers.{name}.{k}");
        if name.is_empty()
            || name.len() > 64
            || !name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        {
            bad(
                format!("triggers.{name}"),
                "a trigger name is 1-64 letters, digits, `_` or `-`",
            );
        }
        let (tool, version) = super::tools::name_and_version(&t.tool, None);
        if tool.is_empty() || version.is_some_and(|v| semver::Version::parse(&v).is_err()) {
            bad(at("tool"), "must be a tool's name or name@version");
        }
        if !super::validate::tools::ROLES.contains(&t.role.as_str()) {
            bad(at("role"), "unknown role (roles: viewer, caller, admin)");
        }
        let agent = t.on == TriggerEvent::AgentTurnCompleted;
        if !t.on.is_about_a_tool() && t.filter.tool.is_some() {
            bad(
                at("filter.tool"),
                "only tool and approval events are about a tool (an agent's: use filter.task)",
            );
        }
        let breaker = t.on == TriggerEvent::BreakerOpened;
        if breaker && t.filter.team.is_some() {
            bad(
                at("filter.team"),
                "a provider's breaker is no team's: set `team`, the team the tool runs for",
            );
        }
        match &t.team {
            // The rule of a request's team_id.
            Some(team)
                if team.is_empty()
                    || team.len() > 128
                    || !team.bytes().all(|b| {
                        b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b':' | b'@')
                    }) =>
            {
                bad(
                    at("team"),
                    "must be a team ID: 1-128 letters, digits and - _ . : @",
                );
            }
            None if breaker => bad(
                at("team"),
                "breaker.opened is no team's event: name the team the started tool runs for",
            ),
            _ => {}
        }
        if !agent && t.filter.task.is_some() {
            bad(
                at("filter.task"),
                "only agent.turn.completed events have a task (the agent)",
            );
        }
        if !t.input.is_object() {
            bad(at("input"), "must be a table (the tool's input object)");
        }
        for field in placeholders(&t.input) {
            if !EVENT_FIELDS.contains(&field.as_str()) {
                let known = EVENT_FIELDS.join(", ");
                bad(
                    at("input"),
                    &format!("no event field `{field}` (fields: {known})"),
                );
            }
        }
    }
    let poll = config.trigger_relay.poll_interval;
    if poll < std::time::Duration::from_millis(10) || poll > std::time::Duration::from_secs(3600) {
        bad("trigger_relay.poll_interval".into(), "must be 10ms to 1h");
    }
}

/// The fields of every `{{event.<field>}}` in `value`'s strings.
pub fn placeholders(value: &serde_json::Value) -> Vec<String> {
    let mut out = Vec::new();
    match value {
        serde_json::Value::String(s) => {
            let mut rest = s.as_str();
            while let Some(start) = rest.find("{{") {
                let after = &rest[start + 2..];
                let Some(end) = after.find("}}") else { break };
                let inner = after[..end].trim();
                if let Some(field) = inner.strip_prefix("event.") {
                    out.push(field.to_owned());
                }
                rest = &after[end + 2..];
            }
        }
        serde_json::Value::Array(items) => items.iter().for_each(|v| out.extend(placeholders(v))),
        serde_json::Value::Object(map) => map.values().for_each(|v| out.extend(placeholders(v))),
        _ => {}
    }
    out
}

#[cfg(test)]
mod tests {
    use crate::config::Config;

    fn problems(toml: &str) -> String {
        match Config::from_toml_str(toml, |_| None) {
            Ok(_) => String::new(),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn a_trigger_is_checked_at_load() {
        let ok = "[triggers.t]\non = \"tool.invocation.failed\"\ntool = \"ops.alert\"\ninput = { text = \"{{event.tool}}\" }\n";
        assert_eq!(problems(ok), "");
        let unknown_field = ok.replace("event.tool", "event.colour");
        assert!(problems(&unknown_field).contains("no event field `colour`"));
        let role = format!("{ok}role = \"root\"\n");
        assert!(problems(&role).contains("triggers.t.role"));
        let event = ok.replace("tool.invocation.failed", "breaker.exploded");
        assert!(
            problems(&event).contains("unknown variant"),
            "{}",
            problems(&event)
        );
        let breaker = ok.replace("tool.invocation.failed", "breaker.opened");
        assert!(problems(&breaker).contains("triggers.t.team"));
        assert_eq!(problems(&format!("{breaker}team = \"ops\"\n")), "");
        assert!(problems(&format!("{breaker}team = \"ops team\"\n")).contains("triggers.t.team"));
        let team_filter = format!("{breaker}team = \"ops\"\nfilter = {{ team = \"a\" }}\n");
        assert!(problems(&team_filter).contains("triggers.t.filter.team"));
        let cap = ok.replace("tool.invocation.failed", "usage.cap.reached");
        let cap_tool = format!("{cap}filter = {{ tool = \"x\" }}\n");
        assert!(problems(&cap_tool).contains("triggers.t.filter.tool"));
        let cap_fields = cap.replace(
            "{{event.tool}}",
            "{{event.cap}} {{event.spent}}/{{event.limit}}",
        );
        assert_eq!(problems(&cap_fields), "");
        let tool = ok.replace("ops.alert", "ops.alert@latest");
        assert!(problems(&tool).contains("triggers.t.tool"));
        let task = format!("{ok}filter = {{ task = \"support\" }}\n");
        assert!(problems(&task).contains("triggers.t.filter.task"));
    }
}
