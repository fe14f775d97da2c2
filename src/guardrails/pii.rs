//! PII masking with restore (SPEC §15): personal data replaced with typed
//! placeholders (`<EMAIL_1>`) before a provider sees it, the same value
//! always the same placeholder within one call, and the originals put back
//! into the answer when asked. Card numbers must pass the Luhn check, IBANs
//! their mod-97 check, SSNs the rules of valid areas, so that order numbers
//! and dates stay. The originals never leave the masker: its `Debug` shows
//! counts only, and nothing logs it.

use crate::config::guardrails::PiiKind;
use regex::Regex;
use std::{collections::HashMap, fmt, sync::LazyLock};

/// Each kind's candidates, before its check; in the order overlaps are
/// settled (an email holds digits a phone would take, an IBAN a card's).
const ORDER: [PiiKind; 6] = [
    PiiKind::Email,
    PiiKind::Iban,
    PiiKind::Card,
    PiiKind::Ssn,
    PiiKind::Ip,
    PiiKind::Phone,
];

fn pattern(kind: PiiKind) -> &'static Regex {
    static EMAIL: LazyLock<Regex> = LazyLock::new(|| {
        compiled(
            r"(?i)\b[a-z0-9._%+-]+@[a-z0-9](?:[a-z0-9-]*[a-z0-9])?(?:\.[a-z0-9](?:[a-z0-9-]*[a-z0-9])?)*\.[a-z]{2,}\b",
        )
    });
    static IBAN: LazyLock<Regex> =
        LazyLock::new(|| compiled(r"\b[A-Z]{2}\d{2}(?: ?[A-Z0-9]{4}){2,7}(?: ?[A-Z0-9]{1,3})?\b"));
    static CARD: LazyLock<Regex> = LazyLock::new(|| compiled(r"\b\d(?:[ -]?\d){12,18}\b"));
    static SSN: LazyLock<Regex> = LazyLock::new(|| compiled(r"\b\d{3}-\d{2}-\d{4}\b"));
    static IP: LazyLock<Regex> = LazyLock::new(|| {
        compiled(r"\b(?:\d{1,3}\.){3}\d{1,3}\b|\b(?:[0-9A-Fa-f]{1,4}:){7}[0-9A-Fa-f]{1,4}\b")
    });
    // International (+), North American, or a national number with a trunk 0.
    static PHONE: LazyLock<Regex> = LazyLock::new(|| {
        compiled(
            r"\+\d{1,3}[ .-]?(?:\(?\d{1,4}\)?[ .-]?){1,5}\d{2,4}\b|\(?\b\d{3}\)?[ .-]\d{3}[ .-]\d{4}\b|\b0\d{2,4}[ /.-]?\d{3,4}[ .-]?\d{3,4}\b",
        )
    });
    match kind {
        PiiKind::Email => &EMAIL,
        PiiKind::Iban => &IBAN,
        PiiKind::Card => &CARD,
        PiiKind::Ssn => &SSN,
        PiiKind::Ip => &IP,
        PiiKind::Phone => &PHONE,
    }
}

/// A pattern of this file: a broken one is a bug a unit test catches,
/// matching nothing rather than panicking in production.
fn compiled(p: &str) -> Regex {
    Regex::new(p).unwrap_or_else(|e| {
        tracing::error!(error = %e, "a PII pattern does not compile");
        Regex::new(r"[^\s\S]").unwrap_or_else(|_| unreachable!())
    })
}

/// Whether the candidate `text` of `kind` is one (its check holds).
fn valid(kind: PiiKind, text: &str) -> bool {
    match kind {
        PiiKind::Email => true,
        PiiKind::Card => luhn(text),
        PiiKind::Iban => iban(text),
        PiiKind::Ssn => ssn(text),
        PiiKind::Ip => ip(text),
        PiiKind::Phone => {
            let digits = text.chars().filter(char::is_ascii_digit).count();
            (7..=15).contains(&digits)
        }
    }
}

/// The Luhn check over 13–19 digits.
pub fn luhn(text: &str) -> bool {
    let digits: Vec<u32> = text.chars().filter_map(|c| c.to_digit(10)).collect();
    if !(13..=19).contains(&digits.len()) {
        return false;
    }
    let sum: u32 = digits
        .iter()
        .rev()
        .enumerate()
        .map(|(i, &d)| match (i % 2 == 1, d * 2) {
            (true, doubled) if doubled > 9 => doubled - 9,
            (true, doubled) => doubled,
            (false, _) => d,
        })
        .sum();
    sum.is_multiple_of(10)
}

/// ISO 13616: the country and check digits moved to the end, letters as
/// numbers, the whole mod 97 is 1.
fn iban(text: &str) -> bool {
    let compact: Vec<char> = text.chars().filter(|c| !c.is_whitespace()).collect();
    if !(15..=34).contains(&compact.len()) {
        return false;
    }
    let rotated = compact[4..].iter().chain(&compact[..4]);
    let mut rest: u32 = 0;
    for c in rotated {
        let Some(v) = c.to_digit(36) else {
            return false;
        };
        let step = if v >= 10 { 100 } else { 10 };
        rest = (rest * step + v) % 97;
    }
    rest == 1
}

/// Not area 000, 666 or 900–999, group 00 or serial 0000.
fn ssn(text: &str) -> bool {
    let mut parts = text.split('-');
    let (Some(area), Some(group), Some(serial)) = (parts.next(), parts.next(), parts.next()) else {
        return false;
    };
    area != "000" && area != "666" && !area.starts_with('9') && group != "00" && serial != "0000"
}

fn ip(text: &str) -> bool {
    text.contains(':') || text.split('.').all(|o| o.parse::<u8>().is_ok())
}

/// One call's masker: what it replaced, to put back.
#[derive(Default)]
pub struct Masker {
    kinds: Vec<PiiKind>,
    placeholders: HashMap<String, String>,
    originals: HashMap<String, String>,
    counts: HashMap<PiiKind, u32>,
}

impl fmt::Debug for Masker {
    // Never the originals: a masker in a log line must not leak what it hides.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Masker")
            .field("kinds", &self.kinds)
            .field("masked", &self.originals.len())
            .finish()
    }
}

impl Masker {
    /// A masker of `kinds` for one call.
    pub fn new(kinds: &[PiiKind]) -> Self {
        Self {
            kinds: kinds.to_vec(),
            ..Self::default()
        }
    }

    /// `text` with each value of the masked kinds replaced by its
    /// placeholder, the same value always the same one.
    pub fn mask(&mut self, text: &str) -> String {
        let mut spans: Vec<(usize, usize, PiiKind)> = Vec::new();
        for kind in ORDER.into_iter().filter(|k| self.kinds.contains(k)) {
            for m in pattern(kind).find_iter(text) {
                let (start, end) = (m.start(), m.end());
                let free = spans.iter().all(|&(s, e, _)| end <= s || start >= e);
                if free && valid(kind, m.as_str()) {
                    spans.push((start, end, kind));
                }
            }
        }
        if spans.is_empty() {
            return text.to_owned();
        }
        spans.sort_unstable_by_key(|&(s, _, _)| s);
        let mut out = String::with_capacity(text.len());
        let mut at = 0;
        for (start, end, kind) in spans {
            out.push_str(&text[at..start]);
            out.push_str(&self.placeholder(kind, &text[start..end]));
            at = end;
        }
        out.push_str(&text[at..]);
        out
    }

    fn placeholder(&mut self, kind: PiiKind, original: &str) -> String {
        if let Some(p) = self.placeholders.get(original) {
            return p.clone();
        }
        let n = self.counts.entry(kind).or_insert(0);
        *n += 1;
        let p = format!("<{}_{n}>", kind.tag());
        self.placeholders.insert(original.to_owned(), p.clone());
        self.originals.insert(p.clone(), original.to_owned());
        p
    }

    /// `text` with every placeholder this masker made put back; any other
    /// text that looks like one is left as it is.
    pub fn restore(&self, text: &str) -> String {
        static PLACEHOLDER: LazyLock<Regex> =
            LazyLock::new(|| compiled(r"<(?:EMAIL|PHONE|CARD|SSN|IBAN|IP)_\d{1,6}>"));
        if self.originals.is_empty() {
            return text.to_owned();
        }
        PLACEHOLDER
            .replace_all(text, |c: &regex::Captures<'_>| {
                let p = &c[0];
                self.originals
                    .get(p)
                    .cloned()
                    .unwrap_or_else(|| p.to_owned())
            })
            .into_owned()
    }

    /// How many values it masked.
    pub fn masked(&self) -> usize {
        self.originals.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: [PiiKind; 6] = ORDER;

    #[test]
    fn each_kind_is_masked_with_a_stable_typed_placeholder_and_restored() {
        let mut m = Masker::new(&ALL);
        let text = "Mail ann@example.com or call +1 415 555 0100; card 4111 1111 1111 1111, \
                    ssn 123-45-6789, iban DE89 3704 0044 0532 0130 00, from 192.168.1.20. \
                    Again: ann@example.com.";
        let masked = m.mask(text);
        assert_eq!(
            masked,
            "Mail <EMAIL_1> or call <PHONE_1>; card <CARD_1>, ssn <SSN_1>, iban <IBAN_1>, \
             from <IP_1>. Again: <EMAIL_1>."
        );
        assert_eq!(m.masked(), 6);
        assert_eq!(m.restore(&masked), text);
        assert_eq!(m.restore("<EMAIL_9> stays"), "<EMAIL_9> stays");
        let debug = format!("{m:?}");
        assert!(
            !debug.contains("ann@") && debug.contains("masked: 6"),
            "{debug}"
        );
    }

    #[test]
    fn checks_keep_order_numbers_dates_and_versions() {
        let mut m = Masker::new(&ALL);
        let text = "Order 4111 1111 1111 1112 shipped 2024-05-01, build 10.0.300.1, \
                    ref 000-12-3456.";
        assert_eq!(m.mask(text), text);
        // Bad check digits: not an IBAN (its digit groups may still pass for a phone).
        let bad_iban = "DE00 3704 0044 0532 0130 00";
        assert_eq!(Masker::new(&[PiiKind::Iban]).mask(bad_iban), bad_iban);
        assert!(luhn("4111-1111-1111-1111") && luhn("378282246310005"));
        assert!(!luhn("1234 5678 9012 3456") && !luhn("4111"));
    }

    #[test]
    fn only_the_kinds_asked_for_are_masked() {
        let mut m = Masker::new(&[PiiKind::Card]);
        assert_eq!(
            m.mask("ann@example.com pays with 5555555555554444"),
            "ann@example.com pays with <CARD_1>"
        );
    }

    #[test]
    fn every_pattern_compiles() {
        for kind in ALL {
            assert!(!pattern(kind).as_str().contains("[^\\s\\S]"));
        }
    }
}
