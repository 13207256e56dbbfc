//! Team webhooks, on the leader: the notifier turns job events and budget alerts into
//! deliveries, and the delivery workers send them, signed with the Standard Webhooks scheme
//! (<https://www.standardwebhooks.com>).
//!
//! Nothing that writes a job event or a budget alert knows about webhooks. The notifier reads
//! both after its cursor and, in one transaction of the leader, writes a delivery for every
//! webhook that asked for the event and moves the cursor: a crash leaves both or neither.
//! Each delivery's message id is derived from what it reports, and a webhook holds a message
//! id once, so a pass that reads an event again writes nothing new.
//!
//! A delivery is claimed by pushing its next attempt a lease ahead and committing; the request
//! is sent outside any transaction and its result recorded after. A process that dies between
//! the two leaves the delivery due again when the lease ends: it is sent again, with the same
//! `webhook-id` and the same body, which is what receivers deduplicate on.

use std::time::Duration;

use base64::{engine::general_purpose::STANDARD as BASE64, Engine as _};
use hmac::{Hmac, Mac};
use serde_json::json;
use sha2::Sha256;

use super::{leader_tx, ControlError, Ctx};
use crate::{db, db::webhooks::NewDelivery, domain::BudgetPeriod};

/// The event types a webhook may ask for, as they appear on the wire.
pub const EVENT_TYPES: [&str; 7] =
    ["job.succeeded", "job.failed", "job.preempted", "job.requeued", "job.cancelled", "job.idle", "budget.threshold"];

/// The Standard Webhooks retry schedule after each failed attempt, in units of
/// `ControlConfig::webhook_retry_unit` (a second in production): 5 s, 5 min, 30 min, 2 h,
/// 5 h, 10 h, 10 h. The first attempt is immediate; after the eighth the delivery fails.
pub const RETRY_AFTER: [u64; 7] = [5, 300, 1_800, 7_200, 18_000, 36_000, 36_000];

/// Job events a pass reads at most, so a backlog is worked through in bounded transactions.
const EVENTS_PER_PASS: i64 = 5_000;

/// Job event ids a pass reads again below its cursor. Ids are taken when an event is written
/// and become visible when its transaction commits, so a long transaction can commit an event
/// below ids a pass already read; rereading the last ids finds it, and the message key keeps
/// what was already enqueued from being enqueued twice.
const REREAD_EVENTS: i64 = 2_000;

/// How far back a pass reads budget alerts before its cursor, for the same reason.
const REREAD_ALERTS: chrono::TimeDelta = chrono::TimeDelta::minutes(10);

/// Deliveries one worker claims at a time.
const CLAIM_BATCH: i64 = 16;

/// How long a receiver may take to answer.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// Runs the notifier and the delivery worker until this process stops leading.
pub async fn run(ctx: Ctx, epoch: i64) {
    tokio::select! {
        () = notifier(ctx.clone(), epoch) => {}
        () = deliverer(ctx, epoch) => {}
    }
}

async fn notifier(ctx: Ctx, epoch: i64) {
    loop {
        match pass(&ctx, epoch).await {
            Ok(_) => {}
            Err(ControlError::NotLeader) => return,
            Err(e) => tracing::warn!(error = %e, "webhook notifier pass failed"),
        }
        tokio::time::sleep(ctx.config.notify_interval).await;
    }
}

async fn deliverer(ctx: Ctx, epoch: i64) {
    let client = match reqwest::Client::builder()
        .timeout(REQUEST_TIMEOUT)
        // A receiver's redirect is its answer; following it would send the signed body elsewhere.
        .redirect(reqwest::redirect::Policy::none())
        .build()
    {
        Ok(client) => client,
        Err(e) => {
            tracing::error!(error = %e, "cannot build the webhook client; no webhooks are delivered");
            return std::future::pending().await;
        }
    };
    loop {
        match deliver_due(&ctx, epoch, &client).await {
            Ok(0) => tokio::time::sleep(ctx.config.notify_interval).await,
            Ok(_) => {}
            Err(ControlError::NotLeader) => return,
            Err(e) => {
                tracing::warn!(error = %e, "webhook delivery failed");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    }
}

/// One notifier pass: enqueues a delivery for every new job event and budget alert a webhook
/// asked for; how many it wrote.
pub async fn pass(ctx: &Ctx, epoch: i64) -> Result<u64, ControlError> {
    let mut tx = leader_tx(&ctx.pool, epoch).await?;
    let cursor = db::webhooks::lock_cursor(&mut tx).await?;
    let upto = db::webhooks::event_horizon(&mut tx, cursor.last_event_id, EVENTS_PER_PASS).await?;
    let jobs = db::webhooks::job_notices(&mut tx, (cursor.last_event_id - REREAD_EVENTS).max(0), upto).await?;
    let alerts = db::webhooks::budget_notices(&mut tx, cursor.last_alert_at - REREAD_ALERTS).await?;
    let newest_alert = db::webhooks::newest_alert(&mut tx).await?;
    let mut deliveries: Vec<NewDelivery> = jobs.iter().map(job_delivery).collect();
    deliveries.extend(alerts.iter().map(budget_delivery));
    let written = db::webhooks::enqueue(&mut tx, &deliveries).await?;
    let next = db::webhooks::Cursor {
        last_event_id: upto,
        last_alert_at: newest_alert.map_or(cursor.last_alert_at, |at| at.max(cursor.last_alert_at)),
    };
    if next.last_event_id != cursor.last_event_id || next.last_alert_at != cursor.last_alert_at || written > 0 {
        db::webhooks::advance_cursor(&mut tx, next).await?;
        tx.commit().await?;
    }
    if written > 0 {
        tracing::debug!(deliveries = written, "webhook deliveries enqueued");
    }
    Ok(written)
}

/// The sentence a Slack-format webhook gets for a job's event.
fn job_sentence(n: &db::webhooks::JobNotice) -> String {
    let what = match n.kind.as_str() {
        "succeeded" => "succeeded",
        "failed" => "failed",
        "preempted" => "was preempted",
        "requeued" => "was requeued",
        "idle" => "holds idle GPUs",
        _ => "was cancelled",
    };
    let reason = n.reason.as_deref().map(|r| format!(" ({r})")).unwrap_or_default();
    format!("Job {} of team {} {what}{reason}: {}.", n.job_name, n.team, n.message)
}

fn job_delivery(n: &db::webhooks::JobNotice) -> NewDelivery {
    let event_type = format!("job.{}", n.kind);
    let payload = if n.format == "slack" {
        json!({ "text": job_sentence(n) })
    } else {
        json!({
            "type": event_type,
            "timestamp": n.at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
            "data": {
                "job": n.job_id,
                "name": n.job_name,
                "team": n.team,
                "state": n.kind,
                "exit_code": n.exit_code,
                "attempt": n.attempt,
                "reason": n.reason,
                "message": n.message,
                "url": format!("/api/v1/jobs/{}", n.job_id),
            }
        })
    };
    NewDelivery { webhook_id: n.webhook_id, message_id: format!("msg_evt_{}", n.event_id), event_type, payload }
}

fn budget_delivery(n: &db::webhooks::BudgetNotice) -> NewDelivery {
    let period = BudgetPeriod::from_date(n.period).to_string();
    let payload = if n.format == "slack" {
        json!({ "text": format!("Team {} has used {}% of its budget for {period}.", n.team, n.threshold) })
    } else {
        json!({
            "type": "budget.threshold",
            "timestamp": n.raised_at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
            "data": {
                "team": n.team,
                "period": period,
                "threshold": n.threshold,
                "spent": n.spent,
                "amount": n.amount,
                "unit": n.unit,
            }
        })
    };
    NewDelivery {
        webhook_id: n.webhook_id,
        message_id: n.message_id.clone(),
        event_type: "budget.threshold".into(),
        payload,
    }
}

/// The `webhook-signature` value for a message: `v1,` and the base64 HMAC-SHA256, keyed by the
/// secret's bytes (the base64 after `whsec_`), of `{id}.{timestamp}.{body}`. `None` for a
/// secret not of that form (Fairway never makes one).
pub fn sign(secret: &str, id: &str, timestamp: i64, body: &str) -> Option<String> {
    let key = BASE64.decode(secret.strip_prefix("whsec_")?).ok()?;
    let mut mac = Hmac::<Sha256>::new_from_slice(&key).ok()?;
    mac.update(format!("{id}.{timestamp}.").as_bytes());
    mac.update(body.as_bytes());
    Some(format!("v1,{}", BASE64.encode(mac.finalize().into_bytes())))
}

/// When a delivery that has now failed `attempts` times is next tried; `None` once the
/// schedule is spent.
pub fn retry_in(attempts: i32, unit: Duration) -> Option<Duration> {
    let step = usize::try_from(attempts).ok()?.checked_sub(1)?;
    RETRY_AFTER.get(step).map(|&units| unit.saturating_mul(u32::try_from(units).unwrap_or(u32::MAX)))
}

/// Claims due deliveries and sends them together; how many it claimed.
async fn deliver_due(ctx: &Ctx, epoch: i64, client: &reqwest::Client) -> Result<usize, ControlError> {
    let mut tx = leader_tx(&ctx.pool, epoch).await?;
    let lease_ms = i64::try_from(ctx.config.webhook_lease.as_millis()).unwrap_or(i64::MAX);
    let claimed = db::webhooks::claim_due(&mut tx, CLAIM_BATCH, lease_ms).await?;
    tx.commit().await?;
    let sent = futures_util::future::join_all(claimed.iter().map(|d| attempt(ctx, client, d))).await;
    for result in sent {
        result?;
    }
    Ok(claimed.len())
}

/// Sends one delivery once and records what came of it.
async fn attempt(ctx: &Ctx, client: &reqwest::Client, d: &db::webhooks::Claimed) -> Result<(), ControlError> {
    let timestamp = chrono::Utc::now().timestamp();
    let Some(signature) = sign(&d.secret, &d.message_id, timestamp, &d.body) else {
        db::webhooks::mark_attempt_failed(&ctx.pool, d.id, None, "the webhook's secret is not a whsec_ secret", None)
            .await?;
        return Ok(());
    };
    let response = client
        .post(&d.url)
        .header("content-type", "application/json")
        .header("webhook-id", &d.message_id)
        .header("webhook-timestamp", timestamp.to_string())
        .header("webhook-signature", signature)
        .body(d.body.clone())
        .send()
        .await;
    let (status, error) = match response {
        Ok(r) if r.status().is_success() => {
            db::webhooks::mark_delivered(&ctx.pool, d.id, i32::from(r.status().as_u16())).await?;
            ctx.metrics.webhook_delivery("delivered");
            return Ok(());
        }
        Ok(r) => (Some(i32::from(r.status().as_u16())), format!("the receiver answered {}", r.status())),
        // Without the URL: the error is shown in the delivery log, the URL is beside it.
        Err(e) => (None, crate::telemetry::error_chain(&e.without_url())),
    };
    let retry = retry_in(d.attempts + 1, ctx.config.webhook_retry_unit);
    let retry_ms = retry.map(|r| i64::try_from(r.as_millis()).unwrap_or(i64::MAX));
    db::webhooks::mark_attempt_failed(&ctx.pool, d.id, status, &error, retry_ms).await?;
    ctx.metrics.webhook_delivery(if retry.is_some() { "retrying" } else { "failed" });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signature_matches_the_standard_webhooks_example() {
        // The example from the Standard Webhooks specification's reference libraries.
        let secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
        let body = r#"{"test": 2432232314}"#;
        assert_eq!(
            sign(secret, "msg_p5jXN8AQM9LWM0D4loKWxJek", 1_614_265_330, body).as_deref(),
            Some("v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=")
        );
    }

    #[test]
    fn retries_follow_the_standard_schedule_then_stop_after_eight_attempts() {
        let s = Duration::from_secs(1);
        assert_eq!(retry_in(1, s), Some(Duration::from_secs(5)));
        assert_eq!(retry_in(2, s), Some(Duration::from_secs(300)));
        assert_eq!(retry_in(7, s), Some(Duration::from_secs(36_000)));
        assert_eq!(retry_in(8, s), None);
        assert_eq!(retry_in(0, s), None);
    }

    #[test]
    fn a_secret_without_its_prefix_signs_nothing() {
        assert_eq!(sign("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "msg_1", 1, "{}"), None);
    }
}
