//! The database's rows turned into the engine's [`Snapshot`], with the maps that turn the
//! engine's indices back into jobs, teams and nodes.

use std::{
    collections::{BTreeMap, HashMap},
    sync::Arc,
};

use crate::domain;
use crate::metering::figures::{cents, gpu_hours};
use chrono::{TimeZone as _, Utc};
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
        decision::{Figures, PendingReason},
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
    /// The currency budgets are counted in, for sentences.
    pub currency: String,
    /// Per running elastic gang (by engine id): how many replicas its own row holds, and its
    /// running extras' rows in the order their replicas follow those in its placement.
    pub extras: HashMap<u64, (usize, Vec<domain::JobId>)>,
    class_index: HashMap<domain::GpuClassId, ClassId>,
    team_index: HashMap<domain::TeamId, TeamId>,
    priority_index: HashMap<String, PriorityId>,
}

fn millis(t: chrono::DateTime<chrono::Utc>) -> i64 {
    t.timestamp_millis()
}

/// A replica's CPU and memory as the engine counts them (none for a job from before they were
/// recorded).
fn host_of(cpu_millis: Option<i32>, memory_mib: Option<i32>) -> scheduler::Host {
    let amount = |v: Option<i32>| v.and_then(|v| u32::try_from(v).ok()).unwrap_or(0);
    scheduler::Host { cpu_millis: amount(cpu_millis), memory_mib: amount(memory_mib) }
}

/// A topology level in words, as a job names it.
fn level_name(level: Level) -> &'static str {
    match level {
        Level::NvlinkDomain => "NVLink domain",
        Level::Node => "node",
        Level::Rack => "rack",
        Level::Zone => "zone",
    }
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
        let mut clusters: BTreeMap<domain::ClusterId, u32> = BTreeMap::new();
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
            let next = clusters.len() as u32;
            let cluster = *clusters.entry(n.cluster_id).or_insert(next);
            node_index.insert((n.cluster_id, n.name.as_str(), class), nodes.len() as NodeId);
            nodes.push(Node {
                name: format!("{}/{}", n.cluster, n.name),
                class,
                units: n.gpus.clamp(0, 64) as u8,
                nvlink_domain_size: n.nvlink_domain_size.clamp(0, 64) as u8,
                rack,
                zone,
                cluster,
                elastic: n.elastic,
                spot: n.spot,
                drivers: domain::driver::DriverStack::read(n.driver_version.as_deref(), n.cuda_version.as_deref()),
                // Counted only where the cluster says both.
                host: match (n.cpu_millis, n.memory_mib) {
                    (Some(cpu), Some(memory)) => Some(scheduler::Host {
                        cpu_millis: u32::try_from(cpu).unwrap_or(0),
                        memory_mib: u32::try_from(memory).unwrap_or(0),
                    }),
                    _ => None,
                },
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
                preemption_delay_ms: i64::from(p.preemption_delay_seconds) * 1000,
            })
            .collect();
        // Budgets are monthly: what a job spends after this month is next month's.
        let mut config = config;
        let (_, period_end) = crate::billing::budgets::period_bounds(crate::billing::budgets::period_of(rows.now));
        config.budget_period_end_ms = Some(millis(period_end));
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
                forecast_errors: Default::default(),
                config,
            },
            jobs: HashMap::new(),
            nodes: node_refs,
            team_names: rows.teams.iter().map(|t| t.name.clone()).collect(),
            currency: String::new(),
            class_index,
            team_index,
            priority_index,
            extras: HashMap::new(),
        };
        // Running elastic gangs, by job id: their engine id and running index.
        let mut gangs: HashMap<domain::JobId, (u64, usize)> = HashMap::new();
        for job in rows.jobs {
            let Some(mut spec) = world.spec_of(&job) else { continue };
            if let Some(gang) = job.extra_of {
                // An extra replica is part of its gang's running job while both run; one that
                // is leaving is a stopping job of its own (the engine's convention), and one
                // holding nothing is the orphan pass's to end.
                if job.holds_gpus {
                    let placement = world.placement_from_json(&job, &node_index);
                    let active = matches!(job.state, JobState::Admitted | JobState::Running);
                    match gangs.get(&gang) {
                        Some(&(id, index)) if active => {
                            let r = &mut world.snapshot.running[index];
                            r.spec.replicas += placement.len() as u16;
                            r.placement.extend(placement);
                            world.extras.entry(id).or_default().1.push(job.id);
                        }
                        _ => world.snapshot.running.push(RunningJob {
                            spec: JobSpec { elastic: None, ..spec },
                            started_ms: job.started_at.or(job.admitted_at).map_or(now_ms, millis),
                            last_checkpoint_ms: Some(now_ms),
                            placement,
                            terminating: true,
                        }),
                    }
                }
                world.jobs.insert(job.seq as u64, job);
                continue;
            }
            if job.holds_gpus {
                if let Some(max) = job.max_replicas {
                    let min = spec.replicas;
                    spec.elastic = Some(scheduler::Elastic { min_replicas: min, max_replicas: max.max(1) as u16 });
                }
                let placement = world.placement_from_json(&job, &node_index);
                let started = job.started_at.or(job.admitted_at).map_or(now_ms, millis);
                world.snapshot.running.push(RunningJob {
                    spec,
                    started_ms: started,
                    // A replica of a service keeps no progress: stopping it loses no work, so it
                    // is the first victim a preemption considers.
                    last_checkpoint_ms: if job.service_replica {
                        Some(now_ms)
                    } else {
                        job.last_checkpoint_at.map(millis)
                    },
                    placement,
                    terminating: !matches!(job.state, JobState::Admitted | JobState::Running),
                });
                let index = world.snapshot.running.len() - 1;
                let r = &mut world.snapshot.running[index];
                if r.spec.elastic.is_some() && !r.terminating {
                    // Its extras' rows follow its own (their seq is later).
                    r.spec.replicas = r.placement.len() as u16;
                    let (id, own) = (r.spec.id, r.placement.len());
                    gangs.insert(job.id, (id, index));
                    world.extras.insert(id, (own, Vec::new()));
                }
            } else if job.state == JobState::Pending {
                if let Some(max) = job.max_replicas {
                    spec.elastic =
                        Some(scheduler::Elastic { min_replicas: spec.replicas, max_replicas: max.max(1) as u16 });
                }
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
            queued_ms: millis(job.queued_at),
            max_runtime_ms: i64::from(job.max_runtime_seconds) * 1000,
            allow_spot: job.allow_spot,
            fixed_nodes_only: job.fixed_nodes_only,
            kind: Some(scheduler::runtime::kind_of(&job.name)),
            expected_runtime_ms: job.expected_runtime_seconds.map(|s| i64::from(s) * 1000),
            grace_ms: job.preemption_grace_seconds.map(|s| i64::from(s) * 1000),
            min_drivers: domain::driver::DriverStack::read(
                job.min_driver_version.as_deref(),
                job.min_cuda_version.as_deref(),
            ),
            host: host_of(job.cpu_millis, job.memory_mib),
            preemption_delay_ms: job.preemption_delay_seconds.map(|s| i64::from(s) * 1000),
            attained_ms: job.attained_ms,
            elastic: None,
        })
    }

    /// Gives the engine what the forecast learnt: runtime history and past errors.
    pub fn set_forecast_inputs(&mut self, inputs: &mut super::forecast::ForecastInputs) {
        let (history, errors) = inputs.for_snapshot(&self.team_index, &self.priority_index);
        self.snapshot.history = history;
        self.snapshot.forecast_errors = errors;
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
            queued_ms: self.snapshot.now_ms,
            max_runtime_ms: i64::from(job.max_runtime_seconds) * 1000,
            allow_spot: job.allow_spot,
            fixed_nodes_only: job.service.is_some() || job.workload.needs_kubernetes(),
            kind: Some(scheduler::runtime::kind_of(&job.name)),
            expected_runtime_ms: job.expected_runtime_seconds.map(|s| i64::from(s) * 1000),
            grace_ms: job.preemption_grace_seconds.map(|s| i64::from(s) * 1000),
            min_drivers: domain::driver::DriverStack::read(
                job.min_driver_version.as_deref(),
                job.min_cuda_version.as_deref(),
            ),
            host: host_of(job.cpu_millis, job.memory_mib),
            preemption_delay_ms: job.preemption_delay_seconds.map(|s| i64::from(s) * 1000),
            attained_ms: 0,
            elastic: None,
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
                Some(ReplicaPlacement {
                    node,
                    units: slot.gpus.iter().map(|&u| (u, UNIT)).collect(),
                    host: host_of(job.cpu_millis, job.memory_mib),
                })
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

    /// A pending reason's sentence for people, with the numbers behind it: what the job
    /// needs, what the team holds and may hold, what is free, what a budget has left.
    /// `class` is the job's GPU class; other jobs are named by their ids (the engine's job
    /// numbers mean nothing to users).
    pub fn pending_message(
        &self,
        job_team: domain::TeamId,
        class: domain::GpuClassId,
        reason: &PendingReason,
        f: &Figures,
    ) -> String {
        let of = self.class_name_of(class);
        let (needs, free) = (gpus(f.needs), gpus(f.free));
        let job_id = |j: &u64| self.jobs.get(j).map(|j| j.id.to_string()).unwrap_or_default();
        let quota = |team: &TeamId| {
            let (q, holds) = f.quota.unwrap_or_default();
            (self.team_name(*team), gpus(q.reserved), gpus(q.burst), gpus(q.reserved + q.burst), gpus(holds))
        };
        match reason {
            PendingReason::NeverFits => {
                format!("no cluster has room for the whole gang: it needs {needs} GPUs of {of}")
            }
            PendingReason::BurstLimit { team } => {
                let (team, reserved, burst, limit, holds) = quota(team);
                format!(
                    "team {team} holds {holds} of the {limit} GPUs of {of} its quota allows ({reserved} reserved + {burst} burst), and this job needs {needs} more; it starts when the team's jobs free enough"
                )
            }
            PendingReason::ExceedsQuota { team } => {
                let (team, reserved, burst, limit, _) = quota(team);
                format!(
                    "the job needs {needs} GPUs of {of}, more than team {team}'s quota allows at all ({limit}: {reserved} reserved + {burst} burst); it starts only if the quota is raised"
                )
            }
            PendingReason::ReservedQuotaExhausted { team } => {
                let (team, reserved, _, _, holds) = quota(team);
                format!(
                    "its priority class cannot be preempted, so it runs only within reserved quota: team {team}'s non-preemptible jobs hold {holds} of its {reserved} reserved GPUs of {of}, and this job needs {needs}"
                )
            }
            PendingReason::BudgetExhausted => match f.budget {
                Some(b) if b.gpu_time => format!(
                    "team {}'s hard budget has {} GPU-hours left this period, and this job may use up to {}; it starts when the budget is raised or the next period begins",
                    self.team_name(b.team),
                    gpu_hours(b.left.max(0)),
                    gpu_hours(b.needs)
                ),
                Some(b) => format!(
                    "team {}'s hard budget has {} {} left this period, and this job may cost up to {}; it starts when the budget is raised or the next period begins",
                    self.team_name(b.team),
                    cents(b.left.max(0)),
                    self.currency,
                    cents(b.needs)
                ),
                None => "the team's hard budget cannot cover this job's maximum cost".to_owned(),
            },
            PendingReason::NoTopologyFit { within: Some(level) } => format!(
                "{free} GPUs of {of} are free to it, enough for the {needs} it needs, but not within one {} as it requires",
                level_name(*level)
            ),
            PendingReason::NoTopologyFit { within: None } => format!(
                "{free} GPUs of {of} are free to it, enough for the {needs} it needs, but not within one cluster, and a gang runs within one"
            ),
            PendingReason::FairShareBehind { team } => {
                // The largest borrower may be the job's own team or department: said so, it
                // cannot read as another team's priority.
                let own = self.team_index.get(&job_team).copied();
                let chain = std::iter::successors(own, |&t| self.snapshot.teams.get(t as usize).and_then(|x| x.parent))
                    .take(self.snapshot.teams.len());
                let whose = match chain.enumerate().find(|&(_, t)| t == *team).map(|(depth, _)| depth) {
                    Some(0) => format!("its own team {}", self.team_name(*team)),
                    Some(_) => format!("its department {}", self.team_name(*team)),
                    None => format!("team {}", self.team_name(*team)),
                };
                format!(
                    "it must borrow burst capacity: it needs {needs} GPUs of {of} and {free} are free to it; the largest borrower, {whose}, holds no more than its fair share, so none is taken back"
                )
            }
            PendingReason::InsufficientCapacity => {
                format!("not enough free GPUs of {of}: it needs {needs} and {free} are free to it")
            }
            PendingReason::WaitingForReclaim => format!(
                "preempted jobs are releasing the GPUs it will get: it needs {needs} GPUs of {of} and {free} are free to it now"
            ),
            PendingReason::ReservedFor { job } => format!(
                "GPUs of {of} are held for job {}, an earlier gang that would otherwise starve: it needs {needs} and {free} are free to it",
                job_id(job)
            ),
            PendingReason::BehindHeadOfLine { job } => {
                format!("job {} at the head of the queue is waiting, and jobs start in order", job_id(job))
            }
            PendingReason::VictimsInMinimumRuntime { at_ms } => format!(
                "not enough free GPUs of {of}: it needs {needs} and {free} are free to it; the jobs it may preempt for the rest have not yet run the minimum runtime before preemption, and enough of them have at {}",
                Utc.timestamp_millis_opt(*at_ms).single().map_or_else(String::new, |t| t.format("%H:%M:%S UTC").to_string())
            ),
            PendingReason::DriverUnavailable => {
                let (required, newest) = drivers_in_words(f);
                format!(
                    "it requires {required}, and no node of {of} runs it, or not enough of them to hold its {needs} GPUs ({newest}); it starts only after nodes are upgraded"
                )
            }
            PendingReason::NoHostFit { asks } => {
                let cpu = domain::workload::format_cpu(i32::try_from(asks.cpu_millis).unwrap_or(i32::MAX));
                let memory = domain::workload::format_memory(i32::try_from(asks.memory_mib).unwrap_or(i32::MAX));
                format!(
                    "{free} GPUs of {of} are free to it, enough for the {needs} it needs, but no node with free GPUs also has the {cpu} CPU and {memory} memory a replica asks beside them; it starts when a node has both"
                )
            }
            PendingReason::PreemptionDelayed { until_ms, victims } => {
                let jobs = if *victims == 1 { "1 running job".to_owned() } else { format!("{victims} running jobs") };
                format!(
                    "not enough free GPUs of {of}: it needs {needs} and {free} are free to it; preempting {jobs} would make room, but its preemption delay lets capacity come first (jobs ending, nodes being added): it takes any that comes, and preempts them at {} if none has",
                    Utc.timestamp_millis_opt(*until_ms).single().map_or_else(String::new, |t| t.format("%H:%M:%S UTC").to_string())
                )
            }
            PendingReason::NoDriverFit => {
                let (required, _) = drivers_in_words(f);
                let meeting = gpus(f.drivers.map_or(0, |d| d.free_meeting));
                format!(
                    "{free} GPUs of {of} are free to it, enough for the {needs} it needs, but only {meeting} of them on nodes that run {required}; it starts when enough of those are free"
                )
            }
        }
    }
}

impl World {
    /// The numbers behind a pending reason, for clients (the sentence carries the same).
    pub fn pending_figures(&self, reason: &PendingReason, f: &Figures) -> domain::WaitFigures {
        let units = |milli: u64| milli as f64 / f64::from(UNIT);
        let job_id = |j: &u64| self.jobs.get(j).map(|j| j.id);
        let (team, blocking_job) = match reason {
            PendingReason::BurstLimit { team }
            | PendingReason::ExceedsQuota { team }
            | PendingReason::ReservedQuotaExhausted { team }
            | PendingReason::FairShareBehind { team } => (Some(self.team_name(*team)), None),
            PendingReason::BudgetExhausted => (f.budget.map(|b| self.team_name(b.team)), None),
            PendingReason::ReservedFor { job } | PendingReason::BehindHeadOfLine { job } => (None, job_id(job)),
            _ => (None, None),
        };
        let budget = f.budget.map(|b| {
            let (unit, scale) =
                if b.gpu_time { (domain::BudgetUnit::GpuHours, 3_600_000) } else { (domain::BudgetUnit::Money, 1) };
            domain::BudgetShortfall { unit, needs: b.needs / scale, left: b.left.max(0) / scale }
        });
        domain::WaitFigures {
            needs_gpus: units(f.needs),
            free_gpus: units(f.free),
            team,
            in_use_gpus: f.quota.map(|(_, holds)| units(holds)),
            reserved_gpus: f.quota.map(|(q, _)| units(q.reserved)),
            burst_gpus: f.quota.map(|(q, _)| units(q.burst)),
            budget,
            blocking_job,
            earliest_start_at: None,
            latest_start_at: None,
            unforeseeable: None,
            victims_preemptible_at: match reason {
                PendingReason::VictimsInMinimumRuntime { at_ms } => Utc.timestamp_millis_opt(*at_ms).single(),
                _ => None,
            },
            preempts_at: match reason {
                PendingReason::PreemptionDelayed { until_ms, .. } => Utc.timestamp_millis_opt(*until_ms).single(),
                _ => None,
            },
            would_preempt_jobs: match reason {
                PendingReason::PreemptionDelayed { victims, .. } => Some(*victims),
                _ => None,
            },
            waiting_for: Vec::new(),
            drivers: f.drivers.map(|d| {
                let text = |v: Option<domain::driver::Version>| v.map(|v| v.to_string());
                domain::DriverWait {
                    min_driver_version: text(d.required.driver),
                    min_cuda_version: text(d.required.cuda),
                    newest_driver_version: text(d.newest.driver),
                    newest_cuda_version: text(d.newest.cuda),
                    free_gpus_meeting: units(d.free_meeting),
                }
            }),
        }
    }
}

/// A driver reason's requirement, and the newest versions the class's nodes run, in words.
fn drivers_in_words(f: &Figures) -> (String, String) {
    let Some(d) = f.drivers else { return (String::new(), String::new()) };
    let newest = match (d.newest.driver, d.newest.cuda) {
        (None, None) => "its nodes do not say which driver they run".to_owned(),
        (driver, cuda) => {
            let say = |v: Option<domain::driver::Version>| v.map_or_else(|| "unknown".to_owned(), |v| v.to_string());
            format!("the newest there: driver {}, CUDA {}", say(driver), say(cuda))
        }
    };
    (d.required.as_minimum(), newest)
}

/// Milli-units as a number of GPUs: whole when whole, else with up to three decimals.
fn gpus(milli: u64) -> String {
    if milli.is_multiple_of(u64::from(UNIT)) {
        (milli / u64::from(UNIT)).to_string()
    } else {
        let text = format!("{:.3}", milli as f64 / f64::from(UNIT));
        text.trim_end_matches('0').to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::db::snapshot::{ClassRow, PriorityRow, TeamRow};
    use chrono::Utc;

    /// A world of one team and one class holding `jobs`.
    fn world_of(jobs: Vec<LiveJob>) -> World {
        let rows = SnapshotRows {
            now: Utc::now(),
            classes: vec![ClassRow { id: class(), name: "h100".into(), rate: 0, fraction_milli: 1000 }],
            nodes: Vec::new(),
            teams: vec![TeamRow { id: team(), name: "ml".into(), parent_id: None, fair_share_weight_milli: 1000 }],
            quotas: Vec::new(),
            priorities: vec![PriorityRow {
                name: "experiment".into(),
                priority: 0,
                preemptible: true,
                usage_factor_milli: 1000,
                price_multiplier_milli: 1000,
                preemption_grace_seconds: 30,
                preemption_delay_seconds: 0,
            }],
            history: Vec::new(),
            jobs: jobs.into_iter().map(Arc::new).collect(),
        };
        World::build(rows, scheduler::snapshot::Config::default())
    }

    fn team() -> domain::TeamId {
        domain::TeamId::from_u128(1)
    }

    fn class() -> domain::GpuClassId {
        domain::GpuClassId::from_u128(2)
    }

    fn live(seq: i64, state: JobState, expected_runtime_seconds: Option<i32>) -> LiveJob {
        LiveJob {
            id: domain::JobId::from_u128(100 + seq as u128),
            seq,
            team_id: team(),
            name: "train".into(),
            gpu_class_id: class(),
            priority_class: "experiment".into(),
            replicas: 1,
            gpus_per_replica: 1,
            topology_mode: "any".into(),
            topology_level: None,
            max_runtime_seconds: 3600,
            expected_runtime_seconds,
            preemption_grace_seconds: None,
            state,
            attempt: i32::from(state == JobState::Running),
            holds_gpus: state == JobState::Running,
            cluster_id: None,
            placement: None,
            submitted_at: Utc::now(),
            queued_at: Utc::now(),
            admitted_at: None,
            started_at: None,
            last_checkpoint_at: None,
            attained_ms: 0,
            pending_reason: None,
            allow_spot: false,
            min_driver_version: None,
            min_cuda_version: None,
            held: false,
            service_replica: false,
            fixed_nodes_only: false,
            cpu_millis: None,
            memory_mib: None,
            preemption_delay_seconds: None,
            max_replicas: None,
            extra_of: None,
        }
    }

    #[test]
    fn the_engine_sees_the_runtime_running_and_waiting_jobs_declared_in_milliseconds() {
        let world = world_of(vec![
            live(1, JobState::Running, Some(600)),
            live(2, JobState::Running, None),
            live(3, JobState::Pending, Some(1800)),
            live(4, JobState::Pending, None),
        ]);
        let running: Vec<Option<i64>> = world.snapshot.running.iter().map(|r| r.spec.expected_runtime_ms).collect();
        assert_eq!(running, [Some(600_000), None]);
        let pending: Vec<Option<i64>> = world.snapshot.pending.iter().map(|j| j.expected_runtime_ms).collect();
        assert_eq!(pending, [Some(1_800_000), None]);
    }

    #[test]
    fn a_dry_run_proposes_the_runtime_the_job_declares() {
        let world = world_of(Vec::new());
        let job = NewJob {
            id: domain::JobId::new(),
            name: "what if".into(),
            gpu_class_id: class(),
            priority_class: "experiment".into(),
            replicas: 1,
            gpus_per_replica: 1,
            max_runtime_seconds: 3600,
            expected_runtime_seconds: Some(900),
            image: "x".into(),
            command: serde_json::json!([]),
            env: serde_json::json!({}),
            labels: serde_json::json!({}),
            topology_mode: "any".into(),
            topology_level: None,
            preemption_grace_seconds: None,
            max_retries: 0,
            allow_spot: false,
            cpu_millis: None,
            memory_mib: None,
            workload: Default::default(),
            min_driver_version: None,
            min_cuda_version: None,
            depends_on: Vec::new(),
            if_dependency_fails: Default::default(),
            array: None,
            service: None,
            accepted_despite: Vec::new(),
            preemption_delay_seconds: None,
            max_replicas: None,
        };
        assert_eq!(world.proposed(team(), &job).map(|j| j.expected_runtime_ms), Some(Some(900_000)));
        let undeclared = NewJob { expected_runtime_seconds: None, ..job };
        assert_eq!(world.proposed(team(), &undeclared).map(|j| j.expected_runtime_ms), Some(None));
    }

    #[test]
    fn a_fair_share_wait_names_the_largest_borrower_as_the_jobs_own_team_its_department_or_another_team() {
        let dept = domain::TeamId::from_u128(10);
        let other = domain::TeamId::from_u128(11);
        let row =
            |id, name: &str, parent_id| TeamRow { id, name: name.into(), parent_id, fair_share_weight_milli: 1000 };
        let rows = SnapshotRows {
            teams: vec![row(dept, "research", None), row(team(), "ml", Some(dept)), row(other, "prod", None)],
            now: Utc::now(),
            classes: vec![ClassRow { id: class(), name: "h100".into(), rate: 0, fraction_milli: 1000 }],
            nodes: Vec::new(),
            quotas: Vec::new(),
            priorities: Vec::new(),
            history: Vec::new(),
            jobs: Vec::new(),
        };
        let world = World::build(rows, scheduler::snapshot::Config::default());
        let said = |borrower: domain::TeamId| {
            let largest = world.team_index[&borrower];
            world.pending_message(
                team(),
                class(),
                &PendingReason::FairShareBehind { team: largest },
                &Figures::default(),
            )
        };
        assert!(said(team()).contains("the largest borrower, its own team ml, holds no more"), "{}", said(team()));
        assert!(said(dept).contains("the largest borrower, its department research, holds"), "{}", said(dept));
        assert!(said(other).contains("the largest borrower, team prod, holds"), "{}", said(other));
    }

    #[test]
    fn a_gang_kept_from_its_gpus_by_topology_says_the_level_or_that_it_runs_within_one_cluster() {
        let world = world_of(Vec::new());
        let figures = Figures { needs: 16_000, free: 20_000, ..Figures::default() };
        let said = |within| world.pending_message(team(), class(), &PendingReason::NoTopologyFit { within }, &figures);
        assert_eq!(
            said(None),
            "20 GPUs of h100 are free to it, enough for the 16 it needs, but not within one cluster, and a gang runs within one"
        );
        assert!(
            said(Some(Level::Rack)).ends_with("but not within one rack as it requires"),
            "{}",
            said(Some(Level::Rack))
        );
    }
}
