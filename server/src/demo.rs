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
    ("research", "a100-80gb", 4, 4),
    ("research", "a100-80gb.mig-3g.40gb", 8, 8),
    ("nlp", "h100-80gb", 16, 32),
    ("vision", "h100-80gb", 16, 16),
    ("vision", "a100-80gb", 4, 4),
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

/// Seeds the demo platform unless teams already exist.
pub async fn seed(ctx: &control::Ctx) -> anyhow::Result<()> {
    let pool = &ctx.pool;
    if !db::teams::list_all(pool, None, 1).await?.is_empty() {
        println!("Demo: teams exist already; not seeding again.");
        return Ok(());
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
    for (name, role, team, team_role) in USERS {
        let user = db::users::insert(&mut tx, name, &hash, role).await?;
        if let Some(&t) = team.and_then(|t| ids.get(t)) {
            db::members::upsert(&mut tx, t, user.id, team_role).await?;
        }
    }
    tx.commit().await?;
    println!("Demo: seeded teams research/{{nlp,vision}} and prod-inference, quotas, a rate card and users");
    println!("      alice (nlp admin), bob (vision member), carol (prod-inference admin), finn (finance),");
    println!("      all with password {DEMO_PASSWORD}. Jobs arrive every few seconds.");
    Ok(())
}

/// A demo job shape: (team, class, replicas, GPUs per replica, priority, simulated seconds).
const SHAPES: [(&str, &str, i32, i32, &str, u32); 8] = [
    ("nlp", "h100-80gb", 2, 8, "experiment", 1800),
    ("nlp", "h100-80gb", 1, 4, "experiment", 600),
    ("nlp", "h100-80gb", 1, 8, "production", 1800),
    ("vision", "h100-80gb", 1, 8, "experiment", 900),
    ("vision", "a100-80gb", 1, 2, "experiment", 600),
    ("vision", "a100-80gb.mig-3g.40gb", 1, 1, "scavenger", 300),
    ("prod-inference", "h100-80gb", 1, 4, "serving", 7200),
    ("prod-inference", "a100-80gb.mig-1g.10gb", 1, 1, "serving", 3600),
];

/// The demo stops submitting while this many jobs wait: a queue that only grew would make
/// every wait look endless.
const MAX_PENDING: i64 = 16;

/// Keeps submitting demo jobs, one every `every` while fewer than [`MAX_PENDING`] wait, until
/// the process ends.
pub async fn generate(pool: PgPool, every: Duration) {
    let mut rng = SplitMix64(0x00de_3000);
    let mut n = 0u64;
    loop {
        tokio::time::sleep(every).await;
        match db::jobs::pending_count(&pool).await {
            Ok(waiting) if waiting >= MAX_PENDING => continue,
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(error = %e, "demo cannot count the waiting jobs");
                continue;
            }
        }
        n += 1;
        let (team, class, replicas, gpus, priority, seconds) = SHAPES[(rng.next_u64() % SHAPES.len() as u64) as usize];
        let jitter = (rng.next_u64() % u64::from(seconds)) as u32;
        if let Err(e) = submit(&pool, n, team, class, replicas, gpus, priority, seconds / 2 + jitter).await {
            tracing::warn!(error = %e, "demo job not submitted");
        }
    }
}

#[expect(clippy::too_many_arguments, reason = "one job's shape")]
async fn submit(
    pool: &PgPool,
    n: u64,
    team: &str,
    class: &str,
    replicas: i32,
    gpus: i32,
    priority: &str,
    seconds: u32,
) -> anyhow::Result<()> {
    let team_row = db::teams::by_name(pool, team).await?.context("demo team missing")?;
    let class_row = db::gpu_classes::by_name(pool, class).await?.context("demo class missing")?;
    let job = NewJob {
        id: JobId::new(),
        name: format!("{team}-{}-{n}", if replicas > 1 { "gang" } else { "run" }),
        gpu_class_id: class_row.id,
        priority_class: priority.to_owned(),
        replicas,
        gpus_per_replica: gpus,
        max_runtime_seconds: 86_400,
        expected_runtime_seconds: None,
        image: "nvcr.io/nvidia/pytorch:24.05-py3".into(),
        command: json!(["python", "train.py"]),
        env: json!({"FAIRWAY_SIM_RUNTIME_SECONDS": seconds.to_string()}),
        labels: json!({"demo": "true"}),
        topology_mode: if replicas > 1 { "preferred".into() } else { "any".into() },
        topology_level: (replicas > 1).then(|| "rack".to_owned()),
        preemption_grace_seconds: None,
        max_retries: 0,
        allow_spot: false,
    };
    db::jobs::insert_many(pool, team_row.id, "demo", &[job]).await?;
    db::jobs::wake_scheduler(pool).await?;
    Ok(())
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
        for (team, class, replicas, gpus, priority, _) in SHAPES {
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
