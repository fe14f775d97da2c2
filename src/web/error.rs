//! The one place the HTTP edge's failures become responses (SPEC §13).
//!
//! A failure is first mapped exactly as gRPC maps it (`api::error::to_status`:
//! the same stable reason, message, counters and access-log reason), then
//! rendered in OpenAI's shape: `{"error": {"message", "type", "code", "param"}}`
//! with `code` our reason, the HTTP status from the gRPC code, and
//! `Retry-After` (whole seconds, rounded up) plus `retry-after-ms` where gRPC
//! sends `RetryInfo`. Both edges therefore answer a failure alike by
//! construction.

use crate::{
    api::error::{Failure, to_status},
    call::CallError,
    telemetry::trace_id::TRACE_ID_HEADER,
};
use axum::{
    http::{HeaderValue, StatusCode, header},
    response::{IntoResponse, Response},
};
use serde_json::json;
use std::time::Duration;
use tonic::{Code, Status};
use tonic_types::StatusExt;

/// A refused or failed request, ready to answer.
#[derive(Debug)]
pub(super) struct HttpError {
    status: Status,
    /// The request field the caller names differently on this edge (`task` is `model`).
    rename: Option<(&'static str, &'static str)>,
}

impl HttpError {
    /// `failure`, reported under `trace_id`.
    pub(super) fn new(failure: Failure, trace_id: &str) -> Self {
        Self {
            status: to_status(failure, trace_id),
            rename: None,
        }
    }

    /// A call's failure, reported under `trace_id`.
    pub(super) fn call(err: CallError, trace_id: &str) -> Self {
        Self::new(err.into(), trace_id)
    }

    /// One invalid field.
    pub(super) fn invalid(field: &str, why: &str, trace_id: &str) -> Self {
        Self::new(Failure::invalid(field, why), trace_id)
    }

    /// Reports the gRPC field `from` as this edge's `to` (`param`).
    pub(super) fn renaming(mut self, from: &'static str, to: &'static str) -> Self {
        self.rename = Some((from, to));
        self
    }

    /// The stable reason.
    pub(super) fn reason(&self) -> String {
        self.status
            .get_details_error_info()
            .map(|i| i.reason)
            .unwrap_or_default()
    }

    /// The client-safe message.
    pub(super) fn message(&self) -> &str {
        self.status.message()
    }

    /// OpenAI's error object, as sent in a body or a stream's last event.
    pub(super) fn body(&self) -> serde_json::Value {
        let param = self
            .status
            .get_details_bad_request()
            .and_then(|b| b.field_violations.into_iter().next())
            .map(|v| match self.rename {
                Some((from, to)) if v.field == from => to.to_owned(),
                _ => v.field,
            });
        let status = http_status(self.status.code());
        json!({"error": {
            "message": self.status.message(),
            "type": error_type(status),
            "code": self.reason(),
            "param": param,
        }})
    }
}

impl IntoResponse for HttpError {
    fn into_response(self) -> Response {
        let status = http_status(self.status.code());
        let mut response = (status, axum::Json(self.body())).into_response();
        let headers = response.headers_mut();
        if let Some(trace) = self.status.metadata().get(TRACE_ID_HEADER)
            && let Ok(value) = HeaderValue::from_bytes(trace.as_bytes())
        {
            headers.insert(TRACE_ID_HEADER, value);
        }
        let delay = self
            .status
            .get_details_retry_info()
            .and_then(|r| r.retry_delay);
        // The SDKs retry every 429 and 5xx unless told not to: only where
        // gRPC advises a retry (a cap reached will not pass by retrying).
        let retry = HeaderValue::from_static(if delay.is_some() { "true" } else { "false" });
        headers.insert(header::HeaderName::from_static("x-should-retry"), retry);
        for (name, value) in delay.map(retry_headers).into_iter().flatten() {
            headers.insert(name, value);
        }
        response
    }
}

/// `Retry-After` in whole seconds (rounded up, at least 1) and the
/// `retry-after-ms` the OpenAI SDKs prefer.
fn retry_headers(delay: Duration) -> [(header::HeaderName, HeaderValue); 2] {
    let ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
    let seconds = ms.div_ceil(1000).max(1);
    [
        (header::RETRY_AFTER, HeaderValue::from(seconds)),
        (
            header::HeaderName::from_static("retry-after-ms"),
            HeaderValue::from(ms),
        ),
    ]
}

/// SPEC §13's mapping of gRPC codes.
pub(super) fn http_status(code: Code) -> StatusCode {
    match code {
        Code::Ok => StatusCode::OK,
        Code::InvalidArgument => StatusCode::BAD_REQUEST,
        Code::Unauthenticated => StatusCode::UNAUTHORIZED,
        Code::PermissionDenied => StatusCode::FORBIDDEN,
        Code::NotFound => StatusCode::NOT_FOUND,
        Code::Aborted => StatusCode::CONFLICT,
        Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
        Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        Code::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

/// OpenAI's `type` for a status: what its SDKs and docs use.
fn error_type(status: StatusCode) -> &'static str {
    match status {
        StatusCode::BAD_REQUEST | StatusCode::PAYLOAD_TOO_LARGE => "invalid_request_error",
        StatusCode::UNAUTHORIZED => "authentication_error",
        StatusCode::FORBIDDEN => "permission_error",
        StatusCode::NOT_FOUND => "not_found_error",
        StatusCode::CONFLICT => "conflict_error",
        StatusCode::TOO_MANY_REQUESTS => "rate_limit_error",
        StatusCode::SERVICE_UNAVAILABLE => "service_unavailable_error",
        StatusCode::GATEWAY_TIMEOUT => "timeout_error",
        _ => "api_error",
    }
}

/// `err` answered with `status` instead of its code's: an HTTP-only
/// refusal (413, 408, 405) of a failure gRPC reports as INVALID_ARGUMENT.
pub(super) fn with_status(err: HttpError, status: StatusCode) -> Response {
    let mut response = err.into_response();
    *response.status_mut() = status;
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_spec_code_maps_to_its_status() {
        for (code, status) in [
            (Code::InvalidArgument, 400),
            (Code::Unauthenticated, 401),
            (Code::PermissionDenied, 403),
            (Code::NotFound, 404),
            (Code::Aborted, 409),
            (Code::ResourceExhausted, 429),
            (Code::Unavailable, 503),
            (Code::DeadlineExceeded, 504),
            (Code::Internal, 500),
            (Code::FailedPrecondition, 500),
        ] {
            assert_eq!(http_status(code).as_u16(), status, "{code:?}");
        }
    }

    #[test]
    fn retry_after_rounds_up_to_whole_seconds() {
        let [(_, secs), (_, ms)] = retry_headers(Duration::from_millis(200));
        assert_eq!(
            (secs.to_str().ok(), ms.to_str().ok()),
            (Some("1"), Some("200"))
        );
        let [(_, secs), _] = retry_headers(Duration::from_millis(1500));
        assert_eq!(secs.to_str().ok(), Some("2"));
    }

    #[test]
    fn the_body_has_openais_shape_with_our_reason_and_the_field() {
        let err = HttpError::invalid("task", "unknown", "t-1").renaming("task", "model");
        let body = err.body();
        assert_eq!(body["error"]["code"], "INVALID_INPUT");
        assert_eq!(body["error"]["type"], "invalid_request_error");
        assert_eq!(body["error"]["param"], "model");
        assert_eq!(body["error"]["message"], "task: unknown");
    }
}
