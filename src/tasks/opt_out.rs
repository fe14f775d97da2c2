//! Opt-outs. A bare carrier keyword is an opt-out by law in the US (CTIA / FCC), so it
//! needs no model; a plain request to stop ("please stop texting me") GenerateSms must
//! never answer (SPEC §6.2), whatever a model makes of it.

/// Keywords after normalisation (upper-case, letters and digits only): "Opt-Out" matches.
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

/// True when `message` is exactly one keyword after normalisation ("stop please" is not).
pub fn is_opt_out(message: &str) -> bool {
    let normalized: String = message
        .chars()
        .filter(|c| c.is_alphanumeric())
        .flat_map(char::to_uppercase)
        .map(|c| if c == 'Ê' { 'E' } else { c })
        .collect();
    KEYWORDS.contains(&normalized.as_str())
}

/// Phrases asking to stop, as whole words after normalisation (lower-case, apostrophes
/// dropped, other runs of non-alphanumerics one space), padded with the spaces they match.
const STOP_PHRASES: &[&str] = &[
    " unsubscribe ",
    " remove me ",
    " take me off ",
    " opt me out ",
    " opt out ",
    " optout ",
    " lose my number ",
    " delete my number ",
    " leave me alone ",
    " please stop ",
    " pls stop ",
    " plz stop ",
    " stop it ",
    " stop now ",
];

/// Words that ask to stop a way of contacting a few words later ("stop sending me texts"),
/// with that reach. "dont" and "never" reach less far: "don't forget to call me" and
/// "never mind, call me" ask for a call.
const STOP_WORDS: &[(&str, usize)] = &[
    ("stop", 3),
    ("quit", 3),
    ("cease", 3),
    ("dont", 2),
    ("never", 1),
];

/// Ways of contacting, as word prefixes ("text" covers texting, texts).
const CONTACT_WORDS: &[&str] = &[
    "text", "txt", "messag", "msg", "sms", "contact", "call", "email", "spam",
];

/// True when `message` is an opt-out keyword or asks in words to stop being contacted.
/// Errs on the safe side: "don't call before 9" matches too, and a person decides.
pub fn asks_to_stop(message: &str) -> bool {
    if is_opt_out(message) {
        return true;
    }
    let mut normal = String::with_capacity(message.len() + 2);
    normal.push(' ');
    for c in message.chars() {
        if matches!(c, '\'' | '\u{2019}' | '\u{2018}' | '\u{02BC}' | '`') {
            continue;
        }
        if c.is_alphanumeric() {
            normal.extend(c.to_lowercase());
        } else if !normal.ends_with(' ') {
            normal.push(' ');
        }
    }
    if !normal.ends_with(' ') {
        normal.push(' ');
    }
    if STOP_PHRASES.iter().any(|p| normal.contains(p)) {
        return true;
    }
    let words: Vec<&str> = normal.split_whitespace().collect();
    let contact = |w: &&str| CONTACT_WORDS.iter().any(|c| w.starts_with(c));
    let within = |i: usize, reach: usize| words[i + 1..].iter().take(reach).any(contact);
    words.iter().enumerate().any(|(i, word)| match *word {
        // "no more texts", the contact word right after: "no more
        // questions, call me" is a lead asking for a call.
        "no" => words.get(i + 1) == Some(&"more") && words.get(i + 2).is_some_and(contact),
        // "do not ...", never "can not ...".
        "not" => i > 0 && words[i - 1] == "do" && within(i, 2),
        w => STOP_WORDS
            .iter()
            .any(|(stop, reach)| *stop == w && within(i, *reach)),
    })
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
            ("stop texts please", true),
            ("Stop messages", true),
            ("please stop", true),
            ("stop these texts", true),
            ("don\u{2018}t ever text me", true),
            ("never text me again", true),
            ("quit texting me", true),
            ("do not call this number", true),
            ("no more msgs", true),
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
            ("no, text me the price", false),
            ("I can not make it, text me later", false),
            ("stop by at 5, call me first", false),
            ("No more questions, call me tomorrow", false),
            ("Don't forget to call me", false),
            ("Never mind, call me at 5", false),
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
