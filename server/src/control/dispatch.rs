//! The dispatcher: works through the outbox the scheduling cycles write, a few rows per
//! transaction, rows claimed with `for update skip locked` so several workers (or replicas)
//! never take the same one. The rows stay locked while the backend is called and are marked
//! done in the same transaction, so a crash at any point leaves them to be claimed again;
//! backend calls are idempotent (object names derive from the job id and attempt), so doing
//! one twice is harmless. Failed calls are retried with exponential backoff, jitter and a cap.

use std::{
    collections::{BTreeMap, HashMap},
    time::{Duration, Instant},
};

use chrono::Utc;
use serde_json::json;

use super::{
    leader_tx,
    reconcile::{end_attempts, Ended},
    ControlError, Ctx,
};
use crate::{
    backends::{object_name, within, BackendError, Gang, Outcome, ReplicaSlot},
    db,
    domain::{JobId, JobState},
};

/// First retry delay.
const BACKOFF_BASE_MS: f64 = 250.0;
/// Longest retry delay.
const BACKOFF_CAP_MS: f64 = 60_000.0;
/// Longest a backend call may take before it counts as failed.
const CALL_TIMEOUT: Duration = Duration::from_secs(20);

/// The delay before retry `tries + 1`: exponential, capped, with "equal jitter" so that
/// many rows failing together do not retry together.
pub fn backoff_ms(tries: i32, random: f64) -> i64 {
    let exp = BACKOFF_BASE_MS * 2f64.powi(tries.clamp(0, 30));
    let capped = exp.min(BACKOFF_CAP_MS);
    (capped / 2.0 + capped / 2.0 * random.clamp(0.0, 1.0)) as i64
}

/// Outbox rows one transaction takes at most. A burst of small jobs is dispatched with one
/// transaction (and one commit) per batch instead of per job, while a batch stays short
/// enough that the job rows it keeps share-locked are not held up for long.
const BATCH: i64 = 16;

/// Longest a dispatcher claims from its [`Cursor`]'s floor before it claims from the start.
const FULL_CLAIM_EVERY: Duration = Duration::from_secs(1);

/// Where a dispatcher's next claim starts reading the outbox. A row marked done leaves the
/// open rows' index only when vacuum removes its entry, so a claim from the start walks the
/// entry of every row done since (4 ms and more after a burst of tens of thousands); from the
/// lowest id the last claim took, it walks none. Rows below the floor are done, or held by
/// another dispatcher, or put off for a retry: a claim from the start at least every
/// [`FULL_CLAIM_EVERY`], and after any claim from the floor that found nothing, takes those
/// (a retry waits at least 125 ms anyway).
#[derive(Debug, Clone, Default)]
pub struct Cursor {
    floor: i64,
    /// When the last claim from the start was made; `None` makes the next one from the start.
    last_full: Option<Instant>,
}

impl Cursor {
    /// The lowest outbox id the next claim looks at, made at `now`.
    pub fn from(&mut self, now: Instant) -> i64 {
        match self.last_full {
            Some(at) if now.duration_since(at) < FULL_CLAIM_EVERY => self.floor,
            _ => {
                self.last_full = Some(now);
                0
            }
        }
    }

    /// Records what a claim from `from` took: the floor moves up to the lowest id taken. One
    /// that took nothing sends the next claim to the start.
    pub fn claimed(&mut self, from: i64, ids: impl IntoIterator<Item = i64>) {
        match ids.into_iter().min() {
            Some(lowest) => self.floor = self.floor.max(lowest),
            None if from > 0 => self.last_full = None,
            None => {}
        }
    }
}

/// Handles up to [`BATCH`] due outbox rows in one transaction; how many there were.
pub async fn dispatch_batch(ctx: &Ctx, epoch: i64, cursor: &mut Cursor) -> Result<usize, ControlError> {
    let mut tx = leader_tx(&ctx.pool, epoch).await?;
    let from = cursor.from(Instant::now());
    let rows = db::outbox::claim(&mut tx, from, BATCH).await?;
    let mut asked = create_all(ctx, &mut tx, &rows).await?;
    let mut dispatched = Vec::with_capacity(rows.len());
    for row in &rows {
        dispatch_row(ctx, &mut tx, row, asked.remove(&row.id), &mut dispatched).await?;
    }
    db::outbox::record_dispatched(&mut tx, &dispatched).await?;
    tx.commit().await?;
    if !dispatched.is_empty() {
        ctx.reconcile_soon.notify_one();
    }
    cursor.claimed(from, rows.iter().map(|r| r.id));
    Ok(rows.len())
}

/// The answer to the object a `submit` row asks for, asked before any row is recorded.
struct Asked {
    gang: Gang,
    /// The cluster's answer, with the service endpoint a replica is reached at.
    answer: Result<Option<String>, BackendError>,
}

/// An object to ask one cluster for.
struct Ask {
    outbox_id: i64,
    gang: Gang,
    endpoint: Option<String>,
}

/// Whether `row` asks to create the object of its job's current, admitted or running attempt.
fn creates(row: &db::outbox::OutboxRow) -> bool {
    row.action == "submit"
        && row.job_attempt == row.attempt
        && matches!(row.job_state, JobState::Admitted | JobState::Running)
}

/// Creates the objects the batch's `submit` rows ask for: their jobs read in one statement,
/// each cluster's gangs handed over in one [`crate::backends::Backend::submit_many`] call.
/// By outbox row id; a row whose job is gone has no answer.
async fn create_all(
    ctx: &Ctx,
    tx: &mut db::Tx<'_>,
    rows: &[db::outbox::OutboxRow],
) -> Result<HashMap<i64, Asked>, ControlError> {
    let wanted: Vec<&db::outbox::OutboxRow> = rows
        .iter()
        .filter(|row| creates(row) && row.cluster.as_deref().is_some_and(|c| ctx.backends.contains_key(c)))
        .collect();
    let mut asked = HashMap::with_capacity(wanted.len());
    if wanted.is_empty() {
        return Ok(asked);
    }
    let ids: Vec<JobId> = wanted.iter().map(|row| row.job_id).collect();
    let jobs: HashMap<JobId, db::jobs::JobRow> =
        db::jobs::get_many(&mut **tx, &ids).await?.into_iter().map(|job| (job.id, job)).collect();
    let mut by_cluster: BTreeMap<&str, Vec<Ask>> = BTreeMap::new();
    for row in wanted {
        let Some(job) = jobs.get(&row.job_id) else { continue };
        let cluster = row.cluster.as_deref().unwrap_or_default();
        let gang = gang(job, &object_name(row.job_id, row.attempt));
        // A service's replica runs only where the service can be reached.
        match gang.service.as_ref().map(|s| ctx.backends[cluster].endpoint(&gang.team, s)).transpose() {
            Ok(endpoint) => by_cluster.entry(cluster).or_default().push(Ask { outbox_id: row.id, gang, endpoint }),
            Err(e) => {
                asked.insert(row.id, Asked { gang, answer: Err(e) });
            }
        }
    }
    for (cluster, asks) in by_cluster {
        let gangs: Vec<Gang> = asks.iter().map(|ask| ask.gang.clone()).collect();
        let answers = ctx.backends[cluster].submit_many(&gangs, CALL_TIMEOUT).await;
        for (ask, answer) in asks.into_iter().zip(answers) {
            asked.insert(ask.outbox_id, Asked { gang: ask.gang, answer: answer.map(|()| ask.endpoint) });
        }
    }
    Ok(asked)
}

/// Does what one claimed outbox row asks, recording the result in `tx`, or, for an object a
/// cluster accepted, in `dispatched`, which the batch records at once. A `submit` row's
/// object was asked for already ([`create_all`]); `asked` is the answer, none when its job
/// is gone.
async fn dispatch_row(
    ctx: &Ctx,
    tx: &mut db::Tx<'_>,
    row: &db::outbox::OutboxRow,
    asked: Option<Asked>,
    dispatched: &mut Vec<db::outbox::Dispatched>,
) -> Result<(), ControlError> {
    let object = object_name(row.job_id, row.attempt);
    let backend = row.cluster.as_deref().and_then(|c| ctx.backends.get(c).map(|b| (c.to_owned(), b.clone())));
    let Some((cluster, backend)) = backend else {
        let delay = backoff_ms(row.tries, rand::random());
        db::outbox::retry_later(tx, row.id, delay, "no backend is configured for the job's cluster").await?;
        return Ok(());
    };
    match row.action.as_str() {
        // The job was cancelled or preempted before its object existed, or a newer attempt
        // replaced it: nothing to create. The reconciler releases the GPUs.
        // (A running job's object exists already: the reconciler saw it after a crash cut
        // this row short, and a repeated create is a harmless no-op that records it.)
        "submit" if !creates(row) => {
            db::outbox::complete(tx, row.id, Some("superseded before dispatch")).await?;
        }
        "submit" => {
            let Some(Asked { gang, answer }) = asked else {
                db::outbox::complete(tx, row.id, Some("job deleted")).await?;
                return Ok(());
            };
            match answer {
                Ok(endpoint) => {
                    if let (Some(service), Some(address)) = (&gang.service, endpoint) {
                        db::services::set_endpoint(tx, service.id, &cluster, &address).await?;
                    }
                    dispatched.push(db::outbox::Dispatched {
                        outbox_id: row.id,
                        job_id: row.job_id,
                        attempt: row.attempt,
                        at: Utc::now(),
                        message: format!("created {object} on cluster {cluster}"),
                        data: json!({"object": object, "cluster": cluster, "tries": row.tries + 1}),
                    });
                }
                Err(BackendError::Transient(e)) => {
                    ctx.metrics.dispatch_error(&cluster, "transient");
                    let delay = backoff_ms(row.tries, rand::random());
                    if row.tries == 0 || row.tries % 5 == 4 {
                        db::jobs::add_event(
                            tx,
                            row.job_id,
                            row.attempt,
                            "dispatch_error",
                            Some("transient"),
                            &format!("cluster {cluster} did not accept the job yet ({e}); retrying in {delay} ms"),
                            None,
                        )
                        .await?;
                    }
                    db::outbox::retry_later(tx, row.id, delay, &e).await?;
                }
                Err(e @ (BackendError::CapacityUnavailable(_) | BackendError::Rejected(_))) => {
                    let (kind, outcome) = match &e {
                        BackendError::CapacityUnavailable(_) => ("capacity", Outcome::CapacityUnavailable),
                        _ => ("rejected", Outcome::AppFailed { exit_code: None, reason: "Rejected".into() }),
                    };
                    ctx.metrics.dispatch_error(&cluster, kind);
                    db::jobs::add_event(
                        tx,
                        row.job_id,
                        row.attempt,
                        "dispatch_error",
                        Some(kind),
                        &format!("cluster {cluster} refused the job: {e}"),
                        None,
                    )
                    .await?;
                    db::outbox::complete(tx, row.id, Some(&e.to_string())).await?;
                    let ended = Ended {
                        job_id: row.job_id,
                        attempt: row.attempt,
                        outcome,
                        started_at: None,
                        ended_at: Utc::now(),
                        object: object.clone(),
                        cause: None,
                    };
                    end_attempts(tx, &[ended], ctx).await?;
                    let attempt = [(row.job_id, row.attempt)];
                    crate::metering::ledger::book_many(tx, &attempt, None, &ctx.config.pricing).await?;
                }
            }
        }
        _ => {
            let grace = Duration::from_millis(row.grace_ms.max(0) as u64);
            match within(CALL_TIMEOUT, backend.stop(&object, grace)).await {
                Ok(()) => db::outbox::complete(tx, row.id, None).await?,
                Err(e) => {
                    ctx.metrics.dispatch_error(&cluster, "stop");
                    let delay = backoff_ms(row.tries, rand::random());
                    db::outbox::retry_later(tx, row.id, delay, &e.to_string()).await?;
                }
            }
        }
    }
    Ok(())
}

/// The gang to create for a job's current attempt.
pub fn gang(job: &db::jobs::JobRow, object: &str) -> Gang {
    let replicas: Vec<ReplicaSlot> =
        job.placement.as_ref().and_then(|p| serde_json::from_value(p.0.clone()).ok()).unwrap_or_default();
    let strings = |v: &serde_json::Value| -> BTreeMap<String, String> {
        v.as_object()
            .map(|m| m.iter().map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_owned())).collect())
            .unwrap_or_default()
    };
    Gang {
        object: object.to_owned(),
        job_id: job.id,
        attempt: job.attempt,
        team: job.team.clone(),
        job_name: job.name.clone(),
        gpu_class: job.gpu_class.clone(),
        priority_class: job.priority_class.clone(),
        image: job.image.clone(),
        command: job.command.0.clone(),
        env: strings(&job.env.0),
        labels: strings(&job.labels.0),
        max_runtime: Duration::from_secs(job.max_runtime_seconds.max(0) as u64),
        cpu_millis: job.cpu_millis,
        memory_mib: job.memory_mib,
        workload: job.workload.0.clone(),
        replicas,
        array: match (job.array_id, job.array_index, job.array_task_count) {
            (Some(id), Some(index), Some(count)) => Some(crate::backends::ArrayTaskEnv { id, index, count }),
            _ => None,
        },
        service: match (job.service_id, &job.service, job.service_slot, job.service_revision, job.service_port) {
            (Some(id), Some(name), Some(slot), Some(revision), Some(port)) => {
                Some(crate::backends::ServiceBinding { id, name: name.clone(), slot, revision, port })
            }
            _ => None,
        },
        extra_of: match (job.extra_of, job.extra_of_attempt) {
            (Some(gang), Some(attempt)) => Some(crate::backends::ElasticBinding {
                job_id: gang,
                object: crate::backends::object_name(gang, attempt),
            }),
            _ => None,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_with_jitter_and_stops_at_the_cap() {
        assert_eq!(backoff_ms(0, 1.0), 250);
        assert_eq!(backoff_ms(0, 0.0), 125);
        assert_eq!(backoff_ms(3, 1.0), 2000);
        assert_eq!(backoff_ms(20, 1.0), 60_000);
        assert_eq!(backoff_ms(20, 0.0), 30_000);
        assert!(backoff_ms(1000, 0.5) <= 60_000);
    }

    #[test]
    fn a_dispatcher_claims_from_the_lowest_row_it_took_and_from_the_start_every_second() {
        let t0 = Instant::now();
        let mut cursor = Cursor::default();
        assert_eq!(cursor.from(t0), 0, "the first claim reads from the start");
        cursor.claimed(0, [40, 41, 42]);
        let soon = t0 + Duration::from_millis(100);
        assert_eq!(cursor.from(soon), 40);
        cursor.claimed(40, [43, 44]);
        assert_eq!(cursor.from(soon), 43, "the floor follows the claims");
        // A row put off for a retry below the floor is found by the claim from the start.
        assert_eq!(cursor.from(t0 + FULL_CLAIM_EVERY), 0);
        cursor.claimed(0, [7]);
        assert_eq!(cursor.from(t0 + FULL_CLAIM_EVERY), 43, "a low row taken does not move the floor down");
    }

    #[test]
    fn a_claim_from_the_floor_that_finds_nothing_sends_the_next_to_the_start() {
        let t0 = Instant::now();
        let mut cursor = Cursor::default();
        assert_eq!(cursor.from(t0), 0);
        cursor.claimed(0, [10]);
        assert_eq!(cursor.from(t0), 10);
        cursor.claimed(10, []);
        assert_eq!(cursor.from(t0), 0, "whatever waits below the floor is looked for at once");
        cursor.claimed(0, []);
        assert_eq!(cursor.from(t0), 10, "an empty outbox is not read from the start again and again");
    }
}
