//! Trace ID resolution (SPEC §3): `context.trace_id`, else the `x-trace-id`
//! metadata, else the trace-id of a W3C `traceparent`, else a new one.

use crate::domain::Headers;

/// Longest trace ID we accept from a caller.
pub const MAX_TRACE_ID_LEN: usize = 128;

/// Metadata key carrying the trace ID in and out.
pub const TRACE_ID_HEADER: &str = "x-trace-id";

/// Where the trace ID of a request came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TraceSource {
    /// `RequestContext.trace_id`.
    Context,
    /// `x-trace-id` request metadata.
    Header,
    /// W3C `traceparent` request metadata.
    TraceParent,
    /// Generated here (UUIDv7, 32 hex digits).
    Generated,
}

/// A caller-supplied trace ID that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("must be 1-{MAX_TRACE_ID_LEN} characters of [A-Za-z0-9._:-]")]
pub struct BadTraceId {
    /// The field it came from (`context.trace_id` or `x-trace-id`).
    pub field: &'static str,
}

/// Picks the request's trace ID. A malformed `context.trace_id` or `x-trace-id`
/// is refused (it would reach logs and upstream headers); a malformed
/// `traceparent` is ignored, as W3C Trace Context requires.
pub fn resolve(
    context_trace_id: &str,
    metadata: &impl Headers,
) -> Result<(String, TraceSource), BadTraceId> {
    if !context_trace_id.is_empty() {
        return checked(context_trace_id, "context.trace_id").map(|t| (t, TraceSource::Context));
    }
    if let Some(value) = metadata.text(TRACE_ID_HEADER) {
        let value = value.map_err(|()| BadTraceId {
            field: TRACE_ID_HEADER,
        })?;
        return checked(value, TRACE_ID_HEADER).map(|t| (t, TraceSource::Header));
    }
    if let Some(id) = metadata
        .text("traceparent")
        .and_then(Result::ok)
        .and_then(traceparent_trace_id)
    {
        return Ok((id.to_owned(), TraceSource::TraceParent));
    }
    Ok((generate(), TraceSource::Generated))
}

/// A new trace ID: a UUIDv7 in 32 hex digits, a W3C trace-id that sorts by time.
pub fn generate() -> String {
    uuid::Uuid::now_v7().simple().to_string()
}

fn checked(value: &str, field: &'static str) -> Result<String, BadTraceId> {
    let ok = !value.is_empty()
        && value.len() <= MAX_TRACE_ID_LEN
        && value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b':'));
    if ok {
        Ok(value.to_owned())
    } else {
        Err(BadTraceId { field })
    }
}

/// The trace-id of a valid version-00 `traceparent`
/// (`00-<32 hex>-<16 hex>-<2 hex>`, ids not all zero).
pub fn traceparent_trace_id(header: &str) -> Option<&str> {
    let mut parts = header.trim().split('-');
    let (version, trace, parent, flags) =
        (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    let lower_hex = |s: &str, n: usize| {
        s.len() == n
            && s.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    };
    let valid = lower_hex(version, 2)
        && version != "ff"
        && lower_hex(trace, 32)
        && trace.bytes().any(|b| b != b'0')
        && lower_hex(parent, 16)
        && parent.bytes().any(|b| b != b'0')
        && lower_hex(flags, 2)
        // Version 00 has exactly four fields; later versions may add more.
        && (version != "00" || parts.next().is_none());
    valid.then_some(trace)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::metadata::MetadataMap;

    fn md(pairs: &[(&'static str, &'static str)]) -> MetadataMap {
        let mut m = MetadataMap::new();
        for (k, v) in pairs {
            m.insert(*k, v.parse().unwrap());
        }
        m
    }

    const TP: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn precedence_is_context_header_traceparent_generated() {
        let all = md(&[("x-trace-id", "hdr-1"), ("traceparent", TP)]);
        assert_eq!(
            resolve("ctx-1", &all).unwrap(),
            ("ctx-1".into(), TraceSource::Context)
        );
        assert_eq!(
            resolve("", &all).unwrap(),
            ("hdr-1".into(), TraceSource::Header)
        );
        let tp = md(&[("traceparent", TP)]);
        assert_eq!(
            resolve("", &tp).unwrap(),
            (
                "4bf92f3577b34da6a3ce929d0e0e4736".into(),
                TraceSource::TraceParent
            )
        );
        let (id, src) = resolve("", &MetadataMap::new()).unwrap();
        assert_eq!(src, TraceSource::Generated);
        assert_eq!(id.len(), 32);
        assert!(traceparent_trace_id(&format!("00-{id}-00f067aa0ba902b7-01")).is_some());
    }

    #[test]
    fn bad_traceparents_are_ignored() {
        for bad in [
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "garbage",
        ] {
            assert_eq!(traceparent_trace_id(bad), None, "{bad}");
        }
    }

    #[test]
    fn unsafe_caller_ids_are_refused() {
        assert!(resolve("a b", &MetadataMap::new()).is_err());
        assert!(resolve(&"x".repeat(129), &MetadataMap::new()).is_err());
        assert_eq!(
            resolve("", &md(&[("x-trace-id", "bad\"id")]))
                .unwrap_err()
                .field,
            "x-trace-id"
        );
    }
}
