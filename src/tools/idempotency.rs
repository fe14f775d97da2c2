//! Idempotency keys of workflow invocations (SPEC §9.4): the lowercase hex
//! SHA-256 of the RFC 8785 canonical JSON of `{tool, version, team, input,
//! triggered_by, window}`, where `window` is the invocation time floored to
//! the tool's `idempotency_window` (unix ms). The same call within one
//! window has the same key; a caller-supplied key replaces it.

use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use std::time::Duration;

/// What a key is computed from.
#[derive(Debug, Clone, Copy)]
pub struct Keyed<'a> {
    pub tool: &'a str,
    pub version: &'a str,
    pub team: &'a str,
    pub input: &'a Value,
    /// Who triggered it (the API key's name, an agent's conversation).
    pub triggered_by: &'a str,
    /// When, unix ms.
    pub at_ms: i64,
    pub window: Duration,
}

/// The start of the window `at_ms` falls in, unix ms.
pub fn window_start(at_ms: i64, window: Duration) -> i64 {
    let w = i64::try_from(window.as_millis()).unwrap_or(i64::MAX).max(1);
    at_ms.div_euclid(w) * w
}

/// The derived key.
pub fn key(k: &Keyed<'_>) -> String {
    let value = json!({
        "tool": k.tool,
        "version": k.version,
        "team": k.team,
        "input": k.input,
        "triggered_by": k.triggered_by,
        "window": window_start(k.at_ms, k.window),
    });
    let bytes = serde_json_canonicalizer::to_vec(&value).unwrap_or_default();
    hex::encode(Sha256::digest(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keyed<'a>(input: &'a Value, at_ms: i64) -> Keyed<'a> {
        Keyed {
            tool: "crm.add_note",
            version: "1.0.0",
            team: "t1",
            input,
            triggered_by: "crm-key",
            at_ms,
            window: Duration::from_secs(300),
        }
    }

    #[test]
    fn same_call_same_window_same_key() {
        let t = 1_790_000_100_000_i64; // the start of a 5-minute window
        let a = json!({"lead_id": "L1", "note": "hi"});
        let b = json!({"note": "hi", "lead_id": "L1"});
        assert_eq!(
            key(&keyed(&a, t)),
            key(&keyed(&b, t + 150_000)),
            "key order, same window"
        );
        assert_ne!(
            key(&keyed(&a, t)),
            key(&keyed(&a, t + 300_000)),
            "next window"
        );
        assert_ne!(
            key(&keyed(&a, t)),
            key(&keyed(&json!({"lead_id": "L2", "note": "hi"}), t))
        );
        let k = key(&keyed(&a, t));
        assert_eq!(k.len(), 64);
        assert!(
            k.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        );
        let by_hand = hex::encode(Sha256::digest(
            br#"{"input":{"lead_id":"L1","note":"hi"},"team":"t1","tool":"crm.add_note","triggered_by":"crm-key","version":"1.0.0","window":1790000100000}"#,
        ));
        // 1_790_000_100_000 is itself a window start (divisible by 300_000).
        assert_eq!(window_start(t, Duration::from_secs(300)), 1_790_000_100_000);
        assert_eq!(k, by_hand);
    }
}
