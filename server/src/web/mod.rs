//! The web portal: server-rendered pages (askama templates in `web/templates`) for teams to
//! see their quota, what runs, what waits and why, and to follow and cancel their jobs.
//! Works without JavaScript; no asset comes from elsewhere (`Content-Security-Policy:
//! default-src 'self'`). Pages read and act through the same `db` and domain functions as
//! the API, with the same team roles.

pub mod charts;
pub mod cluster;
pub mod figures;
pub mod pages;
pub mod session;

use axum::{
    extract::Request,
    http::{header, HeaderValue},
    middleware::{self, Next},
    response::Response,
    routing::{get, post},
    Router,
};

use crate::state::AppState;

/// The portal's routes.
pub fn router() -> Router<AppState> {
    Router::new()
        .route("/", get(pages::home))
        .route("/login", get(pages::login_form).post(pages::login))
        .route("/login/oidc/{provider}", get(pages::oidc_begin))
        .route("/login/oidc/{provider}/callback", get(pages::oidc_callback))
        .route("/logout", post(pages::logout))
        .route("/teams/{team}", get(pages::team))
        .route("/teams/{team}/jobs", get(pages::team_jobs))
        .route("/teams/{team}/arrays", get(pages::team_arrays))
        .route("/teams/{team}/arrays/{array}", get(pages::array))
        .route("/teams/{team}/arrays/{array}/cancel", post(pages::cancel_array))
        .route("/teams/{team}/services", get(pages::team_services).post(pages::create_service))
        .route("/teams/{team}/services/{service}", get(pages::service))
        .route("/teams/{team}/services/{service}/change", post(pages::change_service))
        .route("/teams/{team}/services/{service}/delete", post(pages::delete_service))
        .route("/teams/{team}/tokens", get(pages::team_tokens).post(pages::create_token))
        .route("/teams/{team}/audit", get(pages::team_audit))
        .route("/teams/{team}/webhooks", get(pages::team_webhooks).post(pages::create_webhook))
        .route("/teams/{team}/webhooks/{webhook}", get(pages::webhook))
        .route("/teams/{team}/webhooks/{webhook}/delete", post(pages::delete_webhook))
        .route("/teams/{team}/quotas", get(pages::team_quotas).post(pages::set_quota))
        .route("/teams/{team}/budgets", post(pages::set_budget))
        .route("/teams/{team}/budgets/{period}/delete", post(pages::delete_budget))
        .route("/teams/{team}/statements/{period}", get(pages::statement))
        .route("/teams/{team}/members", get(pages::team_members).post(pages::set_member))
        .route("/teams/{team}/members/{username}/remove", post(pages::remove_member))
        .route("/admin", get(pages::admin))
        .route("/admin/teams", post(pages::create_team))
        .route("/admin/rates", post(pages::set_rate))
        .route("/admin/priority-classes", post(pages::save_priority_class))
        .route("/admin/idle-policies", post(pages::save_idle_policy))
        .route("/admin/users", get(pages::users).post(pages::create_user))
        .route("/admin/users/{username}", post(pages::change_user))
        .route("/audit", get(pages::audit))
        .route("/teams/{team}/tokens/{token}/revoke", post(pages::revoke_token))
        .route("/teams/{team}/jobs/new", get(pages::submit_form).post(pages::submit))
        .route("/teams/{team}/jobs/preview", post(pages::preview))
        .route("/teams/{team}/templates/{template}/delete", post(pages::delete_template))
        .route("/jobs/{job}", get(pages::job))
        .route("/jobs/{job}/live", get(pages::job_live))
        .route("/jobs/{job}/log", get(pages::job_log))
        .route("/jobs/{job}/cancel", post(pages::cancel))
        .route("/jobs/{job}/rerun", post(pages::rerun))
        .route("/clusters", get(pages::clusters))
        .route("/clusters/{cluster}/nodes/{node}/clear-faults", post(pages::clear_faults))
        .route("/billing", get(pages::billing))
        .route("/billing/usage.csv", get(pages::billing_usage_csv))
        .route("/billing/periods/{period}", get(pages::billing_period))
        .route("/billing/exports/{period}/{format}", get(pages::billing_export))
        .route("/static/portal.css", get(pages::stylesheet))
        .route("/static/preview.js", get(pages::preview_script))
        .route("/static/job-live.js", get(pages::job_script))
        .layer(middleware::from_fn(security_headers))
}

/// Headers every portal response carries: nothing from elsewhere, no framing, no sniffing,
/// and pages that may show a team's data are not cached.
async fn security_headers(request: Request, next: Next) -> Response {
    let mut response = next.run(request).await;
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static("default-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"),
    );
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    headers.insert(header::REFERRER_POLICY, HeaderValue::from_static("same-origin"));
    headers.entry(header::CACHE_CONTROL).or_insert(HeaderValue::from_static("no-store"));
    response
}
