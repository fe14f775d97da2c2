//! A request's headers as either edge carries them: gRPC metadata or HTTP
//! headers. Authentication and trace IDs read both through [`Headers`].

/// Text headers by name.
pub trait Headers {
    /// The value of `name`: `None` when absent, `Some(Err(()))` when not visible ASCII.
    fn text(&self, name: &str) -> Option<Result<&str, ()>>;
}

impl Headers for http::HeaderMap {
    fn text(&self, name: &str) -> Option<Result<&str, ()>> {
        self.get(name).map(|v| v.to_str().map_err(|_| ()))
    }
}

impl Headers for tonic::metadata::MetadataMap {
    fn text(&self, name: &str) -> Option<Result<&str, ()>> {
        self.get(name).map(|v| v.to_str().map_err(|_| ()))
    }
}
