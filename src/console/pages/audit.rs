//! Audit: a team's chain, a page at a time, and its verification on demand.

use super::super::{Console, QueryOf, Viewer, error::ConsoleError, layout, respond};
use crate::audit::store as audit_store;
use axum::{extract::State, response::Response};
use maud::html;
use serde::Deserialize;

/// Events per page.
const PAGE: i64 = 100;

/// The page's query.
#[derive(Deserialize, Default)]
pub(crate) struct Params {
    team: Option<String>,
    /// Events after this sequence number.
    after: Option<String>,
    /// Verify the chain.
    verify: Option<String>,
}

/// GET `/console/audit`.
pub(crate) async fn show(
    State(console): State<Console>,
    viewer: Viewer,
    QueryOf(p): QueryOf<Params>,
) -> Result<Response, ConsoleError> {
    let (teams, team) =
        match super::team_page(&console, &viewer, p.team.as_deref(), "Audit").await? {
            Ok(picked) => picked,
            Err(none) => return Ok(none),
        };
    let after = match p.after.as_deref().filter(|a| !a.is_empty()) {
        None => 0,
        Some(a) => a
            .parse::<i64>()
            .ok()
            .filter(|a| *a >= 0)
            .ok_or_else(|| ConsoleError::invalid("after", "must be an event number"))?,
    };
    let store = console.pipeline.store();
    let verified = match p.verify.as_deref() {
        Some(_) => Some(audit_store::verify(store, &team).await?),
        None => None,
    };
    let mut events = audit_store::list(
        store,
        &audit_store::Filter {
            team_id: team.clone(),
            since_ms: None,
            until_ms: None,
            trace_id: None,
            after_seq: after,
            limit: PAGE + 1,
        },
    )
    .await?;
    let more = events.len() > PAGE as usize;
    events.truncate(PAGE as usize);
    let next = events.last().map(|l| l.seq).filter(|_| more);
    let body = html! {
        (layout::team_picker("/console/audit", &teams, &team, html! {}))
        form.inline method="get" action="/console/audit" {
            input type="hidden" name="team" value=(team);
            button type="submit" name="verify" value="1" { "Verify the chain" }
        }
        @if let Some(v) = &verified {
            @if v.ok {
                p.notice role="status" id="verify-result" { span.good { "The chain holds" } ": " (v.events_checked) " events checked." }
            } @else {
                p.error role="alert" id="verify-result" {
                    span.bad { "The chain is broken" } " at event " (v.first_broken_seq) " " code { (v.first_broken_event_id) }
                    " (" (v.reason) "), after " (v.events_checked) " events checked."
                }
            }
        }
        h2 { "Events" @if after > 0 { " after #" (after) } }
        @if events.is_empty() { (layout::empty("No events.")) } @else {
            table id="audit-events" {
                caption { "Audit events of " (team) ", in chain order" }
                thead { tr {
                    th.n scope="col" { "#" } th scope="col" { "When" } th scope="col" { "Category" }
                    th scope="col" { "Action" } th scope="col" { "Subject" } th scope="col" { "Decision" }
                    th scope="col" { "Principal" } th scope="col" { "Trace" }
                } }
                tbody {
                    @for l in &events {
                        tr {
                            td.n { (l.seq) } td { (layout::when(l.event.at_ms)) } td { (l.event.category.as_str()) }
                            td { (l.event.action) } td { (l.event.subject) } td { (l.event.decision) }
                            td { (l.event.principal) }
                            td { a href=(format!("/console/calls?team={team}&trace={}", l.event.trace_id)) { code { (l.event.trace_id) } } }
                        }
                    }
                }
            }
        }
        @if let Some(next) = next {
            p { a href=(format!("/console/audit?team={team}&after={next}")) { "Next events" } }
        }
    };
    Ok(respond(&viewer, layout::page("Audit", Some(&viewer), body)))
}
