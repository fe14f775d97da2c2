use super::*;
use crate::audit::Category;
use serde_json::json;

fn outbox(triggers: &str) -> Arc<Outbox> {
    let config = Config::from_toml_str(triggers, |_| None).unwrap();
    Outbox::from_config(&config).unwrap()
}

fn result(team: &str, principal: &str, subject: &str, decision: &str) -> AuditEvent {
    AuditEvent::new(
        team,
        principal,
        "trace-1",
        Category::Workflow,
        "workflow.result",
        subject,
    )
    .decided(decision, if decision == "ok" { "" } else { "HTTP_500" })
}

#[test]
fn globs_match_any_run_where_a_star_stands() {
    for (pattern, text, want) in [
        ("crm.*", "crm.add_note", true),
        ("crm.*", "billing.refund", false),
        ("*", "", true),
        ("*note", "crm.add_note", true),
        ("crm.*.v*", "crm.x.v2", true),
        ("a*a", "a", false),
        ("t1", "t1", true),
        ("t1", "t10", false),
    ] {
        assert_eq!(glob(pattern, text), want, "{pattern} ~ {text}");
    }
}

#[test]
fn an_event_fires_the_triggers_whose_kind_and_filter_it_matches() {
    let outbox = outbox(
        r#"
[triggers.on_fail]
on = "tool.invocation.failed"
filter = { tool = "crm.*", team = "t*" }
tool = "ops.alert"
role = "admin"
input = { text = "{{event.tool}}: {{event.reason}}" }
[triggers.on_ok]
on = "tool.invocation.succeeded"
tool = "ops.alert"
[triggers.off]
on = "tool.invocation.failed"
tool = "ops.alert"
enabled = false
"#,
    );
    let fired = |e: AuditEvent| outbox.statements(&[e], 1).len();
    assert_eq!(
        fired(result("t1", "crm-key", "crm.add_note@1.0.0", "error")),
        1
    );
    assert_eq!(
        fired(result("t1", "crm-key", "billing.refund@1.0.0", "error")),
        0
    );
    assert_eq!(
        fired(result("acme", "crm-key", "crm.add_note@1.0.0", "error")),
        0
    );
    assert_eq!(
        fired(result("t1", "crm-key", "crm.add_note@1.0.0", "ok")),
        1
    );
    // A trigger's own tool calls fire nothing.
    assert_eq!(
        fired(result("t1", "trigger:on_ok", "crm.add_note@1.0.0", "ok")),
        0
    );
    let other = AuditEvent::new(
        "t1",
        "k",
        "",
        Category::Tool,
        "tool.call",
        "crm.add_note@1.0.0",
    );
    assert_eq!(fired(other), 0);
}

#[test]
fn placeholders_take_the_events_fields() {
    let event = result("t1", "crm-key", "crm.add_note@1.2.0", "error");
    let seen = Seen::of(&event).unwrap();
    let fields = fields(&event, &seen, "on_fail");
    let template = json!({
        "text": "{{event.tool}} failed for {{ event.team }}: {{event.reason}}",
        "at": "{{event.at_ms}}",
        "list": ["{{event.version}}", 3],
        "unknown": "{{event.nope}} and {{other}}",
    });
    let rendered = render(&template, &fields);
    assert_eq!(rendered["text"], "crm.add_note failed for t1: HTTP_500");
    assert_eq!(rendered["at"], json!(event.at_ms));
    assert_eq!(rendered["list"], json!(["1.2.0", 3]));
    assert_eq!(rendered["unknown"], "{{event.nope}} and {{other}}");
    assert_eq!(fields["event"], "tool.invocation.failed");
    assert_eq!(fields["trigger"], "on_fail");
}

#[test]
fn a_cap_event_gives_its_cap_fields_and_runs_for_the_triggers_team() {
    let outbox = outbox(
        r#"
[triggers.budget]
on = "usage.cap.warning"
filter = { team = "acme" }
tool = "ops.alert"
team = "ops"
input = { text = "{{event.cap}} at {{event.spent}}/{{event.limit}} for {{event.user}}" }
"#,
    );
    assert!(outbox.follows_caps());
    let warning = |subject: &str, reason: &str| {
        AuditEvent::new(
            "acme",
            "system:ledger",
            "",
            Category::Usage,
            "usage.cap.warning",
            subject,
        )
        .decided("allow", reason)
    };
    let event = warning(
        "user:u/1/day/cost_usd",
        "CAP_WARNING cap=daily_cost_usd limit=2500000 spent=2000000",
    );
    let seen = Seen::of(&event).unwrap();
    let got = fields(&event, &seen, "budget");
    assert_eq!(got["user"], "u/1");
    assert_eq!(got["cap"], "daily_cost_usd");
    assert_eq!(got["limit"], json!(2.5));
    assert_eq!(got["spent"], json!(2.0));
    assert_eq!(got["provider"], "");
    let rows = outbox.statements(&[event], 1);
    assert_eq!(rows.len(), 1);
    // The row is the trigger team's, not the event's.
    let args = format!("{:?}", rows[0].args);
    assert!(args.contains("\"ops\""), "{args}");

    let team = warning(
        "team:acme/month/requests",
        "CAP_WARNING cap=monthly_requests limit=5 spent=4",
    );
    let seen = Seen::of(&team).unwrap();
    let got = fields(&team, &seen, "budget");
    assert_eq!(got["user"], "");
    assert_eq!(
        (got["limit"].clone(), got["spent"].clone()),
        (json!(5), json!(4))
    );
    let mut reached = team.clone();
    reached.action = "usage.cap.reached".into();
    assert_eq!(
        outbox.statements(&[reached], 1).len(),
        0,
        "only warnings are followed"
    );
}
