//! The ops console (SPEC §17): in a real browser (headless Chromium driven
//! by playwright-core, [`browser`]) against the real server, its figures
//! checked against GetUsage and an approval clicked through; and its guards
//! over plain HTTP ([`guards`]): sessions, CSRF, team scoping, loopback.

mod browser;
mod guards;

use crate::{
    agents::{conversation_id, converse, kinds, toml_with, turn},
    common::TestApp,
    observability::free_port,
    tools::{CALLER, webhook::Webhook},
};
use ai_orchestrator::api::pb::converse_event::Event;

/// The held-note agent of the approval tests (admins who may decide), a
/// monthly request cap, and the console.
pub(super) fn extra() -> String {
    format!(
        "{}\n[metering.default_limits]\nmax_requests = 1000\n\n[console]\nenabled = true\n",
        crate::agents::approvals::EXTRA
    )
}

/// A server with the console on its metrics listener: the app and the console's base URL.
pub(super) async fn spawn(hook: &Webhook, extra: &str) -> (TestApp, String) {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("console.db").display());
    let port = free_port();
    let toml = toml_with(
        &url,
        "http://127.0.0.1:9",
        "http://127.0.0.1:9",
        &hook.url(),
        extra,
    )
    .replacen(
        "listen = \"127.0.0.1:0\"\n",
        &format!("listen = \"127.0.0.1:0\"\nmetrics_listen = \"127.0.0.1:{port}\"\n"),
        1,
    );
    let mut app = TestApp::spawn_toml_env(&toml, crate::agents::env).await;
    app.keep(dir);
    let base = format!("http://127.0.0.1:{port}");
    let client = reqwest::Client::new();
    crate::common::wait_for(|| {
        let client = client.clone();
        let url = format!("{base}/healthz");
        async move { client.get(url).send().await.is_ok() }
    })
    .await;
    (app, base)
}

/// A turn of `noter` for t1 that stops for approval: its conversation and approval.
pub(super) async fn held_turn(app: &TestApp) -> (String, String) {
    let events = turn(
        app,
        CALLER,
        "console-hold",
        converse("noter", "Lead L-1 called", None),
    )
    .await
    .unwrap();
    assert_eq!(
        kinds(&events),
        ["started", "tool_call", "approval_required", "completed"]
    );
    let approval = events
        .iter()
        .find_map(|e| match e {
            Event::ApprovalRequired(a) => Some(a.approval_id.clone()),
            _ => None,
        })
        .unwrap();
    (conversation_id(&events), approval)
}

/// A client that shows redirects instead of following them.
pub(super) fn http() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
}

/// GET `url`, with one more header if given.
pub(super) async fn get(
    url: impl reqwest::IntoUrl,
    header: Option<(&str, &str)>,
) -> reqwest::Response {
    let mut req = http().get(url);
    if let Some((name, value)) = header {
        req = req.header(name, value);
    }
    req.send().await.unwrap()
}

/// The `name=value` of the session cookie a response sets.
pub(super) fn set_cookie(r: &reqwest::Response) -> String {
    let set = r.headers()["set-cookie"].to_str().unwrap();
    set.split(';').next().unwrap().to_owned()
}

pub(super) async fn post(
    base: &str,
    path: &str,
    cookie: Option<&str>,
    body: &str,
) -> reqwest::Response {
    let mut req = http()
        .post(format!("{base}{path}"))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(body.to_owned());
    if let Some(cookie) = cookie {
        req = req.header("cookie", cookie);
    }
    req.send().await.unwrap()
}

/// The CSRF token of a page's forms.
pub(super) fn csrf_of(html: &str) -> String {
    let at = html
        .find(r#"name="csrf" value=""#)
        .expect("a form with a CSRF token");
    let rest = &html[at + r#"name="csrf" value=""#.len()..];
    rest[..rest.find('"').unwrap()].to_owned()
}

/// Page `path` as the session `cookie` sees it; it must answer 200.
pub(super) async fn page(client: &reqwest::Client, base: &str, cookie: &str, path: &str) -> String {
    let r = client
        .get(format!("{base}{path}"))
        .header("cookie", cookie)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "{path}");
    r.text().await.unwrap()
}
