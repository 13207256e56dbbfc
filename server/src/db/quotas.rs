//! Quotas per team per GPU class.

use crate::domain::GpuClassId;
use crate::domain::TeamId;
use chrono::{DateTime, Utc};
use sqlx::PgPool;

use super::Tx;

/// A stored quota with its class's name.
#[derive(Debug, Clone, serde::Serialize)]
pub struct QuotaRow {
    pub gpu_class: String,
    pub reserved: i32,
    pub burst: i32,
    pub lendable: Option<i32>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub version: i64,
}

/// Quotas of `team_id` by class name.
pub async fn list(pool: &PgPool, team_id: TeamId) -> Result<Vec<QuotaRow>, sqlx::Error> {
    sqlx::query_as!(
        QuotaRow,
        "select c.name as gpu_class, q.reserved, q.burst, q.lendable, q.created_at, q.updated_at, q.version
         from quotas q join gpu_classes c on c.id = q.gpu_class_id
         where q.team_id = $1 order by c.name",
        team_id as TeamId
    )
    .fetch_all(pool)
    .await
}

/// The quota of `team_id` for `class_id`.
pub async fn get(pool: &PgPool, team_id: TeamId, class_id: GpuClassId) -> Result<Option<QuotaRow>, sqlx::Error> {
    sqlx::query_as!(
        QuotaRow,
        "select c.name as gpu_class, q.reserved, q.burst, q.lendable, q.created_at, q.updated_at, q.version
         from quotas q join gpu_classes c on c.id = q.gpu_class_id
         where q.team_id = $1 and q.gpu_class_id = $2",
        team_id as TeamId,
        class_id as GpuClassId
    )
    .fetch_optional(pool)
    .await
}

/// Everything a quota change is validated against, read under locks so two concurrent
/// changes in one subtree cannot both pass the checks.
#[derive(Debug, Clone)]
pub struct QuotaContext {
    /// The quota being changed, if it exists.
    pub current: Option<QuotaRow>,
    /// The parent's reserved quota for the class (`None`: no parent, or no quota row).
    pub parent_reserved: Option<i32>,
    /// The sum of the other children of the parent, excluding this team.
    pub siblings_reserved: i64,
    /// The sum of this team's children's reserved quotas.
    pub children_reserved: i64,
    /// Reserved quota of the class across all top-level teams, excluding this team.
    pub other_roots_reserved: i64,
}

/// Reads and locks what a change of `team_id`'s quota for `class_id` must respect. Locks the
/// class row first: every quota change of a class serialises on it.
///
/// `for no key update`, not `for update`: the rows that point at the class (jobs submitted,
/// nodes an inventory sync writes) check their foreign key with `for key share`, which only
/// `for update` blocks. An inventory sync holds the catalogue version (its class upsert bumps
/// it) before it writes nodes, and this change bumps the catalogue version after the lock:
/// with `for update` the two waited for each other until PostgreSQL broke the deadlock,
/// and the quota change failed with a 500.
pub async fn context_for_update(
    tx: &mut Tx<'_>,
    team_id: TeamId,
    parent_id: Option<TeamId>,
    class_id: GpuClassId,
) -> Result<QuotaContext, sqlx::Error> {
    sqlx::query!("select id from gpu_classes where id = $1 for no key update", class_id as GpuClassId)
        .fetch_optional(&mut **tx)
        .await?;
    let current = sqlx::query_as!(
        QuotaRow,
        "select c.name as gpu_class, q.reserved, q.burst, q.lendable, q.created_at, q.updated_at, q.version
         from quotas q join gpu_classes c on c.id = q.gpu_class_id
         where q.team_id = $1 and q.gpu_class_id = $2",
        team_id as TeamId,
        class_id as GpuClassId
    )
    .fetch_optional(&mut **tx)
    .await?;
    let sums = sqlx::query!(
        r#"select
             (select reserved from quotas where team_id = $2 and gpu_class_id = $3) as parent_reserved,
             (select coalesce(sum(q.reserved), 0) from quotas q join teams t on t.id = q.team_id
               where t.parent_id = $2 and q.gpu_class_id = $3 and q.team_id <> $1) as "siblings!",
             (select coalesce(sum(q.reserved), 0) from quotas q join teams t on t.id = q.team_id
               where t.parent_id = $1 and q.gpu_class_id = $3) as "children!",
             (select coalesce(sum(q.reserved), 0) from quotas q join teams t on t.id = q.team_id
               where t.parent_id is null and q.gpu_class_id = $3 and q.team_id <> $1) as "roots!""#,
        team_id as TeamId,
        parent_id as Option<TeamId>,
        class_id as GpuClassId
    )
    .fetch_one(&mut **tx)
    .await?;
    Ok(QuotaContext {
        current,
        parent_reserved: sums.parent_reserved,
        siblings_reserved: sums.siblings,
        children_reserved: sums.children,
        other_roots_reserved: sums.roots,
    })
}

/// Creates or replaces a quota.
pub async fn upsert(
    tx: &mut Tx<'_>,
    team_id: TeamId,
    class_id: GpuClassId,
    reserved: i32,
    burst: i32,
    lendable: Option<i32>,
) -> Result<QuotaRow, sqlx::Error> {
    let row = sqlx::query_as!(
        QuotaRow,
        r#"with q as (
               insert into quotas (team_id, gpu_class_id, reserved, burst, lendable) values ($1, $2, $3, $4, $5)
               on conflict (team_id, gpu_class_id) do update
               set reserved = excluded.reserved, burst = excluded.burst, lendable = excluded.lendable,
                   updated_at = now(), version = quotas.version + 1
               returning *
           )
           select c.name as gpu_class, q.reserved, q.burst, q.lendable, q.created_at, q.updated_at, q.version
           from q join gpu_classes c on c.id = q.gpu_class_id"#,
        team_id as TeamId,
        class_id as GpuClassId,
        reserved,
        burst,
        lendable
    )
    .fetch_one(&mut **tx)
    .await?;
    record_reserved(tx, team_id, class_id, reserved).await?;
    Ok(row)
}

/// Removes a quota.
pub async fn delete(tx: &mut Tx<'_>, team_id: TeamId, class_id: GpuClassId) -> Result<(), sqlx::Error> {
    sqlx::query!(
        "delete from quotas where team_id = $1 and gpu_class_id = $2",
        team_id as TeamId,
        class_id as GpuClassId
    )
    .execute(&mut **tx)
    .await?;
    record_reserved(tx, team_id, class_id, 0).await
}

/// Records the team's reserved quota of a class from now on (the history the
/// reserved-plus-burst chargeback model bills).
async fn record_reserved(
    tx: &mut Tx<'_>,
    team_id: TeamId,
    class_id: GpuClassId,
    reserved: i32,
) -> Result<(), sqlx::Error> {
    sqlx::query!(
        "insert into quota_history (team_id, gpu_class_id, effective_from, reserved)
         values ($1, $2, date_trunc('milliseconds', now()), $3)
         on conflict (team_id, gpu_class_id, effective_from) do update set reserved = excluded.reserved",
        team_id as TeamId,
        class_id as GpuClassId,
        reserved
    )
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// One team's platform limit (reserved + burst) for one GPU class.
#[derive(Debug, Clone)]
pub struct TeamLimit {
    pub team: String,
    pub gpu_class: String,
    pub limit: i32,
}

/// Every team's limit per GPU class, by team.
pub async fn team_limits(pool: &PgPool) -> Result<Vec<TeamLimit>, sqlx::Error> {
    sqlx::query_as!(
        TeamLimit,
        r#"select t.name as team, c.name as gpu_class, (q.reserved + q.burst) as "limit!"
           from quotas q join teams t on t.id = q.team_id join gpu_classes c on c.id = q.gpu_class_id
           order by t.name, c.name"#
    )
    .fetch_all(pool)
    .await
}

/// One team's quota of a class beside what the whole class is doing: the inputs of "lent to
/// others" on a dashboard.
#[derive(Debug, Clone)]
pub struct ClassLending {
    pub team_id: TeamId,
    pub gpu_class: String,
    pub reserved: i64,
    /// How much of `reserved` others may borrow (all of it unless limited).
    pub lendable: i64,
    /// GPUs the team's admitted and running jobs hold within its reserved quota.
    pub own_in_use: i64,
    /// GPUs every team's borrowing jobs of the class hold.
    pub class_borrowed: i64,
    /// GPUs of the class in every cluster.
    pub class_capacity: i64,
}

/// Every team's quota of the classes `team_id` has a quota of, with the class's borrowing
/// and capacity.
pub async fn lending(pool: &PgPool, team_id: TeamId) -> Result<Vec<ClassLending>, sqlx::Error> {
    sqlx::query_as!(
        ClassLending,
        r#"with held as (
               select j.team_id, j.gpu_class_id,
                      coalesce(sum(j.replicas * j.gpus_per_replica) filter (where not j.borrowing), 0)::int8 as own,
                      coalesce(sum(j.replicas * j.gpus_per_replica) filter (where j.borrowing), 0)::int8 as borrowed
               from jobs j
               where j.state in ('admitted', 'running')
                 and j.gpu_class_id in (select gpu_class_id from quotas where team_id = $1)
               group by 1, 2
           )
           select q.team_id, g.name as gpu_class, q.reserved::int8 as "reserved!",
                  coalesce(q.lendable, q.reserved)::int8 as "lendable!",
                  coalesce(h.own, 0)::int8 as "own_in_use!",
                  (select coalesce(sum(b.borrowed), 0) from held b where b.gpu_class_id = q.gpu_class_id)::int8
                      as "class_borrowed!",
                  (select coalesce(sum(c.gpus), 0) from cluster_capacity c where c.gpu_class_id = q.gpu_class_id)::int8
                      as "class_capacity!"
           from quotas q
           join gpu_classes g on g.id = q.gpu_class_id
           left join held h on h.team_id = q.team_id and h.gpu_class_id = q.gpu_class_id
           where q.gpu_class_id in (select gpu_class_id from quotas where team_id = $1)
           order by g.name, q.team_id"#,
        team_id as TeamId
    )
    .fetch_all(pool)
    .await
}
