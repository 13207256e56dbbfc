//! The service pass: where a service's replicas are started and stopped. Each scheduling
//! cycle, after the array pass and before the snapshot is read, one transaction checks the
//! leader's epoch, locks the services that need looking after and their replicas, and
//! follows `domain::service::plan` for each: a replica job for every empty slot (the first
//! start, a replica whose restarts are spent after a change, a scale-up, the next step of a
//! rolling update), a stop for every replica beyond the size asked or replaced by its
//! successor. New replicas join this cycle's snapshot; the engine admits them within the
//! quotas like any job.

use serde_json::json;

use super::ControlError;
use crate::{
    backends::Backend,
    db::{
        self,
        jobs::{NewEvent, NewJob, ServiceReplica, Submission},
        services::ServiceRow,
    },
    domain::{
        service::{self, StopWhy, Target, NO_MAXIMUM_RUNTIME_SECONDS},
        JobId,
    },
};

/// What a pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Reconciled {
    pub started: usize,
    pub stopped: usize,
}

/// The job of the replica in `slot` of `service`.
pub fn replica_job(service: &ServiceRow, slot: i32) -> NewJob {
    let t = &service.template.0;
    NewJob {
        id: JobId::new(),
        name: service.name.clone(),
        gpu_class_id: t.gpu_class_id,
        priority_class: t.priority_of(slot, service.min_replicas).to_owned(),
        replicas: 1,
        gpus_per_replica: t.gpus,
        max_runtime_seconds: NO_MAXIMUM_RUNTIME_SECONDS,
        expected_runtime_seconds: None,
        image: t.image.clone(),
        command: json!(t.command),
        env: t.env.clone(),
        labels: t.labels.clone(),
        topology_mode: "any".into(),
        topology_level: None,
        preemption_grace_seconds: t.preemption_grace_seconds,
        max_retries: t.restart_budget,
        allow_spot: false,
        cpu_millis: t.cpu_millis,
        memory_mib: t.memory_mib,
        workload: t.workload.clone(),
        min_driver_version: t.min_driver_version.clone(),
        min_cuda_version: t.min_cuda_version.clone(),
        depends_on: Vec::new(),
        if_dependency_fails: Default::default(),
        accepted_despite: Vec::new(),
        array: None,
        service: Some(ServiceReplica {
            service_id: service.id,
            name: service.name.clone(),
            port: service.port,
            slot,
            revision: service.revision,
        }),
        preemption_delay_seconds: None,
        max_replicas: None,
    }
}

/// Runs the pass as the leader of `epoch`; a cycle calls it when `db::snapshot::passes_due`
/// says it has something to do.
pub async fn reconcile(pool: &sqlx::PgPool, epoch: i64) -> Result<Reconciled, ControlError> {
    let mut tx = pool.begin().await?;
    if !db::leader::check_epoch(&mut tx, epoch).await? {
        return Err(ControlError::NotLeader);
    }
    let services = db::services::lock_open(&mut tx).await?;
    let ids: Vec<_> = services.iter().map(|s| s.id).collect();
    let replicas = db::services::replicas(&mut *tx, &ids).await?;
    let mut new_jobs: Vec<(crate::domain::TeamId, String, NewJob)> = Vec::new();
    // Each replica to stop, with the words of why.
    let mut stop: std::collections::HashMap<JobId, (String, StopWhy, i64)> = std::collections::HashMap::new();
    for s in &services {
        let mine: Vec<_> = replicas.iter().filter(|r| r.service_id == s.id).collect();
        let seen: Vec<_> = mine.iter().map(|r| r.replica()).collect();
        let target = Target { replicas: s.replicas, min: s.min_replicas, revision: s.revision };
        let plan = service::plan(target, &seen);
        for slot in plan.start {
            new_jobs.push((s.team_id, format!("service {}", s.name), replica_job(s, slot)));
        }
        for (job, why) in plan.stop {
            let Some(r) = mine.iter().find(|r| r.job_id == job) else { continue };
            let what = match why {
                StopWhy::ScaledDown if s.deleted_at.is_some() => format!("service {} was deleted", s.name),
                StopWhy::ScaledDown => format!("service {} was scaled to {} replicas", s.name, s.replicas),
                StopWhy::Replaced { .. } => {
                    format!("replaced by a replica of revision {} of service {}", s.revision, s.name)
                }
                StopWhy::NoRoom => format!(
                    "no room within the quotas beside the replica of service {} it replaces; a new one starts once that one has stopped",
                    s.name
                ),
            };
            stop.insert(job, (what, why, r.grace_ms));
        }
    }
    // The replicas to stop, and those taking their places: a replica is stopped for its
    // successor only if that one is still live once both are locked (it may have ended since
    // the read), else the slot is looked at again next cycle.
    let mut wanted: Vec<JobId> = stop.keys().copied().collect();
    wanted.extend(stop.values().filter_map(|(_, why, _)| match why {
        StopWhy::Replaced { by } => Some(*by),
        _ => None,
    }));
    wanted.sort_unstable();
    wanted.dedup();
    let locked = db::services::lock_to_stop(&mut tx, &wanted).await?;
    let live: std::collections::HashSet<JobId> = locked.iter().map(|r| r.job_id).collect();
    stop.retain(|_, (_, why, _)| match why {
        StopWhy::Replaced { by } => live.contains(by),
        _ => true,
    });
    let locked: Vec<_> = locked.into_iter().filter(|r| stop.contains_key(&r.job_id)).collect();
    let stopped = locked.len();
    let mut idle: Vec<JobId> = Vec::new();
    let mut events: Vec<NewEvent> = Vec::new();
    for r in locked {
        let Some((what, why, grace_ms)) = stop.remove(&r.job_id) else { continue };
        if r.holds_gpus {
            db::jobs::mark_cancelled(&mut tx, r.job_id, r.attempt, Some(grace_ms)).await?;
            events.push(NewEvent {
                job_id: r.job_id,
                attempt: r.attempt,
                kind: "cancel_requested",
                reason: Some("service".into()),
                message: format!("{what}; stopping with a {} s grace period", grace_ms / 1000),
                data: None,
            });
        } else {
            idle.push(r.job_id);
            events.push(NewEvent {
                job_id: r.job_id,
                attempt: r.attempt,
                kind: "cancelled",
                reason: Some("service".into()),
                message: if why == StopWhy::NoRoom { what } else { format!("{what}, before this replica ran") },
                data: None,
            });
        }
    }
    db::jobs::cancel_idle(&mut tx, &idle).await?;
    db::jobs::add_events(&mut tx, &events).await?;
    let submissions: Vec<Submission> = new_jobs
        .iter()
        .map(|(team_id, by, job)| Submission { team_id: *team_id, submitted_by: by, job, check: None })
        .collect();
    let started =
        if submissions.is_empty() { 0 } else { db::jobs::insert_submissions(&mut *tx, &submissions).await?.len() };
    tx.commit().await?;
    Ok(Reconciled { started, stopped })
}

/// Removes from `cluster` the endpoints of deleted services whose replicas have all ended,
/// and forgets them: run by the leader's reconciler after each pass over the cluster. How
/// many it removed.
pub async fn withdraw(pool: &sqlx::PgPool, cluster: &str, backend: &dyn Backend) -> Result<usize, ControlError> {
    let gone = db::services::withdrawable(pool, cluster).await?;
    for e in &gone {
        backend.withdraw(&e.team, &e.name).await?;
        db::services::forget_endpoint(pool, e.service_id, cluster).await?;
        tracing::info!(cluster, team = %e.team, service = %e.name, "service endpoint removed");
    }
    Ok(gone.len())
}
