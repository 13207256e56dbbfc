//! The REST API under `/api/v1`: routes, their OpenAPI entries and their authorization
//! policies, registered together so none can exist without the others.

pub mod arrays;
pub mod audit;
pub mod auth;
pub mod billing;
pub mod budgets;
pub mod ci_trusts;
pub mod clusters;
pub mod document;
pub mod gpu_classes;
pub mod health;
pub mod idle_policies;
pub mod jobs;
pub mod priority_classes;
pub mod quotas;
pub mod services;
pub mod teams;
pub mod templates;
pub mod token_exchange;
pub mod tokens;
pub mod users;
pub mod webhooks;

use utoipa::{
    openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme},
    Modify, OpenApi,
};
use utoipa_axum::{router::OpenApiRouter, routes};

// The handlers name these as `super::error::Problem`, `super::extract::ApiJson`, ...
use crate::http::{error, extract};
use crate::{
    auth::policy::{Policy, RoutePolicy},
    domain::TeamRole,
    state::AppState,
};

const fn route(method: &'static str, path: &'static str, policy: Policy) -> RoutePolicy {
    RoutePolicy { method, path, policy }
}

use Policy::{Authenticated, Job, PlatformAdmin, Public, Team};

/// Every route's authorization policy. A route missing here is refused at runtime and fails
/// the test that compares this table with the OpenAPI document.
pub const ROUTE_POLICIES: &[RoutePolicy] = &[
    route("GET", "/healthz", Public),
    route("GET", "/readyz", Public),
    route("GET", "/metrics", Public),
    route("POST", "/api/v1/auth/token", Public),
    route("POST", "/api/v1/auth/token-exchange", Public),
    route("GET", "/api/v1/me", Authenticated),
    route("POST", "/api/v1/me/password", Authenticated),
    route("GET", "/api/v1/users", PlatformAdmin),
    route("POST", "/api/v1/users", PlatformAdmin),
    route("PATCH", "/api/v1/users/{username}", PlatformAdmin),
    route("GET", "/api/v1/teams", Authenticated),
    route("POST", "/api/v1/teams", PlatformAdmin),
    route("GET", "/api/v1/teams/{team}", Team(TeamRole::Viewer)),
    route("PATCH", "/api/v1/teams/{team}", Team(TeamRole::Admin)),
    route("DELETE", "/api/v1/teams/{team}", Policy::TeamPlatformAdmin),
    route("GET", "/api/v1/teams/{team}/members", Team(TeamRole::Viewer)),
    route("PUT", "/api/v1/teams/{team}/members/{username}", Team(TeamRole::Admin)),
    route("DELETE", "/api/v1/teams/{team}/members/{username}", Team(TeamRole::Admin)),
    route("GET", "/api/v1/teams/{team}/tokens", Team(TeamRole::Admin)),
    route("POST", "/api/v1/teams/{team}/tokens", Team(TeamRole::Admin)),
    route("DELETE", "/api/v1/teams/{team}/tokens/{token_id}", Team(TeamRole::Admin)),
    route("GET", "/api/v1/teams/{team}/ci-trusts", Team(TeamRole::Viewer)),
    route("POST", "/api/v1/teams/{team}/ci-trusts", Team(TeamRole::Admin)),
    route("GET", "/api/v1/teams/{team}/ci-trusts/{trust}", Team(TeamRole::Viewer)),
    route("DELETE", "/api/v1/teams/{team}/ci-trusts/{trust}", Team(TeamRole::Admin)),
    route("GET", "/api/v1/teams/{team}/webhooks", Team(TeamRole::Viewer)),
    route("POST", "/api/v1/teams/{team}/webhooks", Team(TeamRole::Admin)),
    route("DELETE", "/api/v1/teams/{team}/webhooks/{webhook}", Team(TeamRole::Admin)),
    route("GET", "/api/v1/teams/{team}/webhooks/{webhook}/deliveries", Team(TeamRole::Viewer)),
    route("GET", "/api/v1/teams/{team}/job-templates", Team(TeamRole::Viewer)),
    route("GET", "/api/v1/teams/{team}/job-templates/{template}", Team(TeamRole::Viewer)),
    route("PUT", "/api/v1/teams/{team}/job-templates/{template}", Team(TeamRole::Member)),
    route("DELETE", "/api/v1/teams/{team}/job-templates/{template}", Team(TeamRole::Member)),
    route("POST", "/api/v1/teams/{team}/job-templates/{template}/jobs", Team(TeamRole::Member)),
    route("GET", "/api/v1/teams/{team}/quotas", Team(TeamRole::Viewer)),
    route("GET", "/api/v1/teams/{team}/quotas/{gpu_class}", Team(TeamRole::Viewer)),
    route("PUT", "/api/v1/teams/{team}/quotas/{gpu_class}", Policy::TeamPlatformAdmin),
    route("DELETE", "/api/v1/teams/{team}/quotas/{gpu_class}", Policy::TeamPlatformAdmin),
    route("GET", "/api/v1/teams/{team}/budgets", Team(TeamRole::Viewer)),
    route("PUT", "/api/v1/teams/{team}/budgets/{period}", Policy::TeamPlatformAdmin),
    route("DELETE", "/api/v1/teams/{team}/budgets/{period}", Policy::TeamPlatformAdmin),
    route("GET", "/api/v1/teams/{team}/audit-log", Team(TeamRole::Admin)),
    route("POST", "/api/v1/teams/{team}/jobs", Team(TeamRole::Member)),
    route("GET", "/api/v1/teams/{team}/jobs", Team(TeamRole::Viewer)),
    route("POST", "/api/v1/teams/{team}/jobs:batch", Team(TeamRole::Member)),
    route("POST", "/api/v1/teams/{team}/jobs:dry-run", Team(TeamRole::Member)),
    route("GET", "/api/v1/teams/{team}/queue", Team(TeamRole::Viewer)),
    route("POST", "/api/v1/teams/{team}/arrays", Team(TeamRole::Member)),
    route("GET", "/api/v1/teams/{team}/arrays", Team(TeamRole::Viewer)),
    route("GET", "/api/v1/teams/{team}/arrays/{array}", Team(TeamRole::Viewer)),
    route("GET", "/api/v1/teams/{team}/arrays/{array}/tasks", Team(TeamRole::Viewer)),
    route("POST", "/api/v1/teams/{team}/arrays/{array}/cancel", Team(TeamRole::Member)),
    route("POST", "/api/v1/teams/{team}/services", Team(TeamRole::Member)),
    route("GET", "/api/v1/teams/{team}/services", Team(TeamRole::Viewer)),
    route("GET", "/api/v1/teams/{team}/services/{service}", Team(TeamRole::Viewer)),
    route("PATCH", "/api/v1/teams/{team}/services/{service}", Team(TeamRole::Member)),
    route("DELETE", "/api/v1/teams/{team}/services/{service}", Team(TeamRole::Member)),
    route("GET", "/api/v1/jobs/{job}", Job(TeamRole::Viewer)),
    route("POST", "/api/v1/jobs/{job}/cancel", Job(TeamRole::Member)),
    route("POST", "/api/v1/jobs/{job}/rerun", Job(TeamRole::Member)),
    route("GET", "/api/v1/jobs/{job}/events", Job(TeamRole::Viewer)),
    route("GET", "/api/v1/jobs/{job}/events:stream", Job(TeamRole::Viewer)),
    route("GET", "/api/v1/jobs/{job}/logs", Job(TeamRole::Viewer)),
    route("GET", "/api/v1/jobs/{job}/utilisation", Job(TeamRole::Viewer)),
    route("GET", "/api/v1/teams/{team}/events:stream", Team(TeamRole::Viewer)),
    route("POST", "/api/v1/jobs/{job}/checkpoint", Job(TeamRole::Member)),
    route("GET", "/api/v1/gpu-classes", Authenticated),
    route("POST", "/api/v1/gpu-classes", PlatformAdmin),
    route("GET", "/api/v1/gpu-classes/{gpu_class}", Authenticated),
    route("PATCH", "/api/v1/gpu-classes/{gpu_class}", PlatformAdmin),
    route("GET", "/api/v1/gpu-classes/{gpu_class}/rates", Authenticated),
    route("POST", "/api/v1/gpu-classes/{gpu_class}/rates", PlatformAdmin),
    route("GET", "/api/v1/idle-policies", PlatformAdmin),
    route("PUT", "/api/v1/idle-policies", PlatformAdmin),
    route("DELETE", "/api/v1/idle-policies/{policy}", PlatformAdmin),
    route("GET", "/api/v1/teams/{team}/idle-policies", Team(TeamRole::Viewer)),
    route("GET", "/api/v1/priority-classes", Authenticated),
    route("POST", "/api/v1/priority-classes", PlatformAdmin),
    route("GET", "/api/v1/priority-classes/{priority_class}", Authenticated),
    route("PUT", "/api/v1/priority-classes/{priority_class}", PlatformAdmin),
    route("GET", "/api/v1/clusters", Authenticated),
    route("PUT", "/api/v1/clusters/{cluster}", PlatformAdmin),
    route("DELETE", "/api/v1/clusters/{cluster}/nodes/{node}/faults", PlatformAdmin),
    route("GET", "/api/v1/audit-log", PlatformAdmin),
    route("GET", "/api/v1/teams/{team}/usage", Team(TeamRole::Viewer)),
    route("GET", "/api/v1/teams/{team}/statements/{period}", Team(TeamRole::Viewer)),
    route("GET", "/api/v1/teams/{team}/budget-status", Team(TeamRole::Viewer)),
    route("GET", "/api/v1/billing/exports", Policy::Finance),
    route("GET", "/api/v1/billing/exports/control", Policy::Finance),
    route("GET", "/api/v1/billing/periods", Policy::Finance),
    route("GET", "/api/v1/billing/utilisation", Policy::Finance),
    route("POST", "/api/v1/billing/periods/{period}/close", Policy::Finance),
];

#[derive(OpenApi)]
#[openapi(
    info(
        title = "Fairway",
        description = "Multi-tenant GPU platform: teams, reserved and burst quotas, fair-share admission, chargeback.",
        license(name = "Apache-2.0", identifier = "Apache-2.0")
    ),
    modifiers(&BearerAuth),
    security(("bearer" = [])),
    components(schemas(error::Problem, crate::billing::export::Format)),
    tags(
        (name = "auth", description = "Signing in, and exchanging a CI job's ID token for an API token"),
        (name = "users", description = "Users (platform admins)"),
        (name = "teams", description = "Teams and their members"),
        (name = "tokens", description = "API tokens for CI pipelines"),
        (name = "ci-trusts", description = "CI trust policies: the CI issuers' ID tokens a team exchanges for short-lived API tokens"),
        (name = "job-templates", description = "A team's saved job requests, and jobs submitted from them with only what changes"),
        (name = "webhooks", description = "Signed notifications of job ends and budget thresholds, and their delivery logs"),
        (name = "jobs", description = "Jobs: submit, watch, cancel, the queue and dry runs"),
        (name = "arrays", description = "Job arrays: many tasks of one spec, each told its index; their counts, and cancelling them whole"),
        (name = "services", description = "Inference services: independent replicas with no maximum runtime at one endpoint, restarted, scaled and rolled to new images within the quotas"),
        (name = "quotas", description = "Reserved, burst and lendable GPUs per team and class"),
        (name = "budgets", description = "Monthly budgets per team"),
        (name = "billing", description = "Usage, statements, budget status and finance exports"),
        (name = "gpu-classes", description = "The GPU catalogue and rate card"),
        (name = "priority-classes", description = "Priority classes"),
        (name = "idle-policies", description = "What happens to jobs whose GPUs stay idle"),
        (name = "clusters", description = "Clusters and their capacity"),
        (name = "audit", description = "Audit log"),
        (name = "health", description = "Health and metrics"),
    )
)]
struct ApiDoc;

struct BearerAuth;

impl Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .bearer_format("JWT access token or fwy_ API token")
                    .build(),
            ),
        );
    }
}

/// Every route with its OpenAPI entry.
pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::with_openapi(ApiDoc::openapi())
        .routes(routes!(health::get_healthz))
        .routes(routes!(health::get_readyz))
        .routes(routes!(health::get_metrics))
        .routes(routes!(auth::create_access_token))
        .routes(routes!(token_exchange::exchange_token))
        .routes(routes!(auth::get_me))
        .routes(routes!(users::change_password))
        .routes(routes!(users::create_user, users::list_users))
        .routes(routes!(users::update_user))
        .routes(routes!(teams::create_team, teams::list_teams))
        .routes(routes!(teams::get_team, teams::update_team, teams::delete_team))
        .routes(routes!(teams::list_members))
        .routes(routes!(teams::put_member, teams::delete_member))
        .routes(routes!(tokens::create_token, tokens::list_tokens))
        .routes(routes!(tokens::revoke_token))
        .routes(routes!(ci_trusts::create_ci_trust, ci_trusts::list_ci_trusts))
        .routes(routes!(ci_trusts::get_ci_trust, ci_trusts::delete_ci_trust))
        .routes(routes!(webhooks::create_webhook, webhooks::list_webhooks))
        .routes(routes!(webhooks::delete_webhook))
        .routes(routes!(webhooks::list_webhook_deliveries))
        .routes(routes!(templates::list_job_templates))
        .routes(routes!(templates::get_job_template, templates::put_job_template, templates::delete_job_template))
        .routes(routes!(templates::create_job_from_template))
        .routes(routes!(jobs::create_job, jobs::list_jobs))
        .routes(routes!(jobs::create_jobs_batch))
        .routes(routes!(jobs::dry_run_job))
        .routes(routes!(jobs::get_queue))
        .routes(routes!(jobs::get_job))
        .routes(routes!(jobs::cancel_job))
        .routes(routes!(jobs::rerun_job))
        .routes(routes!(jobs::list_job_events))
        .routes(routes!(jobs::stream_job_events))
        .routes(routes!(jobs::job_logs))
        .routes(routes!(jobs::job_utilisation))
        .routes(routes!(jobs::stream_team_events))
        .routes(routes!(jobs::report_checkpoint))
        .routes(routes!(arrays::create_array, arrays::list_arrays))
        .routes(routes!(arrays::get_array))
        .routes(routes!(arrays::list_array_tasks))
        .routes(routes!(arrays::cancel_array))
        .routes(routes!(services::create_service, services::list_services))
        .routes(routes!(services::get_service, services::update_service, services::delete_service))
        .routes(routes!(quotas::list_quotas))
        .routes(routes!(quotas::get_quota, quotas::put_quota, quotas::delete_quota))
        .routes(routes!(budgets::list_budgets))
        .routes(routes!(budgets::put_budget, budgets::delete_budget))
        .routes(routes!(audit::list_team_audit_log))
        .routes(routes!(audit::list_audit_log))
        .routes(routes!(gpu_classes::create_gpu_class, gpu_classes::list_gpu_classes))
        .routes(routes!(gpu_classes::get_gpu_class, gpu_classes::update_gpu_class))
        .routes(routes!(gpu_classes::list_gpu_class_rates, gpu_classes::create_gpu_class_rate))
        .routes(routes!(idle_policies::list_idle_policies, idle_policies::set_idle_policy))
        .routes(routes!(idle_policies::delete_idle_policy))
        .routes(routes!(idle_policies::list_team_idle_policies))
        .routes(routes!(priority_classes::list_priority_classes, priority_classes::create_priority_class))
        .routes(routes!(priority_classes::get_priority_class, priority_classes::put_priority_class))
        .routes(routes!(clusters::list_clusters))
        .routes(routes!(clusters::put_cluster))
        .routes(routes!(clusters::clear_node_faults))
        .routes(routes!(billing::get_team_usage))
        .routes(routes!(billing::get_team_statement))
        .routes(routes!(billing::get_team_budget_status))
        .routes(routes!(billing::export_billing))
        .routes(routes!(billing::get_export_control))
        .routes(routes!(billing::list_billing_periods))
        .routes(routes!(billing::get_billing_utilisation))
        .routes(routes!(billing::close_billing_period))
}

/// Every documented operation as (method, path template), in document order.
pub fn documented_operations() -> Vec<(&'static str, String)> {
    let mut operations = Vec::new();
    for (path, item) in openapi().paths.paths {
        for (method, present) in [
            ("GET", item.get.is_some()),
            ("POST", item.post.is_some()),
            ("PUT", item.put.is_some()),
            ("PATCH", item.patch.is_some()),
            ("DELETE", item.delete.is_some()),
        ] {
            if present {
                operations.push((method, path.clone()));
            }
        }
    }
    operations
}

/// The API's routes and its finished OpenAPI document (see [`document`]).
pub fn split() -> (axum::Router<AppState>, utoipa::openapi::OpenApi) {
    let (routes, mut doc) = router().split_for_parts();
    document::finish(&mut doc);
    (routes, doc)
}

/// The OpenAPI document of the API, as committed in `openapi/openapi.json`.
pub fn openapi() -> utoipa::openapi::OpenApi {
    split().1
}

/// The document as pretty JSON with a trailing newline, byte for byte what is committed.
pub fn openapi_json() -> String {
    let mut text = openapi().to_pretty_json().unwrap_or_default();
    text.push('\n');
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_documented_operation_has_a_policy_and_every_policy_a_route() {
        let operations = documented_operations();
        for (method, path) in &operations {
            assert!(
                crate::auth::policy::policy_for(ROUTE_POLICIES, method, path).is_some(),
                "{method} {path} has no policy"
            );
        }
        for r in ROUTE_POLICIES {
            assert!(
                operations.iter().any(|(m, p)| *m == r.method && p == r.path),
                "policy for {} {} has no route",
                r.method,
                r.path
            );
        }
        assert_eq!(operations.len(), ROUTE_POLICIES.len());
    }

    #[test]
    fn the_document_is_openapi_3_1() {
        let json = openapi_json();
        assert!(json.contains("\"openapi\": \"3.1.0\""), "{}", &json[..200]);
    }
}
