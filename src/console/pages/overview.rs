//! Overview: the fleet's last hour (request rate, errors, p50/p99), its
//! spend today and this month, spend per day, and the breakers.

use super::super::{Console, Viewer, chart, error::ConsoleError, layout, respond};
use crate::{
    resilience::BreakerState,
    usage::summary::{self, Dimension, Totals},
};
use axum::{extract::State, response::Response};
use maud::{Markup, html};

const HOUR_MS: i64 = 3_600_000;
const DAY_MS: i64 = 86_400_000;

/// GET `/console`.
pub(crate) async fn show(
    State(console): State<Console>,
    viewer: Viewer,
) -> Result<Response, ConsoleError> {
    let teams = super::visible_teams(&console, &viewer).await?;
    let store = console.pipeline.store();
    let now = chrono::Utc::now().timestamp_millis();
    // The end is exclusive: a call recorded this millisecond counts.
    let end = now + 1;
    let hour = summary::summarize_teams(store, &teams, now - HOUR_MS, end, &[]).await?;
    let today =
        summary::summarize_teams(store, &teams, now - now.rem_euclid(DAY_MS), end, &[]).await?;
    let (month_start, month_end) = summary::month_of(chrono::Utc::now());
    let month =
        summary::summarize_teams(store, &teams, month_start, month_end, &[Dimension::Day]).await?;
    let body = html! {
        p {
            "Figures from every replica, over " (teams.len()) " team(s) with recent usage."
            @if teams.len() as i64 >= super::MAX_TEAMS {
                " Only the first " (super::MAX_TEAMS) " teams by name are counted."
            }
        }
        h2 { "Last hour" }
        (last_hour(&hour.totals))
        h2 { "Spend" }
        dl.figures {
            (figure("requests-today", "Requests today (UTC)", today.totals.requests.to_string()))
            (figure("spend-today", "Spend today (UTC)", layout::usd(today.totals.cost_micros)))
            (figure("requests-month", "Requests this month", month.totals.requests.to_string()))
            (figure("spend-month", "Spend this month", layout::usd(month.totals.cost_micros)))
        }
        @let days: Vec<_> = month.buckets.iter().map(|(k, t)| {
            let day = k.day.clone().unwrap_or_default();
            (day, t.cost_micros as f64, layout::usd(t.cost_micros))
        }).collect();
        (chart::bars("spend-per-day", "Spend per day this month (USD)", &days))
        h2 { "Providers" }
        (providers(&console))
    };
    Ok(respond(
        &viewer,
        layout::page("Overview", Some(&viewer), body),
    ))
}

fn figure(id: &str, label: &str, value: String) -> Markup {
    html! { div { dt { (label) } dd id=(id) { (value) } } }
}

fn last_hour(t: &Totals) -> Markup {
    let rate = if t.requests == 0 {
        0.0
    } else {
        t.errors as f64 / t.requests as f64
    };
    html! {
        dl.figures {
            (figure("requests-per-minute", "Requests per minute", format!("{:.2}", t.requests as f64 / 60.0)))
            (figure("requests-hour", "Requests", t.requests.to_string()))
            (figure("error-rate", "Errors", format!("{} ({})", t.errors, layout::percent(rate))))
            (figure("latency-p50", "Latency p50", format!("{} ms", t.latency_p50_ms)))
            (figure("latency-p99", "Latency p99", format!("{} ms", t.latency_p99_ms)))
        }
    }
}

/// Each provider's breaker on this replica, linking to the Providers page.
fn providers(console: &Console) -> Markup {
    let resilience = console.pipeline.router().resilience();
    html! {
        ul {
            @for name in console.pipeline.config().providers.keys() {
                @let state = resilience.get(name).map(|g| g.breaker.snapshot().state);
                li {
                    a href="/console/providers" { (name) } ": "
                    @match state {
                        Some(state) => { span class=(format!("state-{}", state_name(state))) { (state_name(state)) } },
                        None => { span { "no breaker" } },
                    }
                }
            }
        }
    }
}

/// A breaker state as GetProviderHealth spells it.
pub(super) fn state_name(state: BreakerState) -> &'static str {
    match state {
        BreakerState::Closed => "CLOSED",
        BreakerState::Open => "OPEN",
        BreakerState::HalfOpen => "HALF_OPEN",
    }
}
