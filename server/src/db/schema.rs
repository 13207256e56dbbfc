//! The schema's migrations as applied to this database: what `fairway migrate` and the
//! start-up check read before they act.

use sqlx::PgPool;

use super::MIGRATOR;

/// The versions of the successfully applied migrations, newest first.
pub async fn applied_versions(pool: &PgPool) -> Result<Vec<i64>, sqlx::Error> {
    sqlx::query_scalar("select version from _sqlx_migrations where success order by version desc").fetch_all(pool).await
}

/// The newest migration this binary carries.
pub fn latest_known() -> i64 {
    MIGRATOR.iter().map(|m| m.version).max().unwrap_or(0)
}

/// Where one step down leads from `applied` (newest first): the version below the newest,
/// or 0 when only one is applied; `None` when nothing is applied.
pub fn one_step_down(applied: &[i64]) -> Option<i64> {
    match applied {
        [] => None,
        [_] => Some(0),
        [_, below, ..] => Some(*below),
    }
}

/// Why `migrate down` did not revert.
#[derive(Debug, thiserror::Error)]
pub enum DownError {
    /// Without a target, the step is computed from the applied versions; if they cannot be
    /// read, guessing (0 would revert everything) is not safe.
    #[error(
        "cannot read the applied migrations, so the one step down is unknown; refusing to revert anything \
         (pass --target VERSION to revert to a version you name)"
    )]
    UnknownApplied(#[source] sqlx::Error),
    /// The revert itself failed.
    #[error("reverting migrations failed")]
    Revert(#[source] sqlx::migrate::MigrateError),
}

/// Reverts the migrations above `target`, or with no target the newest one. Returns the
/// version the schema is at afterwards, or `None` when nothing was applied.
pub async fn migrate_down(pool: &PgPool, target: Option<i64>) -> Result<Option<i64>, DownError> {
    let target = match target {
        Some(t) => t,
        None => {
            let applied = applied_versions(pool).await.map_err(DownError::UnknownApplied)?;
            match one_step_down(&applied) {
                Some(t) => t,
                None => return Ok(None),
            }
        }
    };
    MIGRATOR.undo(pool, target).await.map_err(DownError::Revert)?;
    Ok(Some(target))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_step_down_reverts_only_the_newest_migration() {
        assert_eq!(one_step_down(&[30, 20, 10]), Some(20));
        assert_eq!(one_step_down(&[10]), Some(0));
        assert_eq!(one_step_down(&[]), None);
    }
}
