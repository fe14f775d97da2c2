//! A request's headers as either edge carries them: gRPC metadata (`api`)
//! or HTTP headers (`web`), each edge implementing [`Headers`] for its
//! type. Authentication and trace IDs read both through it.

/// Text headers by name.
pub trait Headers {
    /// The value of `name`: `None` when absent, `Some(Err(()))` when not visible ASCII.
    fn text(&self, name: &str) -> Option<Result<&str, ()>>;
}
