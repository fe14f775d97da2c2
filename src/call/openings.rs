//! `breaker.opened` (SPEC §16): each opening of a provider's circuit
//! breaker on this replica becomes an audit event on the global chain
//! (team ''), whose outbox rows start the triggers following it. Breakers
//! are per replica, so each replica's opening is its own event.

use super::Pipeline;
use crate::{
    audit::{AuditEvent, Category},
    router::Opened,
    usage::ledger::Op,
};
use tokio::sync::watch;

/// Openings waiting to be audited, at most; a storm of more is logged only.
const BACKLOG: usize = 256;
/// How long the shutdown waits to audit the openings still queued.
const DRAIN_WITHIN: std::time::Duration = std::time::Duration::from_secs(5);

/// Audits every breaker opening until `stop`; returns at once when the
/// openings are told elsewhere already.
pub async fn run(pipeline: Pipeline, mut stop: watch::Receiver<bool>) {
    let Some(mut openings) = pipeline.router().watch_openings(BACKLOG) else {
        tracing::warn!("breaker openings are watched twice: not audited here");
        return;
    };
    loop {
        let opened = tokio::select! {
            opened = openings.recv() => opened,
            _ = stop.wait_for(|s| *s) => None,
        };
        match opened {
            Some(opened) => audit(&pipeline, &opened).await,
            None => break,
        }
    }
    // What opened before the stop is still audited: in one write, and not
    // waited for past DRAIN_WITHIN when the store is slow.
    let mut left = Vec::new();
    while let Ok(opened) = openings.try_recv() {
        left.push(event(&opened));
    }
    if !left.is_empty() {
        let write = pipeline.ledger().submit(Op::Audit(left));
        match tokio::time::timeout(DRAIN_WITHIN, write).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => {
                tracing::error!(error = %e, "auditing breaker openings at shutdown failed")
            }
            Err(_) => tracing::error!("auditing breaker openings at shutdown timed out"),
        }
    }
}

async fn audit(pipeline: &Pipeline, opened: &Opened) {
    let event = event(opened);
    if let Err(e) = pipeline.ledger().submit(Op::Audit(vec![event])).await {
        tracing::error!(provider = %opened.provider, error = %e, "auditing a breaker opening failed");
    }
}

/// `breaker.opened` on provider `subject`, reason `BREAKER_OPENED consecutive_failures=<n>`.
fn event(opened: &Opened) -> AuditEvent {
    AuditEvent::new(
        "",
        "system:resilience",
        "",
        Category::Provider,
        "breaker.opened",
        &opened.provider,
    )
    .decided(
        "error",
        &format!(
            "BREAKER_OPENED consecutive_failures={}",
            opened.consecutive_failures
        ),
    )
}
