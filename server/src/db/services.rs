//! Inference services: the service rows with their replica template, the replicas the
//! leader's service pass reads and locks, and where each service can be reached. The
//! replicas themselves are jobs (`db::jobs`).

use chrono::{DateTime, Utc};
use sqlx::{types::Json, PgPool};

use super::Tx;
use crate::domain::{
    service::{Phase, Replica, Template},
    JobId, JobState, ServiceId, TeamId,
};

/// A service.
#[derive(Debug, Clone)]
pub struct ServiceRow {
    pub id: ServiceId,
    pub seq: i64,
    pub team_id: TeamId,
    pub team: String,
    pub name: String,
    pub min_replicas: i32,
    pub max_replicas: i32,
    /// Replicas asked for; 0 once deleted.
    pub replicas: i32,
    pub port: i32,
    pub revision: i32,
    pub template: Json<Template>,
    /// The replica as it was asked for (`ops::services::ReplicaSpec`).
    pub replica_spec: Json<serde_json::Value>,
    pub gpu_class: String,
    pub created_by: String,
    pub created_at: DateTime<Utc>,
    pub changed_at: DateTime<Utc>,
    pub deleted_at: Option<DateTime<Utc>>,
    pub version: i64,
}

/// A service to store.
#[derive(Debug, Clone)]
pub struct NewService<'a> {
    pub id: ServiceId,
    pub team_id: TeamId,
    pub name: &'a str,
    pub min_replicas: i32,
    pub max_replicas: i32,
    pub replicas: i32,
    pub port: i32,
    pub template: &'a Template,
    pub replica_spec: &'a serde_json::Value,
    pub created_by: &'a str,
}

/// Stores a service; `false` when the team already has a live service of that name.
pub async fn insert(tx: &mut Tx<'_>, s: &NewService<'_>) -> Result<bool, sqlx::Error> {
    let stored = sqlx::query!(
        "insert into services (id, team_id, name, min_replicas, max_replicas, replicas, port, template, replica_spec,
                               created_by)
         values ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
         on conflict (team_id, name) where deleted_at is null do nothing",
        s.id as ServiceId,
        s.team_id as TeamId,
        s.name,
        s.min_replicas,
        s.max_replicas,
        s.replicas,
        s.port,
        Json(s.template) as _,
        s.replica_spec,
        s.created_by
    )
    .execute(&mut **tx)
    .await?;
    Ok(stored.rows_affected() == 1)
}

/// A query for [`ServiceRow`]s followed by `$rest` (the where clause and what follows).
macro_rules! select_services {
    ($rest:tt, $($arg:expr),* $(,)?) => {
        sqlx::query_as!(
            ServiceRow,
            r#"select s.id as "id: ServiceId", s.seq, s.team_id as "team_id: TeamId", t.name as team, s.name,
                      s.min_replicas, s.max_replicas, s.replicas, s.port, s.revision,
                      s.template as "template: Json<Template>", s.replica_spec as "replica_spec: Json<serde_json::Value>",
                      c.name as gpu_class, s.created_by, s.created_at,
                      s.changed_at, s.deleted_at, s.version
               from services s
               join teams t on t.id = s.team_id
               join gpu_classes c on c.id = (s.template ->> 'gpu_class_id')::uuid
               "# + $rest,
            $($arg),*
        )
    };
}

/// The live service `name` of `team_id`.
pub async fn get(
    db: impl sqlx::PgExecutor<'_>,
    team_id: TeamId,
    name: &str,
) -> Result<Option<ServiceRow>, sqlx::Error> {
    select_services!(r#"where s.team_id = $1 and s.name = $2 and s.deleted_at is null"#, team_id as TeamId, name)
        .fetch_optional(db)
        .await
}

/// Service `id` of `team_id`, deleted or not.
pub async fn by_id(
    db: impl sqlx::PgExecutor<'_>,
    team_id: TeamId,
    id: ServiceId,
) -> Result<Option<ServiceRow>, sqlx::Error> {
    select_services!(r#"where s.team_id = $1 and s.id = $2"#, team_id as TeamId, id as ServiceId)
        .fetch_optional(db)
        .await
}

/// A team's live services, oldest first, after `after_seq` when given.
pub async fn list(
    db: impl sqlx::PgExecutor<'_>,
    team_id: TeamId,
    after_seq: Option<i64>,
    limit: i64,
) -> Result<Vec<ServiceRow>, sqlx::Error> {
    select_services!(
        r#"where s.team_id = $1 and s.deleted_at is null and ($2::int8 is null or s.seq > $2)
           order by s.seq
           limit $3"#,
        team_id as TeamId,
        after_seq,
        limit
    )
    .fetch_all(db)
    .await
}

/// Locks the live service `name` of `team_id` for a change.
pub async fn lock(tx: &mut Tx<'_>, team_id: TeamId, name: &str) -> Result<Option<ServiceRow>, sqlx::Error> {
    select_services!(
        r#"where s.team_id = $1 and s.name = $2 and s.deleted_at is null for no key update of s"#,
        team_id as TeamId,
        name
    )
    .fetch_optional(&mut **tx)
    .await
}

/// What a change of a service writes.
#[derive(Debug, Clone)]
pub struct Change<'a> {
    pub min_replicas: i32,
    pub max_replicas: i32,
    pub replicas: i32,
    pub revision: i32,
    pub template: &'a Template,
    pub replica_spec: &'a serde_json::Value,
}

/// Writes `change` to service `id`, marking the change (replicas out of restarts start
/// again) and bumping its version.
pub async fn update(tx: &mut Tx<'_>, id: ServiceId, change: &Change<'_>) -> Result<(), sqlx::Error> {
    sqlx::query!(
        "update services set min_replicas = $2, max_replicas = $3, replicas = $4, revision = $5, template = $6,
                replica_spec = $7, changed_at = now(), version = version + 1
         where id = $1",
        id as ServiceId,
        change.min_replicas,
        change.max_replicas,
        change.replicas,
        change.revision,
        Json(change.template) as _,
        change.replica_spec
    )
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// Marks service `id` deleted: it asks for no replicas, and its name is free again.
pub async fn delete(tx: &mut Tx<'_>, id: ServiceId) -> Result<(), sqlx::Error> {
    sqlx::query!(
        "update services set deleted_at = now(), replicas = 0, changed_at = now(), version = version + 1
         where id = $1",
        id as ServiceId
    )
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// Locks the services the pass looks after: the live ones, and the deleted ones whose
/// replicas have not all ended. `no key update`: a dispatcher recording an endpoint (a
/// foreign key to the service) is not held up by it.
pub async fn lock_open(tx: &mut Tx<'_>) -> Result<Vec<ServiceRow>, sqlx::Error> {
    select_services!(
        r#"where s.deleted_at is null
              or exists (select 1 from jobs j where j.service_id = s.id
                            and (j.state in ('pending', 'admitted', 'running') or j.holds_gpus))
           order by s.id
           for no key update of s"#,
    )
    .fetch_all(&mut **tx)
    .await
}

/// A replica job as the pass and the service's view see it.
#[derive(Debug, Clone)]
pub struct ReplicaRow {
    pub service_id: ServiceId,
    pub job_id: JobId,
    pub slot: i32,
    pub revision: i32,
    pub state: JobState,
    pub attempt: i32,
    pub holds_gpus: bool,
    /// The reason it shows while it waits.
    pub pending_reason: Option<String>,
    /// Runs at the service's guaranteed class.
    pub guaranteed: bool,
    pub since_change: bool,
    pub grace_ms: i64,
}

impl ReplicaRow {
    /// The replica as the pure rules see it.
    pub fn replica(&self) -> Replica {
        Replica {
            job: self.job_id,
            slot: self.slot,
            revision: self.revision,
            guaranteed: self.guaranteed,
            phase: Phase::of(self.state, self.holds_gpus, self.pending_reason.as_deref()),
            since_change: self.since_change,
        }
    }
}

/// The replicas that decide what services `ids` do next: those that run or will, those
/// still giving GPUs back, and those that ended since the service's last change (they tell
/// whether a slot's restarts are spent). Not locked: the pass is the only writer of new
/// replicas, and it locks the few it stops ([`lock_to_stop`]).
pub async fn replicas(db: impl sqlx::PgExecutor<'_>, ids: &[ServiceId]) -> Result<Vec<ReplicaRow>, sqlx::Error> {
    sqlx::query_as!(
        ReplicaRow,
        r#"select j.service_id as "service_id!: ServiceId", j.id as "job_id: JobId", j.service_slot as "slot!",
                  j.service_revision as "revision!", j.state as "state: JobState", j.attempt, j.holds_gpus,
                  j.pending_reason, j.priority_class = s.template ->> 'priority_class' as "guaranteed!",
                  coalesce(j.finished_at >= s.changed_at, false) as "since_change!",
                  coalesce(j.preemption_grace_seconds, p.preemption_grace_seconds)::int8 * 1000 as "grace_ms!"
           from jobs j
           join services s on s.id = j.service_id
           join priority_classes p on p.name = j.priority_class
           where j.service_id = any($1)
             and (j.state in ('pending', 'admitted', 'running') or j.holds_gpus or j.finished_at >= s.changed_at)
           order by j.service_id, j.service_slot, j.seq"#,
        ids as &[ServiceId]
    )
    .fetch_all(db)
    .await
}

/// A replica the pass stops, as it is now that it is locked.
#[derive(Debug, Clone)]
pub struct ToStop {
    pub job_id: JobId,
    pub attempt: i32,
    pub holds_gpus: bool,
}

/// Locks the replicas `ids` the pass means to stop (and those taking their places), in id
/// order (as the reconciler locks jobs), skipping any another transaction holds (the
/// dispatcher creating it, the reconciler ending it): those are looked at again next cycle.
/// Only those still live are returned, as they are now.
pub async fn lock_to_stop(tx: &mut Tx<'_>, ids: &[JobId]) -> Result<Vec<ToStop>, sqlx::Error> {
    sqlx::query_as!(
        ToStop,
        r#"select id as "job_id: JobId", attempt, holds_gpus from jobs
           where id = any($1) and (state in ('pending', 'admitted', 'running') or (state = 'preempted' and holds_gpus))
           order by id
           for update skip locked"#,
        ids as &[JobId]
    )
    .fetch_all(&mut **tx)
    .await
}

/// Records where service `id` can be reached on the cluster named `cluster`.
pub async fn set_endpoint(tx: &mut Tx<'_>, id: ServiceId, cluster: &str, address: &str) -> Result<(), sqlx::Error> {
    sqlx::query!(
        "insert into service_endpoints (service_id, cluster_id, address)
         select $1, c.id, $3 from clusters c where c.name = $2
         on conflict (service_id, cluster_id) do update set address = excluded.address",
        id as ServiceId,
        cluster,
        address
    )
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// Where a service can be reached: a cluster and an address there.
#[derive(Debug, Clone)]
pub struct Endpoint {
    pub service_id: ServiceId,
    pub cluster: String,
    pub address: String,
}

/// The endpoints of services `ids`, by cluster name.
pub async fn endpoints(db: impl sqlx::PgExecutor<'_>, ids: &[ServiceId]) -> Result<Vec<Endpoint>, sqlx::Error> {
    sqlx::query_as!(
        Endpoint,
        r#"select e.service_id as "service_id: ServiceId", c.name as cluster, e.address
           from service_endpoints e join clusters c on c.id = e.cluster_id
           where e.service_id = any($1)
           order by e.service_id, c.name"#,
        ids as &[ServiceId]
    )
    .fetch_all(db)
    .await
}

/// An endpoint nothing needs any more: its service is deleted and every replica ended.
#[derive(Debug, Clone)]
pub struct Withdrawable {
    pub service_id: ServiceId,
    pub team: String,
    pub name: String,
}

/// The endpoints on the cluster named `cluster` of deleted services whose replicas have all
/// ended.
pub async fn withdrawable(pool: &PgPool, cluster: &str) -> Result<Vec<Withdrawable>, sqlx::Error> {
    sqlx::query_as!(
        Withdrawable,
        r#"select s.id as "service_id: ServiceId", t.name as team, s.name
           from service_endpoints e
           join clusters c on c.id = e.cluster_id
           join services s on s.id = e.service_id
           join teams t on t.id = s.team_id
           where c.name = $1 and s.deleted_at is not null
             and not exists (select 1 from jobs j where j.service_id = s.id
                                and (j.state in ('pending', 'admitted', 'running') or j.holds_gpus))
             -- A live service of the same name uses the same endpoint: it stays.
             and not exists (select 1 from services l where l.team_id = s.team_id and l.name = s.name
                                and l.deleted_at is null)"#,
        cluster
    )
    .fetch_all(pool)
    .await
}

/// Forgets the endpoint of service `id` on the cluster named `cluster`, once removed there.
pub async fn forget_endpoint(pool: &PgPool, id: ServiceId, cluster: &str) -> Result<(), sqlx::Error> {
    sqlx::query!(
        "delete from service_endpoints e using clusters c
         where e.cluster_id = c.id and c.name = $2 and e.service_id = $1",
        id as ServiceId,
        cluster
    )
    .execute(pool)
    .await?;
    Ok(())
}
