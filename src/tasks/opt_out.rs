//! Carrier opt-out keywords. A message that is nothing but one of these is an
//! opt-out by law in the US (CTIA / FCC rules), so it never needs a model.
//! And plain requests to stop being contacted ("please stop texting me"),
//! which GenerateSms must never answer (SPEC §6.2) whatever a model makes
//! of them.

/// Keywords after normalisation (upper-case, letters and digits only), so
/// "Stop.", "stop!!", "Opt-Out" and "STOP ALL" all match.
const KEYWORDS: &[&str] = &[
    "STOP",
    "STOPALL",
    "UNSUBSCRIBE",
    "CANCEL",
    "END",
    "QUIT",
    "OPTOUT",
    "REVOKE",
    "STOPP",
    "ARRET",
];

/// True when `message`, ignoring case, spacing and punctuation, is exactly
/// one opt-out keyword. "stop please" is not: it goes to the model.
pub fn is_opt_out(message: &str) -> bool {
    let normalized: String = message
        .chars()
        .filter(|c| c.is_alphanumeric())
        .flat_map(char::to_uppercase)
        .map(|c| if c == 'Ê' { 'E' } else { c })
        .collect();
    KEYWORDS.contains(&normalized.as_str())
}

/// Requests to stop being contacted, as whole words after normalisation
/// (lower-case, apostrophes dropped, any other non-alphanumeric run one
/// space). Clear phrasings only: a negated one ("don't stop texting me")
/// also matches, and errs on the safe side: a person decides.
const STOP_REQUESTS: &[&str] = &[
    "stop texting",
    "stop text",
    "stop txting",
    "stop messaging",
    "stop message",
    "stop sending",
    "stop contacting",
    "stop calling",
    "unsubscribe",
    "remove me",
    "take me off",
    "opt me out",
    "opt out",
    "optout",
    "do not text",
    "dont text",
    "do not message",
    "dont message",
    "do not contact",
    "dont contact",
    "no more texts",
    "no more messages",
    "lose my number",
    "delete my number",
    "leave me alone",
];

/// True when `message` is an opt-out keyword or asks, in words, to stop
/// being contacted: the inbound GenerateSms never answers.
pub fn asks_to_stop(message: &str) -> bool {
    if is_opt_out(message) {
        return true;
    }
    let mut words = String::with_capacity(message.len() + 2);
    words.push(' ');
    for c in message.chars().filter(|c| !matches!(c, '\'' | '’')) {
        if c.is_alphanumeric() {
            words.extend(c.to_lowercase());
        } else if !words.ends_with(' ') {
            words.push(' ');
        }
    }
    if !words.ends_with(' ') {
        words.push(' ');
    }
    STOP_REQUESTS
        .iter()
        .any(|phrase| words.contains(&format!(" {phrase} ")))
}

#[cfg(test)]
mod tests {
    use super::{asks_to_stop, is_opt_out};

    #[test]
    fn requests_to_stop_in_words() {
        let cases = [
            ("STOP", true),
            ("Please stop texting me.", true),
            ("pls STOP TEXTING ME!!!", true),
            ("Don't text me again", true),
            ("don’t contact me", true),
            ("Unsubscribe me please", true),
            ("Remove me from your list", true),
            ("take me off this list", true),
            ("opt-out", true),
            ("I want to opt out", true),
            ("Lose my number", true),
            ("no more texts thanks", true),
            ("Sure, text me tomorrow", false),
            ("What does it cost?", false),
            ("stopped by your store today", false),
            ("I removed the app", false),
            ("", false),
        ];
        for (message, expected) in cases {
            assert_eq!(asks_to_stop(message), expected, "{message:?}");
        }
    }

    #[test]
    fn keyword_table() {
        let cases = [
            ("STOP", true),
            ("stop", true),
            ("Stop.", true),
            ("  STOP!!  ", true),
            ("StopAll", true),
            ("stop all", true),
            ("UNSUBSCRIBE", true),
            ("cancel", true),
            ("End", true),
            ("quit.", true),
            ("opt-out", true),
            ("Opt out", true),
            ("OPTOUT", true),
            ("revoke", true),
            ("Arrêt", true),
            ("stop please", false),
            ("please stop texting me", false),
            ("stopped", false),
            ("the end is near", false),
            ("", false),
            ("🛑", false),
        ];
        for (message, expected) in cases {
            assert_eq!(is_opt_out(message), expected, "{message:?}");
        }
    }
}
