//! Idle reclamation's data: the policies (`idle_policies`) and jobs' idle stretches
//! (`idle_spans`).

use chrono::{DateTime, NaiveDate, Utc};
use sqlx::PgPool;

use super::Tx;
use crate::domain::{
    idle::{IdleAction, IdlePolicy},
    IdlePolicyId, JobId, TeamId,
};

/// A stored policy, with what people read it by.
#[derive(Debug, Clone, PartialEq)]
pub struct PolicyRow {
    pub id: IdlePolicyId,
    /// The team's name; `None` for every team.
    pub team: Option<String>,
    pub policy: IdlePolicy,
    pub updated_at: DateTime<Utc>,
}

struct RawPolicy {
    id: IdlePolicyId,
    team_id: Option<TeamId>,
    team: Option<String>,
    priority_class: Option<String>,
    below_sm_active_percent: f64,
    idle_seconds: i32,
    notice_seconds: i32,
    action: String,
    updated_at: DateTime<Utc>,
}

impl RawPolicy {
    fn row(self) -> PolicyRow {
        PolicyRow {
            id: self.id,
            team: self.team,
            policy: IdlePolicy {
                team_id: self.team_id,
                priority_class: self.priority_class,
                below_sm_active_percent: self.below_sm_active_percent,
                idle_seconds: self.idle_seconds,
                notice_seconds: self.notice_seconds,
                // The column's check allows only these; an unknown one never reclaims.
                action: IdleAction::parse(&self.action).unwrap_or(IdleAction::Exempt),
            },
            updated_at: self.updated_at,
        }
    }
}

/// Every policy, the platform's first, then by team and class.
pub async fn policies<'e, E: sqlx::PgExecutor<'e>>(db: E) -> Result<Vec<PolicyRow>, sqlx::Error> {
    let rows = sqlx::query_as!(
        RawPolicy,
        r#"select p.id as "id: IdlePolicyId", p.team_id as "team_id: TeamId", t.name as "team?", p.priority_class,
                  p.below_sm_active_percent, p.idle_seconds, p.notice_seconds, p.action, p.updated_at
           from idle_policies p left join teams t on t.id = p.team_id
           order by t.name nulls first, p.priority_class nulls first"#
    )
    .fetch_all(db)
    .await?;
    Ok(rows.into_iter().map(RawPolicy::row).collect())
}

/// Sets the policy of its scope (team and class), replacing the one there. Returns its id.
pub async fn upsert_policy(tx: &mut Tx<'_>, policy: &IdlePolicy) -> Result<IdlePolicyId, sqlx::Error> {
    sqlx::query_scalar!(
        r#"insert into idle_policies (id, team_id, priority_class, below_sm_active_percent, idle_seconds,
                                    notice_seconds, action)
         values ($1, $2, $3, $4, $5, $6, $7)
         on conflict on constraint idle_policies_scope_key do update set
             below_sm_active_percent = excluded.below_sm_active_percent, idle_seconds = excluded.idle_seconds,
             notice_seconds = excluded.notice_seconds, action = excluded.action, updated_at = now()
         returning id as "id: IdlePolicyId""#,
        IdlePolicyId::new() as IdlePolicyId,
        policy.team_id as Option<TeamId>,
        policy.priority_class,
        policy.below_sm_active_percent,
        policy.idle_seconds,
        policy.notice_seconds,
        policy.action.as_str()
    )
    .fetch_one(&mut **tx)
    .await
}

/// Removes a policy; false when there was none of that id.
pub async fn delete_policy(tx: &mut Tx<'_>, id: IdlePolicyId) -> Result<bool, sqlx::Error> {
    Ok(sqlx::query!("delete from idle_policies where id = $1", id as IdlePolicyId)
        .execute(&mut **tx)
        .await?
        .rows_affected()
        == 1)
}

/// A running attempt sampled at one read, with what the idle rule needs.
#[derive(Debug, Clone)]
pub struct Sampled {
    pub job_id: JobId,
    pub attempt: i32,
    pub job_name: String,
    pub team_id: TeamId,
    pub team: String,
    pub gpu_class: String,
    pub priority_class: String,
    /// The job's own grace period, or its priority class's.
    pub grace_ms: i64,
    /// GPUs held × the class's fraction in thousandths.
    pub gpu_milli: i64,
    /// The replicas' SM activity at the read, weighted by their GPUs, as a ratio.
    pub sm_active: f64,
    /// The open idle stretch: when it began, when it was warned, whether it was acted on.
    pub stretch_started_at: Option<DateTime<Utc>>,
    pub warned_at: Option<DateTime<Utc>>,
    pub acted_at: Option<DateTime<Utc>>,
}

/// The running attempts among `jobs` whose replicas were sampled at `at`. Named by job, so
/// the read walks the rows of the jobs just sampled, never every replica ever recorded.
pub async fn sampled_at(tx: &mut Tx<'_>, jobs: &[JobId], at: DateTime<Utc>) -> Result<Vec<Sampled>, sqlx::Error> {
    sqlx::query_as!(
        Sampled,
        r#"select j.id as "job_id: JobId", j.attempt, j.name as job_name, j.team_id as "team_id: TeamId",
                  t.name as team, c.name as gpu_class, j.priority_class,
                  coalesce(j.preemption_grace_seconds, pc.preemption_grace_seconds)::int8 * 1000 as "grace_ms!",
                  u.gpus::int8 * u.fraction_milli as "gpu_milli!",
                  coalesce(sum(r.sm_active * r.gpus) / nullif(sum(r.gpus), 0), 0) as "sm_active!",
                  s.started_at as "stretch_started_at?", s.warned_at, s.acted_at
           from replica_utilisation r
           join jobs j on j.id = r.job_id and j.attempt = r.attempt and j.state = 'running'
           join teams t on t.id = j.team_id
           join gpu_classes c on c.id = j.gpu_class_id
           join priority_classes pc on pc.name = j.priority_class
           join usage_intervals u on u.job_id = j.id and u.attempt = j.attempt
           left join idle_spans s on s.job_id = j.id and s.attempt = j.attempt and s.open
           where r.job_id = any($2) and r.sampled_at = $1
           group by j.id, t.name, c.name, pc.preemption_grace_seconds, u.gpus, u.fraction_milli, s.started_at, s.warned_at,
                    s.acted_at"#,
        at,
        jobs as &[JobId]
    )
    .fetch_all(&mut **tx)
    .await
}

/// Opens a stretch at `at` for each attempt, holding `gpu_milli`.
pub async fn open_spans(tx: &mut Tx<'_>, spans: &[(JobId, i32, i64)], at: DateTime<Utc>) -> Result<(), sqlx::Error> {
    if spans.is_empty() {
        return Ok(());
    }
    let ids: Vec<JobId> = spans.iter().map(|s| s.0).collect();
    let attempts: Vec<i32> = spans.iter().map(|s| s.1).collect();
    let gpu_milli: Vec<i64> = spans.iter().map(|s| s.2).collect();
    sqlx::query!(
        "insert into idle_spans (job_id, attempt, started_at, ended_at, gpu_milli)
         select u.id, u.attempt, $4, $4, u.gpu_milli from unnest($1::uuid[], $2::int4[], $3::int8[]) as u(id, attempt, gpu_milli)
         on conflict do nothing",
        &ids as &[JobId],
        &attempts,
        &gpu_milli,
        at
    )
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// What happens to the open stretches of attempts at a read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpanChange {
    /// Still idle: the stretch now ends at the read.
    Extend,
    /// Idle, and warned at the read.
    Warn,
    /// Idle, and acted on at the read.
    Act,
    /// Busy again: the stretch is closed where it ended.
    Close,
}

/// Applies `change` to the open stretches of `attempts` at `at`.
pub async fn change_spans(
    tx: &mut Tx<'_>,
    attempts: &[(JobId, i32)],
    change: SpanChange,
    at: DateTime<Utc>,
) -> Result<(), sqlx::Error> {
    if attempts.is_empty() {
        return Ok(());
    }
    let ids: Vec<JobId> = attempts.iter().map(|a| a.0).collect();
    let numbers: Vec<i32> = attempts.iter().map(|a| a.1).collect();
    let (extend, warn, act, close) = (
        change != SpanChange::Close,
        change == SpanChange::Warn,
        change == SpanChange::Act,
        change == SpanChange::Close,
    );
    sqlx::query!(
        "update idle_spans s set ended_at = case when $4 then $3 else s.ended_at end,
                warned_at = case when $5 then $3 else s.warned_at end,
                acted_at = case when $6 then $3 else s.acted_at end,
                open = not $7
         from unnest($1::uuid[], $2::int4[]) as u(id, attempt)
         where s.job_id = u.id and s.attempt = u.attempt and s.open",
        &ids as &[JobId],
        &numbers,
        at,
        extend,
        warn,
        act,
        close
    )
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// A job's idle time in a billing period and what it cost.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdleJob {
    pub job_id: JobId,
    pub job_name: String,
    /// GPU time held idle, GPU-thousandths × milliseconds (the ledger's unit).
    pub idle_gpu_milli_ms: i64,
    /// That time at what the job was billed per GPU-millisecond in the period (micro-units);
    /// it counts once the job's time is booked (each completed hour, and its end).
    pub idle_cost_micros: i64,
}

/// The jobs of `team_id` that held GPUs idle within `[from, to)`, billing period `period`,
/// costliest first.
pub async fn idle_jobs(
    pool: &PgPool,
    team_id: TeamId,
    period: NaiveDate,
    from: DateTime<Utc>,
    to: DateTime<Utc>,
) -> Result<Vec<IdleJob>, sqlx::Error> {
    sqlx::query_as!(
        IdleJob,
        r#"with spans as (
               select s.job_id,
                      sum(s.gpu_milli * (extract(epoch from least(s.ended_at, $3) - greatest(s.started_at, $2))
                                         * 1000)::int8)::int8 as idle
               from idle_spans s join jobs j on j.id = s.job_id
               where j.team_id = $1 and s.started_at < $3 and s.ended_at > $2
               group by s.job_id
           ), billed as (
               select l.job_id, sum(l.gpu_milli_ms)::int8 as used, sum(l.billed_cost_micros)::int8 as cost
               from usage_ledger l
               where l.team_id = $1 and l.billing_period = $4 and l.job_id in (select job_id from spans)
               group by l.job_id
           )
           select sp.job_id as "job_id!: JobId", j.name as job_name, sp.idle as "idle_gpu_milli_ms!",
                  coalesce(round(b.cost::numeric * least(sp.idle, b.used) / nullif(b.used, 0)), 0)::int8
                      as "idle_cost_micros!"
           from spans sp join jobs j on j.id = sp.job_id left join billed b on b.job_id = sp.job_id
           where sp.idle > 0
           order by 4 desc, 3 desc, 1"#,
        team_id as TeamId,
        from,
        to,
        period
    )
    .fetch_all(pool)
    .await
}
