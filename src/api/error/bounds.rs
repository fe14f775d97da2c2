//! What an error may repeat: a caller's value, the message and the
//! violations are cut to bounds, so a status's trailers stay far below
//! what gRPC clients accept (16 KiB).

use tonic_types::ErrorDetails;

/// Most bytes of a caller's value (a task, an ID) an error repeats.
pub(super) const MAX_ECHO: usize = 128;

/// Most bytes of an error's message. A status travels in the trailers, which clients refuse
/// past 16 KiB (hyper) or 8 KiB (gRPC C-core): a long echo would arrive as a protocol error.
/// The message travels twice (`grpc-message` percent-encoded, `grpc-status-details-bin`
/// base64), as do the details, so every part is bounded to keep the whole under 8 KiB.
pub(super) const MAX_MESSAGE: usize = 1024;

/// Most field violations an error lists (a schema check reports up to 20), and most bytes
/// of each path and description, which can echo the caller's keys or a schema's enum.
const MAX_VIOLATIONS: usize = 5;
const MAX_VIOLATION_FIELD: usize = 128;
const MAX_VIOLATION_DESCRIPTION: usize = 192;

/// Keeps the status's `BadRequest` within the bounds above, wherever its violations came from.
pub(super) fn bound_violations(details: &mut ErrorDetails) {
    let Some(bad) = details.bad_request() else {
        return;
    };
    let bounded: Vec<_> = bad
        .field_violations
        .iter()
        .take(MAX_VIOLATIONS)
        .map(|v| {
            let mut v = v.clone();
            v.field = clip(&v.field, MAX_VIOLATION_FIELD);
            v.description = clip(&v.description, MAX_VIOLATION_DESCRIPTION);
            v
        })
        .collect();
    details.set_bad_request(bounded);
}

/// Configured names a refusal lists (an unknown task or agent): sorted, comma-separated,
/// at most [`MAX_KNOWN`] of them and each clipped, so a large config keeps the status small.
pub(super) fn known_names(known: &[String]) -> String {
    if known.is_empty() {
        return "none configured".to_owned();
    }
    let mut names: Vec<&String> = known.iter().collect();
    names.sort();
    let mut listed: Vec<String> = names
        .iter()
        .take(MAX_KNOWN)
        .map(|n| clip(n, MAX_ECHO))
        .collect();
    if names.len() > MAX_KNOWN {
        listed.push(format!("and {} more", names.len() - MAX_KNOWN));
    }
    listed.join(", ")
}

/// Names listed by [`known_names`].
const MAX_KNOWN: usize = 20;

/// `text` cut to at most `max` bytes at a character boundary, plus a 3-byte mark when cut.
pub(super) fn clip(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let end = (0..=max)
        .rev()
        .find(|&i| text.is_char_boundary(i))
        .unwrap_or(0);
    format!("{}…", text.get(..end).unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::error::*;

    #[test]
    fn clips_at_a_character_boundary_within_the_bytes() {
        assert_eq!(clip("short", 8), "short");
        assert_eq!(clip("abcdef", 3), "abc…");
        // "é" is 2 bytes: a cut inside it steps back before it.
        assert_eq!(clip("aébc", 2), "a…");
        assert_eq!(clip("ééé", 4), "éé…");
    }

    #[test]
    fn an_error_lists_a_bounded_number_of_bounded_violations() {
        // Non-ASCII throughout, the worst case: `grpc-message` percent-encodes it (3 bytes
        // a byte), and the details carry it again.
        let violations: Vec<(String, String)> = (0..20)
            .map(|i| (format!("/{i}/{}", "ü".repeat(10_000)), "ü".repeat(10_000)))
            .collect();
        let status = to_status(Failure::Invalid(violations), "t1");
        let details = status.get_error_details();
        let listed = &details.bad_request().unwrap().field_violations;
        assert_eq!(listed.len(), MAX_VIOLATIONS);
        for v in listed {
            assert!(
                v.field.len() <= MAX_VIOLATION_FIELD + 3,
                "{}",
                v.field.len()
            );
            assert!(v.description.len() <= MAX_VIOLATION_DESCRIPTION + 3);
        }
        assert!(status.message().len() <= MAX_MESSAGE + 3);
        let mut trailers = tonic::codegen::http::HeaderMap::new();
        status.add_header(&mut trailers).unwrap();
        let size: usize = trailers
            .iter()
            .map(|(k, v)| k.as_str().len() + v.len())
            .sum();
        assert!(size < 8 * 1024, "{size} bytes of trailers");
    }
}
