//! Teams' CI trust policies (`ci_trusts`): which CI issuer's ID tokens, for which audience and
//! with which claims, a team exchanges for its own short-lived API tokens.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use sqlx::{types::Json, PgPool};

use super::Tx;
use crate::domain::{CiTrustId, TeamId};

/// A stored trust policy, with its team's name.
#[derive(Debug, Clone)]
pub struct CiTrustRow {
    pub id: CiTrustId,
    pub team_id: TeamId,
    pub team_name: String,
    pub name: String,
    pub issuer: String,
    pub audience: String,
    /// Claim name → pattern (see `domain::ci_trust`).
    pub conditions: Json<BTreeMap<String, String>>,
    pub role: String,
    pub token_ttl_seconds: i32,
    pub created_by: String,
    pub created_at: DateTime<Utc>,
}

/// A policy to store.
#[derive(Debug)]
pub struct NewCiTrust<'a> {
    pub team_id: TeamId,
    pub name: &'a str,
    pub issuer: &'a str,
    pub audience: &'a str,
    pub conditions: &'a BTreeMap<String, String>,
    pub role: &'a str,
    pub token_ttl_seconds: i32,
    pub created_by: &'a str,
}

/// Stores a new policy; a second one of the same name in the team violates
/// `ci_trusts_team_id_name_key`.
pub async fn insert(tx: &mut Tx<'_>, trust: &NewCiTrust<'_>) -> Result<CiTrustRow, sqlx::Error> {
    sqlx::query_as!(
        CiTrustRow,
        r#"with c as (
               insert into ci_trusts (id, team_id, name, issuer, audience, conditions, role, token_ttl_seconds,
                                      created_by)
               values ($1, $2, $3, $4, $5, $6, $7, $8, $9)
               returning *
           )
           select c.id as "id: CiTrustId", c.team_id as "team_id: TeamId", t.name as team_name, c.name, c.issuer,
                  c.audience, c.conditions as "conditions: Json<BTreeMap<String, String>>", c.role,
                  c.token_ttl_seconds, c.created_by, c.created_at
           from c join teams t on t.id = c.team_id"#,
        CiTrustId::new() as CiTrustId,
        trust.team_id as TeamId,
        trust.name,
        trust.issuer,
        trust.audience,
        Json(trust.conditions) as _,
        trust.role,
        trust.token_ttl_seconds,
        trust.created_by
    )
    .fetch_one(&mut **tx)
    .await
}

/// The policy `name` of `team_id`.
pub async fn get(pool: &PgPool, team_id: TeamId, name: &str) -> Result<Option<CiTrustRow>, sqlx::Error> {
    sqlx::query_as!(
        CiTrustRow,
        r#"select c.id as "id: CiTrustId", c.team_id as "team_id: TeamId", t.name as team_name, c.name, c.issuer,
                  c.audience, c.conditions as "conditions: Json<BTreeMap<String, String>>", c.role,
                  c.token_ttl_seconds, c.created_by, c.created_at
           from ci_trusts c join teams t on t.id = c.team_id
           where c.team_id = $1 and c.name = $2"#,
        team_id as TeamId,
        name
    )
    .fetch_optional(pool)
    .await
}

/// The policy `name` of `team_id`, locked until the transaction ends.
pub async fn get_for_update(tx: &mut Tx<'_>, team_id: TeamId, name: &str) -> Result<Option<CiTrustRow>, sqlx::Error> {
    sqlx::query_as!(
        CiTrustRow,
        r#"select c.id as "id: CiTrustId", c.team_id as "team_id: TeamId", t.name as team_name, c.name, c.issuer,
                  c.audience, c.conditions as "conditions: Json<BTreeMap<String, String>>", c.role,
                  c.token_ttl_seconds, c.created_by, c.created_at
           from ci_trusts c join teams t on t.id = c.team_id
           where c.team_id = $1 and c.name = $2
           for update of c"#,
        team_id as TeamId,
        name
    )
    .fetch_optional(&mut **tx)
    .await
}

/// Policies of `team_id` in name order, after the name `after`.
pub async fn list(
    pool: &PgPool,
    team_id: TeamId,
    after: Option<&str>,
    limit: i64,
) -> Result<Vec<CiTrustRow>, sqlx::Error> {
    sqlx::query_as!(
        CiTrustRow,
        r#"select c.id as "id: CiTrustId", c.team_id as "team_id: TeamId", t.name as team_name, c.name, c.issuer,
                  c.audience, c.conditions as "conditions: Json<BTreeMap<String, String>>", c.role,
                  c.token_ttl_seconds, c.created_by, c.created_at
           from ci_trusts c join teams t on t.id = c.team_id
           where c.team_id = $1 and ($2::text is null or c.name > $2)
           order by c.name limit $3"#,
        team_id as TeamId,
        after,
        limit
    )
    .fetch_all(pool)
    .await
}

/// The policies that trust `issuer`, of the team named `team` only when one is named, in
/// team and name order: the candidates of a token exchange.
pub async fn for_issuer(pool: &PgPool, issuer: &str, team: Option<&str>) -> Result<Vec<CiTrustRow>, sqlx::Error> {
    sqlx::query_as!(
        CiTrustRow,
        r#"select c.id as "id: CiTrustId", c.team_id as "team_id: TeamId", t.name as team_name, c.name, c.issuer,
                  c.audience, c.conditions as "conditions: Json<BTreeMap<String, String>>", c.role,
                  c.token_ttl_seconds, c.created_by, c.created_at
           from ci_trusts c join teams t on t.id = c.team_id
           where c.issuer = $1 and ($2::text is null or t.name = $2)
           order by t.name, c.name"#,
        issuer,
        team
    )
    .fetch_all(pool)
    .await
}

/// Deletes the policy `id` of `team_id`.
pub async fn delete(tx: &mut Tx<'_>, team_id: TeamId, id: CiTrustId) -> Result<(), sqlx::Error> {
    sqlx::query!("delete from ci_trusts where team_id = $1 and id = $2", team_id as TeamId, id as CiTrustId)
        .execute(&mut **tx)
        .await?;
    Ok(())
}
