//! The cluster view.

use askama::Template;
use axum::{
    extract::{Path, State},
    response::{IntoResponse, Redirect, Response},
};

use super::{
    platform_admin::require_platform_admin, principal, render, signed_in, CurrentUser, NoFields, PageError, PortalForm,
    SignedIn,
};
use crate::{db, ops, state::AppState, web::cluster};

#[derive(Template)]
#[template(path = "cluster.html")]
struct ClusterPage {
    signed_in: Option<SignedIn>,
    clusters: Vec<cluster::ClusterView>,
    classes: Vec<cluster::ClassFree>,
    /// Each team's colour, for viewers who see every team.
    teams: Vec<cluster::TeamColour>,
    /// Nodes out of the inventory because their GPUs report a fault.
    faults: Vec<FaultLine>,
    /// Whether the viewer may clear DCGM's faults (platform admins).
    can_clear: bool,
    csrf: String,
    /// Per cluster, a sentence for each GPU class whose nodes run several driver versions.
    driver_warnings: Vec<(String, String)>,
}

/// A node out of the inventory, as the page lists it.
struct FaultLine {
    cluster: String,
    node: String,
    since: String,
    why: String,
    /// DCGM's faults stay until a platform admin clears them; a node's own clear with it.
    sticky: bool,
}

/// Every cluster's nodes and GPUs, coloured by whose jobs hold them.
pub async fn clusters(State(state): State<AppState>, CurrentUser(user): CurrentUser) -> Result<Response, PageError> {
    let sees_all = principal(&user).platform_role().is_some();
    let teams = db::teams::list_visible_to_user(&state.db, user.user_id, None, 10_000).await?;
    let viewer = cluster::Viewer { teams: teams.into_iter().map(|t| t.id).collect(), sees_all };
    let nodes = db::clusters::layout(&state.db).await?;
    let held = db::clusters::held_placements(&state.db).await?;
    let cluster::Layout { clusters, classes, teams } = cluster::layout(&nodes, &held, &viewer);
    let faults = db::clusters::faults(&state.db)
        .await?
        .into_iter()
        .map(|f| FaultLine {
            sticky: f.source == crate::domain::gpu_health::FaultSource::Dcgm,
            since: f.since.format("%Y-%m-%d %H:%M:%S UTC").to_string(),
            cluster: f.cluster,
            node: f.node,
            why: f.why,
        })
        .collect();
    let can_clear = require_platform_admin(&user).is_ok();
    let driver_warnings = ops::clusters::drivers(&state.db)
        .await?
        .into_iter()
        .flat_map(|(cluster, (_, warnings))| warnings.into_iter().map(move |w| (cluster.clone(), w)))
        .collect();
    Ok(render(&ClusterPage {
        signed_in: Some(signed_in(&user)),
        clusters,
        classes,
        teams,
        faults,
        can_clear,
        csrf: user.csrf_token.clone(),
        driver_warnings,
    }))
}

/// Clears the GPU faults DCGM reported on a node (platform admins), then shows the clusters.
pub async fn clear_faults(
    State(state): State<AppState>,
    Path((cluster, node)): Path<(String, String)>,
    PortalForm { user, .. }: PortalForm<NoFields>,
) -> Result<Response, PageError> {
    require_platform_admin(&user)?;
    ops::clusters::clear_faults(&state, &principal(&user), &cluster, &node).await?;
    Ok(Redirect::to("/clusters").into_response())
}
