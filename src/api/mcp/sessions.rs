//! The MCP endpoint's sessions, at most `mcp_endpoint.max_sessions` at a time.
//!
//! rmcp's in-memory manager keeps a session (a task and its channels) until closed or idle
//! for 5 minutes, with no cap: a client opening sessions without end would hold memory for
//! each. This wraps it and refuses a session past the cap, one creation at a time.
//!
//! rmcp answers a failed creation with a 500 logged as an error, so while the cap is reached
//! the middleware refuses an `initialize` itself with a 503 ([`Sessions::full`]). The loser
//! of a race for the last place is noted in [`REFUSED`] ([`noting_refusals`]), also a 503.

use futures::Stream;
use rmcp::{
    model::{ClientJsonRpcMessage, ServerJsonRpcMessage},
    transport::streamable_http_server::{
        SessionManager,
        session::{
            EventStore, RestoreOutcome, ServerSseMessage, SessionId,
            local::{LocalSessionManager, LocalSessionManagerError},
        },
    },
};
use std::{cell::Cell, future::Future};
use tokio::sync::Mutex;

tokio::task_local! {
    /// Set when this request's session was refused for the cap.
    static REFUSED: Cell<bool>;
}

/// Runs `request` (a request's handling by rmcp), and says whether it was
/// refused a session for the cap.
pub async fn noting_refusals<T>(request: impl Future<Output = T>) -> (T, bool) {
    REFUSED
        .scope(Cell::new(false), async {
            let answer = request.await;
            (answer, REFUSED.with(Cell::get))
        })
        .await
}

/// rmcp's in-memory sessions, capped.
pub struct Sessions {
    inner: LocalSessionManager,
    max: usize,
    /// Held across the count and the insert of a new session.
    creating: Mutex<()>,
}

/// Why a session operation failed.
#[derive(Debug, thiserror::Error)]
pub enum SessionsError {
    /// The cap is reached; a session must end before another starts.
    #[error("the MCP endpoint holds its maximum of {0} sessions")]
    Full(usize),
    #[error(transparent)]
    Local(#[from] LocalSessionManagerError),
}

impl Sessions {
    /// At most `max` sessions at once.
    pub fn new(max: usize) -> Self {
        Self {
            inner: LocalSessionManager::default(),
            max,
            creating: Mutex::new(()),
        }
    }

    /// Whether a new session would be refused now.
    pub async fn full(&self) -> bool {
        self.inner.sessions.read().await.len() >= self.max
    }
}

impl SessionManager for Sessions {
    type Error = SessionsError;
    type Transport = <LocalSessionManager as SessionManager>::Transport;

    async fn create_session(&self) -> Result<(SessionId, Self::Transport), Self::Error> {
        let _one_at_a_time = self.creating.lock().await;
        if self.full().await {
            let _ = REFUSED.try_with(|refused| refused.set(true));
            return Err(SessionsError::Full(self.max));
        }
        Ok(self.inner.create_session().await?)
    }

    async fn initialize_session(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<ServerJsonRpcMessage, Self::Error> {
        Ok(self.inner.initialize_session(id, message).await?)
    }

    async fn has_session(&self, id: &SessionId) -> Result<bool, Self::Error> {
        Ok(self.inner.has_session(id).await?)
    }

    async fn close_session(&self, id: &SessionId) -> Result<(), Self::Error> {
        Ok(self.inner.close_session(id).await?)
    }

    async fn create_stream(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        Ok(self.inner.create_stream(id, message).await?)
    }

    async fn accept_message(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<(), Self::Error> {
        Ok(self.inner.accept_message(id, message).await?)
    }

    async fn create_standalone_stream(
        &self,
        id: &SessionId,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        Ok(self.inner.create_standalone_stream(id).await?)
    }

    async fn resume(
        &self,
        id: &SessionId,
        last_event_id: String,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        Ok(self.inner.resume(id, last_event_id).await?)
    }

    /// A session another replica opened, re-created here from the cluster store (rmcp then
    /// replays its `initialize`), under the same cap as a new one.
    async fn restore_session(
        &self,
        id: SessionId,
    ) -> Result<RestoreOutcome<Self::Transport>, Self::Error> {
        let _one_at_a_time = self.creating.lock().await;
        if self.full().await {
            let _ = REFUSED.try_with(|refused| refused.set(true));
            return Err(SessionsError::Full(self.max));
        }
        Ok(self.inner.restore_session(id).await?)
    }

    fn event_store(&self) -> Option<std::sync::Arc<dyn EventStore>> {
        self.inner.event_store()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The manager's own check, for two `initialize`s racing past the
    /// middleware's: the loser is refused and noted for the 503.
    #[tokio::test]
    async fn a_session_past_the_cap_is_refused_and_noted() {
        let sessions = Sessions::new(1);
        let (first, refused) = noting_refusals(sessions.create_session()).await;
        assert!(first.is_ok() && !refused);
        assert!(sessions.full().await);
        let (second, refused) = noting_refusals(sessions.create_session()).await;
        assert!(
            matches!(second, Err(SessionsError::Full(1))),
            "{:?}",
            second.as_ref().err()
        );
        assert!(refused);
        // Outside a request's scope a refusal is still an error, unnoted.
        assert!(matches!(
            sessions.create_session().await,
            Err(SessionsError::Full(1))
        ));
        // Once the session closes there is room again.
        let (id, _transport) = first.unwrap();
        sessions.close_session(&id).await.unwrap();
        assert!(!sessions.full().await);
    }
}
