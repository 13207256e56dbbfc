//! Teams: the tenants, arranged in a tree.

use crate::domain::{TeamId, UserId};
use chrono::{DateTime, Utc};
use sqlx::PgPool;

use super::Tx;

/// A stored team with its parent's name.
#[derive(Debug, Clone, serde::Serialize)]
pub struct TeamRow {
    pub id: TeamId,
    pub name: String,
    pub parent_id: Option<TeamId>,
    pub parent: Option<String>,
    pub display_name: String,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub version: i64,
}

/// The team called `name`.
pub async fn by_name(pool: &PgPool, name: &str) -> Result<Option<TeamRow>, sqlx::Error> {
    sqlx::query_as!(
        TeamRow,
        r#"select t.id as "id: TeamId", t.name, t.parent_id as "parent_id: TeamId", p.name as "parent?", t.display_name,
                  t.created_at, t.updated_at, t.version
           from teams t left join teams p on p.id = t.parent_id
           where t.name = $1"#,
        name
    )
    .fetch_optional(pool)
    .await
}

/// The team with id `id`.
pub async fn by_id(pool: &PgPool, id: TeamId) -> Result<Option<TeamRow>, sqlx::Error> {
    sqlx::query_as!(
        TeamRow,
        r#"select t.id as "id: TeamId", t.name, t.parent_id as "parent_id: TeamId", p.name as "parent?", t.display_name,
                  t.created_at, t.updated_at, t.version
           from teams t left join teams p on p.id = t.parent_id
           where t.id = $1"#,
        id as TeamId
    )
    .fetch_optional(pool)
    .await
}

/// Creates a team; fails on `teams_name_key` when the name is taken.
pub async fn insert(
    tx: &mut Tx<'_>,
    name: &str,
    parent_id: Option<TeamId>,
    display_name: &str,
) -> Result<TeamRow, sqlx::Error> {
    sqlx::query_as!(
        TeamRow,
        r#"with t as (
               insert into teams (id, name, parent_id, display_name) values ($1, $2, $3, $4)
               returning *
           )
           select t.id as "id: TeamId", t.name, t.parent_id as "parent_id: TeamId", p.name as "parent?", t.display_name,
                  t.created_at, t.updated_at, t.version
           from t left join teams p on p.id = t.parent_id"#,
        TeamId::new() as TeamId,
        name,
        parent_id as Option<TeamId>,
        display_name
    )
    .fetch_one(&mut **tx)
    .await
}

/// All teams by name, after `after`.
pub async fn list_all(pool: &PgPool, after: Option<&str>, limit: i64) -> Result<Vec<TeamRow>, sqlx::Error> {
    sqlx::query_as!(
        TeamRow,
        r#"select t.id as "id: TeamId", t.name, t.parent_id as "parent_id: TeamId", p.name as "parent?", t.display_name,
                  t.created_at, t.updated_at, t.version
           from teams t left join teams p on p.id = t.parent_id
           where $1::text is null or t.name > $1
           order by t.name limit $2"#,
        after,
        limit
    )
    .fetch_all(pool)
    .await
}

/// Teams `user_id` can see: those it belongs to and all their descendants.
pub async fn list_visible_to_user(
    pool: &PgPool,
    user_id: UserId,
    after: Option<&str>,
    limit: i64,
) -> Result<Vec<TeamRow>, sqlx::Error> {
    sqlx::query_as!(
        TeamRow,
        r#"with recursive visible(id) as (
               select team_id from team_members where user_id = $1
               union
               select c.id from teams c join visible v on c.parent_id = v.id
           )
           select t.id as "id: TeamId", t.name, t.parent_id as "parent_id: TeamId", p.name as "parent?", t.display_name,
                  t.created_at, t.updated_at, t.version
           from teams t left join teams p on p.id = t.parent_id
           where t.id in (select id from visible) and ($2::text is null or t.name > $2)
           order by t.name limit $3"#,
        user_id as UserId,
        after,
        limit
    )
    .fetch_all(pool)
    .await
}

/// The strongest role `user_id` holds in `team_id` or any of its ancestors: a department's
/// admin administers its child teams too.
pub async fn effective_role(pool: &PgPool, user_id: UserId, team_id: TeamId) -> Result<Option<String>, sqlx::Error> {
    let row = sqlx::query!(
        r#"with recursive chain(id, parent_id) as (
               select id, parent_id from teams where id = $2
               union all
               select t.id, t.parent_id from teams t join chain c on t.id = c.parent_id
           )
           select m.role from team_members m join chain c on c.id = m.team_id
           where m.user_id = $1
           order by case m.role when 'admin' then 3 when 'member' then 2 else 1 end desc
           limit 1"#,
        user_id as UserId,
        team_id as TeamId
    )
    .fetch_optional(pool)
    .await?;
    Ok(row.map(|r| r.role))
}

/// Changes a team's display name, bumping its version.
pub async fn update(tx: &mut Tx<'_>, id: TeamId, display_name: &str) -> Result<TeamRow, sqlx::Error> {
    sqlx::query_as!(
        TeamRow,
        r#"with t as (
               update teams set display_name = $2, updated_at = now(), version = version + 1
               where id = $1 returning *
           )
           select t.id as "id: TeamId", t.name, t.parent_id as "parent_id: TeamId", p.name as "parent?", t.display_name,
                  t.created_at, t.updated_at, t.version
           from t left join teams p on p.id = t.parent_id"#,
        id as TeamId,
        display_name
    )
    .fetch_one(&mut **tx)
    .await
}

/// Locks a team row for the rest of the transaction and returns its version.
pub async fn lock(tx: &mut Tx<'_>, id: TeamId) -> Result<Option<i64>, sqlx::Error> {
    let row = sqlx::query!("select version from teams where id = $1 for update", id as TeamId)
        .fetch_optional(&mut **tx)
        .await?;
    Ok(row.map(|r| r.version))
}

/// True when the team has child teams.
pub async fn has_children(tx: &mut Tx<'_>, id: TeamId) -> Result<bool, sqlx::Error> {
    let row = sqlx::query!(r#"select exists(select 1 from teams where parent_id = $1) as "exists!""#, id as TeamId)
        .fetch_one(&mut **tx)
        .await?;
    Ok(row.exists)
}

/// Deletes a team and everything it owns (members, tokens, quotas, budgets).
pub async fn delete(tx: &mut Tx<'_>, id: TeamId) -> Result<(), sqlx::Error> {
    sqlx::query!("delete from teams where id = $1", id as TeamId).execute(&mut **tx).await?;
    Ok(())
}
