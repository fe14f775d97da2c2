//! The ops RPCs of the `Orchestrator` service: `GetUsage` (from the usage tables) and
//! `GetProviderHealth` (in-memory breaker and health state).

use super::{
    OrchestratorApi, auth, convert,
    error::{Failure, to_status},
    pb, reply, request,
};
use crate::usage::{self, ledger, summary::Dimension};
use tonic::{Request, Response, Status};

impl OrchestratorApi {
    /// `GetUsage`: the team's sums over a period, its caps and what remains.
    pub(super) async fn usage(
        &self,
        request: Request<pb::GetUsageRequest>,
    ) -> Result<Response<pb::GetUsageResponse>, Status> {
        let (metadata, extensions, req) = request.into_parts();
        let trace_id = request::metadata_trace(&metadata)?;
        let fail = |f: Failure| to_status(f, &trace_id);
        request::check_id(&req.team_id, true)
            .map_err(|why| fail(Failure::invalid("team_id", why)))?;
        super::access::note(|f| f.team.clone_from(&req.team_id));
        auth::principal(&extensions, &self.auth)
            .and_then(|p| auth::check_team(&p, "team_id", &req.team_id))
            .map_err(fail)?;
        // It reads the database: shed with the calls under the same bound.
        let _slot = self.pipeline.slot().map_err(|e| fail(e.into()))?;
        let (month_start, month_end) = usage::summary::month_of(chrono::Utc::now());
        // Caller-supplied: validated, never trusted to fit in the arithmetic.
        let instant = |field: &str, t: Option<prost_types::Timestamp>, default: i64| match t {
            None => Ok(default),
            Some(t) => usage::summary::timestamp_ms(t.seconds, t.nanos).ok_or_else(|| {
                fail(Failure::invalid(
                    field,
                    "must be a valid Timestamp between 0001-01-01 and 9999-12-31 UTC",
                ))
            }),
        };
        let start = instant("period_start", req.period_start, month_start)?;
        let end = instant("period_end", req.period_end, month_end)?;
        if end <= start {
            return Err(fail(Failure::invalid(
                "period_end",
                "must be after period_start",
            )));
        }
        let mut dims = Vec::new();
        for (i, d) in req.group_by.iter().enumerate() {
            dims.push(match pb::UsageDimension::try_from(*d) {
                Ok(pb::UsageDimension::Task) => Dimension::Task,
                Ok(pb::UsageDimension::Provider) => Dimension::Provider,
                Ok(pb::UsageDimension::Model) => Dimension::Model,
                Ok(pb::UsageDimension::Day) => Dimension::Day,
                Ok(pb::UsageDimension::User) => Dimension::User,
                _ => {
                    return Err(fail(Failure::invalid(
                        &format!("group_by[{i}]"),
                        "unknown dimension",
                    )));
                }
            });
        }
        let summary = usage::summary::summarize(&self.store, &req.team_id, start, end, &dims)
            .await
            .map_err(|e| fail(Failure::Storage(e.to_string())))?;
        let caps = ledger::caps_of(
            &self.store,
            &req.team_id,
            "",
            self.pipeline.meter().default_caps().team,
        )
        .await
        .map_err(|e| fail(Failure::Storage(e.to_string())))?
        .month;
        // Limits and remaining describe the month the period starts in (caps
        // are per month; a period spanning months has no single "remaining").
        let start_month = usage::summary::month_of_ms(start).map_or(month_start, |(m, _)| m);
        let bucket = usage::bucket::Bucket::team_month(&req.team_id, start_month);
        let balance = ledger::balance_of(&self.store, &bucket)
            .await
            .map_err(|e| fail(Failure::Storage(e.to_string())))?;
        let (limits, remaining) = convert::limits(&caps, &balance);
        let ts = |ms: i64| prost_types::Timestamp {
            seconds: ms.div_euclid(1000),
            nanos: (ms.rem_euclid(1000) * 1_000_000) as i32,
        };
        Ok(reply(
            &trace_id,
            pb::GetUsageResponse {
                team_id: req.team_id,
                period_start: Some(ts(start)),
                period_end: Some(ts(end)),
                totals: Some(convert::totals(&summary.totals)),
                buckets: summary
                    .buckets
                    .iter()
                    .map(|(k, t)| pb::UsageBucket {
                        task: k.task.clone().unwrap_or_default(),
                        provider: k.provider.clone().unwrap_or_default(),
                        model: k.model.clone().unwrap_or_default(),
                        day: k.day.clone().unwrap_or_default(),
                        user_id: k.user.clone().unwrap_or_default(),
                        totals: Some(convert::totals(t)),
                    })
                    .collect(),
                limits: Some(limits),
                remaining: Some(remaining),
            },
        ))
    }

    /// `GetProviderHealth`: every provider's breaker and recent calls.
    pub(super) fn provider_health(
        &self,
        request: &Request<pb::GetProviderHealthRequest>,
    ) -> Result<Response<pb::GetProviderHealthResponse>, tonic::Status> {
        // No context: the trace ID comes from the metadata (malformed: refused) or is new.
        let trace_id = super::request::metadata_trace(request.metadata())?;
        let resilience = self.pipeline.router().resilience();
        let providers = self
            .config
            .providers
            .iter()
            .map(|(name, p)| {
                let Some(guards) = resilience.get(name) else {
                    return pb::ProviderHealth {
                        provider: name.clone(),
                        kind: p.kind.as_str().to_owned(),
                        ..Default::default()
                    };
                };
                convert::provider_health(name, p, guards)
            })
            .collect();
        Ok(reply(
            &trace_id,
            pb::GetProviderHealthResponse { providers },
        ))
    }
}
