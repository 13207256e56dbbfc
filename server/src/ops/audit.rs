//! The audit trail every change leaves: who did what to which object, before and after,
//! written in the change's own transaction so that a change and its record commit together.

use crate::domain::TeamId;
use serde::Serialize;

use super::Result;
use crate::{
    auth::Principal,
    db::{self, audit::Change, Tx},
};

/// Records a change made by `principal` in the change's transaction.
#[expect(clippy::too_many_arguments, reason = "each argument is one column of the audit record")]
pub async fn record<B: Serialize, A: Serialize>(
    tx: &mut Tx<'_>,
    principal: &Principal,
    action: &str,
    object_type: &str,
    object_id: &str,
    team_id: Option<TeamId>,
    before: Option<&B>,
    after: Option<&A>,
) -> Result<()> {
    db::audit::record(
        tx,
        Change {
            actor: &principal.actor(),
            action,
            object_type,
            object_id,
            team_id,
            before: before.map(to_json),
            after: after.map(to_json),
        },
    )
    .await?;
    Ok(())
}

fn to_json<T: Serialize>(value: &T) -> serde_json::Value {
    serde_json::to_value(value).unwrap_or(serde_json::Value::Null)
}
