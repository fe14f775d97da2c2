//! SMS segment counting (GSM 03.38 / 3GPP TS 23.038).
//!
//! GSM-7 text takes 160 septets in a single SMS and 153 per part when
//! concatenated (the UDH takes the rest); characters of the extension table
//! take two septets (ESC + char) and are never split across parts. Any other
//! character forces UCS-2: 70 UTF-16 code units single, 67 per part, and a
//! surrogate pair (e.g. an emoji) is never split across parts.

/// Encoding an SMS needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SmsEncoding {
    /// GSM 03.38 7-bit default alphabet.
    Gsm7,
    /// UCS-2 (UTF-16 code units).
    Ucs2,
}

/// Size of a text as SMS.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SmsSize {
    /// Encoding required.
    pub encoding: SmsEncoding,
    /// Segments (0 for empty text).
    pub segments: u32,
    /// Units used: septets for GSM-7, UTF-16 code units for UCS-2.
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

/// Parts needed when no character may straddle two parts.
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

/// The usual typographic characters a model writes, with their GSM-7
/// equivalents: curly quotes and apostrophes, dashes, the ellipsis, and
/// the non-breaking and other fixed-width spaces (the zero-width ones
/// vanish).
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

/// "Smart encoding": `text` with its typographic characters replaced by
/// GSM-7 equivalents ([`plain`]) when that makes the whole text GSM-7 (a
/// curly apostrophe alone would otherwise force UCS-2 and halve the
/// capacity); `text` unchanged when it is GSM-7 already or would stay
/// UCS-2 anyway.
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
            // Another character keeps it UCS-2: nothing to gain.
            None => return Cow::Borrowed(text),
        }
    }
    Cow::Owned(out)
}

/// Characters that surely fit in `segments` parts of GSM-7 (used to tell the
/// model its length budget).
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
        // Already GSM-7: untouched, borrowed.
        assert!(matches!(
            normalize("Plain text, €5 [ok]"),
            std::borrow::Cow::Borrowed(_)
        ));
        // Another non-GSM character keeps UCS-2: the model's text stays.
        let emoji = "It\u{2019}s great 😀";
        assert_eq!(normalize(emoji), emoji);

        // The boundaries again: 160 GSM-7 septets with a curly apostrophe
        // are one segment once normalised, three UCS-2 segments before.
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
        // An ellipsis adds two septets: 158 + "..." is 161, two segments.
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
        // Extension characters count twice.
        for ext in ["€", "[", "]", "{", "}", "^", "~", "\\", "|"] {
            check(ext, Gsm7, 1, 2);
        }
        check(&"€".repeat(80), Gsm7, 1, 160);
        check(&"€".repeat(81), Gsm7, 2, 162);
        // 152 septets then an escape pair: the pair moves to part two, so
        // 306 septets need three parts, not two.
        check(
            &format!("{}€{}", "a".repeat(152), "a".repeat(152)),
            Gsm7,
            3,
            306,
        );
        // Basic-table specials stay GSM-7.
        check("@£$¥èéùìòÇØøÅåΔ_ΦΓΛΩΠΨΣΘΞÆæßÉ¤¡ÄÖÑÜ§¿äöñüà", Gsm7, 1, 42);
        // Any non-GSM character forces UCS-2.
        check("Olá", Ucs2, 1, 3);
        check(&"a".repeat(70), Gsm7, 1, 70);
        check(&format!("{}ç", "a".repeat(69)), Ucs2, 1, 70);
        check(&format!("{}ç", "a".repeat(70)), Ucs2, 2, 71);
        check(&"ç".repeat(134), Ucs2, 2, 134);
        check(&"ç".repeat(135), Ucs2, 3, 135);
        // Emoji are surrogate pairs: two code units, never split.
        check("😀", Ucs2, 1, 2);
        check(&"😀".repeat(35), Ucs2, 1, 70);
        check(&"😀".repeat(36), Ucs2, 2, 72);
        // A pair that would straddle the part boundary moves whole.
        check(
            &format!("{}😀{}", "a".repeat(66), "a".repeat(66)),
            Ucs2,
            3,
            134,
        );
    }
}
