//! Every console failure becomes a response here, in one place: a login
//! redirect, or a page that says what went wrong with the right status and
//! a stable reason.

use super::layout;
use crate::call::approvals::ApprovalError;
use axum::{
    http::{StatusCode, header},
    response::{IntoResponse, Response},
};
use maud::html;

/// Why a console request failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ConsoleError {
    /// No valid session: the browser goes to the login form.
    #[error("sign in first")]
    LoginNeeded,
    /// Authentication is off and the client is not on this host.
    #[error("with auth.enabled = false the console answers loopback clients only")]
    NotLoopback,
    /// A form post without its session's CSRF token.
    #[error("the form is not from this session; reload the page and try again")]
    Forged,
    /// A team outside the key's teams.
    #[error("this key may not see team `{0}`")]
    TeamForbidden(String),
    /// A malformed query or form field.
    #[error("{field}: {why}")]
    Invalid {
        /// The field.
        field: &'static str,
        /// What is wrong.
        why: String,
    },
    /// Deciding an approval failed.
    #[error(transparent)]
    Approval(#[from] ApprovalError),
    /// The database failed (the detail is logged, not shown).
    #[error("the database is unavailable; try again shortly")]
    Storage(String),
}

impl From<crate::store::StoreError> for ConsoleError {
    fn from(e: crate::store::StoreError) -> Self {
        ConsoleError::Storage(e.to_string())
    }
}

impl ConsoleError {
    /// A malformed field.
    pub fn invalid(field: &'static str, why: impl Into<String>) -> Self {
        ConsoleError::Invalid {
            field,
            why: why.into(),
        }
    }

    /// The stable reason shown with the message.
    fn reason(&self) -> &'static str {
        match self {
            ConsoleError::LoginNeeded => "UNAUTHENTICATED",
            ConsoleError::NotLoopback => "LOOPBACK_ONLY",
            ConsoleError::Forged => "CSRF_TOKEN_INVALID",
            ConsoleError::TeamForbidden(_) => "TEAM_NOT_ALLOWED",
            ConsoleError::Invalid { .. } => "INVALID_ARGUMENT",
            ConsoleError::Approval(e) => e.reason(),
            ConsoleError::Storage(_) => "STORAGE_UNAVAILABLE",
        }
    }

    fn status(&self) -> StatusCode {
        match self {
            ConsoleError::LoginNeeded => StatusCode::SEE_OTHER,
            ConsoleError::NotLoopback | ConsoleError::Forged | ConsoleError::TeamForbidden(_) => {
                StatusCode::FORBIDDEN
            }
            ConsoleError::Invalid { .. } => StatusCode::BAD_REQUEST,
            ConsoleError::Approval(e) => match e {
                ApprovalError::NotFound(_) => StatusCode::NOT_FOUND,
                ApprovalError::CapabilityMissing(_) | ApprovalError::OwnRequest => {
                    StatusCode::FORBIDDEN
                }
                ApprovalError::AlreadyDecided { .. } => StatusCode::CONFLICT,
                ApprovalError::Storage(_) => StatusCode::SERVICE_UNAVAILABLE,
            },
            ConsoleError::Storage(_) => StatusCode::SERVICE_UNAVAILABLE,
        }
    }
}

impl IntoResponse for ConsoleError {
    fn into_response(self) -> Response {
        if let ConsoleError::LoginNeeded = self {
            return (
                StatusCode::SEE_OTHER,
                [(header::LOCATION, "/console/login")],
            )
                .into_response();
        }
        if let ConsoleError::Storage(e) = &self {
            tracing::warn!(error = %e, "console page failed");
        }
        let body = layout::page(
            "Something went wrong",
            None,
            html! {
                p.error role="alert" {
                    (self.to_string()) " " code { "(" (self.reason()) ")" }
                }
                p { a href="/console" { "Back to the console" } }
            },
        );
        (self.status(), super::html_headers(), body.into_string()).into_response()
    }
}
