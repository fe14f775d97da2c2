//! One module per console page; each handler reads its query, asks the
//! services, and renders through `layout`.

pub(super) mod audit;
pub(super) mod calls;
pub(super) mod login;
pub(super) mod overview;
pub(super) mod providers;
pub(super) mod teams;
pub(super) mod tools;
pub(super) mod usage;

use super::{Console, Viewer, error::ConsoleError, layout, respond};
use crate::{auth::TeamScope, usage::record};
use axum::response::Response;

/// Most teams a page lists (a key of every team sees those with usage this month).
pub(super) const MAX_TEAMS: i64 = 500;
const DAY_MS: i64 = 86_400_000;
/// Longest ID a query may name.
const MAX_ID: usize = 128;

/// The teams `viewer` may see: its key's own, or for a key of every team,
/// those with usage this month.
async fn visible_teams(console: &Console, viewer: &Viewer) -> Result<Vec<String>, ConsoleError> {
    Ok(match &viewer.session.principal.teams {
        TeamScope::Only(set) => set.iter().cloned().collect(),
        TeamScope::All => {
            // Since yesterday at least: the last hour of the 1st of the month
            // still covers the teams of the month before.
            let now = chrono::Utc::now();
            let (month_start, _) = crate::usage::summary::month_of(now);
            let since = month_start.min(now.timestamp_millis() - DAY_MS);
            record::active_teams(
                console.pipeline.store(),
                since.div_euclid(DAY_MS),
                MAX_TEAMS,
            )
            .await?
        }
    })
}

/// The team a page shows: `requested` when the viewer may see it (added to
/// `teams` if it had no usage yet), else the first visible team.
fn chosen(
    requested: Option<&str>,
    teams: &mut Vec<String>,
    viewer: &Viewer,
) -> Result<Option<String>, ConsoleError> {
    match requested.filter(|t| !t.is_empty()) {
        Some(team) => {
            check_id("team", team)?;
            if !viewer.may_see(team) {
                return Err(ConsoleError::TeamForbidden(team.to_owned()));
            }
            if !teams.iter().any(|t| t == team) {
                teams.push(team.to_owned());
                teams.sort();
            }
            Ok(Some(team.to_owned()))
        }
        None => Ok(teams.first().cloned()),
    }
}

/// The teams a page offers and the one it shows ([`chosen`]); the page
/// titled `title` saying there is none yet when no team has usage.
async fn team_page(
    console: &Console,
    viewer: &Viewer,
    requested: Option<&str>,
    title: &str,
) -> Result<Result<(Vec<String>, String), Response>, ConsoleError> {
    let mut teams = visible_teams(console, viewer).await?;
    Ok(match chosen(requested, &mut teams, viewer)? {
        Some(team) => Ok((teams, team)),
        None => {
            let body = layout::empty("No team has usage this month yet.");
            Err(respond(viewer, layout::page(title, Some(viewer), body)))
        }
    })
}

/// IDs from a query end up in SQL and on the page: keep them boring, as the
/// gRPC edge does.
fn check_id(field: &'static str, id: &str) -> Result<(), ConsoleError> {
    if id.len() > MAX_ID {
        return Err(ConsoleError::invalid(
            field,
            "must be at most 128 characters",
        ));
    }
    let allowed =
        |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b':' | b'@');
    if !id.bytes().all(allowed) {
        return Err(ConsoleError::invalid(
            field,
            "may only contain letters, digits and - _ . : @",
        ));
    }
    Ok(())
}
