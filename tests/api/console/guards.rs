//! The console's guards over plain HTTP: no session, no page; CSRF on every
//! post; a key's teams only; with authentication off, loopback only; and
//! every page's SQL on both backends.

use super::{csrf_of, extra, get, held_turn, http, page, post, set_cookie, spawn};
use crate::{
    common::TestApp,
    observability::free_port,
    tools::{ADMIN, webhook::Webhook},
};
use ai_orchestrator::api::pb;

#[tokio::test]
async fn without_a_session_every_page_and_post_goes_to_the_login() {
    let hook = Webhook::start().await;
    let (app, base) = spawn(&hook, &extra()).await;
    let (_, approval) = held_turn(&app).await;
    for path in [
        "/console",
        "/console/usage",
        "/console/usage.csv",
        "/console/audit",
    ] {
        let r = get(format!("{base}{path}"), None).await;
        assert_eq!(r.status(), 303, "{path}");
        assert_eq!(r.headers()["location"], "/console/login", "{path}");
    }
    let forged = format!("team=t1&decision=approve&csrf={}", "0".repeat(64));
    let r = post(
        &base,
        &format!("/console/approvals/{approval}"),
        None,
        &forged,
    )
    .await;
    assert_eq!(r.status(), 303);
    // A stolen-looking cookie (not ours) is no session either.
    let r = post(
        &base,
        &format!("/console/approvals/{approval}"),
        Some("aio_console=1.2.3.4"),
        &forged,
    )
    .await;
    assert_eq!(r.status(), 303);

    // Signed in: a missing or wrong CSRF token is refused with its reason.
    let r = post(&base, "/console/login", None, &format!("key={ADMIN}")).await;
    assert_eq!(r.status(), 303);
    let set = r.headers()["set-cookie"].to_str().unwrap().to_owned();
    assert!(
        set.contains("HttpOnly") && set.contains("SameSite=Strict"),
        "{set}"
    );
    let cookie = set_cookie(&r);
    for body in ["team=t1&decision=approve", forged.as_str()] {
        let r = post(
            &base,
            &format!("/console/approvals/{approval}"),
            Some(&cookie),
            body,
        )
        .await;
        assert_eq!(r.status(), 403, "{body}");
        assert!(r.text().await.unwrap().contains("CSRF_TOKEN_INVALID"));
    }
    // Pages answer with a strict content policy and no caching.
    let r = get(format!("{base}/console"), Some(("cookie", &cookie))).await;
    assert_eq!(r.status(), 200);
    assert!(
        r.headers()["content-security-policy"]
            .to_str()
            .unwrap()
            .contains("default-src 'none'")
    );
    assert_eq!(r.headers()["cache-control"], "no-store");
    // A bad query is a console page: 400 with its reason.
    for path in [
        "/console/usage?month=13-2026",
        "/console/usage?team=a%20b",
        "/console/audit?team=t1&after=x",
        "/console/usage?by=a&by=b",
    ] {
        let r = get(format!("{base}{path}"), Some(("cookie", &cookie))).await;
        assert_eq!(r.status(), 400, "{path}");
        assert!(
            r.text().await.unwrap().contains("INVALID_ARGUMENT"),
            "{path}"
        );
    }
    // Signing out needs the token too; with it, the cookie is cleared.
    let r = post(&base, "/console/logout", Some(&cookie), "csrf=00").await;
    assert_eq!(r.status(), 403);
    let csrf = csrf_of(&page(&http(), &base, &cookie, "/console").await);
    let r = post(
        &base,
        "/console/logout",
        Some(&cookie),
        &format!("csrf={csrf}"),
    )
    .await;
    assert_eq!(r.status(), 303);
    assert!(
        r.headers()["set-cookie"]
            .to_str()
            .unwrap()
            .contains("Max-Age=0")
    );
    // A wrong key at the login is a 401 and sets nothing.
    let r = post(&base, "/console/login", None, "key=nope").await;
    assert_eq!(r.status(), 401);
    assert!(r.headers().get("set-cookie").is_none());
    app.stop().await;
}

#[tokio::test]
async fn with_auth_off_only_loopback_clients_are_answered_and_need_no_login() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("open.db").display());
    let port = free_port();
    let toml = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nmetrics_listen = \"0.0.0.0:{port}\"\n\
         [database]\nurl = \"{url}\"\n[console]\nenabled = true\n"
    );
    let mut app = TestApp::spawn_toml(&toml).await;
    app.keep(dir);
    let base = format!("http://127.0.0.1:{port}");
    crate::common::wait_for(|| {
        let url = format!("{base}/healthz");
        async move { reqwest::get(url).await.is_ok() }
    })
    .await;
    let r = get(format!("{base}/console"), None).await;
    assert_eq!(r.status(), 200, "no login with auth off");
    assert!(
        r.headers()["set-cookie"]
            .to_str()
            .unwrap()
            .starts_with("aio_console=")
    );
    let r = get(format!("{base}/console/login"), None).await;
    assert_eq!(r.status(), 303, "nothing to sign in to");
    let r = post(&base, "/console/login", None, "key=anything").await;
    assert_eq!(r.status(), 303, "no key is checked, valid or not");
    assert!(r.headers().get("set-cookie").is_none());
    // A page elsewhere re-pointed at 127.0.0.1 (DNS rebinding) names its own host.
    let r = get(
        format!("{base}/console"),
        Some(("host", &format!("evil.example:{port}"))),
    )
    .await;
    assert_eq!(r.status(), 403);
    assert!(r.text().await.unwrap().contains("LOOPBACK_ONLY"));
    let r = get(format!("http://localhost:{port}/console"), None).await;
    assert_eq!(r.status(), 200, "localhost is this host");
    // The same listener reached on a non-loopback address of this host.
    if let Some(ip) = local_ip() {
        let r = get(format!("http://{ip}:{port}/console"), None).await;
        assert_eq!(r.status(), 403);
        assert!(r.text().await.unwrap().contains("LOOPBACK_ONLY"));
        let r = get(format!("http://{ip}:{port}/healthz"), None).await;
        assert_eq!(r.status(), 200, "the probes stay open");
    }
    app.stop().await;
}

/// This host's address on its default route, if it has one that is not loopback
/// (a UDP "connection" sends nothing).
fn local_ip() -> Option<std::net::IpAddr> {
    let socket = std::net::UdpSocket::bind("0.0.0.0:0").ok()?;
    socket.connect("10.255.255.255:9").ok()?;
    Some(socket.local_addr().ok()?.ip()).filter(|ip| !ip.is_loopback() && !ip.is_unspecified())
}

/// Each page on both backends (auth off, from loopback): the console's reads
/// are SQL of their own, so PostgreSQL runs them too.
#[tokio::test]
async fn every_page_answers_on_sqlite_and_postgresql() {
    let dir = tempfile::tempdir().unwrap();
    let pg = crate::common::TestPostgres::create().await;
    for url in [
        format!("sqlite://{}", dir.path().join("pages.db").display()),
        pg.url.clone(),
    ] {
        let port = free_port();
        let toml = crate::common::config_toml_with(
            &url,
            "latency = \"1ms\"",
            "latency = \"1ms\"",
            "[console]\nenabled = true\n",
        )
        .replacen(
            "listen = \"127.0.0.1:0\"\n",
            &format!("listen = \"127.0.0.1:0\"\nmetrics_listen = \"127.0.0.1:{port}\"\n"),
            1,
        );
        let app = TestApp::spawn_toml(&toml).await;
        for _ in 0..3 {
            app.client
                .clone()
                .execute(pb::ExecuteRequest {
                    context: crate::common::ctx(),
                    task: "meeting_brief".into(),
                    input: Some(pb::execute_request::Input::InputJson(
                        r#"{"company":"Acme","attendees":["Ann"]}"#.into(),
                    )),
                    ..Default::default()
                })
                .await
                .unwrap();
        }
        let base = format!("http://127.0.0.1:{port}");
        let client = http();
        let cookie = set_cookie(&get(format!("{base}/console"), None).await);
        let overview = page(&client, &base, &cookie, "/console").await;
        assert!(
            overview.contains(r#"<dd id="requests-month">3</dd>"#),
            "{url}: {overview}"
        );
        let usage = page(&client, &base, &cookie, "/console/usage?team=t1&by=model").await;
        assert!(usage.contains(r#"<dd id="total-requests">3</dd>"#), "{url}");
        let csv = page(&client, &base, &cookie, "/console/usage.csv?team=t1&by=day").await;
        assert_eq!(csv.lines().count(), 2, "{url}: {csv}");
        assert!(
            page(&client, &base, &cookie, "/console/teams")
                .await
                .contains(r#"data-team="t1""#)
        );
        assert!(
            page(&client, &base, &cookie, "/console/calls?team=t1")
                .await
                .contains("meeting_brief")
        );
        assert!(
            page(&client, &base, &cookie, "/console/tools?team=t1")
                .await
                .contains("No invocations yet.")
        );
        assert!(
            page(&client, &base, &cookie, "/console/audit?team=t1&verify=1")
                .await
                .contains("The chain holds")
        );
        assert!(
            page(&client, &base, &cookie, "/console/providers")
                .await
                .contains(r#"data-provider="primary""#)
        );
        app.stop().await;
    }
    pg.drop_now().await;
}

/// An admin of team t1 only sees and decides t1's, on every page and the CSV.
#[tokio::test]
async fn an_admin_of_one_team_sees_and_decides_only_that_team() {
    use sha2::Digest as _;
    const T1_ADMIN: &str = "aio_test_console_t1_admin_key";
    let hash = hex::encode(sha2::Sha256::digest(T1_ADMIN.as_bytes()));
    let config = format!(
        "{}\n[[auth.keys]]\nname = \"t1-admin\"\nsha256 = \"{hash}\"\nteams = [\"t1\"]\nrole = \"admin\"\n",
        extra()
    );
    let hook = Webhook::start().await;
    let (app, base) = spawn(&hook, &config).await;
    let (_, approval) = held_turn(&app).await;
    let r = post(&base, "/console/login", None, &format!("key={T1_ADMIN}")).await;
    assert_eq!(r.status(), 303);
    let cookie = set_cookie(&r);
    for path in [
        "/console/usage?team=t2",
        "/console/usage.csv?team=t2",
        "/console/calls?team=t2&trace=console-hold",
        "/console/tools?team=t2",
        "/console/audit?team=t2&verify=1",
    ] {
        let r = get(format!("{base}{path}"), Some(("cookie", &cookie))).await;
        assert_eq!(r.status(), 403, "{path}");
        assert!(
            r.text().await.unwrap().contains("TEAM_NOT_ALLOWED"),
            "{path}"
        );
    }
    let tools = page(&http(), &base, &cookie, "/console/tools?team=t1").await;
    assert!(tools.contains(&approval));
    let csrf = csrf_of(&tools);
    let decide = |team: &str| format!("team={team}&decision=reject&csrf={csrf}");
    let r = post(
        &base,
        &format!("/console/approvals/{approval}"),
        Some(&cookie),
        &decide("t2"),
    )
    .await;
    assert_eq!(r.status(), 403, "another team's");
    let r = post(
        &base,
        "/console/approvals/01a00000-0000-7000-8000-000000000000",
        Some(&cookie),
        &decide("t1"),
    )
    .await;
    assert_eq!(r.status(), 404);
    assert!(r.text().await.unwrap().contains("APPROVAL_NOT_FOUND"));
    let r = post(
        &base,
        &format!("/console/approvals/{approval}"),
        Some(&cookie),
        &decide("t1"),
    )
    .await;
    assert_eq!(r.status(), 303);
    assert!(
        r.headers()["location"]
            .to_str()
            .unwrap()
            .ends_with("outcome=rejected")
    );
    let r = post(
        &base,
        &format!("/console/approvals/{approval}"),
        Some(&cookie),
        &decide("t1"),
    )
    .await;
    assert_eq!(r.status(), 409, "decided once");
    app.stop().await;
}
