//! Calls: a team's latest calls, and one trace ID's calls with every
//! attempt (each fallback hop), their cost, and the audit events of the trace.

use super::super::{Console, QueryOf, Viewer, error::ConsoleError, layout, respond};
use crate::{
    audit::{chain::Linked, store as audit_store},
    usage::record::{self, UsageRecord},
};
use axum::{extract::State, response::Response};
use maud::{Markup, html};
use serde::Deserialize;

/// Calls listed without a trace ID.
const RECENT: i64 = 50;
/// Most calls shown for one trace.
const TRACE_CALLS: i64 = 200;
/// Most audit events shown for one trace.
const TRACE_EVENTS: i64 = 200;

/// The page's query.
#[derive(Deserialize, Default)]
pub(crate) struct Params {
    team: Option<String>,
    trace: Option<String>,
}

/// GET `/console/calls`.
pub(crate) async fn show(
    State(console): State<Console>,
    viewer: Viewer,
    QueryOf(p): QueryOf<Params>,
) -> Result<Response, ConsoleError> {
    let trace = p.trace.as_deref().map(str::trim).filter(|t| !t.is_empty());
    if let Some(trace) = trace {
        super::check_id("trace", trace)?;
    }
    let (teams, team) =
        match super::team_page(&console, &viewer, p.team.as_deref(), "Calls").await? {
            Ok(picked) => picked,
            Err(none) => return Ok(none),
        };
    let store = console.pipeline.store();
    let extra = html! {
        label for="trace" { "Trace ID" }
        input id="trace" name="trace" value=(trace.unwrap_or_default()) size="36";
    };
    let found = match trace {
        Some(trace) => {
            let calls = record::of_trace(store, &team, trace, TRACE_CALLS).await?;
            let events = audit_store::list(
                store,
                &audit_store::Filter {
                    team_id: team.clone(),
                    since_ms: None,
                    until_ms: None,
                    trace_id: Some(trace.to_owned()),
                    after_seq: 0,
                    limit: TRACE_EVENTS,
                },
            )
            .await?;
            one_trace(trace, &calls, &events)
        }
        None => recent(&team, &record::recent(store, &team, RECENT).await?),
    };
    let body = html! {
        (layout::team_picker("/console/calls", &teams, &team, extra))
        (found)
    };
    Ok(respond(&viewer, layout::page("Calls", Some(&viewer), body)))
}

fn cost(r: &UsageRecord) -> String {
    r.cost_micros
        .map_or_else(|| "unpriced".to_owned(), layout::usd)
}

fn recent(team: &str, calls: &[UsageRecord]) -> Markup {
    html! {
        h2 { "Latest calls" }
        @if calls.is_empty() { (layout::empty("No calls yet.")) } @else {
            table id="recent-calls" {
                caption { "The latest " (calls.len()) " calls of " (team) }
                thead { tr {
                    th scope="col" { "When" } th scope="col" { "Trace" } th scope="col" { "Task" }
                    th scope="col" { "Served by" } th scope="col" { "Outcome" } th.n scope="col" { "Latency" }
                    th.n scope="col" { "Cost" }
                } }
                tbody {
                    @for r in calls {
                        tr {
                            td { (layout::when(r.created_at_ms)) }
                            td { a href=(format!("/console/calls?team={team}&trace={}", r.trace_id)) { code { (r.trace_id) } } }
                            td { (r.task) }
                            td { (r.provider) " " (r.model) @if r.degraded { " (fallback)" } }
                            td { (r.outcome) }
                            td.n { (r.latency_ms) " ms" }
                            td.n { (cost(r)) }
                        }
                    }
                }
            }
        }
    }
}

fn one_trace(trace: &str, calls: &[UsageRecord], events: &[Linked]) -> Markup {
    let total: i64 = calls.iter().filter_map(|r| r.cost_micros).sum();
    html! {
        h2 { "Trace " code { (trace) } }
        @if calls.is_empty() && events.is_empty() {
            (layout::empty("Nothing of this team carries that trace ID."))
        }
        @if !calls.is_empty() {
            p { (calls.len()) " call(s), " span id="trace-cost" { (layout::usd(total)) } " in all." }
        }
        @for (i, r) in calls.iter().enumerate() {
            h3 { "Call " (i + 1) ": " (r.task) " — " (r.outcome) }
            p {
                @if r.provider.is_empty() { "No model served this record" } @else {
                    "Served by " (r.provider) " " (r.model) @if r.degraded { " (a fallback)" }
                }
                ", " (r.input_tokens) " tokens in, " (r.output_tokens) " out, " (cost(r)) ", " (r.latency_ms) " ms."
            }
            (attempts(&r.attempts))
        }
        @if !events.is_empty() {
            table id="trace-events" {
                caption { "Audit events of the trace" }
                thead { tr {
                    th scope="col" { "When" } th scope="col" { "Action" } th scope="col" { "Subject" }
                    th scope="col" { "Decision" } th scope="col" { "Reason" } th scope="col" { "Principal" }
                } }
                tbody {
                    @for l in events {
                        tr {
                            td { (layout::when(l.event.at_ms)) } td { (l.event.action) } td { (l.event.subject) }
                            td { (l.event.decision) } td { (l.event.reason) } td { (l.event.principal) }
                        }
                    }
                }
            }
        }
    }
}

/// A record's attempts (a JSON array written by the pipeline), one row each.
fn attempts(json: &str) -> Markup {
    let list: Vec<serde_json::Value> = serde_json::from_str(json).unwrap_or_default();
    let text = |v: &serde_json::Value, k: &str| match &v[k] {
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Null => String::new(),
        other => other.to_string(),
    };
    if list.is_empty() {
        return html! {};
    }
    html! {
        table.attempts {
            caption { "Attempts, in order" }
            thead { tr {
                th scope="col" { "#" } th scope="col" { "Provider" } th scope="col" { "Model" }
                th scope="col" { "Outcome" } th scope="col" { "Error" } th.n scope="col" { "Latency" }
                th scope="col" { "Retry" }
            } }
            tbody {
                @for (i, a) in list.iter().enumerate() {
                    tr {
                        td { (i + 1) } td { (text(a, "provider")) } td { (text(a, "model")) }
                        td { (text(a, "outcome")) } td { (text(a, "error_code")) }
                        td.n { (text(a, "latency_ms")) " ms" } td { (text(a, "retry")) }
                    }
                }
            }
        }
    }
}
