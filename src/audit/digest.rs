//! What the audit log keeps of a payload: SHA-256 and size of its redacted RFC 8785 JSON, never
//! the payload; redaction keeps a digest from being brute-forced back to a secret or an email.

use serde_json::Value;
use sha2::{Digest, Sha256};

/// The value put in place of a sensitive one.
pub const REDACTED: &str = "[REDACTED]";

/// Whether a key names personal data or a secret, erring towards redacting.
pub fn is_sensitive(key: &str) -> bool {
    let squashed: String = key
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .map(|c| c.to_ascii_lowercase())
        .collect();
    const ANYWHERE: &[&str] = &[
        "password",
        "passwd",
        "secret",
        "token",
        "apikey",
        "credential",
        "email",
        "phone",
        "address",
        "creditcard",
        "cardnumber",
    ];
    if ANYWHERE.iter().any(|w| squashed.contains(w)) {
        return true;
    }
    let words = words(key);
    words.iter().any(|w| w == "ssn")
        || (words.len() > 1 && words.last().is_some_and(|w| w == "key" || w == "keys"))
}

fn words(key: &str) -> Vec<String> {
    let chars: Vec<char> = key.chars().collect();
    let mut out: Vec<String> = Vec::new();
    let mut word = String::new();
    for (i, &c) in chars.iter().enumerate() {
        if !c.is_ascii_alphanumeric() {
            if !word.is_empty() {
                out.push(std::mem::take(&mut word));
            }
            continue;
        }
        let prev = i.checked_sub(1).and_then(|j| chars.get(j)).copied();
        let next = chars.get(i + 1).copied();
        let starts = c.is_ascii_uppercase()
            && prev.is_some_and(|p| {
                p.is_ascii_lowercase()
                    || p.is_ascii_digit()
                    || (p.is_ascii_uppercase() && next.is_some_and(|n| n.is_ascii_lowercase()))
            });
        if starts && !word.is_empty() {
            out.push(std::mem::take(&mut word));
        }
        word.push(c.to_ascii_lowercase());
    }
    if !word.is_empty() {
        out.push(word);
    }
    out
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
    // Cannot fail on a `Value` (string keys, finite numbers).
    serde_json_canonicalizer::to_vec(value).unwrap_or_default()
}

/// Lowercase hex SHA-256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    sha256_hex_of(&[bytes])
}

/// The lowercase hex SHA-256 of `parts` one after the other, without joining them first.
pub fn sha256_hex_of(parts: &[&[u8]]) -> String {
    let mut hasher = Sha256::new();
    for part in parts {
        hasher.update(part);
    }
    hex::encode(hasher.finalize())
}

/// The audit digest of a payload: the SHA-256 and byte size of its redacted canonical JSON.
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
            "privateKey",
            "private-key",
            "stripe.key",
            "signing key",
            "accessKey",
            "APIKey",
            "x-api-key",
            "SSN",
            "user_ssn",
            "userSSN",
            "ssh_keys",
        ] {
            assert!(is_sensitive(key), "{key}");
        }
        for key in [
            "text",
            "lead_id",
            "note",
            "name",
            "keyboard",
            "monkey",
            "segments",
            "key",
            "businessName",
            "className",
            "passenger",
        ] {
            assert!(!is_sensitive(key), "{key}");
        }
    }

    #[test]
    fn keys_split_into_words_however_they_are_joined() {
        assert_eq!(words("APIKey"), ["api", "key"]);
        assert_eq!(words("privateKey"), ["private", "key"]);
        assert_eq!(words("x-api_key.v2"), ["x", "api", "key", "v2"]);
        assert_eq!(words("userSSN"), ["user", "ssn"]);
        assert_eq!(words("  "), Vec::<String>::new());
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
        assert_eq!(
            a.1,
            br#"{"a":[1,2],"b":1,"token":"[REDACTED]"}"#.len() as i64
        );
    }
}
