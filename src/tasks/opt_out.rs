//! Carrier opt-out keywords. A message that is nothing but one of these is an
//! opt-out by law in the US (CTIA / FCC rules), so it never needs a model.

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

#[cfg(test)]
mod tests {
    use super::is_opt_out;

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
