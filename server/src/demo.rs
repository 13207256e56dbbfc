//! `fairway serve --demo`: a busy platform at once for a newcomer. Seeds teams (a research
//! department with two teams, and a production inference team), quotas, a rate card and
//! users, then keeps submitting a mix of jobs to the simulated cluster.

use crate::domain::{GpuClassId, JobId};
use std::time::Duration;

use anyhow::Context as _;
use serde_json::json;
use sqlx::PgPool;

use crate::{
    auth::password,
    control,
    db::{self, jobs::NewJob},
    domain::idle::{IdleAction, IdlePolicy},
    rng::SplitMix64,
};

/// The password of every demo user.
pub const DEMO_PASSWORD: &str = "fairway-demo";

/// Teams: (name, parent).
const TEAMS: [(&str, Option<&str>); 4] =
    [("research", None), ("nlp", Some("research")), ("vision", Some("research")), ("prod-inference", None)];

/// Quotas: (team, class, reserved, burst).
/// A department's quota bounds its teams' (nested quotas), so it has one for every class
/// its teams use.
/// Research may borrow all of prod-inference's idle reserved H100s, so the demo shows them
/// reclaimed when prod-inference's serving jobs arrive.
const QUOTAS: [(&str, &str, i32, i32); 9] = [
    ("research", "h100-80gb", 32, 32),
    ("research", "a100-80gb", 4, 12),
    ("research", "a100-80gb.mig-3g.40gb", 8, 8),
    ("nlp", "h100-80gb", 16, 32),
    ("vision", "h100-80gb", 16, 16),
    ("vision", "a100-80gb", 4, 12),
    ("vision", "a100-80gb.mig-3g.40gb", 8, 8),
    ("prod-inference", "h100-80gb", 16, 0),
    ("prod-inference", "a100-80gb.mig-1g.10gb", 8, 0),
];

/// Rate card in micro-units per GPU-hour.
const RATES: [(&str, i64); 5] = [
    ("h100-80gb", 4_000_000),
    ("a100-80gb", 2_500_000),
    ("a100-80gb.mig-3g.40gb", 1_100_000),
    ("a100-80gb.mig-1g.10gb", 400_000),
    ("l4-24gb", 800_000),
];

/// Users: (name, platform role, team, team role).
const USERS: [(&str, Option<&str>, Option<&str>, &str); 4] = [
    ("alice", None, Some("nlp"), "admin"),
    ("bob", None, Some("vision"), "member"),
    ("carol", None, Some("prod-inference"), "admin"),
    ("finn", Some("finance"), None, "viewer"),
];

/// Seeds the demo platform unless teams already exist; true when it did.
pub async fn seed(ctx: &control::Ctx) -> anyhow::Result<bool> {
    let pool = &ctx.pool;
    if !db::teams::list_all(pool, None, 1).await?.is_empty() {
        println!("Demo: teams exist already; not seeding again.");
        return Ok(false);
    }
    // The simulated cluster's inventory creates the GPU classes the quotas name.
    control::sync_inventory(ctx).await.context("reading the simulated cluster's inventory")?;
    let hash = tokio::task::spawn_blocking(|| password::hash(DEMO_PASSWORD)).await?;
    let mut tx = pool.begin().await?;
    let mut ids = std::collections::BTreeMap::new();
    for (name, parent) in TEAMS {
        let parent_id = parent.and_then(|p| ids.get(p).copied());
        let team = db::teams::insert(&mut tx, name, parent_id, &format!("Demo team {name}")).await?;
        ids.insert(name, team.id);
    }
    let classes: std::collections::BTreeMap<String, GpuClassId> =
        db::inventory::class_ids(&mut tx).await?.into_iter().collect();
    for (team, class, reserved, burst) in QUOTAS {
        if let (Some(&t), Some(&c)) = (ids.get(team), classes.get(class)) {
            db::quotas::upsert(&mut tx, t, c, reserved, burst, None).await?;
        }
    }
    for (class, rate) in RATES {
        if let Some(&c) = classes.get(class) {
            db::gpu_classes::add_rate(&mut tx, c, None, rate).await?;
        }
    }
    // Every team's jobs are warned after two minutes below 10% SM activity; nothing is
    // stopped, so the demo's decisions stay the scheduler's.
    db::idle::upsert_policy(
        &mut tx,
        &IdlePolicy {
            team_id: None,
            priority_class: None,
            below_sm_active_percent: 10.0,
            idle_seconds: 120,
            notice_seconds: 60,
            action: IdleAction::Notify,
        },
    )
    .await?;
    for (name, role, team, team_role) in USERS {
        let user = db::users::insert(&mut tx, name, &hash, role).await?;
        if let Some(&t) = team.and_then(|t| ids.get(t)) {
            db::members::upsert(&mut tx, t, user.id, team_role).await?;
        }
    }
    tx.commit().await?;
    println!("Demo: seeded teams research/{{nlp,vision}} and prod-inference, quotas, a rate card and users");
    println!("      alice (nlp admin), bob (vision member), carol (prod-inference admin), finn (finance),");
    println!("      all with password {DEMO_PASSWORD}. In the first minutes, jobs arrive that show a fair-share");
    println!("      preemption, a backfill, a reclaim and a priority preemption; then jobs arrive every few seconds.");
    Ok(true)
}

/// A demo job: its name, team, class, replicas × GPUs per replica, priority class,
/// simulated run time and maximum runtime (both in simulated seconds, divided by the
/// simulator's speed-up).
#[derive(Debug, Clone, Copy)]
struct Shape {
    name: &'static str,
    team: &'static str,
    class: &'static str,
    replicas: i32,
    gpus: i32,
    priority: &'static str,
    seconds: u32,
    max_runtime_seconds: i32,
    /// Its GPUs sit nearly idle (a stalled data loader): what the idle policy warns about
    /// and right-sizing prices.
    idle: bool,
}

const DAY: i32 = 86_400;

const fn shape(
    name: &'static str,
    team: &'static str,
    class: &'static str,
    replicas: i32,
    gpus: i32,
    priority: &'static str,
    seconds: u32,
) -> Shape {
    Shape { name, team, class, replicas, gpus, priority, seconds, max_runtime_seconds: DAY, idle: false }
}

/// The opening, in acts: each act is submitted once the jobs of the one before all run and
/// have run past the minimum runtime before preemption, so within a few minutes of a fresh
/// `serve --demo` every headline decision happens once, whatever the machine's speed.
///
/// 1. The H100s fill: prod-inference serves on half its reserved 16, vision runs its reserved
///    16, nlp its reserved 16 and 24 borrowed (prod-inference's idle 8 and the 16 nobody
///    reserves). vision starts an A100 fine-tune on half the A100 node.
/// 2. **Fair share**: vision asks for burst H100s; the cluster is full and nlp holds all the
///    burst, so one of nlp's borrowing runs is preempted for vision.
/// 3. **Reclaim**: prod-inference's second serving replica set needs its reserved quota back
///    from the borrowers.
/// 4. **Priority**: nlp's nightly production evaluation cannot be preempted, and the cluster
///    is full: one of nlp's own experiments makes room for it (the evaluation runs in nlp's
///    reserved quota; the experiments beside it are what nlp borrows). **Backfill**: a vision A100 gang
///    cannot fit beside the fine-tune and holds the four free GPUs; a short evaluation ends
///    (by its maximum runtime) before the gang could start, so it runs on them. Last, as the
///    gang waits for the fine-tune to end.
const OPENING: [&[Shape]; 4] = [
    &[
        shape("prod-inference-llm-serve", "prod-inference", "h100-80gb", 1, 8, "serving", 7200),
        shape("vision-detector-a", "vision", "h100-80gb", 1, 8, "experiment", 5400),
        Shape { idle: true, ..shape("vision-detector-b", "vision", "h100-80gb", 1, 8, "experiment", 5400) },
        shape("nlp-sweep-1", "nlp", "h100-80gb", 1, 8, "experiment", 5400),
        shape("nlp-sweep-2", "nlp", "h100-80gb", 1, 8, "experiment", 5400),
        shape("nlp-sweep-3", "nlp", "h100-80gb", 1, 8, "experiment", 5400),
        shape("nlp-sweep-4", "nlp", "h100-80gb", 1, 8, "experiment", 5400),
        shape("nlp-sweep-5", "nlp", "h100-80gb", 1, 8, "experiment", 5400),
        Shape {
            max_runtime_seconds: 4 * 3600,
            ..shape("vision-a100-finetune", "vision", "a100-80gb", 1, 4, "experiment", 7200)
        },
    ],
    &[shape("vision-detector-c", "vision", "h100-80gb", 1, 8, "experiment", 3600)],
    &[shape("prod-inference-chat-serve", "prod-inference", "h100-80gb", 1, 8, "serving", 7200)],
    &[
        shape("nlp-nightly-eval", "nlp", "h100-80gb", 1, 8, "production", 1800),
        shape("vision-a100-gang", "vision", "a100-80gb", 2, 4, "experiment", 1800),
        Shape {
            max_runtime_seconds: 900,
            ..shape("vision-a100-quick-eval", "vision", "a100-80gb", 1, 2, "experiment", 300)
        },
    ],
];

/// After the opening, jobs drawn from these shapes arrive at random.
const SHAPES: [Shape; 8] = [
    shape("nlp-gang", "nlp", "h100-80gb", 2, 8, "experiment", 1800),
    shape("nlp-run", "nlp", "h100-80gb", 1, 4, "experiment", 600),
    shape("nlp-run", "nlp", "h100-80gb", 1, 8, "production", 1800),
    shape("vision-run", "vision", "h100-80gb", 1, 8, "experiment", 900),
    shape("vision-run", "vision", "a100-80gb", 1, 2, "experiment", 600),
    shape("vision-run", "vision", "a100-80gb.mig-3g.40gb", 1, 1, "scavenger", 300),
    shape("prod-inference-run", "prod-inference", "h100-80gb", 1, 4, "serving", 7200),
    shape("prod-inference-run", "prod-inference", "a100-80gb.mig-1g.10gb", 1, 1, "serving", 3600),
];

/// The demo stops submitting while this many jobs wait: a queue that only grew would make
/// every wait look endless.
const MAX_PENDING: i64 = 16;

/// How long an act waits at most for the one before to start: past it, the demo goes on
/// (a loaded machine makes the show late, never stuck).
const ACT_TIMEOUT: Duration = Duration::from_secs(120);

/// How the demo runs against the service's settings.
#[derive(Debug, Clone, Copy)]
pub struct Pace {
    /// Time between two random jobs.
    pub every: Duration,
    /// The scheduler's minimum runtime before preemption: how long an act waits for the one
    /// before to become preemptible.
    pub min_runtime: Duration,
    /// The simulated cluster's speed-up: jobs declare the expected runtime they will take
    /// in real time, as a user who knows their job would.
    pub speedup: f64,
}

/// Plays the opening on a freshly seeded platform (`fresh`), then keeps submitting jobs
/// drawn from [`SHAPES`], one every `pace.every` while fewer than [`MAX_PENDING`] wait,
/// until the process ends.
pub async fn generate(pool: PgPool, pace: Pace, fresh: bool) {
    if fresh {
        if let Err(e) = opening(&pool, pace).await {
            tracing::warn!(error = %e, "the demo's opening stopped");
        }
    }
    let mut rng = SplitMix64(0x00de_3000);
    let mut n = 0u64;
    loop {
        tokio::time::sleep(pace.every).await;
        match db::jobs::pending_count(&pool).await {
            Ok(waiting) if waiting >= MAX_PENDING => continue,
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(error = %e, "demo cannot count the waiting jobs");
                continue;
            }
        }
        n += 1;
        let shape = SHAPES[rng.index(SHAPES.len())];
        // Runs vary around what their users expect: from half to one and a half times it.
        let ran = shape.seconds / 2 + (rng.below(u64::from(shape.seconds)) as u32);
        let name = format!("{}-{n}", shape.name);
        if let Err(e) = submit(&pool, &name, shape, ran, pace.speedup).await {
            tracing::warn!(error = %e, "demo job not submitted");
        }
    }
}

/// Submits the acts of [`OPENING`] in turn.
async fn opening(pool: &PgPool, pace: Pace) -> anyhow::Result<()> {
    for (i, act) in OPENING.iter().enumerate() {
        let mut ids = Vec::with_capacity(act.len());
        for shape in act.iter() {
            ids.push(submit(pool, shape.name, *shape, shape.seconds, pace.speedup).await?);
        }
        tracing::info!(act = i + 1, jobs = act.len(), "demo act submitted");
        if i + 1 < OPENING.len() {
            started_long_enough(pool, &ids, pace.min_runtime).await?;
        }
    }
    Ok(())
}

/// Waits until every job of `ids` has started and run for `min_runtime` (and a little more,
/// for the cycle to see it), or [`ACT_TIMEOUT`] has passed.
async fn started_long_enough(pool: &PgPool, ids: &[JobId], min_runtime: Duration) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + ACT_TIMEOUT;
    loop {
        let mut latest = Some(chrono::DateTime::<chrono::Utc>::MIN_UTC);
        for &id in ids {
            let started = db::jobs::get(pool, id).await?.and_then(|j| j.started_at);
            latest = latest.zip(started).map(|(a, b)| a.max(b));
        }
        if let Some(latest) = latest {
            let since = (chrono::Utc::now() - latest).to_std().unwrap_or_default();
            let wait = (min_runtime + Duration::from_secs(2)).saturating_sub(since);
            tokio::time::sleep(wait.min(deadline.saturating_duration_since(tokio::time::Instant::now()))).await;
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            tracing::warn!("demo act not started in time; going on");
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// What a demo job's GPUs do, as the simulated cluster's dcgm-exporter reports it: training
/// keeps them busy (the simulator's default), serving at about a third of the SMs, and an
/// idle job at 1.5% with 9 GiB held.
fn activity_env(shape: &Shape, ran: u32) -> serde_json::Value {
    let mut env = json!({"FAIRWAY_SIM_RUNTIME_SECONDS": ran.to_string()});
    let activity: &[(&str, &str)] = if shape.idle {
        &[
            ("FAIRWAY_SIM_GPU_UTIL", "3"),
            ("FAIRWAY_SIM_SM_ACTIVE", "1.5"),
            ("FAIRWAY_SIM_TENSOR_ACTIVE", "0"),
            ("FAIRWAY_SIM_GPU_MEMORY_MIB", "9216"),
        ]
    } else if shape.priority == "serving" {
        &[("FAIRWAY_SIM_GPU_UTIL", "60"), ("FAIRWAY_SIM_SM_ACTIVE", "35"), ("FAIRWAY_SIM_TENSOR_ACTIVE", "20")]
    } else {
        &[]
    };
    for (name, value) in activity {
        env[*name] = json!(value);
    }
    env
}

/// Submits one demo job that runs `ran` simulated seconds and declares the shape's expected
/// runtime, in real time at `speedup`, and wakes the scheduler.
async fn submit(pool: &PgPool, name: &str, shape: Shape, ran: u32, speedup: f64) -> anyhow::Result<JobId> {
    let team_row = db::teams::by_name(pool, shape.team).await?.context("demo team missing")?;
    let class_row = db::gpu_classes::by_name(pool, shape.class).await?.context("demo class missing")?;
    let gang = shape.replicas > 1;
    let job = NewJob {
        id: JobId::new(),
        name: name.to_owned(),
        gpu_class_id: class_row.id,
        priority_class: shape.priority.to_owned(),
        replicas: shape.replicas,
        gpus_per_replica: shape.gpus,
        max_runtime_seconds: shape.max_runtime_seconds,
        expected_runtime_seconds: Some(((f64::from(shape.seconds) / speedup).ceil() as i32).max(1)),
        image: "nvcr.io/nvidia/pytorch:24.05-py3".into(),
        command: json!(["python", "train.py"]),
        env: activity_env(&shape, ran),
        labels: json!({"demo": "true"}),
        topology_mode: if gang { "preferred".into() } else { "any".into() },
        topology_level: gang.then(|| "rack".to_owned()),
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
        accepted_despite: Vec::new(),
        array: None,
        service: None,
        preemption_delay_seconds: None,
        max_replicas: None,
    };
    let id = job.id;
    db::jobs::insert_many(pool, team_row.id, "demo", &[job]).await?;
    db::jobs::wake_scheduler(pool).await?;
    Ok(id)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The priority classes the first migration seeds that cannot be preempted: their jobs
    /// run only within their team's reserved quota.
    const NOT_PREEMPTIBLE: [&str; 2] = ["serving", "production"];

    fn quota(team: &str, class: &str) -> (i32, i32) {
        QUOTAS.iter().find(|q| q.0 == team && q.1 == class).map_or((0, 0), |q| (q.2, q.3))
    }

    #[test]
    fn every_demo_job_can_run_under_the_demo_quotas() {
        for Shape { team, class, replicas, gpus, priority, .. } in
            OPENING.iter().flat_map(|act| act.iter()).chain(&SHAPES)
        {
            let (team, class, priority) = (*team, *class, *priority);
            let need = replicas * gpus;
            let parent = TEAMS.iter().find(|t| t.0 == team).and_then(|t| t.1);
            for level in std::iter::once(team).chain(parent) {
                let (reserved, burst) = quota(level, class);
                assert!(need <= reserved + burst, "{team}'s {need} × {class} exceeds {level}'s quota");
            }
            if NOT_PREEMPTIBLE.contains(&priority) {
                assert!(need <= quota(team, class).0, "{team}'s {priority} job exceeds its reserved quota");
            }
        }
    }
}
