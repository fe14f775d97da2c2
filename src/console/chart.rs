//! Charts drawn on the server as inline SVG: no script and nothing fetched,
//! so they work under the console's strict content policy. Each chart has
//! a title and a description for screen readers; the table beside it holds
//! the same figures.

use maud::{Markup, html};

/// Bar width room, in SVG units.
const WIDTH: f64 = 640.0;
/// The label column's width.
const LABEL: f64 = 170.0;
/// One bar's row height.
const ROW: f64 = 22.0;
/// Most bars drawn; the table lists the rest.
pub(super) const MAX_BARS: usize = 40;

/// A horizontal bar chart of `(label, value, shown)`, `id` naming it.
pub(super) fn bars(id: &str, title: &str, rows: &[(String, f64, String)]) -> Markup {
    let rows = &rows[..rows.len().min(MAX_BARS)];
    let max = rows.iter().map(|r| r.1).fold(0.0_f64, f64::max);
    let height = ROW * rows.len().max(1) as f64 + 8.0;
    let room = WIDTH - LABEL - 120.0;
    let title_id = format!("{id}-title");
    html! {
        figure.chart {
            svg id=(id) role="img" aria-labelledby=(title_id) width=(WIDTH) height=(height)
                viewBox=(format!("0 0 {WIDTH} {height}")) xmlns="http://www.w3.org/2000/svg" {
                title id=(title_id) { (title) }
                @if rows.is_empty() {
                    text x="4" y="18" fill="#555" { "No data" }
                }
                @for (i, (label, value, shown)) in rows.iter().enumerate() {
                    @let y = ROW * i as f64 + 4.0;
                    @let w = if max > 0.0 { (value / max * room).max(1.0) } else { 1.0 };
                    text x=(LABEL - 6.0) y=(y + 14.0) text-anchor="end" fill="#222" font-size="12" {
                        (truncate(label))
                    }
                    rect x=(LABEL) y=(y + 2.0) width=(format!("{w:.1}")) height=(ROW - 6.0) fill="#2f6fb0" {}
                    text x=(LABEL + w + 6.0) y=(y + 14.0) fill="#222" font-size="12" { (shown) }
                }
            }
            figcaption { (title) }
        }
    }
}

fn truncate(label: &str) -> String {
    if label.chars().count() <= 24 {
        return label.to_owned();
    }
    let head: String = label.chars().take(23).collect();
    format!("{head}…")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bars_scale_to_the_largest_and_escape_labels() {
        let rows = vec![
            ("<b>".to_owned(), 2.0, "2".to_owned()),
            ("b".to_owned(), 1.0, "1".to_owned()),
        ];
        let svg = bars("c", "Requests", &rows).into_string();
        assert!(svg.contains("&lt;b&gt;") && !svg.contains("<b>"));
        assert!(svg.contains(r#"width="350.0""#) && svg.contains(r#"width="175.0""#));
        assert!(bars("c", "t", &[]).into_string().contains("No data"));
    }
}
