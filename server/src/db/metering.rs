//! The usage ledger, its rollups, capacity history and billing periods.

use crate::domain::{GpuClassId, JobId, TeamId};
use chrono::{DateTime, NaiveDate, Utc};
use serde_json::Value;
use sqlx::PgPool;

use super::Tx;

/// A closed or open usage interval with everything a ledger row copies from its job.
#[derive(Debug, Clone)]
pub struct IntervalToMeter {
    pub job_id: JobId,
    pub attempt: i32,
    pub job_name: String,
    pub team_id: TeamId,
    pub team_name: String,
    pub gpu_class_id: GpuClassId,
    pub gpu_class: String,
    pub priority_class: String,
    pub gpus: i32,
    pub fraction_milli: i32,
    pub borrowing: bool,
    pub started_at: DateTime<Utc>,
    pub ended_at: Option<DateTime<Utc>>,
    pub price_multiplier_milli: i32,
    pub labels: Value,
    /// The price of the pool it ran on, which replaces the rate card; `None` for the card.
    pub rate_micros_per_gpu_hour: Option<i64>,
}

/// The intervals of the attempts `keys` (job, attempt) that were opened, locked in job
/// order so that two meterings of one are serialised and never deadlock.
pub async fn intervals_for_update(tx: &mut Tx<'_>, keys: &[(JobId, i32)]) -> Result<Vec<IntervalToMeter>, sqlx::Error> {
    let jobs: Vec<JobId> = keys.iter().map(|k| k.0).collect();
    let attempts: Vec<i32> = keys.iter().map(|k| k.1).collect();
    sqlx::query_as!(
        IntervalToMeter,
        r#"select u.job_id, u.attempt, j.name as job_name, u.team_id, t.name as team_name,
                  u.gpu_class_id, c.name as gpu_class, u.priority_class, u.gpus, u.fraction_milli, u.borrowing,
                  u.started_at, u.ended_at,
                  coalesce(p.price_multiplier_milli, 1000) as "price_multiplier_milli!", j.labels,
                  u.rate_micros_per_gpu_hour
           from unnest($1::uuid[], $2::int4[]) as k(job_id, attempt)
           join usage_intervals u on u.job_id = k.job_id and u.attempt = k.attempt
           join jobs j on j.id = u.job_id
           join teams t on t.id = u.team_id
           join gpu_classes c on c.id = u.gpu_class_id
           left join priority_classes p on p.name = u.priority_class
           order by u.job_id, u.attempt
           for update of u"#,
        &jobs as &[JobId],
        &attempts
    )
    .fetch_all(&mut **tx)
    .await
}

/// The rate cards of `classes`: (class, effective from, micro-units per GPU-hour), each
/// class's oldest first.
pub async fn rates_of(
    tx: &mut Tx<'_>,
    classes: &[GpuClassId],
) -> Result<Vec<(GpuClassId, DateTime<Utc>, i64)>, sqlx::Error> {
    let rows = sqlx::query!(
        r#"select gpu_class_id as "gpu_class_id: GpuClassId", effective_from, rate_micros_per_gpu_hour from gpu_class_rates
         where gpu_class_id = any($1) order by gpu_class_id, effective_from"#,
        classes as &[GpuClassId]
    )
    .fetch_all(&mut **tx)
    .await?;
    Ok(rows.into_iter().map(|r| (r.gpu_class_id, r.effective_from, r.rate_micros_per_gpu_hour)).collect())
}

/// A class's rate card: (effective from, micro-units per GPU-hour), oldest first.
pub async fn rates(tx: &mut Tx<'_>, gpu_class_id: GpuClassId) -> Result<Vec<(DateTime<Utc>, i64)>, sqlx::Error> {
    let rows = rates_of(tx, &[gpu_class_id]).await?;
    Ok(rows.into_iter().map(|(_, from, rate)| (from, rate)).collect())
}

/// A usage piece already in the ledger, with whether a correction already refers to it.
#[derive(Debug, Clone)]
pub struct MeteredPiece {
    pub id: i64,
    pub charge_start: DateTime<Utc>,
    pub charge_end: DateTime<Utc>,
    pub duration_ms: i64,
    pub rate_micros_per_gpu_hour: i64,
    pub price_multiplier_milli: i32,
    pub list_cost_micros: i64,
    pub billed_cost_micros: i64,
    pub corrected: bool,
}

/// The usage pieces of the attempts `keys`, each attempt's in time order.
pub async fn metered_pieces(
    tx: &mut Tx<'_>,
    keys: &[(JobId, i32)],
) -> Result<Vec<(JobId, i32, MeteredPiece)>, sqlx::Error> {
    let jobs: Vec<JobId> = keys.iter().map(|k| k.0).collect();
    let attempts: Vec<i32> = keys.iter().map(|k| k.1).collect();
    let rows = sqlx::query!(
        r#"select l.job_id as "job_id!: JobId", l.attempt as "attempt!", l.id, l.charge_start, l.charge_end, l.duration_ms,
                  l.rate_micros_per_gpu_hour, l.price_multiplier_milli, l.list_cost_micros, l.billed_cost_micros,
                  exists (select 1 from usage_ledger c where c.corrects = l.id) as "corrected!"
           from unnest($1::uuid[], $2::int4[]) as k(job_id, attempt)
           join usage_ledger l on l.job_id = k.job_id and l.attempt = k.attempt and l.kind = 'usage'
           order by l.job_id, l.attempt, l.charge_start"#,
        &jobs as &[JobId],
        &attempts
    )
    .fetch_all(&mut **tx)
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| {
            let piece = MeteredPiece {
                id: r.id,
                charge_start: r.charge_start,
                charge_end: r.charge_end,
                duration_ms: r.duration_ms,
                rate_micros_per_gpu_hour: r.rate_micros_per_gpu_hour,
                price_multiplier_milli: r.price_multiplier_milli,
                list_cost_micros: r.list_cost_micros,
                billed_cost_micros: r.billed_cost_micros,
                corrected: r.corrected,
            };
            (r.job_id, r.attempt, piece)
        })
        .collect())
}

/// A ledger row to append.
#[derive(Debug, Clone)]
pub struct NewLedgerRow {
    pub kind: &'static str,
    pub corrects: Option<i64>,
    pub reason: Option<String>,
    pub charge_start: DateTime<Utc>,
    pub charge_end: DateTime<Utc>,
    pub duration_ms: i64,
    pub gpu_milli_ms: i64,
    pub rate_micros_per_gpu_hour: i64,
    pub price_multiplier_milli: i32,
    pub list_cost_micros: i64,
    pub billed_cost_micros: i64,
}

/// Appends rows, each with the interval it books (its job, team and class copied into the
/// row), each in the first open billing period of its charge, and marks their hours for the
/// rollups. A row whose key is already there (the same piece, or a second correction of one
/// piece) is skipped: how many were written.
pub async fn append(
    tx: &mut Tx<'_>,
    currency: &str,
    rows: &[(&IntervalToMeter, NewLedgerRow)],
) -> Result<u64, sqlx::Error> {
    if rows.is_empty() {
        return Ok(0);
    }
    let jobs: Vec<JobId> = rows.iter().map(|(i, _)| i.job_id).collect();
    let attempts: Vec<i32> = rows.iter().map(|(i, _)| i.attempt).collect();
    let job_names: Vec<String> = rows.iter().map(|(i, _)| i.job_name.clone()).collect();
    let teams: Vec<TeamId> = rows.iter().map(|(i, _)| i.team_id).collect();
    let team_names: Vec<String> = rows.iter().map(|(i, _)| i.team_name.clone()).collect();
    let classes: Vec<GpuClassId> = rows.iter().map(|(i, _)| i.gpu_class_id).collect();
    let class_names: Vec<String> = rows.iter().map(|(i, _)| i.gpu_class.clone()).collect();
    let priorities: Vec<String> = rows.iter().map(|(i, _)| i.priority_class.clone()).collect();
    let gpus: Vec<i32> = rows.iter().map(|(i, _)| i.gpus).collect();
    let fractions: Vec<i32> = rows.iter().map(|(i, _)| i.fraction_milli).collect();
    let borrowing: Vec<bool> = rows.iter().map(|(i, _)| i.borrowing).collect();
    let labels: Vec<Value> = rows.iter().map(|(i, _)| i.labels.clone()).collect();
    let kinds: Vec<String> = rows.iter().map(|(_, r)| r.kind.to_owned()).collect();
    let corrects: Vec<Option<i64>> = rows.iter().map(|(_, r)| r.corrects).collect();
    let reasons: Vec<Option<String>> = rows.iter().map(|(_, r)| r.reason.clone()).collect();
    let starts: Vec<DateTime<Utc>> = rows.iter().map(|(_, r)| r.charge_start).collect();
    let ends: Vec<DateTime<Utc>> = rows.iter().map(|(_, r)| r.charge_end).collect();
    let durations: Vec<i64> = rows.iter().map(|(_, r)| r.duration_ms).collect();
    let gpu_time: Vec<i64> = rows.iter().map(|(_, r)| r.gpu_milli_ms).collect();
    let rates: Vec<i64> = rows.iter().map(|(_, r)| r.rate_micros_per_gpu_hour).collect();
    let multipliers: Vec<i32> = rows.iter().map(|(_, r)| r.price_multiplier_milli).collect();
    let list: Vec<i64> = rows.iter().map(|(_, r)| r.list_cost_micros).collect();
    let billed: Vec<i64> = rows.iter().map(|(_, r)| r.billed_cost_micros).collect();
    let written = sqlx::query!(
        r#"insert into usage_ledger (kind, corrects, reason, job_id, attempt, job_name, team_id, team_name,
                                    gpu_class_id, gpu_class, priority_class, gpus, fraction_milli, borrowing,
                                    charge_start, charge_end, duration_ms, gpu_milli_ms, rate_micros_per_gpu_hour,
                                    price_multiplier_milli, list_cost_micros, billed_cost_micros, currency,
                                    billing_period, labels)
           select r.kind, r.corrects, r.reason, r.job, r.attempt, r.job_name, r.team, r.team_name, r.class,
                  r.class_name, r.priority, r.gpus, r.fraction, r.borrowing, r.start, r.finish, r.duration,
                  r.gpu_time, r.rate, r.multiplier, r.list, r.billed, $1, billing_period_for(r.start), r.labels
           from unnest($2::text[], $3::int8[], $4::text[], $5::uuid[], $6::int4[], $7::text[], $8::uuid[],
                       $9::text[], $10::uuid[], $11::text[], $12::text[], $13::int4[], $14::int4[], $15::bool[],
                       $16::timestamptz[], $17::timestamptz[], $18::int8[], $19::int8[], $20::int8[], $21::int4[],
                       $22::int8[], $23::int8[], $24::jsonb[])
                as r(kind, corrects, reason, job, attempt, job_name, team, team_name, class, class_name, priority,
                     gpus, fraction, borrowing, start, finish, duration, gpu_time, rate, multiplier, list, billed,
                     labels)
           on conflict do nothing"#,
        currency,
        &kinds,
        &corrects as &[Option<i64>],
        &reasons as &[Option<String>],
        &jobs as &[JobId],
        &attempts,
        &job_names,
        &teams as &[TeamId],
        &team_names,
        &classes as &[GpuClassId],
        &class_names,
        &priorities,
        &gpus,
        &fractions,
        &borrowing,
        &starts,
        &ends,
        &durations,
        &gpu_time,
        &rates,
        &multipliers,
        &list,
        &billed,
        &labels,
    )
    .execute(&mut **tx)
    .await?
    .rows_affected();
    mark_hours_stale(tx, &starts).await?;
    Ok(written)
}

/// Open intervals that started before `before`: the metering pass books their completed hours.
pub async fn open_intervals(pool: &PgPool, before: DateTime<Utc>) -> Result<Vec<(JobId, i32)>, sqlx::Error> {
    let rows = sqlx::query!(
        r#"select job_id as "job_id: JobId", attempt from usage_intervals
           where ended_at is null and started_at < $1 order by started_at"#,
        before
    )
    .fetch_all(pool)
    .await?;
    Ok(rows.into_iter().map(|r| (r.job_id, r.attempt)).collect())
}

/// Closed intervals with no ledger row at all: left behind by a crash between closing and
/// metering (which share a transaction, so only by an older version) or closed before the
/// ledger existed. The metering pass books them.
pub async fn unmetered_closed_intervals(pool: &PgPool, limit: i64) -> Result<Vec<(JobId, i32)>, sqlx::Error> {
    let rows = sqlx::query!(
        r#"select u.job_id as "job_id: JobId", u.attempt from usage_intervals u
         where u.ended_at is not null
           and date_trunc('milliseconds', u.ended_at) > date_trunc('milliseconds', u.started_at)
           and not exists (select 1 from usage_ledger l where l.job_id = u.job_id and l.attempt = u.attempt)
         order by u.ended_at limit $1"#,
        limit
    )
    .fetch_all(pool)
    .await?;
    Ok(rows.into_iter().map(|r| (r.job_id, r.attempt)).collect())
}

/// Records the schedulable units of every class across all clusters when they changed,
/// effective now. Called after every inventory sync.
pub async fn record_capacity(tx: &mut Tx<'_>) -> Result<u64, sqlx::Error> {
    let done = sqlx::query!(
        "with now as (select date_trunc('milliseconds', now()) as at),
              current as (
                  select c.id as gpu_class_id,
                         coalesce((select sum(cc.gpus) from cluster_capacity cc
                                   where cc.gpu_class_id = c.id and cc.largest_node > 0), 0)::int4 as gpus
                  from gpu_classes c),
              latest as (
                  select distinct on (gpu_class_id) gpu_class_id, gpus from capacity_history
                  order by gpu_class_id, effective_from desc)
         insert into capacity_history (gpu_class_id, effective_from, gpus)
         select cur.gpu_class_id, now.at, cur.gpus
         from current cur cross join now left join latest l on l.gpu_class_id = cur.gpu_class_id
         where l.gpus is distinct from cur.gpus and (l.gpus is not null or cur.gpus > 0)
         on conflict (gpu_class_id, effective_from) do update set gpus = excluded.gpus"
    )
    .execute(&mut **tx)
    .await?;
    Ok(done.rows_affected())
}

/// The instant stored under `key`, storing `default` first when there is none.
pub async fn state_or_set(pool: &PgPool, key: &str, default: DateTime<Utc>) -> Result<DateTime<Utc>, sqlx::Error> {
    sqlx::query!("insert into metering_state (key, at) values ($1, $2) on conflict do nothing", key, default)
        .execute(pool)
        .await?;
    sqlx::query_scalar!("select at from metering_state where key = $1", key).fetch_one(pool).await
}

/// Recomputes the rollups of every stale hour, and the capacity rows of every completed hour
/// up to `complete_before` not computed yet (at most a month back), in one transaction; the
/// hours recomputed.
pub async fn roll_up(pool: &PgPool, complete_before: DateTime<Utc>) -> Result<Vec<DateTime<Utc>>, sqlx::Error> {
    let mut tx = pool.begin().await?;
    let mut hours: Vec<DateTime<Utc>> =
        sqlx::query_scalar!("delete from rollup_dirty_hours returning hour as \"hour!\"").fetch_all(&mut *tx).await?;
    // Completed hours since the last pass computed capacity rows (the state row is locked,
    // so two passes do not both take them).
    sqlx::query!(
        "insert into metering_state (key, at) values ('class_hours_to', $1::timestamptz - interval '31 days')
         on conflict do nothing",
        complete_before
    )
    .execute(&mut *tx)
    .await?;
    let missing: Vec<DateTime<Utc>> = sqlx::query_scalar!(
        r#"with bounds as (
               select greatest(at, $1::timestamptz - interval '31 days') as first
               from metering_state where key = 'class_hours_to' for update)
           select h as "hour!" from bounds,
                generate_series(date_trunc('hour', bounds.first, 'UTC'), $1::timestamptz - interval '1 hour',
                                interval '1 hour') as h"#,
        complete_before
    )
    .fetch_all(&mut *tx)
    .await?;
    hours.extend(missing);
    hours.sort_unstable();
    hours.dedup();
    sqlx::query!("update metering_state set at = greatest(at, $1) where key = 'class_hours_to'", complete_before)
        .execute(&mut *tx)
        .await?;
    if hours.is_empty() {
        tx.commit().await?;
        return Ok(hours);
    }
    sqlx::query!("delete from usage_rollups where hour = any($1)", &hours).execute(&mut *tx).await?;
    // Range predicates per hour, so the ledger's index on `charge_start` serves them.
    sqlx::query!(
        "insert into usage_rollups (hour, team_id, gpu_class_id, priority_class, gpu_milli_ms, billed_cost_micros)
         select h.hour, l.team_id, l.gpu_class_id, l.priority_class,
                sum(l.gpu_milli_ms)::int8, sum(l.billed_cost_micros)::int8
         from unnest($1::timestamptz[]) as h(hour)
         join usage_ledger l on l.charge_start >= h.hour and l.charge_start < h.hour + interval '1 hour'
         group by 1, 2, 3, 4",
        &hours
    )
    .execute(&mut *tx)
    .await?;
    // Capacity and idle only for completed hours: an hour in progress has no idle time yet.
    let complete: Vec<DateTime<Utc>> =
        hours.iter().copied().filter(|h| *h + chrono::Duration::hours(1) <= complete_before).collect();
    sqlx::query!("delete from class_hours where hour = any($1)", &complete).execute(&mut *tx).await?;
    sqlx::query!(
        r#"with h as (select unnest($1::timestamptz[]) as hour),
                c as (select gpu_class_id, effective_from, gpus,
                             coalesce(lead(effective_from) over (partition by gpu_class_id order by effective_from),
                                      'infinity') as until
                      from capacity_history),
                cap as (select h.hour, c.gpu_class_id,
                               sum(c.gpus::int8 * g.fraction_milli
                                   * (extract(epoch from least(c.until, h.hour + interval '1 hour')
                                                       - greatest(c.effective_from, h.hour)) * 1000)::int8)::int8 as milli_ms
                        from h
                        join c on c.effective_from < h.hour + interval '1 hour' and c.until > h.hour
                        join gpu_classes g on g.id = c.gpu_class_id
                        group by 1, 2),
                alloc as (select h.hour, l.gpu_class_id, sum(l.gpu_milli_ms)::int8 as milli_ms
                          from h
                          join usage_ledger l on l.charge_start >= h.hour and l.charge_start < h.hour + interval '1 hour'
                          group by 1, 2)
           insert into class_hours (hour, gpu_class_id, capacity_milli_ms, allocated_milli_ms, idle_milli_ms)
           select coalesce(cap.hour, alloc.hour), coalesce(cap.gpu_class_id, alloc.gpu_class_id),
                  coalesce(cap.milli_ms, 0), coalesce(alloc.milli_ms, 0),
                  coalesce(cap.milli_ms, 0) - coalesce(alloc.milli_ms, 0)
           from cap full join alloc on alloc.hour = cap.hour and alloc.gpu_class_id = cap.gpu_class_id"#,
        &complete
    )
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(hours)
}

/// Whether `period` is closed.
pub async fn period_closed(db: impl sqlx::PgExecutor<'_>, period: NaiveDate) -> Result<bool, sqlx::Error> {
    sqlx::query_scalar!(r#"select exists (select 1 from billing_periods where period = $1) as "closed!""#, period)
        .fetch_one(db)
        .await
}

/// The closed periods, newest first.
pub async fn closed_periods(pool: &PgPool) -> Result<Vec<(NaiveDate, DateTime<Utc>, String)>, sqlx::Error> {
    let rows = sqlx::query!("select period, closed_at, closed_by from billing_periods order by period desc")
        .fetch_all(pool)
        .await?;
    Ok(rows.into_iter().map(|r| (r.period, r.closed_at, r.closed_by)).collect())
}

/// Closes `period`. Takes the ledger's write lock first, so that no row is appended to the
/// period after it closes: a metering transaction either committed before (its rows are in
/// the period) or appends after (its rows go to the next open period).
pub async fn close_period(tx: &mut Tx<'_>, period: NaiveDate, by: &str) -> Result<ClosePeriod, sqlx::Error> {
    sqlx::query!("lock table usage_ledger in exclusive mode").execute(&mut **tx).await?;
    // Periods close in order: an earlier period with charges must be closed first, or its
    // late usage would have nowhere to go but a period already closed.
    let earlier_open = sqlx::query_scalar!(
        r#"select min(l.billing_period) from usage_ledger l
           where l.billing_period < $1
             and not exists (select 1 from billing_periods b where b.period = l.billing_period)"#,
        period
    )
    .fetch_one(&mut **tx)
    .await?;
    if let Some(earlier) = earlier_open {
        return Ok(ClosePeriod::EarlierOpen(earlier));
    }
    let done = sqlx::query!(
        "insert into billing_periods (period, closed_by) values ($1, $2) on conflict do nothing",
        period,
        by
    )
    .execute(&mut **tx)
    .await?;
    Ok(if done.rows_affected() == 1 { ClosePeriod::Closed } else { ClosePeriod::AlreadyClosed })
}

/// What closing a period did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClosePeriod {
    Closed,
    AlreadyClosed,
    /// This earlier period has charges and is still open.
    EarlierOpen(NaiveDate),
}

/// A change of a team's reserved quota of a class.
#[derive(Debug, Clone)]
pub struct QuotaChange {
    pub team_id: TeamId,
    pub gpu_class_id: GpuClassId,
    pub effective_from: DateTime<Utc>,
    pub reserved: i32,
}

/// Every reserved-quota change, by team, class and time.
pub async fn quota_history(pool: &PgPool) -> Result<Vec<QuotaChange>, sqlx::Error> {
    sqlx::query_as!(
        QuotaChange,
        "select team_id, gpu_class_id, effective_from, reserved from quota_history
         order by team_id, gpu_class_id, effective_from"
    )
    .fetch_all(pool)
    .await
}

/// An hourly reservation charge to append.
#[derive(Debug, Clone)]
pub struct NewReservationRow {
    pub team_id: TeamId,
    pub gpu_class_id: GpuClassId,
    pub reserved: i32,
    pub charge_start: DateTime<Utc>,
    pub charge_end: DateTime<Utc>,
    pub duration_ms: i64,
    pub rate_micros_per_gpu_hour: i64,
    pub cost_micros: i64,
}

/// Appends reservation charges (no GPU time: a reservation is paid, not used), each in the
/// first open period of its charge; a piece already booked is skipped. How many were written.
pub async fn append_reservations(
    tx: &mut Tx<'_>,
    currency: &str,
    rows: &[NewReservationRow],
) -> Result<u64, sqlx::Error> {
    if rows.is_empty() {
        return Ok(0);
    }
    let teams: Vec<TeamId> = rows.iter().map(|r| r.team_id).collect();
    let classes: Vec<GpuClassId> = rows.iter().map(|r| r.gpu_class_id).collect();
    let reserved: Vec<i32> = rows.iter().map(|r| r.reserved).collect();
    let starts: Vec<DateTime<Utc>> = rows.iter().map(|r| r.charge_start).collect();
    let ends: Vec<DateTime<Utc>> = rows.iter().map(|r| r.charge_end).collect();
    let durations: Vec<i64> = rows.iter().map(|r| r.duration_ms).collect();
    let rates: Vec<i64> = rows.iter().map(|r| r.rate_micros_per_gpu_hour).collect();
    let costs: Vec<i64> = rows.iter().map(|r| r.cost_micros).collect();
    let written = sqlx::query!(
        "insert into usage_ledger (kind, team_id, team_name, gpu_class_id, gpu_class, priority_class, gpus,
                                   fraction_milli, borrowing, charge_start, charge_end, duration_ms, gpu_milli_ms,
                                   rate_micros_per_gpu_hour, price_multiplier_milli, list_cost_micros,
                                   billed_cost_micros, currency, billing_period)
         select 'reservation', r.team, t.name, r.class, c.name, 'reserved', r.reserved, c.fraction_milli, false,
                r.start, r.finish, r.duration, 0, r.rate, 1000, r.cost, r.cost, $1, billing_period_for(r.start)
         from unnest($2::uuid[], $3::uuid[], $4::int4[], $5::timestamptz[], $6::timestamptz[], $7::int8[],
                     $8::int8[], $9::int8[]) as r(team, class, reserved, start, finish, duration, rate, cost)
         join teams t on t.id = r.team
         join gpu_classes c on c.id = r.class
         on conflict do nothing",
        currency,
        &teams as &[TeamId],
        &classes as &[GpuClassId],
        &reserved,
        &starts,
        &ends,
        &durations,
        &rates,
        &costs
    )
    .execute(&mut **tx)
    .await?
    .rows_affected();
    mark_hours_stale(tx, &starts).await?;
    Ok(written)
}

/// The end of the latest reservation charge, if any was booked.
pub async fn last_reservation_end(pool: &PgPool) -> Result<Option<DateTime<Utc>>, sqlx::Error> {
    sqlx::query_scalar!("select max(charge_end) from usage_ledger where kind = 'reservation'").fetch_one(pool).await
}

/// Marks the hours holding `starts` for the rollups, in the transaction that wrote the rows.
async fn mark_hours_stale(tx: &mut Tx<'_>, starts: &[DateTime<Utc>]) -> Result<(), sqlx::Error> {
    sqlx::query!(
        "insert into rollup_dirty_hours (hour)
         select distinct date_trunc('hour', s, 'UTC') from unnest($1::timestamptz[]) as s",
        starts
    )
    .execute(&mut **tx)
    .await?;
    Ok(())
}
