//! The gRPC services behind one router, each RPC family with its own decode
//! limit (`server.max_*message_bytes`): a message of a million empty history
//! entries costs far more memory decoded than on the wire, so SMS and
//! research get a small limit while `Execute`, tools and agents keep 4 MiB.
//! tonic sets one limit per service, so such a method is routed, ahead of
//! its service's catch-all, to a second handle with the smaller limit; the
//! message is refused from its 5-byte frame header (`OUT_OF_RANGE`), unread.

use crate::{
    api::{
        OrchestratorApi, admin::PromptAdminApi, agent::AgentApi, approvals::ApprovalApi,
        audit::AuditApi, auth::AuthInterceptor, pb, tools::ToolServiceApi,
    },
    auth::Authenticator,
    config::ServerConfig,
};
use pb::{
    agent_service_server::AgentServiceServer, approval_service_server::ApprovalServiceServer,
    audit_service_server::AuditServiceServer, orchestrator_server::OrchestratorServer,
    prompt_admin_server::PromptAdminServer, tool_admin_server::ToolAdminServer,
    tool_service_server::ToolServiceServer,
};
use std::sync::Arc;
use tonic::{
    server::NamedService,
    service::{Routes, interceptor::InterceptedService},
};
use tower::ServiceExt;

/// The services that need a key, each behind the auth interceptor.
pub(super) struct Authenticated {
    pub api: OrchestratorApi,
    pub prompt_admin: PromptAdminApi,
    pub tools: ToolServiceApi,
    pub agents: AgentApi,
    pub audit: AuditApi,
    pub approvals: ApprovalApi,
    pub tool_admin: crate::api::tool_admin::ToolAdminApi,
}

/// `Orchestrator` methods with their own limit, never above `max_message_bytes`.
fn method_limits(server: &ServerConfig) -> [(&'static str, usize); 3] {
    let sms = server.max_sms_message_bytes.min(server.max_message_bytes);
    let research = (server.max_research_message_bytes).min(server.max_message_bytes);
    [
        ("ClassifySms", sms),
        ("GenerateSms", sms),
        ("Research", research),
    ]
}

/// `svc` behind the auth interceptor.
fn guarded<S>(svc: S, auth: &Authenticator) -> InterceptedService<S, AuthInterceptor> {
    InterceptedService::new(svc, AuthInterceptor::new(auth.clone()))
}

/// Every authenticated service, plus the open ones already in `routes`.
pub(super) fn add_authenticated(
    routes: Routes,
    services: Authenticated,
    auth: &Authenticator,
    server: &ServerConfig,
) -> Routes {
    let limit = server.max_message_bytes;
    let api = Arc::new(services.api);
    let orchestrator =
        |limit| OrchestratorServer::from_arc(Arc::clone(&api)).max_decoding_message_size(limit);
    let mut routes = routes
        .add_service(guarded(orchestrator(limit), auth))
        .add_service(guarded(
            PromptAdminServer::new(services.prompt_admin).max_decoding_message_size(limit),
            auth,
        ))
        .add_service(guarded(
            ToolServiceServer::new(services.tools).max_decoding_message_size(limit),
            auth,
        ))
        .add_service(guarded(
            AgentServiceServer::new(services.agents).max_decoding_message_size(limit),
            auth,
        ))
        .add_service(guarded(
            AuditServiceServer::new(services.audit).max_decoding_message_size(limit),
            auth,
        ))
        .add_service(guarded(
            ApprovalServiceServer::new(services.approvals).max_decoding_message_size(limit),
            auth,
        ))
        .add_service(guarded(
            ToolAdminServer::new(services.tool_admin).max_decoding_message_size(limit),
            auth,
        ));
    for (method, limit) in method_limits(server) {
        let svc = guarded(orchestrator(limit), auth);
        let path = format!("/{}/{method}", OrchestratorServer::<OrchestratorApi>::NAME);
        let router = std::mem::take(routes.axum_router_mut());
        *routes.axum_router_mut() = router.route_service(
            &path,
            svc.map_request(|req: http::Request<axum::body::Body>| req.map(tonic::body::Body::new)),
        );
    }
    routes
}
