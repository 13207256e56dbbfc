//! Inference services: a workload of independent replicas with no maximum runtime, kept at
//! a size between a minimum and a maximum by the leader's service pass
//! (`control::services`), reachable at a stable endpoint, scaled and updated (a rolling
//! update, one replica at a time) by the API and the portal, deleted whole. Each replica is
//! a job of one replica: queued, admitted within the quotas, preempted, metered and billed
//! as every job is.
//!
//! The replica is checked as a job is (`ops::jobs::validated`): once as the gang of the
//! minimum replicas at the guaranteed (non-preemptible) priority class, so a minimum that
//! does not fit the team's reserved quota is refused, and once as one replica at the burst
//! class.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::{audit::record, jobs::JobSpec, Error, Precondition, Result};
use crate::{
    auth::{CatalogueVersion, Principal},
    db::{
        self,
        jobs::JobRow,
        services::{Change, Endpoint, NewService, ServiceRow},
        teams::TeamRow,
    },
    domain::{
        check_range,
        service::{self, ReplicaCounts, ServiceName, ServiceState, Target, Template},
        workload::{SecretEnv, Volume},
        FieldError, ServiceId, TeamId,
    },
    state::AppState,
};

/// The class the minimum replicas run at when the service names none.
pub const DEFAULT_PRIORITY_CLASS: &str = "production";
/// The class the replicas above the minimum run at when the service names none.
pub const DEFAULT_BURST_PRIORITY_CLASS: &str = "experiment";

/// A service to create.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ServiceSpec {
    /// Lowercase letters, digits and `-`, starting with a letter, at most 50 characters;
    /// unique among the team's services. On Kubernetes the endpoint is the Service
    /// `fw-svc-<name>` in the team's namespace.
    pub name: String,
    /// Replicas always kept, 1 to 64: they run at `priority_class` (not preemptible), so
    /// they must fit the team's reserved quota together, and are never preempted. Default 1.
    #[serde(default = "one")]
    #[schema(minimum = 1, maximum = 64)]
    pub min_replicas: i64,
    /// Most replicas it may be scaled to, at least `min_replicas`. Default `min_replicas`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, maximum = 64)]
    pub max_replicas: Option<i64>,
    /// Replicas to run now, between the two. Default `min_replicas`. Those above the
    /// minimum run at `burst_priority_class`: they may borrow burst capacity and are the
    /// first to be preempted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<i64>,
    /// The port replicas listen on (told in `PORT`) and the endpoint serves. Default 8000.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, maximum = 65535)]
    pub port: Option<i64>,
    /// Times each replica is restarted after the application fails, 0 to 100 (default 5).
    /// A replica out of restarts leaves its slot empty (the service is `degraded`) until the
    /// service is scaled or updated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 0, maximum = 100)]
    pub restart_budget: Option<i64>,
    /// A priority class that is not preemptible, for the minimum replicas. Default
    /// `production`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority_class: Option<String>,
    /// A preemptible priority class, for the replicas above the minimum. Default
    /// `experiment`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub burst_priority_class: Option<String>,
    /// What every replica runs.
    pub replica: ReplicaSpec,
}

/// One replica of a service: a job of one replica, with no maximum runtime.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReplicaSpec {
    /// GPU class from the catalogue, offered by a Kubernetes or simulated cluster: cloud
    /// batch pools take no services.
    pub gpu_class: String,
    /// GPUs per replica, on one node. Default 1.
    #[serde(default = "one")]
    #[schema(minimum = 1, maximum = 64)]
    pub gpus: i64,
    /// Container image.
    pub image: String,
    /// Command and arguments.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub command: Vec<String>,
    /// Environment variables, as a job's.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Labels, Kubernetes style.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Seconds a replica has to drain when stopped; default from its priority class.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 0, maximum = 86400)]
    pub preemption_grace_seconds: Option<i64>,
    /// CPU per replica, as a job's `cpu`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<String>,
    /// Memory per replica, as a job's `memory`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<String>,
    /// PersistentVolumeClaims of the team's namespace, as a job's `volumes`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<Volume>,
    /// Variables from Secrets of the team's namespace, as a job's `secret_env`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub secret_env: Vec<SecretEnv>,
    /// Secrets of the team's namespace with registry credentials for the image.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub image_pull_secrets: Vec<String>,
    /// Node labels each replica's node must carry.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_selector: BTreeMap<String, String>,
    /// The oldest NVIDIA driver each replica's node may run, as a job's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_driver_version: Option<String>,
    /// The oldest CUDA version each replica's node's driver must support, as a job's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_cuda_version: Option<String>,
}

/// A change of a service: its size, or what its replicas run (a rolling update). Fields
/// left out keep their value.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ServiceUpdate {
    /// Replicas to run now, between the minimum and the maximum.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_replicas: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_replicas: Option<i64>,
    /// A new image: replicas are replaced one at a time, never beyond the quotas.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// A new command (rolling update).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<Vec<String>>,
    /// New environment variables, replacing the old ones whole (rolling update).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env: Option<BTreeMap<String, String>>,
}

fn one() -> i64 {
    1
}

/// A service as people see it: the row, its replicas' counts and state, its endpoints and
/// replica jobs.
pub struct Status {
    pub service: ServiceRow,
    pub state: ServiceState,
    pub counts: ReplicaCounts,
    pub endpoints: Vec<Endpoint>,
    /// Replicas that run or will, still stop, or ended since the last change, in slot order;
    /// only from [`status`].
    pub replicas: Vec<JobRow>,
}

/// Creates the service `spec` for `team` on behalf of `principal`, audited. Its replicas
/// are started by the leader's next cycle.
pub async fn create(
    state: &AppState,
    principal: &Principal,
    team: &TeamRow,
    spec: ServiceSpec,
    version: CatalogueVersion,
) -> Result<ServiceRow> {
    let mut errors = Vec::new();
    let name = ServiceName::parse("name", spec.name.trim()).map_err(|e| errors.push(e)).ok();
    let min = spec.min_replicas;
    let max = spec.max_replicas.unwrap_or(min);
    let replicas = spec.replicas.unwrap_or(min);
    errors.extend(service::check_size(min, max, replicas));
    let port = spec.port.unwrap_or(service::DEFAULT_PORT);
    errors.extend(check_range("port", port, 1, 65535).err());
    let budget = spec.restart_budget.unwrap_or(i64::from(service::DEFAULT_RESTART_BUDGET));
    errors.extend(check_range("restart_budget", budget, 0, 100).err());
    if !errors.is_empty() {
        return Err(Error::Validation(errors));
    }
    let classes = Classes {
        guaranteed: spec.priority_class.clone().unwrap_or_else(|| DEFAULT_PRIORITY_CLASS.into()),
        burst: spec.burst_priority_class.clone().unwrap_or_else(|| DEFAULT_BURST_PRIORITY_CLASS.into()),
    };
    // Checked above: all within i32.
    let (min, max, replicas, port, budget) = (min as i32, max as i32, replicas as i32, port as i32, budget as i32);
    let template = checked(state, team.id, &spec.replica, min, &classes, budget, version).await?;
    let name = name.expect("checked above");
    let id = ServiceId::new();
    let replica_spec = serde_json::to_value(&spec.replica).map_err(|e| Error::internal("service replica", e))?;
    let mut tx = state.db.begin().await?;
    let new = NewService {
        id,
        team_id: team.id,
        name: name.as_str(),
        min_replicas: min,
        max_replicas: max,
        replicas,
        port,
        template: &template,
        replica_spec: &replica_spec,
        created_by: &principal.actor(),
    };
    if !db::services::insert(&mut tx, &new).await? {
        return Err(Error::conflict(
            "service_exists",
            Some("name"),
            format!("team {} already has a service named {}", team.name, name.as_str()),
        ));
    }
    record(&mut tx, principal, "service.create", "service", &id.to_string(), Some(team.id), None::<&()>, Some(&spec))
        .await?;
    tx.commit().await?;
    state.wake_scheduler();
    db::services::get(&state.db, team.id, name.as_str()).await?.ok_or(Error::NotFound("service"))
}

/// Applies `update` to the service `name` of `team` when `precondition` allows, audited:
/// a new size is taken at the next cycle; a new image, command or environment starts a
/// rolling update (a new revision). Any change gives slots whose replica ran out of
/// restarts a new replica.
pub async fn update(
    state: &AppState,
    principal: &Principal,
    team: &TeamRow,
    name: &str,
    update: ServiceUpdate,
    precondition: &Precondition,
    version: CatalogueVersion,
) -> Result<ServiceRow> {
    // Judged without a lock (validation reads the catalogue and budgets), then written under
    // the service's lock only if nothing changed it meanwhile; otherwise judged again against
    // what the other change left. Two changes at once thus apply one after the other.
    let mut tries = 0;
    let (mut tx, before, change_of) = loop {
        let current = db::services::get(&state.db, team.id, name).await?.ok_or(Error::NotFound("service"))?;
        precondition.check(current.version)?;
        let judged = judge(state, team.id, &current, &update, version).await?;
        let mut tx = state.db.begin().await?;
        let before = db::services::lock(&mut tx, team.id, name).await?.ok_or(Error::NotFound("service"))?;
        if before.version == current.version {
            break (tx, before, judged);
        }
        tries += 1;
        if tries == 3 {
            return Err(Error::conflict(
                "service_busy",
                None,
                format!("service {name} kept changing while this change was judged; try again"),
            ));
        }
    };
    let (template, replica_spec, min, max, replicas) = change_of;
    let old = &before.template.0;
    let runs_differently = (&template.image, &template.command, &template.env) != (&old.image, &old.command, &old.env);
    let revision = if runs_differently { before.revision + 1 } else { before.revision };
    let change = Change {
        min_replicas: min,
        max_replicas: max,
        replicas,
        revision,
        template: &template,
        replica_spec: &replica_spec,
    };
    db::services::update(&mut tx, before.id, &change).await?;
    record(
        &mut tx,
        principal,
        "service.update",
        "service",
        &before.id.to_string(),
        Some(team.id),
        None::<&()>,
        Some(&update),
    )
    .await?;
    tx.commit().await?;
    state.wake_scheduler();
    db::services::get(&state.db, team.id, name).await?.ok_or(Error::NotFound("service"))
}

/// `update` applied to `current`, judged: the template, the replica as asked for, and the
/// new minimum, maximum and size. Only a change of what replicas run, or of the minimum
/// (which must fit reserved quota), is judged again; a size within the range is not (a
/// budget set since must not keep a service from scaling down).
async fn judge(
    state: &AppState,
    team_id: TeamId,
    current: &ServiceRow,
    update: &ServiceUpdate,
    version: CatalogueVersion,
) -> Result<(Template, serde_json::Value, i32, i32, i32)> {
    let min = update.min_replicas.unwrap_or(i64::from(current.min_replicas));
    let max = update.max_replicas.unwrap_or(i64::from(current.max_replicas));
    let replicas = update.replicas.unwrap_or(i64::from(current.replicas));
    let errors = service::check_size(min, max, replicas);
    if !errors.is_empty() {
        return Err(Error::Validation(errors));
    }
    // Checked above: all within 1 and 64.
    let (min, max, replicas) = (min as i32, max as i32, replicas as i32);
    let mut replica: ReplicaSpec = serde_json::from_value(current.replica_spec.0.clone())
        .map_err(|e| Error::internal("stored service replica", e))?;
    if let Some(image) = &update.image {
        replica.image.clone_from(image);
    }
    if let Some(command) = &update.command {
        replica.command.clone_from(command);
    }
    if let Some(env) = &update.env {
        replica.env.clone_from(env);
    }
    let old = &current.template.0;
    let classes = Classes { guaranteed: old.priority_class.clone(), burst: old.burst_priority_class.clone() };
    let judged =
        update.image.is_some() || update.command.is_some() || update.env.is_some() || min != current.min_replicas;
    let template = if judged {
        checked(state, team_id, &replica, min, &classes, old.restart_budget, version).await?
    } else {
        old.clone()
    };
    let replica_spec = serde_json::to_value(&replica).map_err(|e| Error::internal("service replica", e))?;
    Ok((template, replica_spec, min, max, replicas))
}

/// Deletes the service `name` of `team`, audited: its replicas stop at the next cycle (with
/// their grace period), its name is free again, its bills remain. Answers the service as
/// deleted.
pub async fn delete(state: &AppState, principal: &Principal, team: &TeamRow, name: &str) -> Result<Status> {
    let mut tx = state.db.begin().await?;
    let before = db::services::lock(&mut tx, team.id, name).await?.ok_or(Error::NotFound("service"))?;
    db::services::delete(&mut tx, before.id).await?;
    record(
        &mut tx,
        principal,
        "service.delete",
        "service",
        &before.id.to_string(),
        Some(team.id),
        None::<&()>,
        None::<&()>,
    )
    .await?;
    tx.commit().await?;
    state.wake_scheduler();
    let mut tx = db::read_snapshot(&state.db).await?;
    let deleted = db::services::by_id(&mut *tx, team.id, before.id).await?.ok_or(Error::NotFound("service"))?;
    let status = summarise(&mut tx, vec![deleted]).await?.pop().expect("one service in, one out");
    tx.commit().await?;
    Ok(status)
}

/// The service `name` of `team_id` as people see it, with its replica jobs.
pub async fn status(state: &AppState, team_id: TeamId, name: &str) -> Result<Status> {
    // One snapshot: read apart, the jobs could still say "admitted" while the counts beside
    // them, read a moment later, already said "ready".
    let mut tx = db::read_snapshot(&state.db).await?;
    let service = db::services::get(&mut *tx, team_id, name).await?.ok_or(Error::NotFound("service"))?;
    let jobs = db::jobs::service_replicas(&mut *tx, service.id, service.changed_at).await?;
    let status = summarise(&mut tx, vec![service]).await?.pop().expect("one service in, one out");
    tx.commit().await?;
    Ok(Status { replicas: jobs, ..status })
}

/// A team's live services as people see them, oldest first, after `after_seq` when given,
/// without their replica jobs (a list shows counts; one service's page or answer reads the
/// jobs, [`status`]): three reads of one snapshot however many services.
pub async fn list(state: &AppState, team_id: TeamId, after_seq: Option<i64>, limit: i64) -> Result<Vec<Status>> {
    let mut tx = db::read_snapshot(&state.db).await?;
    let services = db::services::list(&mut *tx, team_id, after_seq, limit).await?;
    let statuses = summarise(&mut tx, services).await?;
    tx.commit().await?;
    Ok(statuses)
}

/// `services` as people see them, in the order given, from their replicas and endpoints as
/// `tx` sees them.
async fn summarise(tx: &mut db::Tx<'_>, services: Vec<ServiceRow>) -> Result<Vec<Status>> {
    let ids: Vec<ServiceId> = services.iter().map(|s| s.id).collect();
    let seen = db::services::replicas(&mut **tx, &ids).await?;
    let mut endpoints = db::services::endpoints(&mut **tx, &ids).await?;
    let mut out = Vec::with_capacity(services.len());
    for s in services {
        let replicas: Vec<_> =
            seen.iter().filter(|r| r.service_id == s.id).map(db::services::ReplicaRow::replica).collect();
        let target = Target { replicas: s.replicas, min: s.min_replicas, revision: s.revision };
        let (counts, state_now) = service::summary(target, s.deleted_at.is_some(), &replicas);
        let mine: Vec<Endpoint> = endpoints.iter().filter(|e| e.service_id == s.id).cloned().collect();
        endpoints.retain(|e| e.service_id != s.id);
        out.push(Status { service: s, state: state_now, counts, endpoints: mine, replicas: Vec::new() });
    }
    Ok(out)
}

/// The two priority classes of a service.
struct Classes {
    guaranteed: String,
    burst: String,
}

/// `replica` checked for `team_id` as jobs are, naming fields as a service's: the gang of
/// `min` replicas at the guaranteed class (so the minimum must fit reserved quota) and one
/// replica at the burst class; the classes checked for what they must be; a class offered by
/// nodes, not only by cloud pools. Budgets judge a day of the minimum (a job's default
/// maximum runtime); the engine then admits each replica while the hard budgets over the
/// team cover it to the end of their period.
async fn checked(
    state: &AppState,
    team_id: TeamId,
    replica: &ReplicaSpec,
    min: i32,
    classes: &Classes,
    restart_budget: i32,
    version: CatalogueVersion,
) -> Result<Template> {
    let as_job = |replicas: i32, priority: &str| JobSpec {
        name: "service".into(),
        gpu_class: replica.gpu_class.clone(),
        replicas: i64::from(replicas),
        max_replicas: None,
        gpus_per_replica: replica.gpus,
        priority_class: Some(priority.to_owned()),
        max_runtime_seconds: None,
        expected_runtime_seconds: None,
        image: replica.image.clone(),
        command: replica.command.clone(),
        env: replica.env.clone(),
        labels: replica.labels.clone(),
        topology: None,
        preemption_grace_seconds: replica.preemption_grace_seconds,
        preemption_delay_seconds: None,
        max_retries: Some(i64::from(restart_budget)),
        allow_spot: false,
        wait_for_quota: false,
        depends_on: Vec::new(),
        if_dependency_fails: None,
        cpu: replica.cpu.clone(),
        memory: replica.memory.clone(),
        volumes: replica.volumes.clone(),
        secret_env: replica.secret_env.clone(),
        cloud_secret_env: Vec::new(),
        image_pull_secrets: replica.image_pull_secrets.clone(),
        node_selector: replica.node_selector.clone(),
        min_driver_version: replica.min_driver_version.clone(),
        min_cuda_version: replica.min_cuda_version.clone(),
    };
    let mut errors = Vec::new();
    for (class, field, preemptible) in
        [(&classes.guaranteed, "priority_class", false), (&classes.burst, "burst_priority_class", true)]
    {
        match db::priority_classes::by_name(&state.db, class).await? {
            Some(row) if row.preemptible != preemptible => errors.push(FieldError::new(
                field,
                if preemptible { "not_preemptible" } else { "preemptible" },
                if preemptible {
                    format!("{class} is not preemptible: the replicas above the minimum must be, so that they give way first")
                } else {
                    format!("{class} is preemptible: the minimum replicas must never be preempted, so their class must not be")
                },
            )),
            _ => {}
        }
    }
    if !errors.is_empty() {
        return Err(Error::Validation(errors));
    }
    let rename = |e: FieldError| -> FieldError {
        if e.code == "exceeds_budget" {
            return FieldError {
                field: "min_replicas".into(),
                message: format!(
                    "a day of the minimum replicas (a service has no maximum runtime; a day is what is judged at creation) would cost more than a hard budget over the team holds: {}",
                    e.message
                ),
                ..e
            };
        }
        if e.code == "exceeds_reserved_quota" || e.code == "exceeds_quota" {
            let message = format!(
                "the minimum replicas are never preempted, so together they must fit the team's reserved quota: {}",
                e.message.replacen("the gang needs", "they need", 1)
            );
            return FieldError { field: "min_replicas".into(), message, ..e };
        }
        let field = match e.field.as_str() {
            "replica.replicas" => "min_replicas".to_owned(),
            "replica.priority_class" => "priority_class".to_owned(),
            "replica.gpus_per_replica" => "replica.gpus".to_owned(),
            "replica.max_retries" => "restart_budget".to_owned(),
            other => other.to_owned(),
        };
        FieldError { field, ..e }
    };
    let (job, _) = super::jobs::validated(state, team_id, "replica.", &as_job(min, &classes.guaranteed), version)
        .await
        .map_err(|e| match e {
            Error::Validation(v) => Error::Validation(v.into_iter().map(rename).collect()),
            other => other,
        })?;
    super::jobs::validated(state, team_id, "replica.", &as_job(1, &classes.burst), version).await.map_err(
        |e| match e {
            Error::Validation(v) => Error::Validation(
                v.into_iter()
                    .map(rename)
                    .map(|e| {
                        if e.field == "priority_class" {
                            FieldError { field: "burst_priority_class".into(), ..e }
                        } else {
                            e
                        }
                    })
                    .collect(),
            ),
            other => other,
        },
    )?;
    let (fixed, pools) = db::inventory::class_nodes(&state.db, job.gpu_class_id).await?;
    if fixed == 0 && pools > 0 {
        return Err(Error::field(FieldError::new(
            "replica.gpu_class",
            "cloud_pools_only",
            format!(
                "{} is offered only by cloud batch pools, which take no services (they run batch jobs to completion); choose a class a Kubernetes or simulated cluster offers",
                replica.gpu_class
            ),
        )));
    }
    Ok(Template {
        gpu_class_id: job.gpu_class_id,
        gpus: job.gpus_per_replica,
        image: job.image,
        command: replica.command.clone(),
        env: job.env,
        labels: job.labels,
        cpu_millis: job.cpu_millis,
        memory_mib: job.memory_mib,
        workload: job.workload,
        preemption_grace_seconds: job.preemption_grace_seconds,
        priority_class: classes.guaranteed.clone(),
        burst_priority_class: classes.burst.clone(),
        restart_budget,
        min_driver_version: job.min_driver_version,
        min_cuda_version: job.min_cuda_version,
    })
}
