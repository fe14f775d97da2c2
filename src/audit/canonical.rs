//! The RFC 8785 JSON of an event and its `seq` written straight from the
//! struct: what [`super::chain::hash`] hashes, byte for byte what
//! `serde_json_canonicalizer` makes of the event's `Value`, without the
//! `Value` and the canonicalizer's copies. The chain is hashed on the
//! ledger's one writer thread, once per event, so this is on the path of
//! every audited call (ADR 0031); the tests hold it to the reference.

use super::AuditEvent;
use std::io::Write as _;

/// Integers JSON numbers hold exactly (RFC 8785 writes numbers as IEEE
/// doubles); past them the reference path is taken.
const EXACT: i64 = 1 << 53;

enum Field<'a> {
    Text(&'a str),
    Number(i64),
    Null,
}

impl<'a> From<&'a str> for Field<'a> {
    fn from(s: &'a str) -> Self {
        Field::Text(s)
    }
}

fn text(s: Option<&str>) -> Field<'_> {
    s.map_or(Field::Null, Field::Text)
}

fn number(n: Option<i64>) -> Field<'static> {
    n.map_or(Field::Null, Field::Number)
}

/// The canonical JSON of `{seq, ...event}`; `None` when a number is past
/// what a double holds exactly (then only the reference spells it right).
pub fn event(seq: i64, e: &AuditEvent) -> Option<Vec<u8>> {
    let mut fields: [(&str, Field<'_>); 19] = [
        ("actual_cost_micros", number(e.actual_cost_micros)),
        ("action", e.action.as_str().into()),
        ("at_ms", Field::Number(e.at_ms)),
        ("category", e.category.as_str().into()),
        ("decision", e.decision.as_str().into()),
        ("duration_ms", number(e.duration_ms)),
        ("estimated_cost_micros", number(e.estimated_cost_micros)),
        ("id", e.id.as_str().into()),
        ("idempotency_key", text(e.idempotency_key.as_deref())),
        ("input_bytes", number(e.input_bytes)),
        ("input_sha256", text(e.input_sha256.as_deref())),
        ("output_bytes", number(e.output_bytes)),
        ("output_sha256", text(e.output_sha256.as_deref())),
        ("principal", e.principal.as_str().into()),
        ("reason", e.reason.as_str().into()),
        ("seq", Field::Number(seq)),
        ("subject", e.subject.as_str().into()),
        ("team_id", e.team_id.as_str().into()),
        ("trace_id", e.trace_id.as_str().into()),
    ];
    // ASCII keys: byte order is RFC 8785's UTF-16 order.
    fields.sort_unstable_by_key(|(key, _)| *key);
    let mut out = Vec::with_capacity(512);
    out.push(b'{');
    for (i, (key, value)) in fields.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.push(b'"');
        out.extend_from_slice(key.as_bytes());
        out.extend_from_slice(b"\":");
        match value {
            Field::Null => out.extend_from_slice(b"null"),
            Field::Number(n) if n.unsigned_abs() > EXACT.unsigned_abs() => return None,
            Field::Number(n) => write!(out, "{n}").ok()?,
            Field::Text(s) if !needs_escape(s) => {
                out.push(b'"');
                out.extend_from_slice(s.as_bytes());
                out.push(b'"');
            }
            // serde_json escapes exactly RFC 8785's set: `"`, `\`, and the
            // controls (\b \t \n \f \r by name, the rest as lowercase \u00xx).
            Field::Text(s) => serde_json::to_writer(&mut out, s).ok()?,
        }
    }
    out.push(b'}');
    Some(out)
}

/// Whether RFC 8785 escapes any of `s`: IDs, hashes and names never need it,
/// and copying them as they are keeps the writer thread's cost down.
fn needs_escape(s: &str) -> bool {
    s.bytes().any(|b| b < 0x20 || b == b'"' || b == b'\\')
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::audit::{Category, digest};

    /// The reference: the event's `Value` through the canonicalizer.
    fn reference(seq: i64, e: &AuditEvent) -> Vec<u8> {
        let mut value = serde_json::to_value(e).unwrap();
        value["seq"] = seq.into();
        digest::canonical(&value)
    }

    fn event(text: &str, n: Option<i64>) -> AuditEvent {
        let mut e = AuditEvent::new(
            "t1",
            text,
            &format!("trace {text}"),
            Category::Workflow,
            "workflow.result",
            &format!("crm.add_note@1.0.0 {text}"),
        )
        .decided("error", text);
        e.input_sha256 = Some("ab".repeat(32));
        e.output_sha256 = n.map(|_| text.to_owned());
        e.input_bytes = n;
        e.duration_ms = n.map(|v| v / 2);
        e.estimated_cost_micros = n.map(|v| -v);
        e.actual_cost_micros = n;
        e.idempotency_key = n.map(|v| format!("key-{v}"));
        e
    }

    #[test]
    fn an_event_is_written_as_the_reference_writes_it() {
        let controls: String = (0u8..0x20).map(char::from).collect();
        let texts = [
            "",
            "plain",
            "quote \" and backslash \\ and slash /",
            &controls,
            "\u{7f} \u{80} é 中文 \u{2028}\u{2029} \u{fffd} 😀",
            "\u{e000}\u{ffff}\u{10000}",
        ];
        let numbers = [None, Some(0), Some(-1), Some(42), Some(EXACT), Some(-EXACT)];
        for text in texts {
            for n in numbers {
                for seq in [1, 7_000_000_001] {
                    let e = event(text, n);
                    let fast = super::event(seq, &e).expect("within a double's integers");
                    assert_eq!(
                        String::from_utf8_lossy(&fast),
                        String::from_utf8_lossy(&reference(seq, &e)),
                        "{text:?} {n:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn a_number_past_a_doubles_integers_is_left_to_the_reference() {
        let e = event("x", Some(EXACT + 1));
        assert!(super::event(1, &e).is_none());
        assert!(super::event(EXACT + 1, &event("x", None)).is_none());
    }
}
