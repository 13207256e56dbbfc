//! Team webhooks: where a team's job and budget notifications are sent (the control loop's
//! notifier sends them; see `control::notify`).

use chrono::{DateTime, Utc};
use rand::RngCore as _;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::{audit::record, Error, Result};
use crate::{
    auth::Principal,
    control::notify::EVENT_TYPES,
    db::{self, webhooks::DeliveryRow, webhooks::WebhookRow},
    domain::{FieldError, TeamRole, WebhookId},
    state::AppState,
};

/// Longest webhook URL accepted.
const MAX_URL_LEN: usize = 2_048;

/// Random bytes in a webhook's secret: the Standard Webhooks scheme asks for 24 to 64.
const SECRET_BYTES: usize = 32;

/// What a webhook's payloads look like.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum WebhookFormat {
    /// `{"type", "timestamp", "data"}`, the Standard Webhooks payload.
    #[default]
    Standard,
    /// `{"text": "..."}`: one sentence, what a Slack incoming webhook posts.
    Slack,
}

impl WebhookFormat {
    /// The stored form.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Standard => "standard",
            Self::Slack => "slack",
        }
    }
}

/// A webhook to create.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewWebhook {
    /// Where deliveries are POSTed: an `http` or `https` URL.
    pub url: String,
    /// The event types to send, at least one of `job.succeeded`, `job.failed`,
    /// `job.preempted`, `job.requeued`, `job.cancelled`, `job.idle`, `budget.threshold`.
    pub events: Vec<String>,
    /// The payload's shape; `standard` when left out.
    #[serde(default)]
    pub format: WebhookFormat,
}

/// A webhook, without its secret.
#[derive(Serialize, ToSchema)]
pub struct WebhookView {
    pub id: WebhookId,
    /// Where deliveries go; shown whole to team admins, and only its origin to others.
    pub url: String,
    pub events: Vec<String>,
    pub format: WebhookFormat,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub created_by: Option<String>,
    pub created_at: DateTime<Utc>,
}

impl From<WebhookRow> for WebhookView {
    fn from(r: WebhookRow) -> Self {
        Self {
            id: r.id,
            url: r.url,
            events: r.events,
            format: if r.format == "slack" { WebhookFormat::Slack } else { WebhookFormat::Standard },
            created_by: r.created_by,
            created_at: r.created_at,
        }
    }
}

impl WebhookView {
    /// The view a caller with `role` in the team gets: a URL often carries a credential (a
    /// Slack incoming webhook's path is one), so only team admins see more than its origin.
    pub fn for_role(row: WebhookRow, role: TeamRole) -> Self {
        let mut view = Self::from(row);
        if role != TeamRole::Admin {
            view.url = match reqwest::Url::parse(&view.url) {
                Ok(url) => format!("{}/…", url.origin().ascii_serialization()),
                Err(_) => "…".into(),
            };
        }
        view
    }
}

/// A freshly created webhook: the only time its secret is shown.
#[derive(Serialize, ToSchema)]
pub struct CreatedWebhookView {
    #[serde(flatten)]
    pub webhook: WebhookView,
    /// The signing secret, `whsec_` and base64: keep it to verify `webhook-signature`. It
    /// cannot be shown again; `null` in an idempotent replay.
    #[schema(nullable)]
    pub secret: String,
}

/// One delivery of a message to a webhook, with its latest attempt.
#[derive(Serialize, ToSchema)]
pub struct DeliveryView {
    /// The delivery's position in the log, newest highest; the list's cursor.
    pub id: i64,
    /// `webhook-id`: the same on every attempt of this message.
    pub message_id: String,
    pub event_type: String,
    /// `pending` (due at `next_attempt_at`), `delivered` or `failed` (out of attempts).
    pub state: String,
    /// Attempts made so far.
    pub attempts: i32,
    /// The HTTP status of the latest attempt, if the receiver answered.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_status: Option<i32>,
    /// What went wrong in the latest attempt.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    pub created_at: DateTime<Utc>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_attempt_at: Option<DateTime<Utc>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delivered_at: Option<DateTime<Utc>>,
}

impl From<DeliveryRow> for DeliveryView {
    fn from(r: DeliveryRow) -> Self {
        Self {
            id: r.id,
            message_id: r.message_id,
            event_type: r.event_type,
            next_attempt_at: (r.state == "pending").then_some(r.next_attempt_at),
            state: r.state,
            attempts: r.attempts,
            last_status: r.last_status,
            last_error: r.last_error,
            created_at: r.created_at,
            delivered_at: r.delivered_at,
        }
    }
}

/// Checks a webhook's URL: `http` or `https` with a host.
fn check_url(url: &str) -> Result<(), FieldError> {
    if url.len() > MAX_URL_LEN {
        return Err(FieldError::new("url", "too_long", format!("must be at most {MAX_URL_LEN} characters")));
    }
    let parsed =
        reqwest::Url::parse(url).map_err(|e| FieldError::new("url", "invalid_value", format!("is not a URL: {e}")))?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(FieldError::new("url", "invalid_value", "must be an http or https URL"));
    }
    if parsed.host_str().is_none_or(str::is_empty) {
        return Err(FieldError::new("url", "invalid_value", "must name a host"));
    }
    Ok(())
}

/// Checks the event types: at least one, each known; duplicates dropped, order kept.
fn check_events(events: &[String]) -> Result<Vec<String>, FieldError> {
    if events.is_empty() {
        return Err(FieldError::new("events", "empty", "must name at least one event type"));
    }
    let mut kept: Vec<String> = Vec::with_capacity(events.len());
    for (i, e) in events.iter().enumerate() {
        if !EVENT_TYPES.contains(&e.as_str()) {
            return Err(FieldError::new(
                format!("events[{i}]"),
                "invalid_value",
                format!("must be one of {}", EVENT_TYPES.join(", ")),
            ));
        }
        if !kept.contains(e) {
            kept.push(e.clone());
        }
    }
    Ok(kept)
}

/// A new Standard Webhooks secret: `whsec_` and the base64 of random bytes.
fn new_secret() -> String {
    use base64::{engine::general_purpose::STANDARD, Engine as _};
    let mut bytes = [0u8; SECRET_BYTES];
    rand::rngs::OsRng.fill_bytes(&mut bytes);
    format!("whsec_{}", STANDARD.encode(bytes))
}

/// Creates a webhook for `team`, with its audit record (the secret is not in it).
pub async fn create(
    state: &AppState,
    principal: &Principal,
    team: &db::teams::TeamRow,
    body: &NewWebhook,
) -> Result<CreatedWebhookView> {
    check_url(&body.url)?;
    let events = check_events(&body.events)?;
    let created_by = match principal {
        Principal::User { id, .. } => Some(*id),
        Principal::Token { .. } => None,
    };
    let secret = new_secret();
    let mut tx = state.db.begin().await?;
    let row = db::webhooks::insert(
        &mut tx,
        &db::webhooks::NewWebhook {
            team_id: team.id,
            url: &body.url,
            secret: &secret,
            events: &events,
            format: body.format.as_str(),
            created_by,
        },
    )
    .await?;
    let object = format!("{}/{}", team.name, row.id);
    record(
        &mut tx,
        principal,
        "webhook.create",
        "webhook",
        &object,
        Some(team.id),
        None::<&()>,
        Some(&WebhookView::from(row.clone())),
    )
    .await?;
    tx.commit().await?;
    Ok(CreatedWebhookView { webhook: WebhookView::from(row), secret })
}

/// Deletes a webhook of `team` and its delivery log, with its audit record; pending
/// deliveries are not sent.
pub async fn delete(
    state: &AppState,
    principal: &Principal,
    team: &db::teams::TeamRow,
    webhook_id: WebhookId,
) -> Result<()> {
    let mut tx = state.db.begin().await?;
    let before = db::webhooks::delete(&mut tx, team.id, webhook_id).await?.ok_or(Error::NotFound("webhook"))?;
    let object = format!("{}/{}", team.name, webhook_id);
    record(
        &mut tx,
        principal,
        "webhook.delete",
        "webhook",
        &object,
        Some(team.id),
        Some(&WebhookView::from(before)),
        None::<&()>,
    )
    .await?;
    tx.commit().await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_http_and_https_urls_with_a_host_are_accepted() {
        assert!(check_url("https://hooks.example.com/fairway").is_ok());
        assert!(check_url("http://127.0.0.1:9000/").is_ok());
        for bad in ["ftp://example.com/", "file:///etc/passwd", "example.com/hook", "", "javascript:alert(1)"] {
            assert_eq!(check_url(bad).unwrap_err().field, "url", "{bad}");
        }
    }

    #[test]
    fn an_unknown_event_type_is_named_by_its_position() {
        let err = check_events(&["job.failed".into(), "job.exploded".into()]).unwrap_err();
        assert_eq!(err.field, "events[1]");
        assert_eq!(check_events(&[]).unwrap_err().field, "events");
        assert_eq!(check_events(&["job.failed".into(), "job.failed".into()]).unwrap(), vec!["job.failed"]);
    }

    #[test]
    fn a_secret_is_whsec_and_base64_of_32_bytes() {
        use base64::{engine::general_purpose::STANDARD, Engine as _};
        let secret = new_secret();
        let bytes = STANDARD.decode(secret.strip_prefix("whsec_").expect("prefix")).expect("base64");
        assert_eq!(bytes.len(), SECRET_BYTES);
        assert_ne!(secret, new_secret());
    }
}
