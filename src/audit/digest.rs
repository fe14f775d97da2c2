//! What the audit log keeps of a payload: the SHA-256 of its canonical
//! JSON (RFC 8785) after redaction, and its size. Never the payload.
//!
//! Redaction replaces the value of every key that names personal data or a
//! secret ([`is_sensitive`]) with `"[REDACTED]"`, recursively, in arrays
//! too, so two payloads that differ only in a password hash alike and a
//! hash cannot be brute-forced back to an email address.

use serde_json::Value;
use sha2::{Digest, Sha256};

/// The value put in place of a sensitive one.
pub const REDACTED: &str = "[REDACTED]";

/// Whether a key names personal data or a secret: password, secret, token,
/// API key, credential, email, phone, address, SSN, credit card, and any
/// key ending in `_secret`, `_token` or `_key`. Case, `-`, `_` and spaces
/// do not matter (`apiKey`, `api-key`, `API_KEY`).
pub fn is_sensitive(key: &str) -> bool {
    let lower = key.to_ascii_lowercase();
    let squashed: String = lower
        .chars()
        .filter(|c| !matches!(c, '_' | '-' | ' ' | '.'))
        .collect();
    const WORDS: &[&str] = &[
        "password",
        "passwd",
        "secret",
        "token",
        "apikey",
        "credential",
        "email",
        "phone",
        "address",
        "ssn",
        "creditcard",
        "cardnumber",
    ];
    WORDS.iter().any(|w| squashed.contains(w))
        || ["_secret", "_token", "_key"]
            .iter()
            .any(|s| lower.ends_with(s))
}

/// `value` with every sensitive key's value replaced by [`REDACTED`].
pub fn redact(value: &Value) -> Value {
    match value {
        Value::Object(fields) => Value::Object(
            fields
                .iter()
                .map(|(k, v)| {
                    let v = if is_sensitive(k) {
                        Value::String(REDACTED.to_owned())
                    } else {
                        redact(v)
                    };
                    (k.clone(), v)
                })
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(redact).collect()),
        other => other.clone(),
    }
}

/// The canonical JSON (RFC 8785) of `value`.
pub fn canonical(value: &Value) -> Vec<u8> {
    // Serializing a `Value` cannot fail: its keys are strings and its
    // numbers finite; an empty output would still hash deterministically.
    serde_json_canonicalizer::to_vec(value).unwrap_or_default()
}

/// Lowercase hex SHA-256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// The audit digest of a payload: `(sha256 of its redacted canonical JSON,
/// size of that JSON in bytes)`.
pub fn digest(value: &Value) -> (String, i64) {
    let bytes = canonical(&redact(value));
    (
        sha256_hex(&bytes),
        i64::try_from(bytes.len()).unwrap_or(i64::MAX),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn sensitive_keys_follow_the_seeds_patterns() {
        for key in [
            "password",
            "Password",
            "db_password",
            "client_secret",
            "refresh_token",
            "apiKey",
            "api-key",
            "API_KEY",
            "x_api_key",
            "credentials",
            "email",
            "contactEmail",
            "phone_number",
            "address",
            "billing_address",
            "ssn",
            "credit_card",
            "creditCardNumber",
            "stripe_key",
            "session_token",
        ] {
            assert!(is_sensitive(key), "{key}");
        }
        for key in [
            "text", "lead_id", "note", "name", "keyboard", "monkey", "segments",
        ] {
            assert!(!is_sensitive(key), "{key}");
        }
    }

    #[test]
    fn redaction_is_recursive_and_reaches_into_arrays() {
        let input = json!({
            "note": "call back",
            "contact": {"email": "ann@example.com", "phone": "+1 555", "name": "Ann"},
            "items": [{"api_key": "sk-1"}, {"ok": 1}, ["x", {"password": "p"}]],
            "password": {"nested": "objects are replaced whole"}
        });
        assert_eq!(
            redact(&input),
            json!({
                "note": "call back",
                "contact": {"email": REDACTED, "phone": REDACTED, "name": "Ann"},
                "items": [{"api_key": REDACTED}, {"ok": 1}, ["x", {"password": REDACTED}]],
                "password": REDACTED
            })
        );
    }

    #[test]
    fn digests_ignore_key_order_and_secrets_but_see_everything_else() {
        let a = digest(&json!({"b": 1, "a": [1, 2], "token": "one"}));
        let b = digest(&json!({"a": [1, 2], "token": "two", "b": 1}));
        assert_eq!(a, b, "key order and a secret's value do not matter");
        let c = digest(&json!({"a": [2, 1], "b": 1, "token": "one"}));
        assert_ne!(a.0, c.0);
        assert_eq!(a.0.len(), 64);
        assert!(
            a.0.bytes()
                .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
        );
        // RFC 8785: `{"a":[1,2],"b":1,"token":"[REDACTED]"}`.
        assert_eq!(
            a.1,
            br#"{"a":[1,2],"b":1,"token":"[REDACTED]"}"#.len() as i64
        );
    }
}
