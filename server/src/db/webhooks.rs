//! Team webhooks, their deliveries and the notifier's cursor.
//!
//! The notifier turns job events and budget alerts into deliveries; each delivery's message
//! id is derived from what it reports (`msg_evt_<job event id>`, `msg_budget_<team>_<period>_<threshold>`),
//! and `webhook_deliveries_message_key` makes writing it twice a no-op, so a notifier pass
//! that rereads what an earlier one saw enqueues nothing new.

use chrono::{DateTime, NaiveDate, Utc};
use sqlx::PgPool;

use super::Tx;
use crate::domain::{JobId, TeamId, UserId, WebhookId};

/// A stored webhook, without its secret.
#[derive(Debug, Clone, serde::Serialize)]
pub struct WebhookRow {
    pub id: WebhookId,
    pub team_id: TeamId,
    pub url: String,
    pub events: Vec<String>,
    pub format: String,
    pub created_by: Option<String>,
    pub created_at: DateTime<Utc>,
}

/// A webhook to store.
#[derive(Debug)]
pub struct NewWebhook<'a> {
    pub team_id: TeamId,
    pub url: &'a str,
    pub secret: &'a str,
    pub events: &'a [String],
    pub format: &'a str,
    pub created_by: Option<UserId>,
}

/// Stores a new webhook.
pub async fn insert(tx: &mut Tx<'_>, hook: &NewWebhook<'_>) -> Result<WebhookRow, sqlx::Error> {
    sqlx::query_as!(
        WebhookRow,
        r#"with w as (
               insert into webhooks (id, team_id, url, secret, events, format, created_by)
               values ($1, $2, $3, $4, $5, $6, $7)
               returning *
           )
           select w.id as "id: WebhookId", w.team_id as "team_id: TeamId", w.url, w.events, w.format,
                  u.username as "created_by?", w.created_at
           from w left join users u on u.id = w.created_by"#,
        WebhookId::new() as WebhookId,
        hook.team_id as TeamId,
        hook.url,
        hook.secret,
        hook.events,
        hook.format,
        hook.created_by as Option<UserId>
    )
    .fetch_one(&mut **tx)
    .await
}

/// Webhooks of `team_id` in id order, after the webhook `after`.
pub async fn list(
    pool: &PgPool,
    team_id: TeamId,
    after: Option<WebhookId>,
    limit: i64,
) -> Result<Vec<WebhookRow>, sqlx::Error> {
    sqlx::query_as!(
        WebhookRow,
        r#"select w.id as "id: WebhookId", w.team_id as "team_id: TeamId", w.url, w.events, w.format,
                  u.username as "created_by?", w.created_at
           from webhooks w left join users u on u.id = w.created_by
           where w.team_id = $1 and ($2::uuid is null or w.id > $2)
           order by w.id limit $3"#,
        team_id as TeamId,
        after as Option<WebhookId>,
        limit
    )
    .fetch_all(pool)
    .await
}

/// The webhook `id` if it is `team_id`'s.
pub async fn get(pool: &PgPool, team_id: TeamId, id: WebhookId) -> Result<Option<WebhookRow>, sqlx::Error> {
    sqlx::query_as!(
        WebhookRow,
        r#"select w.id as "id: WebhookId", w.team_id as "team_id: TeamId", w.url, w.events, w.format,
                  u.username as "created_by?", w.created_at
           from webhooks w left join users u on u.id = w.created_by
           where w.team_id = $1 and w.id = $2"#,
        team_id as TeamId,
        id as WebhookId
    )
    .fetch_optional(pool)
    .await
}

/// Deletes the webhook `id` of `team_id` with its deliveries; what it was, if it existed.
pub async fn delete(tx: &mut Tx<'_>, team_id: TeamId, id: WebhookId) -> Result<Option<WebhookRow>, sqlx::Error> {
    sqlx::query_as!(
        WebhookRow,
        r#"with w as (delete from webhooks where team_id = $1 and id = $2 returning *)
           select w.id as "id: WebhookId", w.team_id as "team_id: TeamId", w.url, w.events, w.format,
                  u.username as "created_by?", w.created_at
           from w left join users u on u.id = w.created_by"#,
        team_id as TeamId,
        id as WebhookId
    )
    .fetch_optional(&mut **tx)
    .await
}

/// One delivery as its log shows it.
#[derive(Debug, Clone)]
pub struct DeliveryRow {
    pub id: i64,
    pub message_id: String,
    pub event_type: String,
    pub state: String,
    pub attempts: i32,
    pub next_attempt_at: DateTime<Utc>,
    pub last_status: Option<i32>,
    pub last_error: Option<String>,
    pub created_at: DateTime<Utc>,
    pub delivered_at: Option<DateTime<Utc>>,
}

/// Deliveries of the webhook `webhook_id` of `team_id`, newest first, before the delivery
/// `before`.
pub async fn deliveries(
    pool: &PgPool,
    team_id: TeamId,
    webhook_id: WebhookId,
    before: Option<i64>,
    limit: i64,
) -> Result<Vec<DeliveryRow>, sqlx::Error> {
    sqlx::query_as!(
        DeliveryRow,
        r#"select d.id, d.message_id, d.event_type, d.state, d.attempts, d.next_attempt_at, d.last_status,
                  d.last_error, d.created_at, d.delivered_at
           from webhook_deliveries d join webhooks w on w.id = d.webhook_id
           where w.team_id = $1 and d.webhook_id = $2 and ($3::bigint is null or d.id < $3)
           order by d.id desc limit $4"#,
        team_id as TeamId,
        webhook_id as WebhookId,
        before,
        limit
    )
    .fetch_all(pool)
    .await
}

/// The notifier's cursor, locked: one notifier pass at a time.
#[derive(Debug, Clone, Copy)]
pub struct Cursor {
    /// The newest job event id a pass has read.
    pub last_event_id: i64,
    /// The newest budget alert's time a pass has read.
    pub last_alert_at: DateTime<Utc>,
}

/// Reads and locks the notifier's cursor.
pub async fn lock_cursor(tx: &mut Tx<'_>) -> Result<Cursor, sqlx::Error> {
    sqlx::query_as!(Cursor, "select last_event_id, last_alert_at from webhook_cursor for update")
        .fetch_one(&mut **tx)
        .await
}

/// Moves the notifier's cursor.
pub async fn advance_cursor(tx: &mut Tx<'_>, cursor: Cursor) -> Result<(), sqlx::Error> {
    sqlx::query!(
        "update webhook_cursor set last_event_id = $1, last_alert_at = $2",
        cursor.last_event_id,
        cursor.last_alert_at
    )
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// The newest job event id at most `limit` ids after `after`: where a pass that reads from
/// `after` stops.
pub async fn event_horizon(tx: &mut Tx<'_>, after: i64, limit: i64) -> Result<i64, sqlx::Error> {
    let max = sqlx::query_scalar!("select max(id) from job_events where id > $1 and id <= $1 + $2", after, limit)
        .fetch_one(&mut **tx)
        .await?;
    Ok(max.unwrap_or(after))
}

/// A job's end of attempt that a webhook asked for and has no delivery for yet.
#[derive(Debug, Clone)]
pub struct JobNotice {
    pub event_id: i64,
    /// The job event's kind: `succeeded`, `failed`, `preempted`, `requeued` or `cancelled`.
    pub kind: String,
    pub at: DateTime<Utc>,
    pub attempt: i32,
    pub reason: Option<String>,
    pub message: String,
    pub job_id: JobId,
    pub job_name: String,
    pub exit_code: Option<i32>,
    pub team: String,
    pub webhook_id: WebhookId,
    pub format: String,
}

/// Job events with ids in `(from, to]` of the kinds webhooks report, paired with every webhook
/// of the job's team that asked for them, existed when the event happened and has no delivery
/// of it yet.
pub async fn job_notices(tx: &mut Tx<'_>, from: i64, to: i64) -> Result<Vec<JobNotice>, sqlx::Error> {
    sqlx::query_as!(
        JobNotice,
        r#"select e.id as event_id, e.kind, e.at, e.attempt, e.reason, e.message,
                  j.id as "job_id: JobId", j.name as job_name,
                  case when e.kind in ('succeeded', 'failed') then j.exit_code end as exit_code,
                  t.name as team, w.id as "webhook_id: WebhookId", w.format
           from job_events e
           join jobs j on j.id = e.job_id
           join teams t on t.id = j.team_id
           join webhooks w on w.team_id = j.team_id and w.created_at <= e.at and 'job.' || e.kind = any(w.events)
           where e.id > $1 and e.id <= $2
             and e.kind in ('succeeded', 'failed', 'preempted', 'requeued', 'cancelled', 'idle')
             and not exists (select 1 from webhook_deliveries d
                             where d.webhook_id = w.id and d.message_id = 'msg_evt_' || e.id)
           order by e.id, w.id"#,
        from,
        to
    )
    .fetch_all(&mut **tx)
    .await
}

/// A budget alert that a webhook asked for and has no delivery for yet.
#[derive(Debug, Clone)]
pub struct BudgetNotice {
    pub message_id: String,
    pub team: String,
    pub period: NaiveDate,
    pub threshold: i32,
    pub spent: i64,
    pub amount: i64,
    pub unit: String,
    pub raised_at: DateTime<Utc>,
    pub webhook_id: WebhookId,
    pub format: String,
}

/// Budget alerts raised after `after`, paired like [`job_notices`].
pub async fn budget_notices(tx: &mut Tx<'_>, after: DateTime<Utc>) -> Result<Vec<BudgetNotice>, sqlx::Error> {
    sqlx::query_as!(
        BudgetNotice,
        r#"select m.message_id as "message_id!", t.name as team, a.period, a.threshold, a.spent, a.amount, a.unit,
                  a.raised_at, w.id as "webhook_id: WebhookId", w.format
           from budget_alerts a
           cross join lateral (select 'msg_budget_' || replace(a.team_id::text, '-', '') || '_'
                                      || to_char(a.period, 'YYYYMM') || '_' || a.threshold as message_id) m
           join teams t on t.id = a.team_id
           join webhooks w on w.team_id = a.team_id and w.created_at <= a.raised_at
                              and 'budget.threshold' = any(w.events)
           where a.raised_at > $1
             and not exists (select 1 from webhook_deliveries d
                             where d.webhook_id = w.id and d.message_id = m.message_id)
           order by a.raised_at, w.id"#,
        after
    )
    .fetch_all(&mut **tx)
    .await
}

/// The newest budget alert's time, if any.
pub async fn newest_alert(tx: &mut Tx<'_>) -> Result<Option<DateTime<Utc>>, sqlx::Error> {
    sqlx::query_scalar!("select max(raised_at) from budget_alerts").fetch_one(&mut **tx).await
}

/// A delivery to write.
#[derive(Debug)]
pub struct NewDelivery {
    pub webhook_id: WebhookId,
    pub message_id: String,
    pub event_type: String,
    pub payload: serde_json::Value,
}

/// Writes deliveries, skipping any message a webhook already has; how many were new.
pub async fn enqueue(tx: &mut Tx<'_>, deliveries: &[NewDelivery]) -> Result<u64, sqlx::Error> {
    if deliveries.is_empty() {
        return Ok(0);
    }
    let hooks: Vec<WebhookId> = deliveries.iter().map(|d| d.webhook_id).collect();
    let ids: Vec<&str> = deliveries.iter().map(|d| d.message_id.as_str()).collect();
    let types: Vec<&str> = deliveries.iter().map(|d| d.event_type.as_str()).collect();
    let payloads: Vec<serde_json::Value> = deliveries.iter().map(|d| d.payload.clone()).collect();
    let done = sqlx::query!(
        "insert into webhook_deliveries (webhook_id, message_id, event_type, payload)
         select * from unnest($1::uuid[], $2::text[], $3::text[], $4::jsonb[])
         on conflict on constraint webhook_deliveries_message_key do nothing",
        &hooks as &[WebhookId],
        &ids as &[&str],
        &types as &[&str],
        &payloads
    )
    .execute(&mut **tx)
    .await?;
    Ok(done.rows_affected())
}

/// A delivery claimed for one attempt.
#[derive(Debug, Clone)]
pub struct Claimed {
    pub id: i64,
    pub message_id: String,
    /// The payload as it is sent and signed: jsonb's text form, the same bytes every attempt.
    pub body: String,
    /// Attempts made before this one.
    pub attempts: i32,
    pub url: String,
    pub secret: String,
}

/// Claims up to `limit` due pending deliveries by moving each one's next attempt `lease_ms`
/// ahead: the claim commits at once, so no row stays locked across the request, and a
/// process that dies mid-request leaves the delivery due again when the lease ends.
pub async fn claim_due(tx: &mut Tx<'_>, limit: i64, lease_ms: i64) -> Result<Vec<Claimed>, sqlx::Error> {
    sqlx::query_as!(
        Claimed,
        r#"with due as (
               select id from webhook_deliveries
               where state = 'pending' and next_attempt_at <= now()
               order by next_attempt_at limit $1
               for update skip locked
           )
           update webhook_deliveries d
           set next_attempt_at = now() + $2 * interval '1 millisecond'
           from due, webhooks w
           where d.id = due.id and w.id = d.webhook_id
           returning d.id, d.message_id, d.payload::text as "body!", d.attempts, w.url, w.secret"#,
        limit,
        lease_ms as f64
    )
    .fetch_all(&mut **tx)
    .await
}

/// Records an attempt that the receiver accepted.
pub async fn mark_delivered(pool: &PgPool, id: i64, status: i32) -> Result<(), sqlx::Error> {
    sqlx::query!(
        "update webhook_deliveries
         set state = 'delivered', attempts = attempts + 1, last_status = $2, last_error = null, delivered_at = now()
         where id = $1 and state = 'pending'",
        id,
        status
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// Records an attempt that failed: due again in `retry_in_ms`, or `failed` for good when
/// that is `None`.
pub async fn mark_attempt_failed(
    pool: &PgPool,
    id: i64,
    status: Option<i32>,
    error: &str,
    retry_in_ms: Option<i64>,
) -> Result<(), sqlx::Error> {
    sqlx::query!(
        "update webhook_deliveries
         set attempts = attempts + 1, last_status = $2, last_error = $3,
             state = case when $4::float8 is null then 'failed' else 'pending' end,
             next_attempt_at = coalesce(now() + $4 * interval '1 millisecond', next_attempt_at)
         where id = $1 and state = 'pending'",
        id,
        status,
        error,
        retry_in_ms.map(|ms| ms as f64)
    )
    .execute(pool)
    .await?;
    Ok(())
}
