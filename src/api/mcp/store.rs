//! The MCP endpoint's sessions in the cluster store (rmcp's `SessionStore`): a session
//! opened on one replica is restored on any other, so a Kubernetes Service may route a
//! client's requests anywhere (ADR 0025: why not signed session IDs). While the store is
//! down, sessions stay where they were opened (elsewhere a 404: the client opens another).

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
        // Down, or a record that no longer parses: unknown, so the client starts again.
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
