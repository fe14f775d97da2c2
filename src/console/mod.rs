//! The ops console (SPEC §17): read-mostly web pages at `/console` on the
//! metrics listener, for an admin-role key. An edge like `api` and `web`:
//! a page parses its query, reads through the services the gRPC API reads
//! (the usage sums behind GetUsage, the ledger's caps and balances, the
//! breakers, the audit chain) and the pipeline's approvals, and renders
//! HTML on the server. Nothing is fetched at run time: the stylesheet is in
//! the binary and the charts are inline SVG.
//!
//! Access: a login form takes an admin key and sets a signed session cookie
//! ([`session`]); with `auth.enabled = false` there is no login and only
//! loopback clients are answered. Every form post carries the session's
//! CSRF token. Failures become pages in [`error`].

mod chart;
pub(crate) mod error;
mod layout;
mod pages;
mod session;

use crate::{auth::Authenticator, call::Pipeline, domain::Role};
use axum::{
    Form, Router,
    extract::{ConnectInfo, FromRequest, FromRequestParts, Query, Request, State},
    http::{HeaderMap, HeaderValue, StatusCode, header, request::Parts},
    response::{IntoResponse, Response},
    routing::{get, post},
};
use error::ConsoleError;
use serde::de::DeserializeOwned;
use session::{Session, Sessions};
use std::net::SocketAddr;

/// The console's routes and what they share.
#[derive(Clone)]
pub struct Console {
    pipeline: Pipeline,
    sessions: Sessions,
}

impl Console {
    /// The console over the call pipeline, its logins checked by `auth`.
    pub fn new(pipeline: Pipeline, auth: Authenticator) -> anyhow::Result<Self> {
        let sessions = Sessions::new(&pipeline.config().console, auth)
            .map_err(|e| anyhow::anyhow!("console session key: {e}"))?;
        Ok(Self { pipeline, sessions })
    }

    /// The routes under `/console`, to merge into the metrics listener's
    /// router (served with `ConnectInfo<SocketAddr>`).
    pub fn router(self) -> Router {
        Router::new()
            .route("/console", get(pages::overview::show))
            .route("/console/", get(pages::overview::show))
            .route(
                "/console/login",
                get(pages::login::page).post(pages::login::submit),
            )
            .route("/console/logout", post(pages::login::logout))
            .route("/console/usage", get(pages::usage::show))
            .route("/console/usage.csv", get(pages::usage::csv))
            .route("/console/teams", get(pages::teams::show))
            .route("/console/providers", get(pages::providers::show))
            .route("/console/calls", get(pages::calls::show))
            .route("/console/tools", get(pages::tools::show))
            .route("/console/approvals/{id}", post(pages::tools::decide))
            .route("/console/audit", get(pages::audit::show))
            .route("/console/assets/console.css", get(stylesheet))
            .with_state(self)
    }
}

/// The signed-in operator behind a page request.
pub(crate) struct Viewer {
    session: Session,
    /// The CSRF token the page's forms carry.
    csrf: String,
    /// A new session's cookie to set (authentication off: no login form).
    set_cookie: Option<String>,
}

impl Viewer {
    /// Whether the viewer may see `team`.
    fn may_see(&self, team: &str) -> bool {
        self.session.principal.may_act_for(team)
    }
}

impl FromRequestParts<Console> for Viewer {
    type Rejection = ConsoleError;

    async fn from_request_parts(
        parts: &mut Parts,
        console: &Console,
    ) -> Result<Self, Self::Rejection> {
        let sessions = &console.sessions;
        let now = chrono::Utc::now().timestamp();
        if !sessions.auth_enabled() && !local(parts) {
            return Err(ConsoleError::NotLoopback);
        }
        let found = session_cookie(&parts.headers).and_then(|c| sessions.open(c, now));
        let (session, set_cookie) = match found {
            Some(session) => (session, None),
            None if !sessions.auth_enabled() => {
                let value = sessions.anonymous(now);
                let session = sessions
                    .open(&value, now)
                    .ok_or(ConsoleError::LoginNeeded)?;
                (session, Some(sessions.set_cookie(&value)))
            }
            None => return Err(ConsoleError::LoginNeeded),
        };
        debug_assert!(session.principal.role == Role::Admin);
        Ok(Viewer {
            csrf: sessions.csrf(&session),
            session,
            set_cookie,
        })
    }
}

/// With authentication off: a loopback client that asked for a loopback
/// host. The host matters too: a page elsewhere whose name was re-pointed at
/// 127.0.0.1 (DNS rebinding) comes from a local browser but names its own host.
fn local(parts: &Parts) -> bool {
    let peer = parts.extensions.get::<ConnectInfo<SocketAddr>>();
    let from_loopback =
        peer.is_some_and(|ConnectInfo(addr)| addr.ip().to_canonical().is_loopback());
    let host = parts
        .headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok());
    from_loopback && host.is_some_and(loopback_host)
}

/// Whether a `Host` header names this machine: `localhost` or a loopback address, any port.
fn loopback_host(host: &str) -> bool {
    let name = match host.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or_default(),
        None => host.rsplit_once(':').map_or(host, |(name, _)| name),
    };
    name.eq_ignore_ascii_case("localhost")
        || name
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.to_canonical().is_loopback())
}

/// A page's query; a malformed one is a console error page (400), not axum's text.
pub(crate) struct QueryOf<T>(pub T);

impl<T: DeserializeOwned + Send> FromRequestParts<Console> for QueryOf<T> {
    type Rejection = ConsoleError;

    async fn from_request_parts(
        parts: &mut Parts,
        console: &Console,
    ) -> Result<Self, Self::Rejection> {
        Query::<T>::from_request_parts(parts, console)
            .await
            .map(|Query(v)| QueryOf(v))
            .map_err(|e| ConsoleError::invalid("query", e.body_text()))
    }
}

/// A form post's fields; a malformed post is a console error page (400).
pub(crate) struct FormOf<T>(pub T);

impl<T: DeserializeOwned + Send> FromRequest<Console> for FormOf<T> {
    type Rejection = ConsoleError;

    async fn from_request(req: Request, console: &Console) -> Result<Self, Self::Rejection> {
        Form::<T>::from_request(req, console)
            .await
            .map(|Form(v)| FormOf(v))
            .map_err(|e| ConsoleError::invalid("form", e.body_text()))
    }
}

fn session_cookie(headers: &HeaderMap) -> Option<&str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find_map(|h| session::cookie(h, session::COOKIE))
}

/// Headers of every console page: no caching, no framing, nothing loaded
/// but the console's own stylesheet, forms posted only to the console.
fn html_headers() -> [(header::HeaderName, HeaderValue); 6] {
    [
        (
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/html; charset=utf-8"),
        ),
        (header::CACHE_CONTROL, HeaderValue::from_static("no-store")),
        (
            header::CONTENT_SECURITY_POLICY,
            HeaderValue::from_static(
                "default-src 'none'; style-src 'self'; img-src 'self' data:; \
                 form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
            ),
        ),
        (header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY")),
        (
            header::X_CONTENT_TYPE_OPTIONS,
            HeaderValue::from_static("nosniff"),
        ),
        (
            header::REFERRER_POLICY,
            HeaderValue::from_static("same-origin"),
        ),
    ]
}

/// A rendered page for `viewer`, setting its new session's cookie if any.
fn respond(viewer: &Viewer, body: maud::Markup) -> Response {
    let mut response = (StatusCode::OK, html_headers(), body.into_string()).into_response();
    if let Some(cookie) = viewer
        .set_cookie
        .as_deref()
        .and_then(|c| HeaderValue::from_str(c).ok())
    {
        response.headers_mut().append(header::SET_COOKIE, cookie);
    }
    response
}

async fn stylesheet(State(_): State<Console>) -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, "text/css; charset=utf-8"),
            (header::CACHE_CONTROL, "max-age=3600"),
        ],
        include_str!("assets/console.css"),
    )
}

#[cfg(test)]
mod tests {
    use super::loopback_host;

    #[test]
    fn only_loopback_hosts_pass() {
        for ok in [
            "localhost",
            "LOCALHOST:9090",
            "127.0.0.1",
            "127.0.0.1:9090",
            "[::1]:9090",
            "[::1]",
        ] {
            assert!(loopback_host(ok), "{ok}");
        }
        for bad in [
            "evil.example",
            "evil.example:9090",
            "10.0.0.1:9090",
            "localhost.evil.example",
            "[::2]:1",
            "",
        ] {
            assert!(!loopback_host(bad), "{bad}");
        }
    }
}
