//! Turning an incoming request's envelope (context, budget, metadata) into a
//! validated [`CallContext`]: trace ID, team, deadline.

use super::error::Failure;
use crate::{
    api::pb,
    config::ServerConfig,
    resilience::instant_after,
    tasks::{CallContext, Channel, Priority},
    telemetry::trace_id,
    usage::{Meter, meter::Who},
};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;
use tonic::metadata::MetadataMap;

/// Headroom kept before the caller's `grpc-timeout` (at most 10% of it).
pub const DEADLINE_MARGIN: std::time::Duration = std::time::Duration::from_millis(50);

/// Longest accepted team/user ID.
const MAX_ID_LEN: usize = 128;

/// Validates the envelope. On failure returns the trace ID to report with the
/// error (the caller's when usable, else a fresh one) and the failure.
pub(crate) fn call_context(
    context: Option<&pb::RequestContext>,
    budget: Option<&pb::Budget>,
    metadata: &MetadataMap,
    server: &ServerConfig,
    meter: &Meter,
) -> Result<CallContext, (String, Failure)> {
    let started = Instant::now();
    let ctx_trace = context.map_or("", |c| c.trace_id.as_str());
    let trace_id = match trace_id::resolve(ctx_trace, metadata) {
        Ok((id, _)) => id,
        Err(bad) => {
            return Err((
                trace_id::generate(),
                Failure::invalid(bad.field, &bad.to_string()),
            ));
        }
    };
    let fail = |field: &str, why: &str| Err((trace_id.clone(), Failure::invalid(field, why)));
    let Some(context) = context else {
        return fail("context", "is required");
    };
    if let Err(why) = check_id(&context.team_id, true) {
        return fail("context.team_id", why);
    }
    if let Err(why) = check_id(&context.user_id, false) {
        return fail("context.user_id", why);
    }

    let mut timeout = server.default_timeout;
    // tonic's own deadline layer silently ignores a malformed header; we
    // refuse it (docs/api.md), since the caller believes a deadline is set.
    if let Some(grpc) = metadata.get("grpc-timeout") {
        match grpc.to_str().ok().and_then(parse_grpc_timeout) {
            // Finish a little before the caller's own timer fires, so it
            // gets our DEADLINE_EXCEEDED with the attempts rather than a
            // bare CANCELLED from its transport.
            Some(t) => timeout = timeout.min(early(t)),
            None => return fail("grpc-timeout", "malformed grpc-timeout header"),
        }
    }
    if let Some(budget) = budget {
        if budget.max_latency_ms > 0 {
            // The budget promises the answer within it: same margin.
            timeout = timeout.min(early(Duration::from_millis(u64::from(
                budget.max_latency_ms,
            ))));
        }
        if !budget.max_cost_usd.is_finite() || budget.max_cost_usd < 0.0 {
            return fail("budget.max_cost_usd", "must be a non-negative number");
        }
    }
    let channel = match pb::Channel::try_from(context.channel) {
        Ok(pb::Channel::Sms) => Channel::Sms,
        Ok(pb::Channel::Web) => Channel::Web,
        _ => Channel::System,
    };
    let priority = match pb::Priority::try_from(context.priority) {
        Ok(pb::Priority::Background) => Priority::Background,
        _ => Priority::Interactive,
    };
    let who = Who {
        team_id: context.team_id.clone(),
        user_id: context.user_id.clone(),
        trace_id: trace_id.clone(),
        channel: channel.as_str().to_owned(),
        priority: priority.as_str().to_owned(),
    };
    let budget_usd = budget.map(|b| b.max_cost_usd);
    Ok(CallContext {
        team_id: context.team_id.clone(),
        user_id: context.user_id.clone(),
        trace_id,
        channel,
        priority,
        started,
        // `default_timeout` comes from config: an absurd one must not overflow.
        deadline: instant_after(started, timeout),
        meter: Arc::new(meter.session(who, chrono::Utc::now().timestamp_millis(), budget_usd)),
        slot: None,
        traceparent: metadata
            .get("traceparent")
            .and_then(|v| v.to_str().ok())
            .filter(|tp| trace_id::traceparent_trace_id(tp).is_some())
            .map(str::to_owned),
    })
}

/// The time we give ourselves under a caller's limit `t`: a little less
/// ([`DEADLINE_MARGIN`], at most 10% of `t`), so the reply (with its
/// attempts) is on the wire before the caller's own timer fires.
fn early(t: Duration) -> Duration {
    t.saturating_sub(DEADLINE_MARGIN.min(t / 10))
}

/// IDs end up in logs, metrics labels and SQL; keep them boring.
pub(crate) fn check_id(id: &str, required: bool) -> Result<(), &'static str> {
    if id.is_empty() {
        return if required { Err("is required") } else { Ok(()) };
    }
    if id.len() > MAX_ID_LEN {
        return Err("must be at most 128 characters");
    }
    if !id
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b':' | b'@'))
    {
        return Err("may only contain letters, digits and - _ . : @");
    }
    Ok(())
}

/// Parses the `grpc-timeout` header: up to 8 digits and a unit
/// (`H` hours, `M` minutes, `S` seconds, `m` ms, `u` µs, `n` ns).
pub fn parse_grpc_timeout(value: &str) -> Option<Duration> {
    // Checked split: a multi-byte last character must be refused, not panic.
    let (digits, unit) = value.split_at_checked(value.len().checked_sub(1)?)?;
    if digits.is_empty() || digits.len() > 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n * 3600),
        "M" => Duration::from_secs(n * 60),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

/// Rejects inputs larger than the configured limit.
pub(crate) fn check_size(field: &str, bytes: usize, server: &ServerConfig) -> Result<(), Failure> {
    if bytes > server.max_input_bytes {
        return Err(Failure::invalid(
            field,
            &format!("exceeds the {} byte input limit", server.max_input_bytes),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_timeout_units() {
        assert_eq!(parse_grpc_timeout("100m"), Some(Duration::from_millis(100)));
        assert_eq!(parse_grpc_timeout("2S"), Some(Duration::from_secs(2)));
        assert_eq!(parse_grpc_timeout("1H"), Some(Duration::from_secs(3600)));
        assert_eq!(parse_grpc_timeout("5u"), Some(Duration::from_micros(5)));
        assert_eq!(parse_grpc_timeout("123456789S"), None);
        assert_eq!(parse_grpc_timeout("S"), None);
        assert_eq!(parse_grpc_timeout("10x"), None);
        assert_eq!(parse_grpc_timeout(""), None);
        assert_eq!(
            parse_grpc_timeout("10é"),
            None,
            "no panic on a multi-byte unit"
        );
        assert_eq!(
            parse_grpc_timeout("99999999H"),
            Some(Duration::from_secs(99_999_999 * 3600))
        );
    }

    fn meter() -> Meter {
        Meter::new(
            None,
            crate::usage::pricing::Pricing::from_config(&Default::default()),
            &Default::default(),
        )
    }

    fn team() -> pb::RequestContext {
        pb::RequestContext {
            team_id: "t1".into(),
            ..Default::default()
        }
    }

    #[test]
    fn an_absurd_default_timeout_does_not_overflow_the_deadline() {
        let server = ServerConfig {
            default_timeout: Duration::MAX,
            ..Default::default()
        };
        let ctx = call_context(Some(&team()), None, &MetadataMap::new(), &server, &meter())
            .map_err(|(_, f)| format!("{f:?}"))
            .unwrap();
        assert!(ctx.deadline > ctx.started + Duration::from_secs(365 * 24 * 3600));
        // The largest grpc-timeout (99999999 hours) is fine too.
        let mut metadata = MetadataMap::new();
        metadata.insert("grpc-timeout", "99999999H".parse().unwrap());
        assert!(call_context(Some(&team()), None, &metadata, &server, &meter()).is_ok());
    }

    #[test]
    fn a_malformed_grpc_timeout_is_invalid_input() {
        let server = ServerConfig::default();
        for bad in ["soon", "10", "m", "-5m", "1.5S", "123456789m"] {
            let mut metadata = MetadataMap::new();
            metadata.insert("grpc-timeout", bad.parse().unwrap());
            let Err((_, failure)) = call_context(Some(&team()), None, &metadata, &server, &meter())
            else {
                panic!("{bad:?} accepted");
            };
            assert!(
                matches!(&failure, Failure::Invalid(v) if v[0].0 == "grpc-timeout"),
                "{bad:?}: {failure:?}"
            );
        }
        // Not even text: refused rather than ignored.
        let mut metadata = MetadataMap::new();
        metadata.insert(
            "grpc-timeout",
            tonic::metadata::MetadataValue::try_from(&b"1\xffm"[..]).unwrap(),
        );
        assert!(call_context(Some(&team()), None, &metadata, &server, &meter()).is_err());
    }

    #[test]
    fn ids_are_checked() {
        assert!(check_id("team-1", true).is_ok());
        assert!(check_id("", true).is_err());
        assert!(check_id("", false).is_ok());
        assert!(check_id("a b", true).is_err());
        assert!(check_id(&"a".repeat(129), true).is_err());
    }
}
