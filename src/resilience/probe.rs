//! A provider's last active probe (SPEC §18), for `GetProviderHealth` and `/health/providers`.
//! Never fed to the breaker or the call statistics, which describe real calls only.

use std::{
    sync::{Arc, Mutex, PoisonError},
    time::{Duration, SystemTime},
};

/// One probe's outcome.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeResult {
    /// When it ended (wall clock, for display).
    pub at: SystemTime,
    /// Time from sending to the answer, or to the failure.
    pub latency: Duration,
    /// `None` for a 2xx with a well-formed body, else the error code (`TIMEOUT`, `HTTP_503`, …).
    pub error_code: Option<String>,
}

impl ProbeResult {
    /// Whether the provider answered the probe.
    pub fn ok(&self) -> bool {
        self.error_code.is_none()
    }
}

/// The latest probe of one provider. Cheap to clone; clones share state.
#[derive(Debug, Clone, Default)]
pub struct ProbeState {
    last: Arc<Mutex<Option<ProbeResult>>>,
}

impl ProbeState {
    /// Keeps `result` as the latest; returns the one it replaces.
    pub fn record(&self, result: ProbeResult) -> Option<ProbeResult> {
        let mut last = self.last.lock().unwrap_or_else(PoisonError::into_inner);
        last.replace(result)
    }

    /// The latest probe; `None` before the first ends (or without probes).
    pub fn last(&self) -> Option<ProbeResult> {
        self.last
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}
