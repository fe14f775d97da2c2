//! The server's background work: the orphan sweeper, API key reloads, the
//! database probe behind the health service.

use super::{Health, SERVICE_NAMES};
use crate::{
    auth::{Authenticator, keys::KeyStore},
    config::Config,
    store::Store,
    usage::sweeper,
};
use std::{sync::Arc, time::Duration};
use tokio::sync::watch;
use tonic_health::ServingStatus;

/// Charges orphaned reservations. On SQLite at start-up every open
/// reservation is an orphan (the file has one owner); otherwise only those
/// older than `metering.sweep_after`.
pub(super) async fn sweep_orphans(
    store: &Store,
    config: &Config,
    at_startup: bool,
) -> Result<u64, crate::store::StoreError> {
    let now = chrono::Utc::now().timestamp_millis();
    let cutoff = if at_startup && matches!(store, Store::Sqlite(_)) {
        i64::MAX
    } else {
        now - i64::try_from(config.metering.sweep_after.as_millis()).unwrap_or(i64::MAX)
    };
    sweeper::sweep(store, cutoff).await
}

pub(super) async fn sweep_periodically(
    store: Store,
    config: Arc<Config>,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        tokio::select! {
            _ = stop.wait_for(|s| *s) => return,
            () = tokio::time::sleep(config.metering.sweep_interval) => {}
        }
        match sweep_orphans(&store, &config, false).await {
            Ok(0) => {}
            Ok(swept) => tracing::warn!(swept, "charged orphaned reservations at their estimate"),
            Err(e) => tracing::error!(error = %e, "sweeping orphaned reservations failed"),
        }
    }
}

/// How often expired conversations are looked for.
const CONVERSATION_SWEEP_INTERVAL: Duration = Duration::from_secs(600);

/// Erases conversations whose retention ran out (`agents.*.retention_days`
/// after their last turn), at start and every ten minutes.
pub(super) async fn sweep_conversations_periodically(
    store: Store,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        loop {
            let now = chrono::Utc::now().timestamp_millis();
            match crate::agent::conversations::sweep(&store, now).await {
                Ok(0) => break,
                Ok(erased) => tracing::info!(erased, "erased expired conversations"),
                Err(e) => {
                    tracing::error!(error = %e, "erasing expired conversations failed");
                    break;
                }
            }
        }
        tokio::select! {
            _ = stop.wait_for(|s| *s) => return,
            () = tokio::time::sleep(CONVERSATION_SWEEP_INTERVAL) => {}
        }
    }
}

/// Reloads API keys, so created and revoked keys reach every replica.
pub(super) async fn refresh_keys_periodically(
    auth: Authenticator,
    keys: KeyStore,
    interval: Duration,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        tokio::select! {
            _ = stop.wait_for(|s| *s) => return,
            () = tokio::time::sleep(interval) => {}
        }
        // On failure the last loaded keys stay in force.
        if let Err(e) = auth.refresh(&keys).await {
            tracing::error!(error = %e, "reloading API keys failed");
        }
    }
}

pub(super) async fn set_health(health: &Health, status: ServingStatus) {
    // One database behind every service: they turn together, the main one
    // and the overall status last, so their watchers see the rest turned.
    for service in SERVICE_NAMES.iter().rev() {
        health.reporter.set_service_status(service, status).await;
    }
    health.reporter.set_service_status("", status).await;
    let _ = health.ready.send(status == ServingStatus::Serving);
}

/// Keeps health in step with the database: NOT_SERVING while unreachable.
pub(super) async fn probe_database(
    store: Store,
    health: Health,
    interval: Duration,
    mut stop: watch::Receiver<bool>,
) {
    let mut serving = true;
    loop {
        tokio::select! {
            _ = stop.wait_for(|s| *s) => return,
            () = tokio::time::sleep(interval) => {}
        }
        let ok = store.ping(interval.max(Duration::from_millis(500))).await;
        if ok != serving && !*stop.borrow() {
            serving = ok;
            if ok {
                tracing::info!("database reachable again: SERVING");
                set_health(&health, ServingStatus::Serving).await;
            } else {
                tracing::error!("database unreachable: NOT_SERVING");
                set_health(&health, ServingStatus::NotServing).await;
            }
        }
    }
}
