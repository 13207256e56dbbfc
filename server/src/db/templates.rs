//! A team's saved job requests (`job_templates`), by name.

use chrono::{DateTime, Utc};
use sqlx::{types::Json, PgPool};

use super::Tx;
use crate::domain::TeamId;

/// A stored template: the job fields as saved, who saved it and its version.
#[derive(Debug, Clone)]
pub struct TemplateRow {
    pub name: String,
    pub spec: Json<serde_json::Value>,
    pub created_by: String,
    pub created_at: DateTime<Utc>,
    pub updated_by: String,
    pub updated_at: DateTime<Utc>,
    pub version: i64,
}

/// The template `name` of `team_id`.
pub async fn get(pool: &PgPool, team_id: TeamId, name: &str) -> Result<Option<TemplateRow>, sqlx::Error> {
    sqlx::query_as!(
        TemplateRow,
        r#"select name, spec as "spec: Json<serde_json::Value>", created_by, created_at, updated_by, updated_at, version
           from job_templates where team_id = $1 and name = $2"#,
        team_id as TeamId,
        name
    )
    .fetch_optional(pool)
    .await
}

/// The template `name` of `team_id`, locked until the transaction ends.
pub async fn get_for_update(tx: &mut Tx<'_>, team_id: TeamId, name: &str) -> Result<Option<TemplateRow>, sqlx::Error> {
    sqlx::query_as!(
        TemplateRow,
        r#"select name, spec as "spec: Json<serde_json::Value>", created_by, created_at, updated_by, updated_at, version
           from job_templates where team_id = $1 and name = $2 for update"#,
        team_id as TeamId,
        name
    )
    .fetch_optional(&mut **tx)
    .await
}

/// Templates of `team_id` in name order, after the name `after`.
pub async fn list(
    pool: &PgPool,
    team_id: TeamId,
    after: Option<&str>,
    limit: i64,
) -> Result<Vec<TemplateRow>, sqlx::Error> {
    sqlx::query_as!(
        TemplateRow,
        r#"select name, spec as "spec: Json<serde_json::Value>", created_by, created_at, updated_by, updated_at, version
           from job_templates where team_id = $1 and ($2::text is null or name > $2)
           order by name limit $3"#,
        team_id as TeamId,
        after,
        limit
    )
    .fetch_all(pool)
    .await
}

/// Saves `spec` as the template `name` of `team_id` on behalf of `by`: a new one, or a new
/// version of the one of that name.
pub async fn upsert(
    tx: &mut Tx<'_>,
    team_id: TeamId,
    name: &str,
    spec: &serde_json::Value,
    by: &str,
) -> Result<TemplateRow, sqlx::Error> {
    sqlx::query_as!(
        TemplateRow,
        r#"insert into job_templates (team_id, name, spec, created_by, updated_by)
           values ($1, $2, $3, $4, $4)
           on conflict (team_id, name) do update
           set spec = excluded.spec, updated_by = excluded.updated_by, updated_at = now(),
               version = job_templates.version + 1
           returning name, spec as "spec: Json<serde_json::Value>", created_by, created_at, updated_by, updated_at,
                     version"#,
        team_id as TeamId,
        name,
        spec,
        by
    )
    .fetch_one(&mut **tx)
    .await
}

/// Deletes the template `name` of `team_id`.
pub async fn delete(tx: &mut Tx<'_>, team_id: TeamId, name: &str) -> Result<(), sqlx::Error> {
    sqlx::query!("delete from job_templates where team_id = $1 and name = $2", team_id as TeamId, name)
        .execute(&mut **tx)
        .await?;
    Ok(())
}
