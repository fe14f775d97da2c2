//! The login form (an admin key in, a session cookie out) and sign-out.

use super::super::{
    Console, FormOf, Viewer,
    error::ConsoleError,
    html_headers, layout,
    session::{LoginRefused, Sessions},
};
use axum::{
    extract::State,
    http::{HeaderValue, StatusCode, header},
    response::{IntoResponse, Response},
};
use maud::{Markup, html};
use serde::Deserialize;

/// The login form's fields.
#[derive(Deserialize)]
pub(crate) struct Login {
    #[serde(default)]
    key: String,
}

/// The sign-out form's fields.
#[derive(Deserialize)]
pub(crate) struct Logout {
    #[serde(default)]
    csrf: String,
}

fn form(problem: Option<&str>) -> Markup {
    layout::page(
        "Sign in",
        None,
        html! {
            @if let Some(problem) = problem {
                p.error role="alert" id="login-error" { (problem) }
            }
            form method="post" action="/console/login" {
                p {
                    label for="key" { "Admin API key" }
                    br;
                    input id="key" name="key" type="password" autocomplete="off" required size="48";
                }
                button type="submit" { "Sign in" }
            }
        },
    )
}

/// GET: the form (with auth off there is nothing to sign in to).
pub(crate) async fn page(State(console): State<Console>) -> Response {
    if !console.sessions.auth_enabled() {
        return redirect("/console");
    }
    (StatusCode::OK, html_headers(), form(None).into_string()).into_response()
}

/// POST: an admin key signs in; another key is refused (403), an unknown one
/// too (401). With authentication off there is no login: nothing is checked.
pub(crate) async fn submit(
    State(console): State<Console>,
    FormOf(login): FormOf<Login>,
) -> Response {
    if !console.sessions.auth_enabled() {
        return redirect("/console");
    }
    let now = chrono::Utc::now().timestamp();
    let refused = match console.sessions.login(&login.key, now) {
        Ok(cookie) => {
            let mut response = redirect("/console");
            if let Ok(value) = HeaderValue::from_str(&console.sessions.set_cookie(&cookie)) {
                response.headers_mut().append(header::SET_COOKIE, value);
            }
            return response;
        }
        Err(refused) => refused,
    };
    let (status, problem) = match refused {
        LoginRefused::UnknownKey => (StatusCode::UNAUTHORIZED, "That key is not valid."),
        LoginRefused::NotAdmin => (
            StatusCode::FORBIDDEN,
            "That key is valid but not an admin key: the console needs the admin role.",
        ),
    };
    (status, html_headers(), form(Some(problem)).into_string()).into_response()
}

/// POST: ends the session (CSRF-protected, so a page elsewhere cannot sign one out).
pub(crate) async fn logout(
    State(console): State<Console>,
    viewer: Viewer,
    FormOf(form): FormOf<Logout>,
) -> Result<Response, ConsoleError> {
    if !console.sessions.csrf_matches(&viewer.session, &form.csrf) {
        return Err(ConsoleError::Forged);
    }
    let mut response = redirect("/console/login");
    if let Ok(value) = HeaderValue::from_str(&Sessions::clear_cookie()) {
        response.headers_mut().append(header::SET_COOKIE, value);
    }
    Ok(response)
}

fn redirect(to: &'static str) -> Response {
    (StatusCode::SEE_OTHER, [(header::LOCATION, to)]).into_response()
}
