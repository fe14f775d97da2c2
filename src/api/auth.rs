//! The gRPC face of authentication: an interceptor putting the caller's [`Principal`] in
//! the request extensions, and the checks handlers make against it.

use super::error::{Failure, to_status};
use crate::{
    auth::{Authenticator, Principal},
    telemetry::trace_id,
};
use tonic::{Request, Status, metadata::MetadataMap, service::Interceptor};

/// Authenticates every call of the service it wraps (health checks and
/// reflection are not wrapped, so probes need no key).
#[derive(Clone, Debug)]
pub struct AuthInterceptor {
    auth: Authenticator,
}

impl AuthInterceptor {
    /// Over the shared authenticator.
    pub fn new(auth: Authenticator) -> Self {
        Self { auth }
    }
}

impl Interceptor for AuthInterceptor {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        match self.auth.authenticate(request.metadata()) {
            Ok(principal) => {
                request.extensions_mut().insert(principal);
                Ok(request)
            }
            Err(err) => Err(to_status(
                Failure::Unauthenticated(err),
                &trace_of(request.metadata()),
            )),
        }
    }
}

/// The caller's trace ID, or a fresh one (for errors before the request body is read).
pub(crate) fn trace_of(metadata: &MetadataMap) -> String {
    trace_id::resolve("", metadata).map_or_else(|_| trace_id::generate(), |(t, _)| t)
}

/// The principal the interceptor found. Without the interceptor (an embedding, a test)
/// there is none: that is a request without a key, passing only while auth is off.
pub(crate) fn principal(
    extensions: &tonic::Extensions,
    auth: &Authenticator,
) -> Result<Principal, Failure> {
    match extensions.get::<Principal>() {
        Some(p) => Ok(p.clone()),
        None => auth
            .authenticate(&MetadataMap::new())
            .map_err(Failure::Unauthenticated),
    }
}

/// PERMISSION_DENIED unless `principal` may act for `team`.
pub(crate) fn check_team(
    principal: &Principal,
    field: &'static str,
    team: &str,
) -> Result<(), Failure> {
    if principal.may_act_for(team) {
        Ok(())
    } else {
        Err(Failure::TeamNotAllowed {
            field,
            team: team.to_owned(),
        })
    }
}

/// PERMISSION_DENIED unless `principal` administers `team` (`None`: global).
pub(crate) fn check_admin(principal: &Principal, team: Option<&str>) -> Result<(), Failure> {
    if principal.may_administer(team) {
        Ok(())
    } else {
        Err(Failure::AdminRequired(team.map(str::to_owned)))
    }
}
