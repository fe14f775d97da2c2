//! Usage: one team's month grouped by task, provider, model, user or day,
//! the same sums as GetUsage, with a chart and a CSV export.

use super::super::{Console, QueryOf, Viewer, chart, error::ConsoleError, layout, respond};
use crate::usage::summary::{self, BucketKey, Dimension, Summary, Totals};
use axum::{
    extract::State,
    http::header,
    response::{IntoResponse, Response},
};
use chrono::{NaiveDate, TimeZone, Utc};
use maud::{Markup, html};
use serde::Deserialize;

/// The page's query.
#[derive(Deserialize, Default)]
pub(crate) struct Params {
    team: Option<String>,
    /// `YYYY-MM`, the current UTC month when absent.
    month: Option<String>,
    /// `day` (default), `task`, `provider`, `model` or `user`.
    by: Option<String>,
}

const GROUPS: [(&str, &str, Dimension); 5] = [
    ("day", "Day", Dimension::Day),
    ("task", "Task", Dimension::Task),
    ("provider", "Provider", Dimension::Provider),
    ("model", "Model", Dimension::Model),
    ("user", "User", Dimension::User),
];

/// What the query asks for, checked.
struct Asked {
    team: Option<String>,
    teams: Vec<String>,
    month: String,
    start_ms: i64,
    end_ms: i64,
    by: (&'static str, &'static str, Dimension),
}

async fn asked(console: &Console, viewer: &Viewer, p: &Params) -> Result<Asked, ConsoleError> {
    let mut teams = super::visible_teams(console, viewer).await?;
    let team = super::chosen(p.team.as_deref(), &mut teams, viewer)?;
    let by = match p.by.as_deref().filter(|b| !b.is_empty()) {
        None => GROUPS[0],
        Some(b) => *GROUPS.iter().find(|g| g.0 == b).ok_or_else(|| {
            ConsoleError::invalid("by", "must be day, task, provider, model or user")
        })?,
    };
    let (start_ms, end_ms) = match p.month.as_deref().filter(|m| !m.is_empty()) {
        None => summary::month_of(Utc::now()),
        Some(m) => NaiveDate::parse_from_str(&format!("{m}-01"), "%Y-%m-%d")
            .ok()
            .and_then(|d| {
                Utc.from_utc_datetime(&d.and_hms_opt(0, 0, 0)?)
                    .timestamp_millis()
                    .into()
            })
            .and_then(summary::month_of_ms)
            .ok_or_else(|| ConsoleError::invalid("month", "must be a month as YYYY-MM"))?,
    };
    let month = chrono::DateTime::from_timestamp_millis(start_ms)
        .map(|t| t.format("%Y-%m").to_string())
        .unwrap_or_default();
    Ok(Asked {
        team,
        teams,
        month,
        start_ms,
        end_ms,
        by,
    })
}

async fn sums(console: &Console, a: &Asked, team: &str) -> Result<Summary, ConsoleError> {
    Ok(summary::summarize(
        console.pipeline.store(),
        team,
        a.start_ms,
        a.end_ms,
        &[a.by.2],
    )
    .await?)
}

/// GET `/console/usage`.
pub(crate) async fn show(
    State(console): State<Console>,
    viewer: Viewer,
    QueryOf(p): QueryOf<Params>,
) -> Result<Response, ConsoleError> {
    let a = asked(&console, &viewer, &p).await?;
    let Some(team) = a.team.clone() else {
        let body = layout::empty("No team has usage this month yet.");
        return Ok(respond(&viewer, layout::page("Usage", Some(&viewer), body)));
    };
    let s = sums(&console, &a, &team).await?;
    let extra = html! {
        label for="month" { "Month" }
        input id="month" name="month" type="month" value=(a.month);
        label for="by" { "Group by" }
        select id="by" name="by" {
            @for (value, name, _) in GROUPS {
                option value=(value) selected[value == a.by.0] { (name) }
            }
        }
    };
    let csv = format!(
        "/console/usage.csv?team={team}&month={}&by={}",
        a.month, a.by.0
    );
    let rows: Vec<_> = s
        .buckets
        .iter()
        .map(|(k, t)| (group(k), t.requests as f64, t.requests.to_string()))
        .collect();
    let body = html! {
        (layout::team_picker("/console/usage", &a.teams, &team, extra))
        h2 { "Totals for " (team) ", " (a.month) }
        (totals(&s.totals))
        h2 { "By " (a.by.1.to_lowercase()) }
        p { a id="csv" href=(csv) download { "Download as CSV" } }
        (chart::bars("usage-chart", &format!("Requests by {}", a.by.1.to_lowercase()), &rows))
        (table(a.by.1, &s))
    };
    Ok(respond(&viewer, layout::page("Usage", Some(&viewer), body)))
}

fn totals(t: &Totals) -> Markup {
    let item = |id: &str, label: &str, value: String| html! { div { dt { (label) } dd id=(id) { (value) } } };
    html! {
        dl.figures {
            (item("total-requests", "Requests", t.requests.to_string()))
            (item("total-input-tokens", "Input tokens", t.input_tokens.to_string()))
            (item("total-output-tokens", "Output tokens", t.output_tokens.to_string()))
            (item("total-cost", "Cost", layout::usd(t.cost_micros)))
            (item("total-errors", "Errors", t.errors.to_string()))
            (item("total-degraded", "Served by a fallback", t.degraded.to_string()))
        }
    }
}

fn table(by: &str, s: &Summary) -> Markup {
    html! {
        table id="usage-table" {
            caption { "Usage by " (by.to_lowercase()) }
            thead { tr {
                th scope="col" { (by) }
                th.n scope="col" { "Requests" } th.n scope="col" { "Input tokens" }
                th.n scope="col" { "Output tokens" } th.n scope="col" { "Cost" }
                th.n scope="col" { "Errors" } th.n scope="col" { "p50 ms" } th.n scope="col" { "p95 ms" }
            } }
            tbody {
                @for (k, t) in &s.buckets {
                    tr {
                        th scope="row" { (group(k)) }
                        td.n { (t.requests) } td.n { (t.input_tokens) } td.n { (t.output_tokens) }
                        td.n { (layout::usd(t.cost_micros)) } td.n { (t.errors) }
                        td.n { (t.latency_p50_ms) } td.n { (t.latency_p95_ms) }
                    }
                }
            }
        }
    }
}

/// A group's value (the one dimension asked for).
fn value(k: &BucketKey) -> String {
    [&k.day, &k.task, &k.provider, &k.model, &k.user]
        .into_iter()
        .find_map(|v| v.clone())
        .unwrap_or_default()
}

/// A group's name on the page ('' shows as "(none)": a call naming no user).
fn group(k: &BucketKey) -> String {
    let value = value(k);
    if value.is_empty() {
        "(none)".into()
    } else {
        value
    }
}

/// GET `/console/usage.csv`: the page's table as CSV.
pub(crate) async fn csv(
    State(console): State<Console>,
    viewer: Viewer,
    QueryOf(p): QueryOf<Params>,
) -> Result<Response, ConsoleError> {
    let a = asked(&console, &viewer, &p).await?;
    let team = a
        .team
        .clone()
        .ok_or_else(|| ConsoleError::invalid("team", "is required"))?;
    let s = sums(&console, &a, &team).await?;
    let mut out = format!(
        "team,month,{},requests,input_tokens,output_tokens,cost_usd,errors,degraded,unpriced,latency_p50_ms,latency_p95_ms\r\n",
        a.by.0
    );
    for (k, t) in &s.buckets {
        let value = value(k);
        let cost = layout::usd(t.cost_micros).replace('$', "");
        out.push_str(&format!(
            "{},{},{},{},{},{},{cost},{},{},{},{},{}\r\n",
            field(&team),
            a.month,
            field(&value),
            t.requests,
            t.input_tokens,
            t.output_tokens,
            t.errors,
            t.degraded,
            t.unpriced,
            t.latency_p50_ms,
            t.latency_p95_ms
        ));
    }
    // A team picked by default comes from the database: kept to safe characters.
    let safe: String = team
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '_'
            }
        })
        .collect();
    let name = format!(
        "attachment; filename=\"usage-{safe}-{}-by-{}.csv\"",
        a.month, a.by.0
    );
    Ok((
        [
            (header::CONTENT_TYPE, "text/csv; charset=utf-8".to_owned()),
            (header::CONTENT_DISPOSITION, name),
            (header::CACHE_CONTROL, "no-store".to_owned()),
        ],
        out,
    )
        .into_response())
}

/// A CSV field (RFC 4180 quoting). Task, model and user names come from
/// callers: one starting like a formula is prefixed with `'` so a
/// spreadsheet shows it rather than running it.
fn field(value: &str) -> String {
    let value = if value.starts_with(['=', '+', '-', '@', '\t', '\r']) {
        format!("'{value}")
    } else {
        value.to_owned()
    };
    if value.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", value.replace('"', "\"\""))
    } else {
        value
    }
}

#[cfg(test)]
mod tests {
    use super::field;

    #[test]
    fn csv_fields_are_quoted_and_never_formulas() {
        assert_eq!(field("sms_classify"), "sms_classify");
        assert_eq!(field("a,b"), "\"a,b\"");
        assert_eq!(field("say \"hi\""), "\"say \"\"hi\"\"\"");
        assert_eq!(field("=HYPERLINK(1)"), "'=HYPERLINK(1)");
        assert_eq!(field("-1,2"), "\"'-1,2\"");
    }
}
