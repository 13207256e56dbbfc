//! The database's rows turned into the engine's [`Snapshot`], with the maps that turn the
//! engine's indices back into jobs, teams and nodes.

use std::{
    collections::{BTreeMap, HashMap},
    sync::Arc,
};

use crate::domain;
use serde_json::Value;

use crate::{
    backends::ReplicaSlot,
    db::{
        jobs::NewJob,
        snapshot::{LiveJob, SnapshotRows},
    },
    domain::JobState,
    scheduler::{
        self,
        decision::PendingReason,
        snapshot::{
            ClassId, GpuClass, JobSpec, Level, Node, NodeId, PriorityClass, PriorityId, Quota, ReplicaPlacement,
            RunningJob, Snapshot, Team, TeamId, Topology, UNIT,
        },
    },
};

/// A snapshot and how to read the engine's answers.
pub struct World {
    pub snapshot: Snapshot,
    /// Live jobs by the engine's job id (the job's `seq`).
    pub jobs: HashMap<u64, Arc<LiveJob>>,
    /// Per engine node: (cluster id, cluster name, node name).
    pub nodes: Vec<(domain::ClusterId, String, String)>,
    pub team_names: Vec<String>,
    class_index: HashMap<domain::GpuClassId, ClassId>,
    team_index: HashMap<domain::TeamId, TeamId>,
    priority_index: HashMap<String, PriorityId>,
}

fn millis(t: chrono::DateTime<chrono::Utc>) -> i64 {
    t.timestamp_millis()
}

/// The engine's topology for a stored mode and level.
pub fn topology(mode: &str, level: Option<&str>) -> Topology {
    let level = match level {
        Some("nvlink-domain") => Level::NvlinkDomain,
        Some("node") => Level::Node,
        Some("rack") => Level::Rack,
        Some("zone") => Level::Zone,
        _ => return Topology::Any,
    };
    match mode {
        "required" => Topology::Required(level),
        "preferred" => Topology::Preferred(level),
        _ => Topology::Any,
    }
}

impl World {
    /// Builds the snapshot from rows read at one instant.
    /// Sets what each team's hard budgets leave this period (teams absent have none).
    pub fn set_hard_budgets(&mut self, left: &crate::billing::budgets::HardBudgets) {
        for (id, &index) in &self.team_index {
            if let Some(team) = self.snapshot.teams.get_mut(index as usize) {
                team.hard_budget_left_micros = left.money_micros.get(id).copied();
                team.hard_budget_left_gpu_milli_ms = left.gpu_milli_ms.get(id).copied();
            }
        }
    }

    pub fn build(rows: SnapshotRows, config: scheduler::snapshot::Config) -> Self {
        let now_ms = millis(rows.now);
        let class_index: HashMap<domain::GpuClassId, ClassId> =
            rows.classes.iter().enumerate().map(|(i, c)| (c.id, i as ClassId)).collect();
        let classes = rows
            .classes
            .iter()
            .map(|c| GpuClass {
                name: c.name.clone(),
                rate_micros_per_hour: c.rate,
                fraction_milli: c.fraction_milli.clamp(1, 1000) as u32,
            })
            .collect();
        // Racks and zones are numbered per cluster: two clusters' "rack-1" are different racks.
        let mut racks: BTreeMap<(domain::ClusterId, String), u32> = BTreeMap::new();
        let mut zones: BTreeMap<(domain::ClusterId, String), u32> = BTreeMap::new();
        let mut nodes = Vec::new();
        let mut node_refs = Vec::new();
        let mut node_index: HashMap<(domain::ClusterId, &str, ClassId), NodeId> = HashMap::new();
        for n in &rows.nodes {
            let Some(&class) = class_index.get(&n.gpu_class_id) else { continue };
            let next = racks.len() as u32;
            let rack = n.rack.as_ref().map(|r| *racks.entry((n.cluster_id, r.clone())).or_insert(next));
            // Clusters are zones of their own, so a zone-level gang never spans two clusters.
            let next = zones.len() as u32;
            let zone_key = n.zone.clone().unwrap_or_default();
            let zone = Some(*zones.entry((n.cluster_id, zone_key)).or_insert(next));
            node_index.insert((n.cluster_id, n.name.as_str(), class), nodes.len() as NodeId);
            nodes.push(Node {
                name: format!("{}/{}", n.cluster, n.name),
                class,
                units: n.gpus.clamp(0, 64) as u8,
                nvlink_domain_size: n.nvlink_domain_size.clamp(0, 64) as u8,
                rack,
                zone,
                elastic: n.elastic,
                spot: n.spot,
            });
            node_refs.push((n.cluster_id, n.cluster.clone(), n.name.clone()));
        }
        let team_index: HashMap<domain::TeamId, TeamId> =
            rows.teams.iter().enumerate().map(|(i, t)| (t.id, i as TeamId)).collect();
        let history: HashMap<domain::TeamId, f64> = rows.history.iter().copied().collect();
        let mut teams: Vec<Team> = rows
            .teams
            .iter()
            .map(|t| Team {
                name: t.name.clone(),
                parent: t.parent_id.and_then(|p| team_index.get(&p).copied()),
                quotas: BTreeMap::new(),
                fair_share_weight_milli: t.fair_share_weight_milli.max(1) as u32,
                usage_history_micros: history.get(&t.id).copied().unwrap_or(0.0),
                hard_budget_left_micros: None,
                soft_budget_left_micros: None,
                hard_budget_left_gpu_milli_ms: None,
            })
            .collect();
        for q in &rows.quotas {
            if let (Some(&t), Some(&c)) = (team_index.get(&q.team_id), class_index.get(&q.gpu_class_id)) {
                let milli = |gpus: i32| u64::from(gpus.max(0) as u32) * u64::from(UNIT);
                teams[t as usize].quotas.insert(
                    c,
                    Quota {
                        reserved: milli(q.reserved),
                        burst: milli(q.burst),
                        lendable: milli(q.lendable.unwrap_or(q.reserved)),
                    },
                );
            }
        }
        let priority_index: HashMap<String, PriorityId> =
            rows.priorities.iter().enumerate().map(|(i, p)| (p.name.clone(), i as PriorityId)).collect();
        let priorities = rows
            .priorities
            .iter()
            .map(|p| PriorityClass {
                name: p.name.clone(),
                priority: p.priority,
                preemptible: p.preemptible,
                price_multiplier_milli: p.price_multiplier_milli.max(0) as u32,
                usage_factor_milli: p.usage_factor_milli.max(0) as u32,
                preemption_grace_ms: i64::from(p.preemption_grace_seconds) * 1000,
            })
            .collect();
        let mut world = World {
            snapshot: Snapshot {
                now_ms,
                classes,
                nodes,
                teams,
                priorities,
                running: Vec::new(),
                pending: Vec::new(),
                history: Default::default(),
                config,
            },
            jobs: HashMap::new(),
            nodes: node_refs,
            team_names: rows.teams.iter().map(|t| t.name.clone()).collect(),
            class_index,
            team_index,
            priority_index,
        };
        for job in rows.jobs {
            let Some(spec) = world.spec_of(&job) else { continue };
            if job.holds_gpus {
                let placement = world.placement_from_json(&job, &node_index);
                let started = job.started_at.or(job.admitted_at).map_or(now_ms, millis);
                world.snapshot.running.push(RunningJob {
                    spec,
                    started_ms: started,
                    last_checkpoint_ms: job.last_checkpoint_at.map(millis),
                    placement,
                    terminating: !matches!(job.state, JobState::Admitted | JobState::Running),
                });
            } else if job.state == JobState::Pending {
                world.snapshot.pending.push(spec);
            }
            world.jobs.insert(job.seq as u64, job);
        }
        world
    }

    /// The engine's view of a job; `None` for a job naming something the snapshot lacks.
    fn spec_of(&self, job: &LiveJob) -> Option<JobSpec> {
        Some(JobSpec {
            id: job.seq as u64,
            team: *self.team_index.get(&job.team_id)?,
            class: *self.class_index.get(&job.gpu_class_id)?,
            replicas: u16::try_from(job.replicas).ok()?,
            milli_per_replica: u32::try_from(job.gpus_per_replica).ok()? * UNIT,
            priority: *self.priority_index.get(&job.priority_class)?,
            topology: topology(&job.topology_mode, job.topology_level.as_deref()),
            submitted_ms: millis(job.submitted_at),
            max_runtime_ms: i64::from(job.max_runtime_seconds) * 1000,
            allow_spot: job.allow_spot,
            kind: None,
            expected_runtime_ms: None,
        })
    }

    /// A job as it would be submitted now by `team`, for a dry run.
    pub fn proposed(&self, team: domain::TeamId, job: &NewJob) -> Option<JobSpec> {
        Some(JobSpec {
            // Above every real sequence number: never confused with a stored job.
            id: u64::MAX,
            team: *self.team_index.get(&team)?,
            class: *self.class_index.get(&job.gpu_class_id)?,
            replicas: u16::try_from(job.replicas).ok()?,
            milli_per_replica: u32::try_from(job.gpus_per_replica).ok()? * UNIT,
            priority: *self.priority_index.get(&job.priority_class)?,
            topology: topology(&job.topology_mode, job.topology_level.as_deref()),
            submitted_ms: self.snapshot.now_ms,
            max_runtime_ms: i64::from(job.max_runtime_seconds) * 1000,
            allow_spot: job.allow_spot,
            kind: None,
            expected_runtime_ms: None,
        })
    }

    fn placement_from_json(
        &self,
        job: &LiveJob,
        index: &HashMap<(domain::ClusterId, &str, ClassId), NodeId>,
    ) -> Vec<ReplicaPlacement> {
        let (Some(cluster), Some(Value::Array(replicas)), Some(&class)) =
            (job.cluster_id, job.placement.as_ref(), self.class_index.get(&job.gpu_class_id))
        else {
            return Vec::new();
        };
        replicas
            .iter()
            .filter_map(|r| {
                let slot: ReplicaSlot = serde_json::from_value(r.clone()).ok()?;
                // A node that left the inventory no longer counts; its jobs are reconciled.
                let node = *index.get(&(cluster, slot.node.as_str(), class))?;
                Some(ReplicaPlacement { node, units: slot.gpus.iter().map(|&u| (u, UNIT)).collect() })
            })
            .collect()
    }

    /// The cluster (id and name) and the stored placement of an engine placement; `None`
    /// when the replicas span clusters (a gang must run on one).
    pub fn stored_placement(
        &self,
        placement: &[ReplicaPlacement],
    ) -> Option<(domain::ClusterId, String, Vec<ReplicaSlot>)> {
        let mut cluster: Option<(domain::ClusterId, &str)> = None;
        let mut slots = Vec::with_capacity(placement.len());
        for r in placement {
            let (cluster_id, cluster_name, node) = self.nodes.get(r.node as usize)?;
            if cluster.get_or_insert((*cluster_id, cluster_name)).0 != *cluster_id {
                return None;
            }
            slots.push(ReplicaSlot { node: node.clone(), gpus: r.units.iter().map(|(u, _)| *u).collect() });
        }
        let (id, name) = cluster?;
        Some((id, name.to_owned(), slots))
    }

    /// A team's name by engine index.
    pub fn team_name(&self, team: TeamId) -> String {
        self.team_names.get(team as usize).cloned().unwrap_or_default()
    }

    /// A GPU class's name by id.
    pub fn class_name_of(&self, class: domain::GpuClassId) -> String {
        let index = self.class_index.get(&class).map(|&c| usize::from(c));
        index.and_then(|c| self.snapshot.classes.get(c)).map(|c| c.name.clone()).unwrap_or_default()
    }

    /// A team's name by id.
    pub fn team_name_of(&self, team: domain::TeamId) -> String {
        self.team_index.get(&team).map(|&t| self.team_name(t)).unwrap_or_default()
    }

    /// A pending reason's stable code and sentence, with teams named and other jobs named
    /// by their ids (the engine's job numbers mean nothing to users).
    pub fn pending_text(&self, reason: &PendingReason) -> (String, String) {
        (self.pending_code(reason), self.pending_message(reason))
    }

    /// A pending reason's stable code.
    pub fn pending_code(&self, reason: &PendingReason) -> String {
        match reason {
            PendingReason::ReservedFor { .. } => "reserved_for_gang".to_owned(),
            PendingReason::BehindHeadOfLine { .. } => "behind_head_of_line".to_owned(),
            reason => reason.code(&|t| self.team_name(t)),
        }
    }

    /// A pending reason's sentence (see [`World::pending_text`]).
    pub fn pending_message(&self, reason: &PendingReason) -> String {
        let job_id = |j: &u64| self.jobs.get(j).map(|j| j.id.to_string()).unwrap_or_default();
        match reason {
            PendingReason::ReservedFor { job } => {
                format!("GPUs are held for job {}, an earlier gang that would otherwise starve", job_id(job))
            }
            PendingReason::BehindHeadOfLine { job } => {
                format!("job {} at the head of the queue is waiting", job_id(job))
            }
            reason => reason.message(&|t| self.team_name(t)),
        }
    }
}
