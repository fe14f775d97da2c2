//! The page shell every console page shares: the skip link, the navigation
//! (the current page marked for screen readers), one `h1`, and the team
//! picker; plus the number formats the pages show.

use super::Viewer;
use maud::{DOCTYPE, Markup, html};

/// The console's pages in navigation order: path and name.
const PAGES: [(&str, &str); 7] = [
    ("/console", "Overview"),
    ("/console/usage", "Usage"),
    ("/console/teams", "Teams"),
    ("/console/providers", "Providers"),
    ("/console/calls", "Calls"),
    ("/console/tools", "Tools"),
    ("/console/audit", "Audit"),
];

/// A whole page: `title` is its `h1` and names its navigation entry.
pub(super) fn page(title: &str, viewer: Option<&Viewer>, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · ai-orchestrator console" }
                link rel="stylesheet" href="/console/assets/console.css";
            }
            body {
                a.skip href="#main" { "Skip to content" }
                header {
                    p.brand { "ai-orchestrator" }
                    @if let Some(viewer) = viewer {
                        nav aria-label="Console" {
                            ul {
                                @for (path, name) in PAGES {
                                    li {
                                        @if name == title {
                                            a href=(path) aria-current="page" { (name) }
                                        } @else {
                                            a href=(path) { (name) }
                                        }
                                    }
                                }
                            }
                        }
                        form.logout method="post" action="/console/logout" {
                            input type="hidden" name="csrf" value=(viewer.csrf);
                            span { "Signed in as " strong { (viewer.session.principal.name) } }
                            " "
                            button type="submit" { "Sign out" }
                        }
                    }
                }
                main id="main" tabindex="-1" {
                    h1 { (title) }
                    (body)
                }
            }
        }
    }
}

/// The team picker: a labelled select of the teams `viewer` may see.
pub(super) fn team_picker(action: &str, teams: &[String], chosen: &str, extra: Markup) -> Markup {
    html! {
        form.picker method="get" action=(action) {
            label for="team" { "Team" }
            select id="team" name="team" {
                @for team in teams {
                    option value=(team) selected[team == chosen] { (team) }
                }
            }
            (extra)
            button type="submit" { "Show" }
        }
    }
}

/// A message in place of a page's figures (no team, nothing yet).
pub(super) fn empty(text: &str) -> Markup {
    html! { p.empty { (text) } }
}

/// Micro-USD as dollars, to the micro-dollar: exact, as GetUsage sums.
pub(super) fn usd(micros: i64) -> String {
    let sign = if micros < 0 { "-" } else { "" };
    let m = micros.unsigned_abs();
    format!("{sign}${}.{:06}", m / 1_000_000, m % 1_000_000)
}

/// A rate in `[0, 1]` as a percentage with one decimal.
pub(super) fn percent(rate: f64) -> String {
    format!("{:.1} %", rate * 100.0)
}

/// Unix ms as UTC date and time, to the second.
pub(super) fn when(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .map(|t| t.format("%Y-%m-%d %H:%M:%S UTC").to_string())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn money_is_exact_to_the_micro_dollar() {
        assert_eq!(usd(0), "$0.000000");
        assert_eq!(usd(1_234_567), "$1.234567");
        assert_eq!(usd(-5), "-$0.000005");
        assert_eq!(usd(i64::MIN), "-$9223372036854.775808");
    }
}
