//! SMS segment counting (GSM 03.38 / 3GPP TS 23.038): GSM-7 is 160 septets single, 153 a part,
//! UCS-2 70 code units single, 67 a part; an escape pair or surrogate pair never splits.

/// Encoding an SMS needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SmsEncoding {
    Gsm7,
    Ucs2,
}

/// Size of a text as SMS.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SmsSize {
    pub encoding: SmsEncoding,
    pub segments: u32,
    /// Septets for GSM-7, UTF-16 code units for UCS-2.
    pub units: u32,
}

const GSM7_BASIC: &str = "@£$¥èéùìòÇ\nØø\rÅåΔ_ΦΓΛΩΠΨΣΘΞÆæßÉ !\"#¤%&'()*+,-./0123456789:;<=>?\
¡ABCDEFGHIJKLMNOPQRSTUVWXYZÄÖÑÜ§¿abcdefghijklmnopqrstuvwxyzäöñüà";
const GSM7_EXTENSION: &str = "\u{000C}^{}\\[~]|€";

fn gsm7_width(c: char) -> Option<u32> {
    if GSM7_BASIC.contains(c) {
        Some(1)
    } else if GSM7_EXTENSION.contains(c) {
        Some(2)
    } else {
        None
    }
}

/// Measures `text` as an SMS.
pub fn measure(text: &str) -> SmsSize {
    let gsm: Option<Vec<u32>> = text.chars().map(gsm7_width).collect();
    let (encoding, widths, single, part) = match gsm {
        Some(widths) => (SmsEncoding::Gsm7, widths, 160, 153),
        None => (
            SmsEncoding::Ucs2,
            text.chars().map(|c| c.len_utf16() as u32).collect(),
            70,
            67,
        ),
    };
    let units: u32 = widths.iter().sum();
    let segments = if units == 0 {
        0
    } else if units <= single {
        1
    } else {
        pack(&widths, part)
    };
    SmsSize {
        encoding,
        segments,
        units,
    }
}

fn pack(widths: &[u32], capacity: u32) -> u32 {
    let mut parts = 1;
    let mut used = 0;
    for &w in widths {
        if used + w > capacity {
            parts += 1;
            used = 0;
        }
        used += w;
    }
    parts
}

/// Typographic characters a model writes, with GSM-7 equivalents (zero-width ones vanish).
fn plain(c: char) -> Option<&'static str> {
    Some(match c {
        '\u{2018}' | '\u{2019}' | '\u{201A}' | '\u{201B}' | '\u{2032}' | '\u{00B4}' => "'",
        '\u{201C}' | '\u{201D}' | '\u{201E}' | '\u{201F}' | '\u{2033}' | '\u{00AB}'
        | '\u{00BB}' => "\"",
        '\u{2010}' | '\u{2011}' | '\u{2012}' | '\u{2013}' | '\u{2014}' | '\u{2015}'
        | '\u{2212}' => "-",
        '\u{2026}' => "...",
        '\u{00A0}' | '\u{2000}'..='\u{200A}' | '\u{202F}' | '\u{205F}' | '\u{3000}' => " ",
        '\u{200B}' | '\u{2060}' | '\u{FEFF}' => "",
        '\u{2022}' => "-",
        _ => return None,
    })
}

/// "Smart encoding": typographic characters replaced when that makes the text GSM-7 (2x room).
pub fn normalize(text: &str) -> std::borrow::Cow<'_, str> {
    use std::borrow::Cow;
    if text.chars().all(|c| gsm7_width(c).is_some()) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match plain(c) {
            Some(replacement) => out.push_str(replacement),
            None if gsm7_width(c).is_some() => out.push(c),
            None => return Cow::Borrowed(text),
        }
    }
    Cow::Owned(out)
}

/// Characters that surely fit in `segments` GSM-7 parts (the model's length budget).
pub fn gsm7_char_budget(segments: u32) -> u32 {
    match segments {
        0 => 0,
        1 => 160,
        n => n * 153,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(text: &str, encoding: SmsEncoding, segments: u32, units: u32) {
        let size = measure(text);
        assert_eq!(
            size,
            SmsSize {
                encoding,
                segments,
                units
            },
            "{text:?}"
        );
    }

    #[test]
    fn typographic_characters_become_gsm7_when_that_makes_the_text_gsm7() {
        let curly = "We\u{2019}re open \u{2013} come by\u{2026} \u{201C}today\u{201D}!";
        assert_eq!(normalize(curly), "We're open - come by... \"today\"!");
        assert_eq!(measure(curly).encoding, SmsEncoding::Ucs2);
        assert_eq!(measure(&normalize(curly)).encoding, SmsEncoding::Gsm7);
        assert_eq!(normalize("a\u{00A0}b\u{200B}c"), "a bc");
        assert!(matches!(
            normalize("Plain text, €5 [ok]"),
            std::borrow::Cow::Borrowed(_)
        ));
        let emoji = "It\u{2019}s great 😀";
        assert_eq!(normalize(emoji), emoji);

        // 160 septets with a curly apostrophe: one segment once normalised, three before.
        let at_limit = format!("{}\u{2019}", "a".repeat(159));
        assert_eq!(measure(&at_limit).segments, 3);
        let fixed = normalize(&at_limit);
        assert_eq!(
            measure(&fixed),
            SmsSize {
                encoding: SmsEncoding::Gsm7,
                segments: 1,
                units: 160
            }
        );
        let grows = format!("{}\u{2026}", "a".repeat(158));
        assert_eq!(measure(&normalize(&grows)).segments, 2);
        assert_eq!(measure(&normalize(&grows)).units, 161);
    }

    #[test]
    fn segment_table() {
        use SmsEncoding::*;
        check("", Gsm7, 0, 0);
        check("Hello", Gsm7, 1, 5);
        check(&"a".repeat(160), Gsm7, 1, 160);
        check(&"a".repeat(161), Gsm7, 2, 161);
        check(&"a".repeat(306), Gsm7, 2, 306);
        check(&"a".repeat(307), Gsm7, 3, 307);
        for ext in ["€", "[", "]", "{", "}", "^", "~", "\\", "|"] {
            check(ext, Gsm7, 1, 2);
        }
        check(&"€".repeat(80), Gsm7, 1, 160);
        check(&"€".repeat(81), Gsm7, 2, 162);
        // The escape pair moves to part two, so 306 septets need three parts.
        check(
            &format!("{}€{}", "a".repeat(152), "a".repeat(152)),
            Gsm7,
            3,
            306,
        );
        check("@£$¥èéùìòÇØøÅåΔ_ΦΓΛΩΠΨΣΘΞÆæßÉ¤¡ÄÖÑÜ§¿äöñüà", Gsm7, 1, 42);
        check("Olá", Ucs2, 1, 3);
        check(&"a".repeat(70), Gsm7, 1, 70);
        check(&format!("{}ç", "a".repeat(69)), Ucs2, 1, 70);
        check(&format!("{}ç", "a".repeat(70)), Ucs2, 2, 71);
        check(&"ç".repeat(134), Ucs2, 2, 134);
        check(&"ç".repeat(135), Ucs2, 3, 135);
        check("😀", Ucs2, 1, 2);
        check(&"😀".repeat(35), Ucs2, 1, 70);
        check(&"😀".repeat(36), Ucs2, 2, 72);
        check(
            &format!("{}😀{}", "a".repeat(66), "a".repeat(66)),
            Ucs2,
            3,
            134,
        );
    }
}
