//! `[guardrails.<name>]` (SPEC §15): screening rules that tasks and agents
//! list by name. Each has a kind (what it detects), the places it looks
//! (`applies_to`) and what a detection does (`action`).

use serde::Deserialize;
use std::collections::BTreeMap;

/// Patterns of one `regex` guardrail at most.
pub const MAX_PATTERNS: usize = 100;
/// Bytes of one pattern at most.
pub const MAX_PATTERN_BYTES: usize = 1000;
/// Compiled size of one pattern at most (the `regex` crate's size limit).
pub const MAX_COMPILED_BYTES: usize = 1 << 20;

/// One guardrail.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GuardrailConfig {
    pub kind: GuardrailKind,
    /// Where it looks; default the caller's input only.
    #[serde(default = "default_applies_to")]
    pub applies_to: Vec<Stage>,
    pub action: Action,
    /// `regex`: what to find (Rust `regex` syntax, no look-around).
    #[serde(default)]
    pub patterns: Vec<String>,
    /// `injection`: the score at which text is taken for an injection
    /// (default the built-in rules' own, 1.0).
    #[serde(default)]
    pub threshold: Option<f64>,
    /// `classifier`: the task (`[tasks.<name>]`) whose JSON answer
    /// `{flagged, categories[]}` decides.
    #[serde(default)]
    pub task: Option<String>,
    /// `classifier`: what a classification that fails (no answer, not the
    /// JSON asked for) does: `closed` blocks, `open` lets the text through.
    #[serde(default)]
    pub fail: Fail,
}

/// What a classifier's failure does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Fail {
    /// Let the text through, audited and counted (`fail_open`).
    Open,
    /// Refuse it like a block (`fail_closed`): safety over availability.
    #[default]
    Closed,
}

fn default_applies_to() -> Vec<Stage> {
    vec![Stage::Input]
}

/// What a guardrail detects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GuardrailKind {
    /// Any of its `patterns`.
    Regex,
    /// The built-in prompt-injection heuristics, scored against `threshold`.
    Injection,
    /// A model call: the answer of `task` decides.
    Classifier,
}

/// Where a guardrail looks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Stage {
    /// The caller's text: a task's rendered prompt, an agent's message.
    Input,
    /// The model's answer.
    Output,
    /// The arguments a model writes for a tool.
    ToolInput,
    /// A tool's result, before the model sees it.
    ToolOutput,
    /// An agent's retrieved context (layer 4).
    Retrieved,
}

impl Stage {
    /// The name in config, metrics and audit events.
    pub fn as_str(self) -> &'static str {
        match self {
            Stage::Input => "input",
            Stage::Output => "output",
            Stage::ToolInput => "tool_input",
            Stage::ToolOutput => "tool_output",
            Stage::Retrieved => "retrieved",
        }
    }
}

/// What a detection does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    /// Refuse: INVALID_ARGUMENT `GUARDRAIL_BLOCKED`, naming the guardrail.
    Block,
    /// Let it through, audited and counted.
    Flag,
    /// Replace what was found, audited and counted, and go on.
    Redact,
}

impl Action {
    /// The name in config, metrics and audit events.
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Block => "block",
            Action::Flag => "flag",
            Action::Redact => "redact",
        }
    }
}

/// Checks the guardrails and the names tasks and agents list, calling
/// `bad(path, message)` for each problem.
pub(super) fn check(
    guardrails: &BTreeMap<String, GuardrailConfig>,
    tasks: &BTreeMap<String, crate::config::TaskConfig>,
    lists: &[(String, &[String])],
    bad: &mut dyn FnMut(String, &str),
) {
    for (name, g) in guardrails {
        let at = |key: &str| format!("guardrails.{name}.{key}");
        if g.applies_to.is_empty() {
            bad(at("applies_to"), "must name at least one place to look");
        }
        match g.kind {
            GuardrailKind::Regex => regex_patterns(g, &at, bad),
            GuardrailKind::Injection => {
                if !g.patterns.is_empty() {
                    bad(at("patterns"), "is for kind = \"regex\" only");
                }
                if g.threshold.is_some_and(|t| !(t.is_finite() && t > 0.0)) {
                    bad(at("threshold"), "must be a number above 0");
                }
            }
            GuardrailKind::Classifier => classifier(g, guardrails, tasks, &at, bad),
        }
        if g.kind != GuardrailKind::Injection && g.threshold.is_some() {
            bad(at("threshold"), "is for kind = \"injection\" only");
        }
        if g.kind != GuardrailKind::Classifier && g.task.is_some() {
            bad(at("task"), "is for kind = \"classifier\" only");
        }
    }
    for (path, names) in lists {
        for (i, name) in names.iter().enumerate() {
            if !guardrails.contains_key(name) {
                bad(
                    format!("{path}[{i}]"),
                    "names no [guardrails.<name>] section",
                );
            }
        }
    }
}

/// A classifier names a task that is not itself screened by a classifier
/// (a classification would classify itself without end), and cannot
/// redact: its verdict is about the whole text.
fn classifier(
    g: &GuardrailConfig,
    guardrails: &BTreeMap<String, GuardrailConfig>,
    tasks: &BTreeMap<String, crate::config::TaskConfig>,
    at: &dyn Fn(&str) -> String,
    bad: &mut dyn FnMut(String, &str),
) {
    if !g.patterns.is_empty() {
        bad(at("patterns"), "is for kind = \"regex\" only");
    }
    if g.action == Action::Redact {
        bad(
            at("action"),
            "a classifier judges the whole text: use \"block\" or \"flag\"",
        );
    }
    let Some(task) = &g.task else {
        bad(at("task"), "is required: the task whose answer decides");
        return;
    };
    let Some(config) = tasks.get(task) else {
        bad(at("task"), "names no [tasks.<name>] section");
        return;
    };
    let nested = config.guardrails.iter().any(|n| {
        guardrails
            .get(n)
            .is_some_and(|g| g.kind == GuardrailKind::Classifier)
    });
    if nested {
        bad(
            at("task"),
            "names a task that lists a classifier guardrail itself (it would classify its own classification)",
        );
    }
}

fn regex_patterns(
    g: &GuardrailConfig,
    at: &dyn Fn(&str) -> String,
    bad: &mut dyn FnMut(String, &str),
) {
    if g.patterns.is_empty() {
        bad(at("patterns"), "must hold at least one pattern");
    }
    if g.patterns.len() > MAX_PATTERNS {
        bad(at("patterns"), "holds more than 100 patterns");
        return;
    }
    for (i, p) in g.patterns.iter().enumerate() {
        let path = at(&format!("patterns[{i}]"));
        if p.len() > MAX_PATTERN_BYTES {
            bad(path, "is longer than 1000 bytes");
        } else if let Err(e) = compile(p) {
            bad(path, &format!("is not a valid pattern: {e}"));
        }
    }
}

/// `pattern` compiled within the size bound: the one way patterns are compiled.
pub fn compile(pattern: &str) -> Result<regex::Regex, regex::Error> {
    regex::RegexBuilder::new(pattern)
        .size_limit(MAX_COMPILED_BYTES)
        .build()
}

/// `pii = { mask = [...], restore = ... }` on a task: what is masked before
/// a provider sees it (SPEC §15).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PiiConfig {
    /// The kinds replaced with typed placeholders (`<EMAIL_1>`).
    pub mask: Vec<PiiKind>,
    /// Put the originals back into the answer before anyone sees it.
    #[serde(default)]
    pub restore: bool,
}

/// A kind of personal data the masker finds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PiiKind {
    Email,
    Phone,
    /// 13–19 digits that pass the Luhn check.
    Card,
    /// A US social security number (`123-45-6789`, valid areas only).
    Ssn,
    /// An IBAN whose check digits hold (ISO 13616, mod 97).
    Iban,
    /// An IPv4 or full-form IPv6 address.
    Ip,
}

impl PiiKind {
    /// The placeholder's tag (`EMAIL` in `<EMAIL_1>`).
    pub fn tag(self) -> &'static str {
        match self {
            PiiKind::Email => "EMAIL",
            PiiKind::Phone => "PHONE",
            PiiKind::Card => "CARD",
            PiiKind::Ssn => "SSN",
            PiiKind::Iban => "IBAN",
            PiiKind::Ip => "IP",
        }
    }
}
