//! Screening of what passes through a call (SPEC §15): each guardrail a
//! task or agent lists looks at the places it applies to and, on a
//! detection, blocks, flags or redacts. Pure and synchronous: the call
//! pipeline runs it, audits what it reports and counts it. A `classifier`
//! is a model call, so the pipeline runs it itself ([`Guardrail::classifier`]);
//! [`screen`] passes over it.

mod injection;
pub mod pii;

use crate::config::{
    Config,
    guardrails::{Action, Fail, GuardrailConfig, GuardrailKind, Stage, compile},
};
use injection::Injection;
use regex::Regex;
use std::{collections::BTreeMap, sync::Arc};

/// What replaces a redacted span, or a redacted injection's whole text.
fn placeholder(guardrail: &str) -> String {
    format!("[REDACTED:{guardrail}]")
}

/// One compiled guardrail.
#[derive(Debug)]
pub struct Guardrail {
    pub name: String,
    stages: Vec<Stage>,
    pub action: Action,
    detector: Detector,
}

#[derive(Debug)]
enum Detector {
    Regex(Vec<Regex>),
    Injection {
        rules: Arc<Injection>,
        threshold: f64,
    },
    Classifier {
        task: String,
        fail: Fail,
    },
}

/// Every configured guardrail, compiled once at start.
#[derive(Debug, Clone, Default)]
pub struct Guardrails {
    by_name: BTreeMap<String, Arc<Guardrail>>,
}

/// A detection that did not block.
#[derive(Debug, Clone, PartialEq)]
pub struct Finding {
    pub guardrail: String,
    pub action: Action,
    pub stage: Stage,
    /// The injection score, for the audit event.
    pub score: Option<f64>,
    /// What a classifier said (its categories), or why it failed.
    pub detail: Option<String>,
    /// A classifier that failed and let the text through (`fail = "open"`).
    pub failed: bool,
}

/// A blocking guardrail's refusal: names the guardrail, never the content.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("guardrail `{guardrail}` blocked the {}", stage.as_str())]
pub struct Blocked {
    pub guardrail: String,
    pub stage: Stage,
    /// The injection score, for the audit event.
    pub score: Option<f64>,
    /// What a classifier said (its categories), or why it failed.
    pub detail: Option<String>,
    /// A classifier that failed and refused the text (`fail = "closed"`).
    pub failed: bool,
}

/// Text after screening: changed only by redactions.
#[derive(Debug, Clone, PartialEq)]
pub struct Screened {
    pub text: String,
    pub findings: Vec<Finding>,
}

impl Guardrails {
    /// The guardrails of `config` (already validated; a pattern that no
    /// longer compiles is an error here too, never a panic).
    pub fn from_config(config: &Config) -> Result<Self, String> {
        let rules = Arc::new(Injection::builtin()?);
        let mut by_name = BTreeMap::new();
        for (name, g) in &config.guardrails {
            let guardrail = compiled(name, g, &rules)?;
            by_name.insert(name.clone(), Arc::new(guardrail));
        }
        Ok(Self { by_name })
    }

    /// The guardrails `names` list, in order (unknown names were refused at load).
    pub fn listed(&self, names: &[String]) -> Vec<Arc<Guardrail>> {
        names
            .iter()
            .filter_map(|n| self.by_name.get(n).cloned())
            .collect()
    }
}

fn compiled(name: &str, g: &GuardrailConfig, rules: &Arc<Injection>) -> Result<Guardrail, String> {
    let detector = match g.kind {
        GuardrailKind::Regex => Detector::Regex(
            g.patterns
                .iter()
                .map(|p| compile(p).map_err(|e| format!("guardrails.{name}.patterns: {e}")))
                .collect::<Result<_, _>>()?,
        ),
        GuardrailKind::Injection => Detector::Injection {
            rules: Arc::clone(rules),
            threshold: g.threshold.unwrap_or(rules.threshold),
        },
        GuardrailKind::Classifier => Detector::Classifier {
            task: g
                .task
                .clone()
                .ok_or_else(|| format!("guardrails.{name}.task is required"))?,
            fail: g.fail,
        },
    };
    Ok(Guardrail {
        name: name.to_owned(),
        stages: g.applies_to.clone(),
        action: g.action,
        detector,
    })
}

/// What one guardrail found in a text.
enum Detection {
    /// Byte ranges of the matches (a regex).
    Spans(Vec<(usize, usize)>),
    /// The whole text, with its score (an injection).
    Whole(f64),
}

impl Guardrail {
    /// Whether it looks at `stage`.
    pub fn applies(&self, stage: Stage) -> bool {
        self.stages.contains(&stage)
    }

    /// A classifier's task and what its failure does; `None` for the kinds
    /// [`screen`] runs.
    pub fn classifier(&self) -> Option<(&str, Fail)> {
        match &self.detector {
            Detector::Classifier { task, fail } => Some((task, *fail)),
            _ => None,
        }
    }

    fn detect(&self, text: &str) -> Option<Detection> {
        match &self.detector {
            Detector::Regex(patterns) => {
                let mut spans: Vec<(usize, usize)> = patterns
                    .iter()
                    .flat_map(|p| p.find_iter(text).map(|m| (m.start(), m.end())))
                    .filter(|(s, e)| e > s)
                    .collect();
                spans.sort_unstable();
                (!spans.is_empty()).then_some(Detection::Spans(spans))
            }
            Detector::Injection { rules, threshold } => {
                let score = rules.score(text).score;
                (score >= *threshold).then_some(Detection::Whole(score))
            }
            Detector::Classifier { .. } => None,
        }
    }
}

/// `text` screened at `stage` by each of `list` that applies, in order
/// (classifiers aside): the first blocking detection refuses; a redaction
/// changes the text the next guardrail sees; every other detection is
/// reported.
pub fn screen(list: &[Arc<Guardrail>], stage: Stage, text: &str) -> Result<Screened, Blocked> {
    let mut out = Screened {
        text: text.to_owned(),
        findings: Vec::new(),
    };
    for g in list.iter().filter(|g| g.applies(stage)) {
        let Some(found) = g.detect(&out.text) else {
            continue;
        };
        let score = match &found {
            Detection::Whole(score) => Some(*score),
            Detection::Spans(_) => None,
        };
        match g.action {
            Action::Block => {
                return Err(Blocked {
                    guardrail: g.name.clone(),
                    stage,
                    score,
                    detail: None,
                    failed: false,
                });
            }
            Action::Flag => {}
            Action::Redact => out.text = redacted(&out.text, &g.name, &found),
        }
        out.findings.push(Finding {
            guardrail: g.name.clone(),
            action: g.action,
            stage,
            score,
            detail: None,
            failed: false,
        });
    }
    Ok(out)
}

/// `text` with what `found` covers replaced; overlapping spans merge.
fn redacted(text: &str, guardrail: &str, found: &Detection) -> String {
    let spans = match found {
        Detection::Whole(_) => return placeholder(guardrail),
        Detection::Spans(spans) => spans,
    };
    // Sorted by start: a span that overlaps the last one extends it.
    let mut merged: Vec<(usize, usize)> = Vec::with_capacity(spans.len());
    for &(start, end) in spans {
        match merged.last_mut() {
            Some(last) if start <= last.1 => last.1 = last.1.max(end),
            _ => merged.push((start, end)),
        }
    }
    let mut out = String::with_capacity(text.len());
    let mut at = 0;
    for (start, end) in merged {
        out.push_str(&text[at..start]);
        out.push_str(&placeholder(guardrail));
        at = end;
    }
    out.push_str(&text[at..]);
    out
}

#[cfg(test)]
mod tests;
