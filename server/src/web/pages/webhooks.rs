//! A team's webhooks and each one's delivery log. Everyone with a role in the team reads
//! them, with each URL shown as the API shows it (whole to team admins, its origin to
//! others, since a URL may carry a credential); team admins create and delete them.

use askama::Template;
use axum::{
    extract::{Path, RawQuery, State},
    response::{IntoResponse, Redirect, Response},
};
use serde::Deserialize;

use super::{
    administered_team, form_error, principal, render, signed_in, team_and_role, when, CurrentUser, NoFields, PageError,
    PortalForm, SignedIn,
};
use crate::{
    control::notify::EVENT_TYPES,
    db::{self, teams::TeamRow, web_sessions::SessionUser},
    domain::{TeamRole, WebhookId},
    ops::{
        self,
        webhooks::{DeliveryView, NewWebhook, WebhookFormat, WebhookView},
    },
    state::AppState,
};

/// Webhooks the list shows at most; a team with more is told so.
const WEBHOOKS_SHOWN: i64 = 200;

/// Deliveries a page of the log shows; older ones are a link away.
const DELIVERIES_PER_PAGE: i64 = 100;

/// A webhook as the pages show it.
pub struct WebhookLine {
    pub id: WebhookId,
    /// Whole for team admins, its origin for everyone else.
    pub url: String,
    pub format: &'static str,
    pub events: String,
    pub created_by: String,
    pub created: String,
}

impl WebhookLine {
    fn of(row: db::webhooks::WebhookRow, role: TeamRole) -> Self {
        let view = WebhookView::for_role(row, role);
        Self {
            id: view.id,
            url: view.url,
            format: view.format.as_str(),
            events: view.events.join(", "),
            created_by: view.created_by.unwrap_or_else(|| "an API token".into()),
            created: when(view.created_at),
        }
    }
}

/// A webhook just created: where it points and its signing secret, shown this once.
pub struct CreatedLine {
    pub url: String,
    pub secret: String,
}

/// An event type's checkbox on the new-webhook form.
pub struct EventChoice {
    pub name: &'static str,
    pub checked: bool,
}

/// The new-webhook form as the page shows it: empty, or as the user typed it.
pub struct WebhookFormShown {
    pub url: String,
    pub events: Vec<EventChoice>,
    pub slack: bool,
}

impl WebhookFormShown {
    fn empty() -> Self {
        Self::of(&NewWebhookForm::default())
    }

    fn of(form: &NewWebhookForm) -> Self {
        Self {
            url: form.url.clone(),
            events: EVENT_TYPES
                .iter()
                .map(|&name| EventChoice { name, checked: form.events.iter().any(|e| e == name) })
                .collect(),
            slack: form.format == "slack",
        }
    }
}

#[derive(Template)]
#[template(path = "webhooks.html")]
struct WebhooksPage {
    signed_in: Option<SignedIn>,
    csrf: String,
    team: String,
    /// Team admins create and delete webhooks and see each URL whole.
    can_admin: bool,
    webhooks: Vec<WebhookLine>,
    /// The team has more webhooks than the list shows.
    more: bool,
    created: Option<CreatedLine>,
    error: Option<String>,
    form: WebhookFormShown,
}

async fn webhooks_page(
    state: &AppState,
    user: &SessionUser,
    team: &TeamRow,
    role: TeamRole,
    created: Option<CreatedLine>,
    error: Option<String>,
    form: WebhookFormShown,
) -> Result<Response, PageError> {
    let mut rows = db::webhooks::list(&state.db, team.id, None, WEBHOOKS_SHOWN + 1).await?;
    let more = rows.len() as i64 > WEBHOOKS_SHOWN;
    rows.truncate(WEBHOOKS_SHOWN as usize);
    Ok(render(&WebhooksPage {
        signed_in: Some(signed_in(user)),
        csrf: user.csrf_token.clone(),
        team: team.name.clone(),
        can_admin: role >= TeamRole::Admin,
        webhooks: rows.into_iter().map(|w| WebhookLine::of(w, role)).collect(),
        more,
        created,
        error,
        form,
    }))
}

/// A team's webhooks, for everyone with a role in it; team admins also get the form.
pub async fn team_webhooks(
    State(state): State<AppState>,
    CurrentUser(user): CurrentUser,
    Path(name): Path<String>,
) -> Result<Response, PageError> {
    let (team, role) = team_and_role(&state, &user, &name).await?;
    webhooks_page(&state, &user, &team, role, None, None, WebhookFormShown::empty()).await
}

/// The new-webhook form, as typed.
#[derive(Debug, Default)]
pub struct NewWebhookForm {
    url: String,
    /// The ticked event types' checkboxes, in the form's order.
    events: Vec<String>,
    format: String,
}

impl NewWebhookForm {
    /// From the form's fields: one `events` field per ticked checkbox, which a struct
    /// cannot collect from a urlencoded body, hence the pairs.
    fn of(fields: Vec<(String, String)>) -> Self {
        let mut form = Self::default();
        for (key, value) in fields {
            match key.as_str() {
                "url" => form.url = value,
                "events" => form.events.push(value),
                "format" => form.format = value,
                _ => {}
            }
        }
        form
    }
}

/// Creates a webhook from the form; the page that answers shows its secret once.
pub async fn create_webhook(
    State(state): State<AppState>,
    Path(name): Path<String>,
    PortalForm { user, form }: PortalForm<Vec<(String, String)>>,
) -> Result<Response, PageError> {
    let team = administered_team(&state, &user, &name).await?;
    let role = TeamRole::Admin;
    let form = NewWebhookForm::of(form);
    let format = match form.format.as_str() {
        "" | "standard" => WebhookFormat::Standard,
        "slack" => WebhookFormat::Slack,
        _ => {
            let error = Some("format: standard or slack.".to_owned());
            return webhooks_page(&state, &user, &team, role, None, error, WebhookFormShown::of(&form)).await;
        }
    };
    let request = NewWebhook { url: form.url.trim().to_owned(), events: form.events.clone(), format };
    match ops::webhooks::create(&state, &principal(&user), &team, &request).await {
        Ok(created) => {
            let line = CreatedLine { url: created.webhook.url, secret: created.secret };
            webhooks_page(&state, &user, &team, role, Some(line), None, WebhookFormShown::empty()).await
        }
        Err(e) => {
            let error = Some(form_error(e)?);
            webhooks_page(&state, &user, &team, role, None, error, WebhookFormShown::of(&form)).await
        }
    }
}

/// Deletes a webhook, with its delivery log, from its row's button.
pub async fn delete_webhook(
    State(state): State<AppState>,
    Path((name, webhook)): Path<(String, String)>,
    PortalForm { user, .. }: PortalForm<NoFields>,
) -> Result<Response, PageError> {
    let team = administered_team(&state, &user, &name).await?;
    let webhook: WebhookId = webhook.parse().map_err(|_| PageError::not_found())?;
    ops::webhooks::delete(&state, &principal(&user), &team, webhook).await?;
    Ok(Redirect::to(&format!("/teams/{}/webhooks", team.name)).into_response())
}

/// One delivery of the log.
pub struct DeliveryLine {
    pub event_type: String,
    pub message_id: String,
    pub state: String,
    pub attempts: i32,
    pub last_status: String,
    pub last_error: String,
    pub created: String,
    /// When it is due again (pending), when it arrived (delivered), or nothing more (failed).
    pub outcome: String,
}

impl From<DeliveryView> for DeliveryLine {
    fn from(d: DeliveryView) -> Self {
        let outcome = match (d.next_attempt_at, d.delivered_at) {
            (Some(next), _) => format!("next attempt {}", when(next)),
            (None, Some(at)) => format!("delivered {}", when(at)),
            (None, None) => "no attempt left".to_owned(),
        };
        Self {
            event_type: d.event_type,
            message_id: d.message_id,
            state: d.state,
            attempts: d.attempts,
            last_status: d.last_status.map(|s| s.to_string()).unwrap_or_default(),
            last_error: d.last_error.unwrap_or_default(),
            created: when(d.created_at),
            outcome,
        }
    }
}

#[derive(Template)]
#[template(path = "webhook.html")]
struct WebhookPage {
    signed_in: Option<SignedIn>,
    team: String,
    webhook: WebhookLine,
    per_page: i64,
    deliveries: Vec<DeliveryLine>,
    newest_link: Option<String>,
    older_link: Option<String>,
}

/// The delivery log's page, from the query string.
#[derive(Debug, Default, Deserialize)]
struct DeliveriesQuery {
    /// Deliveries older than this one (its id): the next page.
    before: Option<i64>,
}

/// A webhook of the team and its delivery log, newest first, a hundred to a page.
pub async fn webhook(
    State(state): State<AppState>,
    CurrentUser(user): CurrentUser,
    Path((name, webhook)): Path<(String, String)>,
    RawQuery(query): RawQuery,
) -> Result<Response, PageError> {
    let (team, role) = team_and_role(&state, &user, &name).await?;
    let id: WebhookId = webhook.parse().map_err(|_| PageError::not_found())?;
    let row = db::webhooks::get(&state.db, team.id, id).await?.ok_or_else(PageError::not_found)?;
    let q: DeliveriesQuery = serde_urlencoded::from_str(query.as_deref().unwrap_or_default()).unwrap_or_default();
    let mut rows = db::webhooks::deliveries(&state.db, team.id, id, q.before, DELIVERIES_PER_PAGE + 1).await?;
    let more = rows.len() as i64 > DELIVERIES_PER_PAGE;
    rows.truncate(DELIVERIES_PER_PAGE as usize);
    let base = format!("/teams/{}/webhooks/{id}", team.name);
    let older_link = rows.last().filter(|_| more).map(|last| format!("{base}?before={}", last.id));
    let newest_link = q.before.map(|_| base.clone());
    Ok(render(&WebhookPage {
        signed_in: Some(signed_in(&user)),
        team: team.name,
        webhook: WebhookLine::of(row, role),
        per_page: DELIVERIES_PER_PAGE,
        deliveries: rows.into_iter().map(|d| DeliveryLine::from(DeliveryView::from(d))).collect(),
        newest_link,
        older_link,
    }))
}

#[cfg(test)]
mod tests {
    use chrono::{TimeZone, Utc};

    use super::{DeliveryLine, NewWebhookForm};
    use crate::ops::webhooks::DeliveryView;

    #[test]
    fn the_form_keeps_every_ticked_event_in_order_and_ignores_other_fields() {
        let fields =
            [("csrf", "t"), ("url", "https://x.example/"), ("events", "job.failed"), ("events", "job.requeued")];
        let form = NewWebhookForm::of(fields.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect());
        assert_eq!(form.url, "https://x.example/");
        assert_eq!(form.events, ["job.failed", "job.requeued"]);
        assert_eq!(form.format, "");
    }

    #[test]
    fn a_delivery_says_when_it_is_due_again_when_it_arrived_or_that_it_gave_up() {
        let at = Utc.with_ymd_and_hms(2026, 11, 26, 10, 15, 2).single().expect("a time");
        let view = |state: &str, next, delivered| DeliveryView {
            id: 1,
            message_id: "msg_evt_1".into(),
            event_type: "job.failed".into(),
            state: state.into(),
            attempts: 2,
            last_status: Some(500),
            last_error: None,
            created_at: at,
            next_attempt_at: next,
            delivered_at: delivered,
        };
        assert_eq!(DeliveryLine::from(view("pending", Some(at), None)).outcome, "next attempt 2026-11-26 10:15:02Z");
        assert_eq!(DeliveryLine::from(view("delivered", None, Some(at))).outcome, "delivered 2026-11-26 10:15:02Z");
        let failed = DeliveryLine::from(view("failed", None, None));
        assert_eq!((failed.outcome.as_str(), failed.last_status.as_str()), ("no attempt left", "500"));
    }
}
