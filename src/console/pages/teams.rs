//! Teams: each visible team's spend against every cap of its month and day
//! (its override row, else `[metering.default_limits]`), settled and in
//! flight, from the ledger rows admission reads.

use super::super::{Console, Viewer, error::ConsoleError, layout, respond};
use crate::usage::{
    bucket::{Bucket, Period, day_of},
    ledger,
    policy::{Balance, CapKind, Caps},
    summary,
};
use axum::{extract::State, response::Response};
use maud::{Markup, html};

/// GET `/console/teams`.
pub(crate) async fn show(
    State(console): State<Console>,
    viewer: Viewer,
) -> Result<Response, ConsoleError> {
    let teams = super::visible_teams(&console, &viewer).await?;
    let store = console.pipeline.store();
    let defaults = console.pipeline.meter().default_caps();
    let now = chrono::Utc::now();
    let (month_start, _) = summary::month_of(now);
    let day_start = day_of(now.timestamp_millis());
    let mut sections = Vec::with_capacity(teams.len());
    for team in &teams {
        let caps = ledger::caps_of(store, team, "", defaults.team).await?;
        let mut rows = Vec::new();
        for (period, start) in [(Period::Month, month_start), (Period::Day, day_start)] {
            let bucket = Bucket {
                team_id: team.clone(),
                user_id: String::new(),
                period,
                start_ms: start,
            };
            let balance = ledger::balance_of(store, &bucket).await?;
            rows.push((period, caps.of(period), balance));
        }
        sections.push(section(team, &rows));
    }
    let user = defaults.user;
    let body = html! {
        @if teams.is_empty() { (layout::empty("No team has usage this month yet.")) }
        @for s in &sections { (s) }
        h2 { "Every user's caps" }
        p {
            "A request naming a user also counts against that user's caps: by default "
            (describe(&user.month)) " a month and " (describe(&user.day)) " a day, unless "
            code { "limits set --user" } " gave the user their own."
        }
    };
    Ok(respond(&viewer, layout::page("Teams", Some(&viewer), body)))
}

fn section(team: &str, rows: &[(Period, Caps, Balance)]) -> Markup {
    html! {
        section aria-labelledby=(format!("team-{team}")) {
            h2 id=(format!("team-{team}")) { (team) }
            table data-team=(team) {
                caption { "Spend against caps, " (team) }
                thead { tr {
                    th scope="col" { "Cap" } th.n scope="col" { "Spent" } th.n scope="col" { "In flight" }
                    th.n scope="col" { "Limit" } th scope="col" { "Used" }
                } }
                tbody {
                    @for (period, caps, balance) in rows {
                        @for kind in [CapKind::Requests, CapKind::Tokens, CapKind::Cost] {
                            (row(*period, kind, caps, balance))
                        }
                    }
                }
            }
        }
    }
}

fn row(period: Period, kind: CapKind, caps: &Caps, b: &Balance) -> Markup {
    let (spent, reserved, limit) = match kind {
        CapKind::Requests => (b.spent_requests, b.reserved_requests, caps.requests),
        CapKind::Tokens => (b.spent_tokens, b.reserved_tokens, caps.tokens),
        CapKind::Cost => (
            b.spent_cost_micros,
            b.reserved_cost_micros,
            caps.cost_micros,
        ),
    };
    let show = |v: i64| {
        if kind == CapKind::Cost {
            layout::usd(v)
        } else {
            v.to_string()
        }
    };
    let name = format!("{}_{}", period.adjective(), kind.as_str());
    html! {
        tr data-cap=(name) {
            th scope="row" { (name) }
            td.n data-field="spent" { (show(spent)) }
            td.n { (show(reserved)) }
            td.n data-field="limit" { @match limit { Some(l) => (show(l)), None => "none" } }
            td {
                @if let Some(limit) = limit.filter(|l| *l > 0) {
                    @let share = spent as f64 / limit as f64;
                    meter min="0" max="1" low="0.8" high="0.99" optimum="0" value=(format!("{:.3}", share.min(1.0)))
                        aria-label=(format!("{name}: {}", layout::percent(share))) {}
                    " " (layout::percent(share))
                } @else { "no cap" }
            }
        }
    }
}

fn describe(caps: &Caps) -> String {
    let set: Vec<String> = caps
        .set()
        .map(|(kind, limit)| match kind {
            CapKind::Cost => format!("{} USD", layout::usd(limit).replace('$', "")),
            _ => format!("{limit} {}", kind.as_str()),
        })
        .collect();
    if set.is_empty() {
        "no limit".into()
    } else {
        set.join(", ")
    }
}
