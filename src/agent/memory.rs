//! Memory suggestions (SPEC §11.7): an agent with `memory_suggestions = true`
//! asks for a structured `{content, memory_suggestions[]}` answer, checked
//! here. Suggestions are only emitted and stored on the turn; the caller
//! decides what to remember, and nothing in the orchestrator persists a
//! memory. One that looks like a secret or contact data is dropped (a caller
//! storing blindly would keep it forever); the patterns err toward dropping.

use crate::domain::JsonSchemaFormat;
use regex::Regex;
use serde_json::{Value, json};
use std::sync::LazyLock;

/// Most suggestions kept from one answer.
pub const MAX_SUGGESTIONS: usize = 5;
/// Longest suggestion, in characters.
pub const MAX_CHARS: usize = 200;

/// Words that announce a secret or personal data (SPEC §10's list, as the
/// audit redaction uses it), and values shaped like one. Strict on purpose:
/// a dropped suggestion costs little, a stored secret a lot.
const SECRET_PATTERNS: &[&str] = &[
    r"(?i)passw(?:or)?d",
    // Inside names too: client_secret, access_token.
    r"(?i)secret",
    r"(?i)token",
    r"(?i)api[ _-]?keys?",
    // Any `*_key` name.
    r"(?i)[a-z0-9]_key\b",
    r"(?i)credential",
    r"(?i)\bssns?\b",
    r"(?i)social[ _-]?security",
    r"(?i)credit[ _-]?cards?",
    r"(?i)private[ _-]?keys?",
    // The personal-data words of SPEC §10, on their own.
    r"(?i)e-?mail",
    r"(?i)\bphone",
    r"(?i)address",
    // An email address.
    r"[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}",
    // A US social security number.
    r"\b[0-9]{3}-[0-9]{2}-[0-9]{4}\b",
    // A card number: 13–19 digits, optionally grouped.
    r"\b(?:[0-9][ -]?){12,18}[0-9]\b",
    // A street address: number, name, street type.
    r"(?i)\b[0-9]+\s+\w+\s+(?:street|st|avenue|ave|road|rd|boulevard|blvd|lane|ln)\b",
    // Provider keys and tokens with a known shape.
    r"\bsk-[A-Za-z0-9_-]{16,}",
    r"\bAKIA[0-9A-Z]{16}\b",
    r"\bgh[pousr]_[A-Za-z0-9]{20,}",
    r"\bxox[abpr]-",
    r"-----BEGIN",
    r"(?i)\bbearer\s+[A-Za-z0-9._~+/=-]{16,}",
    r"\beyJ[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.",
];

/// Seven or more digits, separated at most by phone punctuation. Checked
/// in code, so a year range such as `2019-2021` passes.
const PHONE_PATTERN: &str = r"\+?\(?[0-9](?:[ ().-]{0,3}[0-9]){6,}";

/// A long run of key-like characters (hex, base64). Checked in code: only a
/// run holding a digit counts, so long hyphenated words pass while random
/// keys (nearly always with a digit) do not.
const RUN_PATTERN: &str = r"[A-Za-z0-9+/=_-]{32,}";

// Constants compiled by a test; one that failed is skipped, never a panic.
static SECRETS: LazyLock<Vec<Regex>> = LazyLock::new(|| {
    SECRET_PATTERNS
        .iter()
        .filter_map(|p| Regex::new(p).ok())
        .collect()
});
static PHONE: LazyLock<Option<Regex>> = LazyLock::new(|| Regex::new(PHONE_PATTERN).ok());
static RUN: LazyLock<Option<Regex>> = LazyLock::new(|| Regex::new(RUN_PATTERN).ok());

/// The structured answer asked of the model.
pub fn format() -> JsonSchemaFormat {
    JsonSchemaFormat {
        name: "agent_answer".into(),
        schema: json!({
            "type": "object",
            "properties": {
                "content": {"type": "string"},
                "memory_suggestions": {
                    "type": "array",
                    "maxItems": MAX_SUGGESTIONS,
                    "items": {"type": "string", "minLength": 1, "maxLength": MAX_CHARS},
                },
            },
            "required": ["content", "memory_suggestions"],
            "additionalProperties": false,
        }),
    }
}

/// The sentence appended to the system prompt of an agent asking for them.
pub fn instruction() -> &'static str {
    "Answer with a JSON object whose \"content\" is your reply to the user and whose \
     \"memory_suggestions\" lists up to 5 short facts about the user worth remembering \
     in later conversations (an empty list if there are none), never passwords, keys, \
     tokens or other secrets, and never contact, card or identity numbers."
}

/// The model's answer, taken apart.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Parsed {
    /// The reply to show the user.
    pub content: String,
    /// Valid suggestions, in the model's order.
    pub suggestions: Vec<String>,
    /// Suggestions rejected (invalid, secret-like, repeated) or past [`MAX_SUGGESTIONS`].
    pub dropped: usize,
}

/// Takes a structured answer apart; one that is not the asked-for object
/// (format ignored, or a fallback provider without it) is all content.
pub fn parse(text: &str) -> Parsed {
    let plain = || Parsed {
        content: text.to_owned(),
        ..Parsed::default()
    };
    let Some(Value::Object(answer)) = serde_json::from_str::<Value>(unfence(text)).ok() else {
        return plain();
    };
    let Some(content) = answer.get("content").and_then(Value::as_str) else {
        return plain();
    };
    let items: &[Value] = match answer.get("memory_suggestions") {
        Some(Value::Array(items)) => items.as_slice(),
        _ => &[],
    };

    let mut suggestions: Vec<String> = Vec::new();
    let mut seen: Vec<String> = Vec::new();
    let mut dropped = 0;
    for item in items {
        let Some(s) = item.as_str().map(str::trim) else {
            dropped += 1;
            continue;
        };
        let chars = s.chars().count();
        // Repeats compared ignoring case: "Has a dog" and "has a dog" are one fact.
        let key = s.to_lowercase();
        let valid = (1..=MAX_CHARS).contains(&chars) && !looks_secret(s) && !seen.contains(&key);
        if valid && suggestions.len() < MAX_SUGGESTIONS {
            suggestions.push(s.to_owned());
            seen.push(key);
        } else {
            dropped += 1;
        }
    }
    Parsed {
        content: content.to_owned(),
        suggestions,
        dropped,
    }
}

/// The answer without a Markdown code fence, which models add even when asked not to.
fn unfence(text: &str) -> &str {
    let trimmed = text.trim();
    let Some(inner) = trimmed
        .strip_prefix("```")
        .and_then(|rest| rest.strip_suffix("```"))
    else {
        return trimmed;
    };
    // The opening line may name the language.
    match inner.split_once('\n') {
        Some((info, body)) if info.trim().chars().all(|c| c.is_ascii_alphanumeric()) => body.trim(),
        _ => inner.trim(),
    }
}

/// Whether `s` looks like a secret or personal contact data: a keyword such
/// as "password", or a value shaped like an address, number, key or token.
pub fn looks_secret(s: &str) -> bool {
    if SECRETS.iter().any(|re| re.is_match(s)) {
        return true;
    }
    let phone = PHONE
        .as_ref()
        .is_some_and(|re| re.find_iter(s).any(|m| !is_year_range(m.as_str())));
    let run = RUN.as_ref().is_some_and(|re| {
        re.find_iter(s)
            .any(|m| m.as_str().bytes().any(|b| b.is_ascii_digit()))
    });
    phone || run
}

/// `2019-2021`, `1990 - 2000`: digits the phone pattern would take.
fn is_year_range(s: &str) -> bool {
    let compact: String = s
        .chars()
        .filter(|c| c.is_ascii_digit() || *c == '-')
        .collect();
    let is_year = |y: &str| y.len() == 4 && (y.starts_with("19") || y.starts_with("20"));
    compact
        .split_once('-')
        .is_some_and(|(from, to)| is_year(from) && is_year(to))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn every_pattern_compiles() {
        for p in SECRET_PATTERNS.iter().chain([&PHONE_PATTERN, &RUN_PATTERN]) {
            assert!(Regex::new(p).is_ok(), "{p}");
        }
        assert_eq!(SECRETS.len(), SECRET_PATTERNS.len());
        assert!(PHONE.is_some() && RUN.is_some());
    }

    #[test]
    fn the_format_bounds_the_suggestions() {
        let f = format();
        assert_eq!(f.name, "agent_answer");
        let list = &f.schema["properties"]["memory_suggestions"];
        assert_eq!(list["maxItems"], 5);
        assert_eq!(list["items"]["minLength"], 1);
        assert_eq!(list["items"]["maxLength"], 200);
        assert_eq!(
            f.schema["required"],
            json!(["content", "memory_suggestions"])
        );
        assert_eq!(f.schema["additionalProperties"], false);
        assert!(instruction().contains("memory_suggestions"));
    }

    #[test]
    fn a_structured_answer_is_taken_apart() {
        let text = r#"{"content": "Sure, booked.", "memory_suggestions": ["Has two dogs", "Prefers morning appointments"]}"#;
        let p = parse(text);
        assert_eq!(p.content, "Sure, booked.");
        assert_eq!(
            p.suggestions,
            ["Has two dogs", "Prefers morning appointments"]
        );
        assert_eq!(p.dropped, 0);

        let fenced = format!("```json\n{text}\n```");
        assert_eq!(parse(&fenced), p);
        assert_eq!(parse(&format!("  ```\n{text}\n```\n")), p);
    }

    #[test]
    fn anything_else_is_all_content() {
        for text in [
            "Just a plain answer.",
            "[1, 2]",
            r#"{"memory_suggestions": ["Has two dogs"]}"#,
            r#"{"content": 42}"#,
            "```json\nnot json\n```",
        ] {
            let p = parse(text);
            assert_eq!(p.content, text);
            assert!(p.suggestions.is_empty() && p.dropped == 0, "{text}");
        }
        for text in [
            r#"{"content": "hi"}"#,
            r#"{"content": "hi", "memory_suggestions": "Has two dogs"}"#,
        ] {
            assert_eq!(parse(text).content, "hi");
            assert!(parse(text).suggestions.is_empty());
        }
    }

    #[test]
    fn suggestions_are_checked_deduplicated_and_capped() {
        let long = "a".repeat(201);
        let longest = "é".repeat(200); // 200 characters, 400 bytes
        let answer = json!({
            "content": "ok",
            "memory_suggestions": [
                "  Has two dogs  ", 7, "", "   ", long.as_str(), "has two dogs",
                "My password is hunter2", longest.as_str(), "Lives near Austin",
                "Likes jazz", "Plays chess", "Reads sci-fi",
            ],
        });
        let p = parse(&answer.to_string());
        assert_eq!(
            p.suggestions,
            [
                "Has two dogs",
                longest.as_str(),
                "Lives near Austin",
                "Likes jazz",
                "Plays chess"
            ]
        );
        // 7, "", "   ", the long one, the repeat, the password, and the surplus.
        assert_eq!(p.dropped, 7);
    }

    #[test]
    fn ordinary_facts_pass() {
        for s in [
            "Prefers morning appointments",
            "Has two dogs",
            "Lives near Austin",
            "Worked at Acme from 2019-2021",
            "Born in 1985, has 3 kids",
            "Wants a 30 minute consultation",
            "Prefers sms/whatsapp/telegram",
            "Is a keen cyclist",
        ] {
            assert!(!looks_secret(s), "{s}");
        }
    }

    #[test]
    fn the_personal_data_words_are_caught_even_in_plain_facts() {
        // SPEC §10's list applies as words: strict, by design.
        for s in [
            "Prefers email over phone calls",
            "Is a secretary at a law firm",
            "Moved to a new address last year",
            "Their client_secret is rotated monthly",
            "Keeps the access_token in a vault",
            "Shared the signing_key",
            "Has an E-mail newsletter",
        ] {
            assert!(looks_secret(s), "{s}");
        }
    }

    #[test]
    fn secret_words_are_caught() {
        for s in [
            "Their password is hunter2",
            "Uses passwd files",
            "Shared a Secret with me",
            "Gave me an access token",
            "API key is on file",
            "Stores the api_key",
            "apikey: abc",
            "Sent credentials by mail",
            "Gave their SSN",
            "Social Security number ends in 12",
            "Pays by credit card",
            "Uploaded a private key",
            "Shared their home address",
        ] {
            assert!(looks_secret(s), "{s}");
        }
    }

    #[test]
    fn secret_values_are_caught() {
        for s in [
            "Reach them at jane.doe+work@example.co.uk",
            "Cell is 555-1234",
            "Call +1 (512) 555-0199",
            "Number 512.555.0199",
            "Card 4111 1111 1111 1111",
            "Card 4111-1111-1111-1111",
            "ID 123-45-6789",
            "Lives at 42 Elm Street",
            "Office on 1600 Pennsylvania Ave",
            "Key sk-proj-abcdefghijklmnop1234",
            "AWS AKIAABCDEFGHIJKLMNOP",
            "ghp_abcdefghijklmnopqrstuvwxyz0123",
            "Slack xoxb-1234",
            "-----BEGIN RSA PRIVATE",
            "Header Bearer abcdefghijklmnop.qrs",
            "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.sig",
            "Hash a1b2c3d4e5f6a7b8c9d0e1f2a3b4c5d6",
            "Blob QUJDREVGR0hJSktMTU5PUFFSU1RVVldYWVo0",
        ] {
            assert!(looks_secret(s), "{s}");
        }
    }

    #[test]
    fn year_ranges_are_not_phone_numbers() {
        assert!(is_year_range("2019-2021"));
        assert!(is_year_range("(1990 - 2000"));
        assert!(!is_year_range("555-1234"));
        assert!(!is_year_range("2019-2021 555-1234"));
        assert!(looks_secret("From 2019-2021 555-1234"));
    }
}
