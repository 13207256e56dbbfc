//! Team membership and roles.

use crate::domain::{TeamId, UserId};
use chrono::{DateTime, Utc};
use sqlx::PgPool;

use super::Tx;

/// A member of a team.
#[derive(Debug, Clone, serde::Serialize)]
pub struct MemberRow {
    pub user_id: UserId,
    pub username: String,
    pub role: String,
    /// `oidc:{provider}` when a provider's groups grant it; `None` when an admin made it.
    pub source: Option<String>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

/// Members of `team_id` by username, after `after`.
pub async fn list(
    pool: &PgPool,
    team_id: TeamId,
    after: Option<&str>,
    limit: i64,
) -> Result<Vec<MemberRow>, sqlx::Error> {
    sqlx::query_as!(
        MemberRow,
        "select m.user_id, u.username, m.role, m.source, m.created_at, m.updated_at
         from team_members m join users u on u.id = m.user_id
         where m.team_id = $1 and ($2::text is null or u.username > $2)
         order by u.username limit $3",
        team_id as TeamId,
        after,
        limit
    )
    .fetch_all(pool)
    .await
}

/// A user's role in a team, as the platform's users page lists it.
#[derive(Debug, Clone)]
pub struct MembershipRow {
    pub user_id: UserId,
    pub team: String,
    pub role: String,
}

/// The memberships of the users `user_ids`, by team name.
pub async fn of_users(pool: &PgPool, user_ids: &[UserId]) -> Result<Vec<MembershipRow>, sqlx::Error> {
    sqlx::query_as!(
        MembershipRow,
        r#"select m.user_id as "user_id: UserId", t.name as team, m.role
           from team_members m join teams t on t.id = m.team_id
           where m.user_id = any($1)
           order by t.name"#,
        user_ids as &[UserId]
    )
    .fetch_all(pool)
    .await
}

/// The membership of `user_id` in `team_id`, locked for update.
pub async fn get_for_update(
    tx: &mut Tx<'_>,
    team_id: TeamId,
    user_id: UserId,
) -> Result<Option<MemberRow>, sqlx::Error> {
    sqlx::query_as!(
        MemberRow,
        "select m.user_id, u.username, m.role, m.source, m.created_at, m.updated_at
         from team_members m join users u on u.id = m.user_id
         where m.team_id = $1 and m.user_id = $2
         for update of m",
        team_id as TeamId,
        user_id as UserId
    )
    .fetch_optional(&mut **tx)
    .await
}

/// Adds a member or changes their role, by hand: a membership a provider granted becomes one
/// an admin made, which sign-ins leave alone.
pub async fn upsert(tx: &mut Tx<'_>, team_id: TeamId, user_id: UserId, role: &str) -> Result<MemberRow, sqlx::Error> {
    sqlx::query_as!(
        MemberRow,
        r#"with m as (
               insert into team_members (team_id, user_id, role) values ($1, $2, $3)
               on conflict (team_id, user_id) do update set role = excluded.role, source = null, updated_at = now()
               returning *
           )
           select m.user_id, u.username, m.role, m.source, m.created_at, m.updated_at
           from m join users u on u.id = m.user_id"#,
        team_id as TeamId,
        user_id as UserId,
        role
    )
    .fetch_one(&mut **tx)
    .await
}

/// Removes a member.
pub async fn delete(tx: &mut Tx<'_>, team_id: TeamId, user_id: UserId) -> Result<(), sqlx::Error> {
    sqlx::query!("delete from team_members where team_id = $1 and user_id = $2", team_id as TeamId, user_id as UserId)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

/// A user's membership as a sign-in sees it.
#[derive(Debug, Clone)]
pub struct Held {
    pub team_id: TeamId,
    pub team: String,
    pub role: String,
    pub source: Option<String>,
}

/// Every membership of `user_id`, locked for the sign-in's changes.
pub async fn held_for_update(tx: &mut Tx<'_>, user_id: UserId) -> Result<Vec<Held>, sqlx::Error> {
    sqlx::query_as!(
        Held,
        r#"select m.team_id as "team_id: TeamId", t.name as team, m.role, m.source
           from team_members m join teams t on t.id = m.team_id
           where m.user_id = $1 order by t.name for update of m"#,
        user_id as UserId
    )
    .fetch_all(&mut **tx)
    .await
}

/// Makes `user_id` a member of `team_id` with `role` as `source` grants it; a membership an
/// admin made is left as it is. True when something changed.
pub async fn grant(
    tx: &mut Tx<'_>,
    team_id: TeamId,
    user_id: UserId,
    role: &str,
    source: &str,
) -> Result<bool, sqlx::Error> {
    let changed = sqlx::query!(
        "insert into team_members (team_id, user_id, role, source) values ($1, $2, $3, $4)
         on conflict (team_id, user_id) do update set role = excluded.role, source = excluded.source, updated_at = now()
         where team_members.source is not null and (team_members.role, team_members.source) is distinct from (excluded.role, excluded.source)",
        team_id as TeamId,
        user_id as UserId,
        role,
        source
    )
    .execute(&mut **tx)
    .await?;
    Ok(changed.rows_affected() > 0)
}
