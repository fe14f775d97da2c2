//! Refusals of the governance and workflow services: an approval's
//! decision, a workflow's callback (HTTP edge), a runtime registry change.

use super::*;

pub(super) fn approval_refusal(
    err: crate::call::approvals::ApprovalError,
    details: &mut ErrorDetails,
    info: &mut HashMap<String, String>,
) -> Parts {
    use crate::call::approvals::ApprovalError as E;
    let code = match &err {
        E::NotFound(_) => Code::NotFound,
        E::CapabilityMissing(capability) => {
            info.insert("capability".into(), capability.clone());
            Code::PermissionDenied
        }
        E::OwnRequest => Code::PermissionDenied,
        E::AlreadyDecided { status, .. } => {
            info.insert("status".into(), (*status).to_owned());
            Code::FailedPrecondition
        }
        E::Storage(detail) => {
            tracing::error!(error = %detail, "storage failure deciding an approval");
            return storage_unavailable(details);
        }
    };
    (code, err.reason(), err.to_string())
}

pub(super) fn callback_refusal(
    err: crate::call::tool::callback::CallbackError,
    details: &mut ErrorDetails,
) -> Parts {
    use crate::call::tool::callback::CallbackError as E;
    let code = match &err {
        E::SignatureInvalid => Code::Unauthenticated,
        E::BodyInvalid(why) => {
            details.add_bad_request_violation("body", why.clone());
            Code::InvalidArgument
        }
        E::Conflict(_) => Code::Aborted,
        E::Storage(detail) => {
            tracing::error!(error = %detail, "storage failure taking a workflow callback");
            return storage_unavailable(details);
        }
    };
    (code, err.reason(), err.to_string())
}

pub(super) fn tool_admin_refusal(
    err: crate::call::tool::admin::ToolAdminError,
    details: &mut ErrorDetails,
    info: &mut HashMap<String, String>,
) -> Parts {
    use crate::call::tool::admin::ToolAdminError as E;
    let code = match &err {
        E::CapabilityMissing => {
            info.insert("capability".into(), crate::call::tool::admin::MANAGE.into());
            Code::PermissionDenied
        }
        E::AllTeamsRequired => Code::PermissionDenied,
        E::ReadOnly(_) => Code::FailedPrecondition,
        E::Invalid(fields) => {
            for (field, why) in fields {
                details.add_bad_request_violation(field.clone(), why.clone());
            }
            Code::InvalidArgument
        }
        E::NotFound(_) => Code::NotFound,
        E::VersionExists(_) => Code::AlreadyExists,
        E::Storage(detail) => {
            tracing::error!(error = %detail, "storage failure changing the tool registry");
            return storage_unavailable(details);
        }
    };
    let message = match &err {
        E::Invalid(fields) => fields
            .iter()
            .map(|(f, why)| format!("{f}: {why}"))
            .collect::<Vec<_>>()
            .join("; "),
        other => other.to_string(),
    };
    (code, err.reason(), message)
}
