//! `research_verify` / `research_deep`: a summary plus sourced findings.
//!
//! Numeric references in the answer (`1`, `[2]`) resolve against the provider's citations
//! (Perplexity); URLs the model wrote are kept. A finding gets only the sources it cites:
//! every citation would overstate how well it is sourced.

use super::{Session, TaskError, parse_json_object};
use crate::{
    domain::{Citation, JsonSchemaFormat},
    prompts,
};
use serde_json::{Value, json};
use std::collections::{BTreeMap, HashSet};

/// Research thoroughness.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Depth {
    /// Quick check of one claim (`research_verify`).
    #[default]
    Verify,
    /// Summary plus findings (`research_deep`).
    Deep,
}

impl Depth {
    /// The task that serves this depth.
    pub fn task(self) -> &'static str {
        match self {
            Depth::Verify => "research_verify",
            Depth::Deep => "research_deep",
        }
    }
}

/// One sourced finding.
#[derive(Debug, Clone, PartialEq)]
pub struct Finding {
    pub claim: String,
    pub sources: Vec<String>,
    /// Confidence in [0, 1].
    pub confidence: f64,
}

/// A research answer.
#[derive(Debug, Clone, PartialEq)]
pub struct Answer {
    pub summary: String,
    pub findings: Vec<Finding>,
    /// Every source the provider cited, in its order.
    pub citations: Vec<Citation>,
}

/// The JSON schema the model must answer with.
pub fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "summary": {"type": "string", "examples": ["The claim holds according to current sources."]},
            "findings": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "claim": {"type": "string"},
                        "sources": {"type": "array", "items": {"type": "string", "examples": ["https://example.com/source"]}},
                        "confidence": {"type": "number", "minimum": 0, "maximum": 1, "examples": [0.8]}
                    },
                    "required": ["claim", "sources", "confidence"],
                    "additionalProperties": false
                }
            }
        },
        "required": ["summary", "findings"],
        "additionalProperties": false
    })
}

/// A research query at a depth.
#[derive(Debug, Clone)]
pub struct Query {
    pub query: String,
    pub depth: Depth,
}

impl super::Task for Query {
    type Output = Answer;

    fn name(&self) -> &str {
        self.depth.task()
    }

    fn input(&self) -> Value {
        json!({"query": self.query, "depth": self.depth.task()})
    }

    async fn run(self, _: &super::Tasks, session: &impl Session) -> Result<Answer, TaskError> {
        research(session, &self.query, self.depth).await
    }
}

/// Answers a research query.
pub async fn research(
    session: &impl Session,
    query: &str,
    depth: Depth,
) -> Result<Answer, TaskError> {
    if query.trim().is_empty() {
        return Err(TaskError::invalid("query", "must not be empty"));
    }
    let task = depth.task();
    let vars = BTreeMap::from([("query".to_owned(), prompts::as_data(query))]);
    let rendered = session.render(task, &vars).await?;
    let format = JsonSchemaFormat {
        name: "research_answer".into(),
        schema: schema(),
    };
    let (answer, _) = session
        .complete(task, &rendered, Some(format), |c| {
            parse(&c.text, &c.citations)
        })
        .await?;
    Ok(answer)
}

/// Parses the model's answer and attaches citations.
pub fn parse(text: &str, citations: &[Citation]) -> Result<Answer, String> {
    let obj = parse_json_object(text)?;
    let summary = obj
        .get("summary")
        .and_then(Value::as_str)
        .ok_or("missing summary")?
        .to_owned();
    let listed = obj
        .get("findings")
        .and_then(Value::as_array)
        .ok_or("missing findings")?;
    let mut findings = Vec::new();
    for (i, f) in listed.iter().enumerate() {
        let claim = f
            .get("claim")
            .and_then(Value::as_str)
            .ok_or(format!("finding {i}: missing claim"))?;
        // The contract gives every finding a confidence; inventing one would
        // pass a guess off as the model's, so a missing one is malformed.
        let confidence = f
            .get("confidence")
            .and_then(Value::as_f64)
            .ok_or(format!("finding {i}: missing confidence"))?;
        if !(0.0..=1.0).contains(&confidence) {
            return Err(format!(
                "finding {i}: confidence {confidence} outside [0, 1]"
            ));
        }
        let given: Vec<&str> = f
            .get("sources")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        findings.push(Finding {
            claim: claim.to_owned(),
            sources: resolve_sources(&given, citations),
            confidence,
        });
    }
    Ok(Answer {
        summary,
        findings,
        citations: citations.to_vec(),
    })
}

/// The finding's sources as URLs, first mention first, each once. The set keeps it linear:
/// a few MiB of answer can name hundreds of thousands of sources.
fn resolve_sources(given: &[&str], citations: &[Citation]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mut seen: HashSet<String> = HashSet::new();
    for source in given {
        let reference = source.trim().trim_start_matches('[').trim_end_matches(']');
        let url = match reference.parse::<usize>() {
            Ok(n) if n >= 1 => citations.get(n - 1).map(|c| c.url.clone()),
            _ if source.starts_with("http://") || source.starts_with("https://") => {
                Some((*source).to_owned())
            }
            _ => None,
        };
        if let Some(url) = url.filter(|u| seen.insert(u.clone())) {
            out.push(url);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cites() -> Vec<Citation> {
        ["https://a.example/1", "https://b.example/2"]
            .iter()
            .map(|u| Citation {
                url: (*u).into(),
                title: None,
            })
            .collect()
    }

    #[test]
    fn numeric_references_resolve_to_citations() {
        let text = r#"{"summary":"s","findings":[
            {"claim":"c1","sources":["[2]","1"],"confidence":0.9},
            {"claim":"c2","sources":[],"confidence":0.4},
            {"claim":"c3","sources":["https://own.example"],"confidence":0.5}]}"#;
        let a = parse(text, &cites()).unwrap();
        assert_eq!(
            a.findings[0].sources,
            vec!["https://b.example/2", "https://a.example/1"]
        );
        assert!(
            a.findings[1].sources.is_empty(),
            "a finding citing nothing has no sources"
        );
        assert_eq!(a.findings[2].sources, vec!["https://own.example"]);
        assert_eq!(a.citations, cites(), "every citation, listed apart");
    }

    /// The most sources a 4 MiB answer can name, repeats included.
    #[test]
    fn a_finding_naming_many_sources_keeps_each_once_in_order() {
        let n = 200_000;
        let mut given: Vec<String> = (0..n).map(|i| format!("https://s.example/{i}")).collect();
        given.extend(["[2]", "https://s.example/7", "1", "[2]"].map(String::from));
        let given: Vec<&str> = given.iter().map(String::as_str).collect();
        let sources = resolve_sources(&given, &cites());
        assert_eq!(sources.len(), n + 2, "two citations, no repeats");
        assert_eq!(sources[7], "https://s.example/7");
        assert_eq!(sources[n..], ["https://b.example/2", "https://a.example/1"]);
    }

    #[test]
    fn rejects_bad_answers() {
        assert!(parse("plain text", &[]).is_err());
        assert!(parse(r#"{"findings":[]}"#, &[]).is_err());
        assert!(parse(r#"{"summary":"s"}"#, &[]).is_err());
        assert!(parse(r#"{"summary":"s","findings":[]}"#, &[]).is_ok());
        for bad in [
            r#"{"summary":"s","findings":[{"claim":"c","confidence":3}]}"#,
            r#"{"summary":"s","findings":[{"claim":"c","confidence":-0.1}]}"#,
            r#"{"summary":"s","findings":[{"claim":"c","sources":[]}]}"#,
            r#"{"summary":"s","findings":[{"claim":"c","confidence":"high"}]}"#,
            r#"{"summary":"s","findings":[{"sources":[],"confidence":0.5}]}"#,
        ] {
            assert!(parse(bad, &[]).is_err(), "{bad}");
        }
        let err = parse(
            r#"{"summary":"s","findings":[{"claim":"c","confidence":0.5},{"claim":"d"}]}"#,
            &[],
        )
        .unwrap_err();
        assert_eq!(err, "finding 1: missing confidence");
    }
}
