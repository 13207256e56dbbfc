//! Chaos: the service with jobs always in flight takes rounds of faults drawn from a fixed
//! seed, and must serve again within 10 s each time, by itself; at the end every job ran
//! exactly once and the ledger books exactly its run.
//!
//! - On its embedded PostgreSQL, 50 rounds: every round SIGKILLs `fairway serve` and restarts
//!   it at once, as a supervisor would; some rounds first SIGKILL the postmaster (Fairway's
//!   supervisor thread starts it again) or one of its backends (PostgreSQL ends every session
//!   and replays its WAL).
//! - On an external PostgreSQL (one this test runs, restarted by its own supervisor when
//!   killed), 12 rounds of the same database faults under a server that is never restarted:
//!   its pool and its scheduler leadership must recover through the outage.
//! - Against a real Kubernetes API server (`common::kube_peer`) reached through a proxy, the
//!   network is cut 8 times for 1 to 3 s while jobs dispatch and pods run and end (the test
//!   plays the kubelet, which keeps working during the cut): no duplicate gang, no orphan, no
//!   attempt dispatched twice, and each job's usage booked exactly once.
//! - On an embedded PostgreSQL whose data directory is a small filesystem (a tmpfs; mounting
//!   one needs root, so elsewhere this test says so and does nothing), the disk is filled while
//!   jobs are submitted and run: every answer is 201 or 503, never a 500; once space is freed
//!   the service writes again by itself; a job answered 503 does not exist, one answered 201
//!   ran once and was booked exactly. The server's own log is on that disk too.
//!
//! What was injected and checked is printed and written to `chaos-*.txt` in cargo's test
//! temp directory, `CARGO_TARGET_TMPDIR` (CI shows them).

mod common;

use std::{
    fmt::Write as _,
    fs,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use common::{
    embedded::Server,
    fresh_dir,
    kube_peer::{self, h100_node, Kubelet},
    ledger,
    platform::Platform,
    proxy::Proxy,
    Replica,
};
use fairway::{
    db::{self, embedded::EmbeddedPostgres},
    rng::SplitMix64,
};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use serde_json::json;

const JOBS_PER_ROUND: usize = 4;
/// How soon the service must serve again after each fault.
const BACK_WITHIN: Duration = Duration::from_secs(10);
/// One simulated second is 100 ms of wall time.
const ENV: [(&str, &str); 2] = [("FAIRWAY_SIM_SPEEDUP", "10"), ("FAIRWAY_CYCLE_INTERVAL_MS", "50")];

/// A fault that hits the database under a running server.
#[derive(Debug, Clone, Copy)]
enum DatabaseFault {
    KillPostmaster,
    KillBackend,
}

/// The service under test as a client sees it, and what the test knows of its database.
struct Target<'a> {
    http: &'a reqwest::Client,
    base: String,
    /// The server's log, shown when it fails to come back.
    log: PathBuf,
    token: String,
    pgdata: &'a Path,
}

impl Target<'_> {
    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    fn log(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Polls a read that needs the database until it answers 200; returns how long that took.
    async fn wait_served(&self, what: &str) -> Duration {
        let started = Instant::now();
        loop {
            let ok = self
                .http
                .get(self.url("/api/v1/teams/ml/jobs?limit=1"))
                .bearer_auth(&self.token)
                // A request caught in the outage may wait for a connection; ask again instead.
                .timeout(Duration::from_secs(1))
                .send()
                .await
                .is_ok_and(|r| r.status() == reqwest::StatusCode::OK);
            if ok {
                return started.elapsed();
            }
            assert!(started.elapsed() < BACK_WITHIN, "not serving {BACK_WITHIN:?} after {what}:\n{}", self.log());
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits, from `since`, until `done` holds, within [`BACK_WITHIN`].
    async fn wait_until(&self, what: &str, since: Instant, done: impl Fn() -> bool) {
        while !done() {
            assert!(since.elapsed() < BACK_WITHIN, "{what}: not recovered within {BACK_WITHIN:?}:\n{}", self.log());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The team `ml` with 64 reserved H100s.
    async fn create_team(&self) {
        let created = self
            .http
            .post(self.url("/api/v1/teams"))
            .bearer_auth(&self.token)
            .json(&json!({"name": "ml", "parent": null}))
            .send()
            .await
            .unwrap();
        assert_eq!(created.status(), reqwest::StatusCode::CREATED, "{}", created.text().await.unwrap());
        // The class exists once the simulated cluster's first inventory sync has run, which
        // may come after the server answers ready on a loaded machine.
        let since = Instant::now();
        loop {
            let quota = self
                .http
                .put(self.url("/api/v1/teams/ml/quotas/h100-80gb"))
                .bearer_auth(&self.token)
                .json(&json!({"reserved": 64, "burst": 0}))
                .send()
                .await
                .unwrap();
            let status = quota.status();
            let body = quota.text().await.unwrap();
            if status == reqwest::StatusCode::OK {
                return;
            }
            let class_missing = status == reqwest::StatusCode::UNPROCESSABLE_ENTITY && body.contains("does not exist");
            assert!(class_missing && since.elapsed() < BACK_WITHIN, "{status}: {body}\n{}", self.log());
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Submits a round's jobs through the API: 1 to 3 s of work each, `last` ones 3 s, so
    /// that work is always in flight when faults land.
    async fn submit(&self, round: usize, last: bool, rng: &mut SplitMix64) -> i64 {
        let jobs: Vec<_> = (0..JOBS_PER_ROUND)
            .map(|i| {
                let runtime = if last { 30 } else { 10 + rng.next_u64() % 21 };
                json!({"name": format!("r{round}-{i}"), "gpu_class": "h100-80gb", "image": "x",
                       "replicas": 1 + i % 2, "gpus_per_replica": 1 + i % 4,
                       "env": {"FAIRWAY_SIM_RUNTIME_SECONDS": runtime.to_string()}})
            })
            .collect();
        let batch = self
            .http
            .post(self.url("/api/v1/teams/ml/jobs:batch"))
            .bearer_auth(&self.token)
            .json(&json!({"jobs": jobs}))
            .send()
            .await
            .unwrap();
        assert_eq!(batch.status(), reqwest::StatusCode::CREATED, "round {round}: {}", batch.text().await.unwrap());
        JOBS_PER_ROUND as i64
    }

    /// Injects `fault` and waits until the service serves again from a recovered database;
    /// returns how long after the kill that was.
    async fn inject(&self, fault: DatabaseFault, round: usize, rng: &mut SplitMix64) -> Duration {
        let pid = postmaster(self.pgdata).expect("a running postmaster");
        let killed = Instant::now();
        let what = format!("round {round}: {fault:?}");
        match fault {
            DatabaseFault::KillPostmaster => {
                sigkill(pid);
                // Served again means served by a new postmaster, not by a backend of the old
                // one that has not noticed yet.
                self.wait_until(&what, killed, || postmaster(self.pgdata).is_some_and(|p| p != pid)).await;
            }
            DatabaseFault::KillBackend => {
                let backends = children(pid);
                assert!(!backends.is_empty(), "the postmaster has children");
                let recoveries = crash_recoveries(self.pgdata);
                sigkill(backends[(rng.next_u64() % backends.len() as u64) as usize]);
                // PostgreSQL ends every session and replays its WAL.
                self.wait_until(&what, killed, || crash_recoveries(self.pgdata) > recoveries).await;
            }
        }
        self.wait_served(&what).await;
        let took = killed.elapsed();
        assert!(took <= BACK_WITHIN, "{what}: serving only {took:?} after the kill");
        took
    }
}

/// A fault for this round, or none: each database fault one round in five.
fn draw(rng: &mut SplitMix64) -> Option<DatabaseFault> {
    match rng.next_u64() % 5 {
        0 => Some(DatabaseFault::KillPostmaster),
        1 => Some(DatabaseFault::KillBackend),
        _ => None,
    }
}

fn sigkill(pid: u32) {
    let sent = std::process::Command::new("kill").args(["-KILL", &pid.to_string()]).status().expect("run kill");
    assert!(sent.success(), "kill -KILL {pid}");
}

/// The pid in the cluster's `postmaster.pid`.
fn postmaster(pgdata: &Path) -> Option<u32> {
    fs::read_to_string(pgdata.join("postmaster.pid")).ok()?.lines().next()?.trim().parse().ok()
}

/// The processes whose parent is `pid`.
fn children(pid: u32) -> Vec<u32> {
    let mut found = Vec::new();
    for entry in fs::read_dir("/proc").unwrap().flatten() {
        let Some(child) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
        let Ok(stat) = fs::read_to_string(entry.path().join("stat")) else { continue };
        // `pid (comm) state ppid ...`
        let ppid = stat.rsplit_once(") ").and_then(|(_, rest)| rest.split(' ').nth(1)?.parse::<u32>().ok());
        if ppid == Some(pid) {
            found.push(child);
        }
    }
    found
}

/// How many times the cluster has reinitialised after a crashed backend (its log sits beside
/// its data directory).
fn crash_recoveries(pgdata: &Path) -> usize {
    fs::read_to_string(pgdata.with_extension("log")).unwrap_or_default().matches("reinitializing").count()
}

fn seconds(d: Duration) -> String {
    format!("{:.2} s", d.as_secs_f64())
}

fn slowest(durations: &[Duration]) -> String {
    durations.iter().max().map_or("-".into(), |d| seconds(*d))
}

/// Waits until every job is done and no backend object is left, then runs the ledger's
/// checks; returns what was checked, in words.
async fn finish_and_check(pool: &sqlx::PgPool, submitted: i64, log: &Path, report: &mut String) {
    let unfinished = ledger::count(pool, "select count(*) from jobs where state <> 'succeeded'").await;
    let finishing = Instant::now();
    loop {
        let done = ledger::count(pool, "select count(*) from jobs where state = 'succeeded'").await;
        let objects = ledger::count(pool, "select count(*) from sim_objects").await;
        if done == submitted && objects == 0 {
            break;
        }
        assert!(
            finishing.elapsed() < Duration::from_secs(90),
            "90 s after the last fault: {done} of {submitted} jobs done, {objects} objects left\n{}",
            fs::read_to_string(log).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(unfinished > 0, "the last fault should leave work in flight");
    writeln!(
        report,
        "after the last fault {unfinished} jobs were unfinished; all done after {}",
        seconds(finishing.elapsed())
    )
    .unwrap();
    for check in ledger::assert_every_job_ran_once_and_was_booked_exactly(pool, submitted).await {
        writeln!(report, "checked: {check}").unwrap();
    }
}

fn publish(name: &str, report: &str) {
    print!("{report}");
    fs::write(Path::new(env!("CARGO_TARGET_TMPDIR")).join(name), report).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_sigkills_of_the_server_and_some_of_its_embedded_database_lose_and_double_nothing() {
    const ROUNDS: usize = 50;
    const SEED: u64 = 0xc4a0_5eed;
    let dir = fresh_dir("chaos-embedded");
    let pgdata = dir.join("postgres");
    let mut server = Server::start_with(&dir, "start-0.log", &ENV).await;
    let http = server.http.clone();
    let token = server.sign_in().await;
    let target = |server: &Server| Target {
        http: &http,
        base: server.base.clone(),
        log: server.log.clone(),
        token: token.clone(),
        pgdata: &pgdata,
    };
    target(&server).create_team().await;

    let mut rng = SplitMix64(SEED);
    let mut report = format!(
        "chaos, embedded database: {ROUNDS} rounds, seed {SEED:#x}, {JOBS_PER_ROUND} jobs submitted per round\n"
    );
    let (mut restarts, mut postmaster_kills, mut backend_kills) = (Vec::new(), Vec::new(), Vec::new());
    let mut submitted = 0;
    for round in 1..=ROUNDS {
        submitted += target(&server).submit(round, round == ROUNDS, &mut rng).await;
        tokio::time::sleep(Duration::from_millis(200 + rng.next_u64() % 1300)).await;
        if let Some(fault) = draw(&mut rng) {
            let took = target(&server).inject(fault, round, &mut rng).await;
            match fault {
                DatabaseFault::KillPostmaster => postmaster_kills.push(took),
                DatabaseFault::KillBackend => backend_kills.push(took),
            }
            writeln!(report, "round {round:2}: {fault:?}, served again after {}", seconds(took)).unwrap();
        }
        server.kill();
        let restarted = Instant::now();
        server = Server::start_with(&dir, &format!("start-{round}.log"), &ENV).await;
        let took = restarted.elapsed();
        assert!(took <= BACK_WITHIN, "round {round}: serving only {took:?} after an immediate restart");
        target(&server).wait_served(&format!("round {round}: restart")).await;
        restarts.push(took);
        writeln!(report, "round {round:2}: SIGKILL fairway serve, restarted at once, ready after {}", seconds(took))
            .unwrap();
    }
    writeln!(
        report,
        "injected: {} server SIGKILLs (slowest restart {}), {} postmaster SIGKILLs (slowest recovery {}), \
         {} backend SIGKILLs (slowest recovery {})",
        restarts.len(),
        slowest(&restarts),
        postmaster_kills.len(),
        slowest(&postmaster_kills),
        backend_kills.len(),
        slowest(&backend_kills),
    )
    .unwrap();

    let options =
        sqlx::postgres::PgConnectOptions::new().socket(&pgdata).port(5432).username("fairway").database("fairway");
    let pool = db::connect(options, 2).await.expect("connect to the embedded database");
    finish_and_check(&pool, submitted, &server.log, &mut report).await;
    pool.close().await;
    publish("chaos-embedded.txt", &report);
    assert!(!postmaster_kills.is_empty() && !backend_kills.is_empty(), "the seed draws both database faults");
    let (status, log) = server.terminate().await;
    assert!(status.success(), "fairway serve exited with {status} after SIGTERM:\n{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_external_database_killed_under_a_running_server_is_reconnected_to_and_nothing_is_lost() {
    const ROUNDS: usize = 12;
    const SEED: u64 = 0x0e47_e4a1;
    let dir = fresh_dir("chaos-external");
    let pgdata = dir.join("pg");
    // The "external" server: its own supervisor (this process) starts it again when killed.
    let pg = EmbeddedPostgres::start(&pgdata, db::embedded::Tuning::DURABLE).await.unwrap();
    pg.create_database("fairway", None).await.unwrap();
    let pool = db::connect(pg.connect_options("fairway"), 2).await.unwrap();
    db::MIGRATOR.run(&pool).await.unwrap();
    pool.close().await;

    let replica = Replica::start_with(&dir, "server", &pg.url("fairway"), &ENV);
    let http = reqwest::Client::builder().no_proxy().timeout(Duration::from_secs(10)).build().unwrap();
    let started = Instant::now();
    let token = loop {
        let signed_in = http
            .post(format!("{}/api/v1/auth/token", replica.base))
            .json(&json!({"username": "admin", "password": "failover-admin-password"}))
            .send()
            .await;
        if let Ok(r) = signed_in {
            if r.status() == reqwest::StatusCode::OK {
                let body: serde_json::Value = r.json().await.unwrap();
                break body["access_token"].as_str().unwrap().to_owned();
            }
        }
        assert!(started.elapsed() < Duration::from_secs(60), "the server did not start:\n{}", replica.log());
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let target = Target { http: &http, base: replica.base.clone(), log: replica.log.clone(), token, pgdata: &pgdata };
    target.create_team().await;

    let mut rng = SplitMix64(SEED);
    let mut report = format!(
        "chaos, external database: {ROUNDS} rounds, seed {SEED:#x}, {JOBS_PER_ROUND} jobs submitted per round, \
         one server never restarted\n"
    );
    let mut submitted = 0;
    for round in 1..=ROUNDS {
        submitted += target.submit(round, round == ROUNDS, &mut rng).await;
        tokio::time::sleep(Duration::from_millis(200 + rng.next_u64() % 1300)).await;
        // Every round has a fault here: alternate, so both kinds land.
        let fault = if round % 2 == 1 { DatabaseFault::KillPostmaster } else { DatabaseFault::KillBackend };
        let took = target.inject(fault, round, &mut rng).await;
        writeln!(report, "round {round:2}: {fault:?}, served again after {}", seconds(took)).unwrap();
    }
    let pool = db::connect(pg.connect_options("fairway"), 2).await.unwrap();
    finish_and_check(&pool, submitted, &replica.log, &mut report).await;
    pool.close().await;
    publish("chaos-external.txt", &report);
    drop(replica);
    pg.stop().await;
}

/// The pods of this test's cluster, as the API server has them.
async fn cluster_pods(kube: &kube::Client, cluster: &str) -> Vec<Pod> {
    let pods: Api<Pod> = Api::all(kube.clone());
    pods.list(&ListParams::default().labels(&format!("fairway.dev/cluster={cluster}"))).await.unwrap().items
}

/// One pass of the kubelet over every pod: a pending one starts, a running one ends well.
/// Asserts on the way that no job ever has pods of two attempts (a duplicate gang).
async fn kubelet_pass(kubelet: &Kubelet, cluster: &str) {
    let pods = cluster_pods(&kubelet.client, cluster).await;
    let mut attempts: std::collections::BTreeMap<String, std::collections::BTreeSet<String>> = Default::default();
    for pod in &pods {
        let labels = pod.metadata.labels.as_ref().unwrap();
        attempts.entry(labels["fairway.dev/job-id"].clone()).or_default().insert(labels["fairway.dev/attempt"].clone());
    }
    assert!(attempts.values().all(|a| a.len() == 1), "one gang per job at a time: {attempts:?}");
    for pod in pods {
        let phase = pod.status.as_ref().and_then(|s| s.phase.clone()).unwrap_or_default();
        match phase.as_str() {
            "Pending" if pod.metadata.deletion_timestamp.is_none() => kubelet.run(&pod).await,
            "Running" => kubelet.exit(&pod, 0, "Completed").await,
            _ => {}
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kubernetes_api_cut_off_again_and_again_loses_doubles_and_orphans_nothing() {
    const CUTS: usize = 8;
    const SEED: u64 = 0x0c07_0ff5;
    let test = "netcut";
    let peer = kube_peer::peer();
    peer.grant_dispatcher().await;
    for i in 0..4 {
        let (mut labels, allocatable) = h100_node("r1");
        labels["fairway-test"] = json!(test);
        peer.gpu_node(&format!("{test}-n{i}"), labels, allocatable).await;
    }
    let upstream = peer.url.trim_start_matches("https://").parse().expect("the API server's address");
    let proxy = Proxy::start(upstream).await;
    let clusters = format!(
        r#"[[cluster]]
name = "{test}"
kind = "kubernetes"
server = "https://{}"
token_file = "{}"
insecure_skip_tls_verify = true
namespace_prefix = "{test}-"
node_selector = "fairway-test={test}"
rack_label = "fairway.dev/rack"
node_lost_after_seconds = 30

[cluster.gpu_products]
"NVIDIA-H100-80GB-HBM3" = "h100-80gb"
"#,
        proxy.addr,
        peer.dispatcher_token_file.display()
    );
    let platform = Platform::start(test, &clusters, &[]).await;
    platform.team("ml", "h100-80gb", 32, 0).await;
    let kubelet = Kubelet { client: peer.admin().await };

    let mut rng = SplitMix64(SEED);
    let mut report = format!(
        "chaos, Kubernetes API behind a cut-able link: {CUTS} cuts, seed {SEED:#x}, 3 two-pod jobs submitted per round\n"
    );
    let mut submitted = 0;
    for round in 1..=CUTS {
        for i in 0..3 {
            let body = json!({"name": format!("r{round}-{i}"), "gpu_class": "h100-80gb", "replicas": 2,
                              "gpus_per_replica": 1 + (i % 2), "image": "nvcr.io/nvidia/pytorch:24.05-py3"});
            platform.submit("ml", body).await;
            submitted += 1;
        }
        tokio::time::sleep(Duration::from_millis(100 + rng.next_u64() % 900)).await;
        kubelet_pass(&kubelet, test).await;
        let outage = Duration::from_millis(1000 + rng.next_u64() % 2000);
        proxy.cut();
        let cut_at = Instant::now();
        // The cluster goes on without Fairway: pods start and end.
        while cut_at.elapsed() < outage {
            kubelet_pass(&kubelet, test).await;
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        proxy.restore();
        writeln!(report, "round {round}: link cut for {}", seconds(outage)).unwrap();
    }
    let finishing = Instant::now();
    platform
        .wait("every job to succeed and its pods to be cleaned up", Duration::from_secs(120), || async {
            kubelet_pass(&kubelet, test).await;
            let done = ledger::count(&platform.pool, "select count(*) from jobs where state = 'succeeded'").await;
            (done == submitted && cluster_pods(&kubelet.client, test).await.is_empty()).then_some(())
        })
        .await;
    writeln!(report, "after the last cut all {submitted} jobs succeeded within {}", seconds(finishing.elapsed()))
        .unwrap();
    let pool = &platform.pool;
    assert_eq!(
        ledger::count(pool, "select count(*) from jobs where attempt <> 1").await,
        0,
        "no job was admitted twice"
    );
    assert_eq!(
        ledger::count(
            pool,
            "select count(*) from (select job_id, attempt from job_events where kind = 'dispatched'
                                   group by 1, 2 having count(*) > 1) d"
        )
        .await,
        0,
        "no attempt was dispatched twice"
    );
    let orphaned: Vec<String> = sqlx::query_scalar(
        "select string_agg(e.at::text || ' ' || e.kind || coalesce(' (' || e.reason || ')', '') || ': ' || e.message,
                           E'\n  ' order by e.id)
         from job_events e where e.job_id in (select job_id from job_events where kind = 'orphan_removed')
         group by e.job_id",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    assert!(
        orphaned.is_empty(),
        "jobs whose backend object outlived them:\n  {}\n--- fairway log, about orphans ---\n{}",
        orphaned.join("\n\n  "),
        platform.log().lines().filter(|l| l.contains("orphan")).collect::<Vec<_>>().join("\n")
    );
    // A create the cut answered with an error may have reached the API server: the job ran
    // and ended from what the watch saw, while its outbox row waits for its retry (at most a
    // minute of back-off), which then finds nothing left to create. Every row is done by then.
    platform
        .wait("every outbox row to be done", Duration::from_secs(90), || async {
            let open = ledger::count(pool, "select count(*) from dispatch_outbox where done_at is null").await;
            (open == 0).then_some(())
        })
        .await;
    let superseded = ledger::count(
        pool,
        "select count(*) from dispatch_outbox where action = 'submit' and last_error = 'superseded before dispatch'",
    )
    .await;
    writeln!(report, "outbox rows done only after their job had ended: {superseded}").unwrap();
    assert_eq!(
        ledger::count(pool, "select count(*) from usage_intervals where ended_at is not null").await,
        submitted,
        "one closed usage interval per job"
    );
    // Each job's ledger is exactly its interval: GPUs × 1000 × milliseconds run.
    let wrong = ledger::count(
        pool,
        "select count(*) from usage_intervals u
         left join (select job_id, sum(gpu_milli_ms) as booked from usage_ledger group by job_id) l on l.job_id = u.job_id
         where coalesce(l.booked, 0) <> u.gpus::int8 * u.fraction_milli
                                        * (extract(epoch from u.ended_at - u.started_at) * 1000)::int8",
    )
    .await;
    assert_eq!(wrong, 0, "jobs whose ledger differs from their usage interval");
    writeln!(report, "checked: one gang per job at every kubelet pass, each job admitted and dispatched once").unwrap();
    writeln!(report, "checked: no orphan removed, outbox empty, one closed usage interval per job, booked exactly")
        .unwrap();
    publish("chaos-network.txt", &report);
    platform.stop().await;
}

/// A small tmpfs mounted at a directory while it lives: a disk that can be filled.
struct SmallDisk {
    dir: PathBuf,
}

impl SmallDisk {
    /// Mounts `size_mib` MiB at `dir`, or says why not (only root may mount).
    fn mount(dir: &Path, size_mib: u32) -> Result<Self, String> {
        fs::create_dir_all(dir).unwrap();
        let out = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size_mib}m,mode=0755"), "tmpfs"])
            .arg(dir)
            .output()
            .map_err(|e| format!("cannot run mount: {e}"))?;
        if !out.status.success() {
            return Err(String::from_utf8_lossy(&out.stderr).trim().to_owned());
        }
        Ok(Self { dir: dir.to_owned() })
    }

    /// Writes a file of zeros until the disk has no space left; returns its path and size.
    fn fill(&self) -> (PathBuf, u64) {
        use std::io::Write as _;
        let path = self.dir.join("filler");
        let mut file = fs::File::create(&path).unwrap();
        let chunk = vec![0u8; 1 << 20];
        let mut written = 0u64;
        loop {
            match file.write(&chunk) {
                Ok(0) => break,
                Ok(n) => written += n as u64,
                Err(e) if e.raw_os_error() == Some(28) => break,
                Err(e) => panic!("filling the disk: {e}"),
            }
        }
        let _ = file.flush();
        (path, written)
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = fs::copy(self.dir.join("server.log"), self.dir.with_file_name("server.log"));
        let _ = std::process::Command::new("umount").arg("-l").arg(&self.dir).status();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_under_the_embedded_database_answers_503_and_the_service_writes_again_once_space_is_freed() {
    let dir = fresh_dir("chaos-disk");
    let data = dir.join("data");
    let disk = match SmallDisk::mount(&data, 256) {
        Ok(disk) => disk,
        Err(why) => {
            let report = format!("chaos, disk full: not run: cannot mount a small filesystem here ({why})\n");
            publish("chaos-disk.txt", &report);
            return;
        }
    };
    // The server's log is on the small disk too, as a service's often is: a log line that
    // cannot be written must stop nothing (it once killed every task that logged). The log
    // is copied out before the disk goes, for a failure's message.
    let log = data.join("server.log");
    let server = Server::start_with(&data, log.to_str().unwrap(), &ENV).await;
    let token = server.sign_in().await;
    let pgdata = data.join("postgres");
    let target = Target {
        http: &server.http.clone(),
        base: server.base.clone(),
        log: server.log.clone(),
        token,
        pgdata: &pgdata,
    };
    target.create_team().await;
    let mut rng = SplitMix64(0xd15c_f011);
    let mut report = String::from("chaos, disk full: the embedded database's data directory on a 256 MiB tmpfs\n");
    let mut accepted = 0;
    for round in 1..=3 {
        accepted += target.submit(round, false, &mut rng).await;
    }

    let (filler, size) = disk.fill();
    writeln!(report, "filled the disk: {} MiB of filler", size >> 20).unwrap();
    // While it is full: batches of 50 jobs for 5 s, each answered 201 (stored whole) or 503.
    let (mut created, mut unavailable) = (0, 0);
    let started = Instant::now();
    let mut batch = 0;
    while started.elapsed() < Duration::from_secs(5) {
        batch += 1;
        let jobs: Vec<_> = (0..50)
            .map(|i| {
                json!({"name": format!("full-{batch}-{i}"), "gpu_class": "h100-80gb", "image": "x",
                            "env": {"FAIRWAY_SIM_RUNTIME_SECONDS": "10"}})
            })
            .collect();
        let answer = target
            .http
            .post(target.url("/api/v1/teams/ml/jobs:batch"))
            .bearer_auth(&target.token)
            .json(&json!({"jobs": jobs}))
            .send()
            .await;
        match answer.as_ref().map(reqwest::Response::status) {
            Ok(reqwest::StatusCode::CREATED) => {
                created += 1;
                accepted += 50;
            }
            Ok(reqwest::StatusCode::SERVICE_UNAVAILABLE) => unavailable += 1,
            // The server may drop a request while its database restarts; never a 500.
            Err(_) => unavailable += 1,
            Ok(other) => panic!("batch {batch} on a full disk answered {other}:\n{}", target.log()),
        }
    }
    writeln!(report, "while full: {created} batches of 50 stored, {unavailable} answered 503").unwrap();
    assert!(unavailable > 0, "a full disk refused no write: the fault did not land");

    fs::remove_file(&filler).unwrap();
    let freed = Instant::now();
    loop {
        let answer = target
            .http
            .post(target.url("/api/v1/teams/ml/jobs:batch"))
            .bearer_auth(&target.token)
            .timeout(Duration::from_secs(2))
            .json(&json!({"jobs": [{"name": "after", "gpu_class": "h100-80gb", "image": "x",
                                    "env": {"FAIRWAY_SIM_RUNTIME_SECONDS": "10"}}]}))
            .send()
            .await;
        if answer.is_ok_and(|r| r.status() == reqwest::StatusCode::CREATED) {
            accepted += 1;
            break;
        }
        assert!(freed.elapsed() < BACK_WITHIN, "no write {BACK_WITHIN:?} after space was freed:\n{}", target.log());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    writeln!(report, "space freed: writes served again after {}", seconds(freed.elapsed())).unwrap();

    let options =
        sqlx::postgres::PgConnectOptions::new().socket(&pgdata).port(5432).username("fairway").database("fairway");
    let pool = db::connect(options, 2).await.expect("connect to the embedded database");
    // Exactly the accepted jobs exist: a refused batch left nothing behind.
    assert_eq!(ledger::count(&pool, "select count(*) from jobs").await, accepted, "jobs stored");
    finish_and_check(&pool, accepted, &server.log, &mut report).await;
    pool.close().await;
    publish("chaos-disk.txt", &report);
    let (status, log) = server.terminate().await;
    assert!(status.success(), "fairway serve exited with {status} after SIGTERM:\n{log}");
    drop(disk);
}
