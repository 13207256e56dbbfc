//! The cluster view.

use askama::Template;
use axum::{extract::State, response::Response};

use super::{principal, render, signed_in, CurrentUser, PageError, SignedIn};
use crate::{db, ops, state::AppState, web::cluster};

#[derive(Template)]
#[template(path = "cluster.html")]
struct ClusterPage {
    signed_in: Option<SignedIn>,
    clusters: Vec<cluster::ClusterView>,
    classes: Vec<cluster::ClassFree>,
    /// Each team's colour, for viewers who see every team.
    teams: Vec<cluster::TeamColour>,
    /// Nodes out of the inventory because their GPUs report a fault: "cluster/node", since
    /// when, why.
    faults: Vec<(String, String, String)>,
    /// Per cluster, a sentence for each GPU class whose nodes run several driver versions.
    driver_warnings: Vec<(String, String)>,
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
        .map(|f| (format!("{}/{}", f.cluster, f.node), f.since.format("%Y-%m-%d %H:%M:%S UTC").to_string(), f.why))
        .collect();
    let driver_warnings = ops::clusters::drivers(&state.db)
        .await?
        .into_iter()
        .flat_map(|(cluster, (_, warnings))| warnings.into_iter().map(move |w| (cluster.clone(), w)))
        .collect();
    Ok(render(&ClusterPage { signed_in: Some(signed_in(&user)), clusters, classes, teams, faults, driver_warnings }))
}
