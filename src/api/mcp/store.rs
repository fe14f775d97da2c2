//! The MCP endpoint's sessions in the cluster store, as rmcp's
//! `SessionStore`: a session opened on one replica is restored by any
//! other (rmcp replays the client's `initialize` there), so a Kubernetes
//! Service may send a client's requests anywhere. ADR 0025 says why a
//! shared store rather than signed session IDs.
//!
//! While the store is down a session is unknown elsewhere (404: the client
//! opens a new one, as the spec has it) and a new one is kept only where
//! it was opened.

use crate::cluster::Cluster;
use rmcp::transport::streamable_http_server::session::{
    SessionState, SessionStore, SessionStoreError,
};

/// rmcp's session store over the cluster store.
pub struct SharedSessions {
    cluster: Cluster,
}

impl SharedSessions {
    /// Sessions kept in `cluster`.
    pub fn new(cluster: Cluster) -> Self {
        Self { cluster }
    }
}

#[async_trait::async_trait]
impl SessionStore for SharedSessions {
    async fn load(&self, session_id: &str) -> Result<Option<SessionState>, SessionStoreError> {
        // Down, or a record that no longer parses: unknown, and the client
        // starts again.
        let Ok(Some(record)) = self.cluster.load_session(session_id).await else {
            return Ok(None);
        };
        Ok(serde_json::from_str(&record).ok())
    }

    async fn store(&self, session_id: &str, state: &SessionState) -> Result<(), SessionStoreError> {
        let record = serde_json::to_string(state)?;
        self.cluster
            .store_session(session_id, &record)
            .await
            .map_err(Into::into)
    }

    async fn delete(&self, session_id: &str) -> Result<(), SessionStoreError> {
        self.cluster
            .delete_session(session_id)
            .await
            .map_err(Into::into)
    }
}
