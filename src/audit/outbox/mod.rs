//! The triggers' outbox (SPEC §16): the audit events that start a
//! `[triggers.<name>]` become outbox rows in the ledger transaction that
//! appends them, so a committed event never loses its trigger to a crash.
//! The relay (`call::triggers`) takes them from here.

mod sql;

use super::AuditEvent;
use crate::{
    config::{
        Config,
        triggers::{TriggerEvent, TriggerFilter},
    },
    store::{Statement, Store, StoreError},
};
use serde_json::{Map, Value};
use std::sync::Arc;

/// One enabled trigger, as the ledger matches it.
#[derive(Debug, Clone, PartialEq)]
struct Rule {
    name: String,
    on: TriggerEvent,
    filter: TriggerFilter,
    /// The team the started tool runs for (`None`: the event's).
    team: Option<String>,
    /// What the row starts, as configured when the event happened: a
    /// replica with another config (a rolling deploy) starts the same.
    tool: String,
    role: String,
    input: Value,
}

/// The enabled triggers, matched against every audit event appended.
#[derive(Debug, Clone, PartialEq)]
pub struct Outbox {
    rules: Vec<Rule>,
}

impl Outbox {
    /// The enabled triggers of `config`; `None` without any (nothing to match).
    pub fn from_config(config: &Config) -> Option<Arc<Self>> {
        let rules: Vec<Rule> = config
            .triggers
            .iter()
            .filter(|(_, t)| t.enabled)
            .map(|(name, t)| Rule {
                name: name.clone(),
                on: t.on,
                filter: t.filter.clone(),
                team: t.team.clone(),
                tool: t.tool.clone(),
                role: t.role.clone(),
                input: t.input.clone(),
            })
            .collect();
        (!rules.is_empty()).then(|| Arc::new(Self { rules }))
    }

    /// Whether some trigger follows a spending cap: only then does the
    /// ledger look for crossings (`usage.cap.*`).
    pub fn follows_caps(&self) -> bool {
        self.rules.iter().any(|r| r.on.is_about_a_cap())
    }

    /// The outbox rows `events` fire, for the transaction appending them.
    pub fn statements(&self, events: &[AuditEvent], now_ms: i64) -> Vec<Statement> {
        let mut out = Vec::new();
        for event in events {
            let Some(seen) = Seen::of(event) else {
                continue;
            };
            for rule in self.rules.iter().filter(|r| seen.fires(r)) {
                let fields = fields(event, &seen, &rule.name);
                let row = serde_json::json!({
                    "tool": rule.tool,
                    "role": rule.role,
                    "input": render(&rule.input, &fields),
                    "fields": fields,
                });
                let team = rule.team.as_deref().unwrap_or(&event.team_id);
                out.push(sql::insert(&rule.name, team, &row, now_ms));
            }
        }
        out
    }
}

/// What an audit event is, as the triggers see it.
struct Seen<'e> {
    kind: TriggerEvent,
    tool: Option<(&'e str, &'e str)>,
    task: Option<&'e str>,
    team: &'e str,
}

impl<'e> Seen<'e> {
    /// The trigger event `event` is, if any. A trigger's own calls fire
    /// nothing: a failing trigger tool would otherwise start itself again.
    fn of(event: &'e AuditEvent) -> Option<Self> {
        if event.principal.starts_with("trigger:") {
            return None;
        }
        let tool = || event.subject.split_once('@').or(Some((&event.subject, "")));
        let (kind, tool, task) = match (event.action.as_str(), event.decision.as_str()) {
            ("tool.result" | "workflow.result", "ok") => {
                (TriggerEvent::ToolSucceeded, tool(), None)
            }
            ("tool.result" | "workflow.result", "error") => {
                (TriggerEvent::ToolFailed, tool(), None)
            }
            ("agent.turn.complete", _) => (
                TriggerEvent::AgentTurnCompleted,
                None,
                Some(event.subject.as_str()),
            ),
            ("approval.requested", _) => (TriggerEvent::ApprovalRequested, tool(), None),
            ("usage.cap.warning", _) => (TriggerEvent::CapWarning, None, None),
            ("usage.cap.reached", _) => (TriggerEvent::CapReached, None, None),
            ("breaker.opened", _) => (TriggerEvent::BreakerOpened, None, None),
            _ => return None,
        };
        Some(Self {
            kind,
            tool,
            task,
            team: &event.team_id,
        })
    }

    fn fires(&self, rule: &Rule) -> bool {
        let f = &rule.filter;
        let matches = |pattern: &Option<String>, value: Option<&str>| match pattern {
            None => true,
            Some(p) => value.is_some_and(|v| glob(p, v)),
        };
        rule.on == self.kind
            && matches(&f.team, Some(self.team))
            && matches(&f.tool, self.tool.map(|(name, _)| name))
            && matches(&f.task, self.task)
    }
}

/// The fields `{{event.<field>}}` reads (`config::triggers::EVENT_FIELDS`).
fn fields(event: &AuditEvent, seen: &Seen<'_>, trigger: &str) -> Map<String, Value> {
    let (tool, version) = seen.tool.unwrap_or(("", ""));
    let mut m = Map::new();
    let mut put = |k: &str, v: Value| {
        m.insert(k.to_owned(), v);
    };
    put("event", seen.kind.as_str().into());
    put("trigger", trigger.into());
    put("team", event.team_id.as_str().into());
    put("tool", tool.into());
    put("version", version.into());
    put("subject", event.subject.as_str().into());
    put("decision", event.decision.as_str().into());
    put("reason", event.reason.as_str().into());
    put("trace_id", event.trace_id.as_str().into());
    put("principal", event.principal.as_str().into());
    put("at_ms", event.at_ms.into());
    put("audit_id", event.id.as_str().into());
    let cap = CapFields::of(event, seen.kind);
    put("user", cap.user.into());
    put("cap", cap.name.into());
    put("limit", cap.limit);
    put("spent", cap.spent);
    let provider = match seen.kind {
        TriggerEvent::BreakerOpened => event.subject.as_str(),
        _ => "",
    };
    put("provider", provider.into());
    m
}

/// A cap event's fields, from its subject (`user:u1/day/requests`) and its
/// reason (`CAP_REACHED cap=daily_requests limit=5 spent=5`); empty for
/// other events. A cost reads in USD, as configured.
struct CapFields<'e> {
    user: &'e str,
    name: &'e str,
    limit: Value,
    spent: Value,
}

impl<'e> CapFields<'e> {
    fn of(event: &'e AuditEvent, kind: TriggerEvent) -> Self {
        let mut out = Self {
            user: "",
            name: "",
            limit: Value::Null,
            spent: Value::Null,
        };
        if !kind.is_about_a_cap() {
            return out;
        }
        // `user:<id>/<period>/<cap>`: an ID may itself hold a `/`.
        if let Some(rest) = event.subject.strip_prefix("user:") {
            out.user = rest.rsplitn(3, '/').nth(2).unwrap_or_default();
        }
        let word = |key: &str| {
            event
                .reason
                .split(' ')
                .find_map(|w| w.strip_prefix(key)?.strip_prefix('='))
        };
        out.name = word("cap").unwrap_or_default();
        let cost = out.name.ends_with("cost_usd");
        let number = |text: Option<&str>| match text.and_then(|t| t.parse::<i64>().ok()) {
            Some(micros) if cost => serde_json::json!(micros as f64 / 1e6),
            Some(n) => n.into(),
            None => Value::Null,
        };
        out.limit = number(word("limit"));
        out.spent = number(word("spent"));
        out
    }
}

/// Whether `text` matches `pattern`, where `*` stands for any run of characters.
pub fn glob(pattern: &str, text: &str) -> bool {
    let parts: Vec<&str> = pattern.split('*').collect();
    let [first, middle @ .., last] = parts.as_slice() else {
        return pattern == text;
    };
    if parts.len() == 1 {
        return pattern == text;
    }
    let Some(mut rest) = text.strip_prefix(first) else {
        return false;
    };
    for part in middle {
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    rest.len() >= last.len() && rest.ends_with(last)
}

/// `template` with every `{{event.<field>}}` replaced from `fields`: a
/// string that is only a placeholder takes the field's value (a number
/// stays a number), one with text around it the field's text.
pub fn render(template: &Value, fields: &Map<String, Value>) -> Value {
    match template {
        Value::String(s) => render_text(s, fields),
        Value::Array(items) => Value::Array(items.iter().map(|v| render(v, fields)).collect()),
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(k, v)| (k.clone(), render(v, fields)))
                .collect(),
        ),
        other => other.clone(),
    }
}

fn render_text(s: &str, fields: &Map<String, Value>) -> Value {
    let field = |inner: &str| {
        let name = inner.trim().strip_prefix("event.")?;
        fields.get(name)
    };
    let whole = s.strip_prefix("{{").and_then(|r| r.strip_suffix("}}"));
    if let Some(inner) = whole.filter(|i| !i.contains("{{"))
        && let Some(v) = field(inner)
    {
        return v.clone();
    }
    let mut out = String::new();
    let mut rest = s;
    while let Some(start) = rest.find("{{") {
        let after = &rest[start + 2..];
        let Some(end) = after.find("}}") else { break };
        out.push_str(&rest[..start]);
        match field(&after[..end]) {
            Some(Value::String(text)) => out.push_str(text),
            Some(other) => out.push_str(&other.to_string()),
            None => out.push_str(&rest[start..start + 2 + end + 2]),
        }
        rest = &after[end + 2..];
    }
    out.push_str(rest);
    Value::String(out)
}

/// A trigger that fired and waits to be started.
#[derive(Debug, Clone, PartialEq)]
pub struct Pending {
    pub id: String,
    pub trigger: String,
    pub team_id: String,
    /// The tool to start (`name` or `name@version`).
    pub tool: String,
    /// The role of the trigger's principal.
    pub role: String,
    /// The tool's input, rendered from the event.
    pub input: Value,
    /// The event's fields (`{{event.<field>}}`).
    pub fields: Map<String, Value>,
    /// Times taken, this one included.
    pub attempts: i64,
    /// Until when this relay holds it.
    pub lease_until_ms: i64,
}

impl Pending {
    /// A row as stored: its `event` column holds the tool, role, input and fields.
    fn from_stored(
        id: String,
        trigger: String,
        team_id: String,
        event: &str,
        attempts: i64,
        lease_until_ms: i64,
    ) -> Self {
        // A row that no longer parses starts nothing and is ended FAILED, never a panic.
        let mut v: Value = serde_json::from_str(event).unwrap_or_default();
        let text = |v: &Value, k: &str| {
            v.get(k)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned()
        };
        Self {
            tool: text(&v, "tool"),
            role: text(&v, "role"),
            input: v.get_mut("input").map(Value::take).unwrap_or(Value::Null),
            fields: match v.get_mut("fields").map(Value::take) {
                Some(Value::Object(m)) => m,
                _ => Map::new(),
            },
            id,
            trigger,
            team_id,
            attempts,
            lease_until_ms,
        }
    }
}

/// The relay's reads of the outbox.
#[async_trait::async_trait]
pub trait OutboxRepository: Send + Sync {
    /// Takes up to `limit` PENDING rows whose lease ran out, leasing them
    /// until `lease_until_ms`.
    async fn take(
        &self,
        now_ms: i64,
        lease_until_ms: i64,
        limit: i64,
    ) -> Result<Vec<Pending>, StoreError>;
    /// Every row (tests, ops): `(trigger, status, invocation_id)`.
    async fn rows(&self) -> Result<Vec<(String, String, Option<String>)>, StoreError>;
    /// Moves row `id`'s lease from `held` to `until` while it is PENDING and
    /// still this relay's: false when another took it.
    async fn renew(&self, id: &str, held: i64, until: i64) -> Result<bool, StoreError>;
    /// Deletes the rows ended before `before_ms`: how many.
    async fn purge(&self, before_ms: i64) -> Result<u64, StoreError>;
}

/// See [`OutboxRepository::take`].
pub async fn take(
    store: &Store,
    now_ms: i64,
    lease_until_ms: i64,
    limit: i64,
) -> Result<Vec<Pending>, StoreError> {
    sql::repository(store)
        .take(now_ms, lease_until_ms, limit)
        .await
}

/// See [`OutboxRepository::rows`].
pub async fn rows(store: &Store) -> Result<Vec<(String, String, Option<String>)>, StoreError> {
    sql::repository(store).rows().await
}

/// See [`OutboxRepository::renew`].
pub async fn renew(store: &Store, id: &str, held: i64, until: i64) -> Result<bool, StoreError> {
    sql::repository(store).renew(id, held, until).await
}

/// See [`OutboxRepository::purge`].
pub async fn purge(store: &Store, before_ms: i64) -> Result<u64, StoreError> {
    sql::repository(store).purge(before_ms).await
}

/// Marks `row` FIRED (started as `invocation_id`) while PENDING under its lease.
pub fn fired(row: &Pending, invocation_id: &str, now_ms: i64) -> Statement {
    sql::end(row, "FIRED", Some(invocation_id), "", now_ms)
}

/// Marks `row` FAILED (refused for good: `error`) while PENDING under its lease.
pub fn failed(row: &Pending, error: &str, now_ms: i64) -> Statement {
    sql::end(row, "FAILED", None, error, now_ms)
}

#[cfg(test)]
mod tests;
