//! Providers: each breaker and its recent calls on this replica (the same
//! figures as GetProviderHealth), and its last active probe.

use super::super::{Console, Viewer, error::ConsoleError, layout, respond};
use super::overview::state_name;
use axum::{extract::State, response::Response};
use maud::html;

/// GET `/console/providers`.
pub(crate) async fn show(
    State(console): State<Console>,
    viewer: Viewer,
) -> Result<Response, ConsoleError> {
    let config = console.pipeline.config();
    let resilience = console.pipeline.router().resilience();
    let ms = |d: Option<std::time::Duration>| {
        d.map_or("–".to_owned(), |d| format!("{} ms", d.as_millis()))
    };
    let body = html! {
        p { "Breakers and recent calls as this replica sees them." }
        table id="providers" {
            caption { "Providers" }
            thead { tr {
                th scope="col" { "Provider" } th scope="col" { "Kind" } th scope="col" { "Breaker" }
                th.n scope="col" { "Failures in a row" } th.n scope="col" { "Recent calls" }
                th.n scope="col" { "Error rate" } th.n scope="col" { "p50" } th.n scope="col" { "p99" }
                th scope="col" { "Recent errors" } th scope="col" { "Last probe" }
            } }
            tbody {
                @for (name, p) in &config.providers {
                    @if let Some(g) = resilience.get(name) {
                        @let b = g.breaker.snapshot();
                        @let h = g.health.snapshot();
                        tr data-provider=(name) {
                            th scope="row" { (name) }
                            td { (p.kind.as_str()) }
                            td data-field="state" class=(format!("state-{}", state_name(b.state))) { (state_name(b.state)) }
                            td.n { (b.consecutive_failures) }
                            td.n data-field="calls" { (h.calls) }
                            td.n data-field="error-rate" { (layout::percent(h.error_rate)) }
                            td.n { (ms(h.p50)) }
                            td.n { (ms(h.p99)) }
                            td {
                                (h.errors) " failed"
                                @if h.connection_errors > 0 { ", " (h.connection_errors) " connection" }
                                @if h.deadline_exceeded > 0 { ", " (h.deadline_exceeded) " past deadline" }
                                @if h.cancelled > 0 { ", " (h.cancelled) " cancelled" }
                                @if h.resent > 0 { ", " (h.resent) " resent" }
                            }
                            td {
                                @match g.probe.last() {
                                    Some(probe) if probe.ok() => { span.good { "ok" } " " (probe.latency.as_millis()) " ms" },
                                    Some(probe) => { span.bad { (probe.error_code.clone().unwrap_or_else(|| "failed".into())) } },
                                    None => { "none" },
                                }
                            }
                        }
                    }
                }
            }
        }
    };
    Ok(respond(
        &viewer,
        layout::page("Providers", Some(&viewer), body),
    ))
}
