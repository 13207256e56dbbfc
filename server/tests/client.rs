//! The client as a CI step runs it: the real `fairway` binary, with a clean environment,
//! against a real `fairway serve` (embedded database, simulated cluster at 10× speed), as a
//! team's API token. Jobs are steered by the simulator's hints in their environment
//! (`FAIRWAY_SIM_RUNTIME_SECONDS`, `FAIRWAY_SIM_EXIT_CODE`).
//!
//! Each test has its own server: a server outlives nothing that started it, and tests run in
//! parallel anyway.

mod common;
// The OpenID peer of the workspace's test crate (npm oidc-provider and a jose CI issuer), for
// the client's CI federation: this suite runs the real binary, which only this crate builds.
#[allow(dead_code, reason = "the client's tests use only its CI issuer")]
#[path = "../../tests/src/oidc.rs"]
mod oidc;

use std::{
    path::PathBuf,
    process::{Output, Stdio},
    time::{Duration, Instant},
};

use common::{embedded::Server, fresh_dir, BIN};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt as _, BufReader};

const TEAM: &str = "vision";
/// The simulated cluster has eight whole A100s.
const CLASS: &str = "a100-80gb";
/// How long any one client run may take here.
const LIMIT: Duration = Duration::from_secs(90);

/// A server with a team, its quota, and the team's CI token.
struct Platform {
    server: Server,
    token: String,
    home: PathBuf,
}

impl Platform {
    async fn start(test: &str) -> Self {
        Self::start_with(test, &[]).await
    }

    /// [`Platform::start`] with more of the server's environment.
    async fn start_with(test: &str, extra: &[(&str, &str)]) -> Self {
        let dir = fresh_dir(&format!("client-{test}"));
        let env: Vec<(&str, &str)> = [("FAIRWAY_SIM_SPEEDUP", "10"), ("FAIRWAY_CYCLE_INTERVAL_MS", "200")]
            .into_iter()
            .chain(extra.iter().copied())
            .collect();
        let server = Server::start_with(&dir, "serve.log", &env).await;
        let admin = server.sign_in().await;
        let api =
            |method: reqwest::Method, path: &str| server.http.request(method, server.url(path)).bearer_auth(&admin);
        // The simulated cluster brings its GPU classes into the catalogue shortly after start.
        let started = Instant::now();
        loop {
            let classes = api(reqwest::Method::GET, "/api/v1/gpu-classes").send().await.unwrap().text().await.unwrap();
            if classes.contains(&format!("\"{CLASS}\"")) {
                break;
            }
            assert!(started.elapsed() < LIMIT, "no {CLASS} in the catalogue: {classes}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let created = api(reqwest::Method::POST, "/api/v1/teams").json(&json!({"name": TEAM})).send().await.unwrap();
        assert_eq!(created.status(), 201, "{}", created.text().await.unwrap());
        let quota = api(reqwest::Method::PUT, &format!("/api/v1/teams/{TEAM}/quotas/{CLASS}"))
            .json(&json!({"reserved": 4, "burst": 0}))
            .send()
            .await
            .unwrap();
        assert_eq!(quota.status(), 200, "{}", quota.text().await.unwrap());
        let expires = (chrono::Utc::now() + chrono::Duration::days(30)).to_rfc3339();
        let minted = api(reqwest::Method::POST, &format!("/api/v1/teams/{TEAM}/tokens"))
            .json(&json!({"name": "ci", "role": "member", "expires_at": expires}))
            .send()
            .await
            .unwrap();
        assert_eq!(minted.status(), 201, "{}", minted.text().await.unwrap());
        let token = minted.json::<Value>().await.unwrap()["secret"].as_str().unwrap().to_owned();
        let home = dir.join("home");
        std::fs::create_dir_all(&home).unwrap();
        Self { server, token, home }
    }

    /// `fairway ARGS` against this platform as its team's CI.
    fn fairway(&self, args: &[&str]) -> tokio::process::Command {
        client(&self.server.base, &self.token, &self.home, args)
    }

    /// Runs the client to its end.
    async fn run(&self, cmd: &mut tokio::process::Command) -> Run {
        let output = tokio::time::timeout(LIMIT, cmd.output())
            .await
            .unwrap_or_else(|_| panic!("the client ran over {LIMIT:?}\n{}", self.log_tail()))
            .expect("running fairway");
        Run::from(output)
    }

    /// A job, read with the team's token.
    async fn job(&self, id: &str) -> Value {
        let r = self
            .server
            .http
            .get(self.server.url(&format!("/api/v1/jobs/{id}")))
            .bearer_auth(&self.token)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        r.json().await.unwrap()
    }

    fn log_tail(&self) -> String {
        let log = common::embedded::read_log(&self.server.log);
        let lines: Vec<&str> = log.lines().collect();
        format!("--- server log ---\n{}", lines[lines.len().saturating_sub(40)..].join("\n"))
    }
}

/// `fairway ARGS` as a CI step runs it: no inherited `FAIRWAY_*`, CI or proxy variables, an
/// empty home (no client file), the server's address and a token.
fn client(url: &str, token: &str, home: &std::path::Path, args: &[&str]) -> tokio::process::Command {
    let mut cmd = tokenless_client(url, home, args);
    cmd.env("FAIRWAY_TOKEN", token);
    cmd
}

/// [`client`] without a token: what a CI step that holds no secret runs.
fn tokenless_client(url: &str, home: &std::path::Path, args: &[&str]) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(BIN);
    for (name, _) in std::env::vars_os() {
        let Some(name) = name.to_str() else { continue };
        let proxy = name.to_ascii_lowercase().ends_with("_proxy");
        let ci =
            fairway::client::ci::VARIABLES.contains(&name) || fairway::client::federation::VARIABLES.contains(&name);
        if name.starts_with("FAIRWAY_") || ci || proxy {
            cmd.env_remove(name);
        }
    }
    cmd.env_remove("XDG_CONFIG_HOME")
        .env("HOME", home)
        .env("FAIRWAY_URL", url)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    cmd
}

/// What a finished client run left.
struct Run {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

impl From<Output> for Run {
    fn from(o: Output) -> Self {
        Run {
            code: o.status.code(),
            stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
        }
    }
}

impl std::fmt::Display for Run {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "exit {:?}\n--- stdout ---\n{}--- stderr ---\n{}", self.code, self.stdout, self.stderr)
    }
}

/// A small simulated job: one GPU, running `seconds` of simulated time (a tenth of it real),
/// then exiting with `exit_code`.
fn job_flags(name: &str, seconds: u32, exit_code: u8) -> Vec<String> {
    [
        "--name",
        name,
        "--gpu-class",
        CLASS,
        "--gpus",
        "1",
        "--image",
        "ghcr.io/acme/train:1",
        "--max-runtime",
        "1h",
        "--env",
        &format!("FAIRWAY_SIM_RUNTIME_SECONDS={seconds}"),
        "--env",
        &format!("FAIRWAY_SIM_EXIT_CODE={exit_code}"),
        "--",
        "python",
        "train.py",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect()
}

fn args<'a>(head: &[&'a str], flags: &'a [String]) -> Vec<&'a str> {
    head.iter().copied().chain(flags.iter().map(String::as_str)).collect()
}

#[tokio::test]
async fn a_job_that_exits_3_makes_submit_wait_exit_3() {
    let p = Platform::start("exit-3").await;
    let flags = job_flags("fails", 20, 3);
    let run = p.run(&mut p.fairway(&args(&["submit", "--wait"], &flags))).await;
    assert_eq!(run.code, Some(3), "{run}\n{}", p.log_tail());
    assert!(!run.stderr.contains("no event stream"), "the client polled instead of following the stream: {run}");
    let id = run.stdout.trim();
    assert!(uuid::Uuid::parse_str(id).is_ok(), "stdout is not the job's id: {run}");
    let failed = run.stderr.lines().find(|l| l.split_whitespace().nth(1) == Some("failed"));
    assert!(failed.is_some(), "no failed event on stderr: {run}");
    assert!(run.stderr.contains(&format!("job {id} failed with exit code 3")), "{run}");
    // Its log streamed while it ran, its last lines before the outcome: what a CI page shows
    // to say why, the simulated job's traceback.
    let (log, _) = run.stderr.split_once(&format!("job {id} failed with exit code 3")).unwrap();
    assert!(log.contains("[rank 0/1] fails attempt 1 on "), "the log from its first line: {run}");
    assert!(log.contains("\nRuntimeError: CUDA error: an illegal memory access was encountered\n"), "{run}");
    assert!(log.contains("\n[rank 0] exit code 3\n"), "{run}");
    assert!(!run.stderr.contains("lines of attempt 1's log ---"), "streamed whole, so no tail again: {run}");
    assert_eq!(p.job(id).await["exit_code"], 3);
    // Run again, it fails the same way: a new job, asking for what the first asked for.
    let rerun = p.run(&mut p.fairway(&["rerun", id, "--wait"])).await;
    assert_eq!(rerun.code, Some(3), "{rerun}");
    let again = rerun.stdout.trim();
    assert_ne!(again, id, "{rerun}");
    let again = p.job(again).await;
    assert_eq!((again["exit_code"].as_i64(), again["labels"]["fairway.dev/rerun-of"].as_str()), (Some(3), Some(id)));
}

#[tokio::test]
async fn a_successful_job_makes_submit_wait_exit_0() {
    let p = Platform::start("exit-0").await;
    let flags = job_flags("succeeds", 20, 0);
    let run = p.run(&mut p.fairway(&args(&["submit", "--wait"], &flags))).await;
    assert_eq!(run.code, Some(0), "{run}\n{}", p.log_tail());
    assert!(!run.stderr.contains("no event stream"), "the client polled instead of following the stream: {run}");
    let id = run.stdout.trim().to_owned();
    for kind in ["submitted", "running", "succeeded"] {
        assert!(run.stderr.lines().any(|l| l.split_whitespace().nth(1) == Some(kind)), "no {kind} event: {run}");
    }
    // Waiting again for a job that already ended replays its timeline and its outcome.
    let again = p.run(&mut p.fairway(&["wait", &id])).await;
    assert_eq!(again.code, Some(0), "{again}");
    assert!(again.stderr.contains(&format!("job {id} succeeded")), "{again}");
}

#[tokio::test]
async fn an_array_submitted_with_wait_reports_its_counts_and_exits_with_its_failed_tasks_code() {
    let p = Platform::start("array").await;
    // Six tasks of 20 s simulated, two at once (the team has 4 A100s): all succeed.
    let flags = job_flags("sweep", 20, 0);
    let run = p.run(&mut p.fairway(&args(&["submit", "--array", "6%2", "--wait"], &flags))).await;
    assert_eq!(run.code, Some(0), "{run}\n{}", p.log_tail());
    let id = run.stdout.trim().to_owned();
    assert!(uuid::Uuid::parse_str(&id).is_ok(), "stdout is not the array's id: {run}");
    assert!(run.stderr.contains("(6 tasks, at most 2 at once): pending; 6 pending, 4 held"), "{run}");
    assert!(run.stderr.trim_end().ends_with("succeeded; 6 succeeded"), "the last line is the outcome: {run}");
    let status = p.run(&mut p.fairway(&["array", "status", &id, "--output", "json"])).await;
    assert_eq!(status.code, Some(0), "{status}");
    let array: Value = serde_json::from_str(&status.stdout).expect("json");
    assert_eq!((array["state"].as_str(), array["counts"]["succeeded"].as_i64()), (Some("succeeded"), Some(6)));
    let tasks = p.run(&mut p.fairway(&["array", "tasks", &id, "--output", "json"])).await;
    let page: Value = serde_json::from_str(&tasks.stdout).expect("json");
    let indices: Vec<i64> =
        page["items"].as_array().unwrap().iter().map(|t| t["array"]["index"].as_i64().unwrap()).collect();
    assert_eq!(indices, [0, 1, 2, 3, 4, 5], "{tasks}");

    // Tasks that exit 3 make the array fail, and the wait exits with their code.
    let failing = job_flags("broken-sweep", 5, 3);
    let run = p.run(&mut p.fairway(&args(&["submit", "--array", "2", "--wait"], &failing))).await;
    assert_eq!(run.code, Some(3), "{run}\n{}", p.log_tail());
    assert!(run.stderr.trim_end().ends_with("failed; 2 failed"), "{run}");
    // And a malformed shape is refused before anything is sent.
    let bad = p.run(&mut p.fairway(&args(&["submit", "--array", "0"], &failing))).await;
    assert_eq!(bad.code, Some(2), "{bad}");
}

#[tokio::test]
async fn a_service_deployed_and_rolled_from_the_client_waits_until_every_replica_runs_the_new_image() {
    let p = Platform::start("service").await;
    let create = [
        "service",
        "create",
        "--name",
        "chat",
        "--gpu-class",
        CLASS,
        "--image",
        "ghcr.io/acme/chat:1",
        "--min",
        "2",
        "--max",
        "3",
        "--env",
        "FAIRWAY_SIM_LOG_EVERY_SECONDS=0",
        "--wait",
        "--timeout",
        "60s",
    ];
    let run = p.run(&mut p.fairway(&create)).await;
    assert_eq!(run.code, Some(0), "{run}\n{}", p.log_tail());
    assert!(run.stderr.contains("service chat (2..3 replicas): starting"), "it reported the start: {run}");
    assert!(run.stdout.starts_with("service chat (2..3 replicas): ready; 2 of 2 running revision 1"), "{run}");
    assert!(run.stdout.contains(&format!("at chat.{TEAM}.")), "the endpoint is shown: {run}");

    // A deploy step: a new image, waited for until both replicas run it.
    let update = ["service", "update", "chat", "--image", "ghcr.io/acme/chat:2", "--wait", "--timeout", "60s"];
    let run = p.run(&mut p.fairway(&update)).await;
    assert_eq!(run.code, Some(0), "{run}\n{}", p.log_tail());
    assert!(run.stderr.contains("rolling"), "it reported the roll: {run}");
    assert!(run.stdout.contains("ready; 2 of 2 running revision 2"), "{run}");
    let status = p.run(&mut p.fairway(&["service", "status", "chat", "--output", "json"])).await;
    let service: Value = serde_json::from_str(&status.stdout).expect("json");
    assert_eq!((service["image"].as_str(), service["revision"].as_i64()), (Some("ghcr.io/acme/chat:2"), Some(2)));
    let images: Vec<&str> = service["replica_jobs"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|j| j["state"] == "running")
        .map(|j| j["image"].as_str().unwrap())
        .collect();
    assert_eq!(images, ["ghcr.io/acme/chat:2", "ghcr.io/acme/chat:2"], "{status}");

    // Beyond the maximum: refused by the server, naming the field.
    let run = p.run(&mut p.fairway(&["service", "scale", "chat", "4"])).await;
    assert_eq!(run.code, Some(65), "{run}");
    assert!(run.stderr.contains("replicas"), "{run}");
    let run = p.run(&mut p.fairway(&["service", "list"])).await;
    assert!(run.stdout.starts_with("service chat (2..3 replicas): ready"), "{run}");
    let run = p.run(&mut p.fairway(&["service", "delete", "chat"])).await;
    assert_eq!(run.code, Some(0), "{run}");
    assert!(run.stdout.contains("deleted"), "{run}");
}

#[tokio::test]
async fn sigterm_to_a_waiting_client_cancels_its_job() {
    let p = Platform::start("sigterm").await;
    // Ten minutes of simulated time: a minute here, far longer than the test waits.
    let flags = job_flags("cancelled-by-ci", 600, 0);
    let mut child = p.fairway(&args(&["submit", "--wait"], &flags)).spawn().expect("spawn fairway submit");
    let mut stdout = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut stderr = BufReader::new(child.stderr.take().unwrap()).lines();
    let id =
        tokio::time::timeout(LIMIT, stdout.next_line()).await.expect("no job id in time").unwrap().expect("no job id");
    // Signal once the client says the job runs, as a CI system cancels a step mid-way.
    let mut seen = Vec::new();
    let running = tokio::time::timeout(LIMIT, async {
        while let Some(line) = stderr.next_line().await.unwrap() {
            let is_running = line.split_whitespace().nth(1) == Some("running");
            seen.push(line);
            if is_running {
                return true;
            }
        }
        false
    })
    .await;
    assert_eq!(running, Ok(true), "the client never said the job runs:\n{}\n{}", seen.join("\n"), p.log_tail());
    let pid = child.id().unwrap().to_string();
    let sent = std::process::Command::new("kill").args(["-TERM", &pid]).status().unwrap();
    assert!(sent.success(), "kill -TERM {pid}");
    let rest = tokio::time::timeout(LIMIT, async {
        while let Some(line) = stderr.next_line().await.unwrap() {
            seen.push(line);
        }
    })
    .await;
    assert!(rest.is_ok(), "the client did not end after SIGTERM:\n{}", seen.join("\n"));
    let status = child.wait().await.unwrap();
    let stderr = seen.join("\n");
    assert_eq!(status.code(), Some(143), "{stderr}\n{}", p.log_tail());
    assert!(stderr.contains(&format!("SIGTERM: cancelling job {id}")), "{stderr}");
    // The client followed the job to its end before exiting.
    assert_eq!(p.job(&id).await["state"], "cancelled", "{stderr}");
}

#[tokio::test]
async fn the_same_ci_job_submitting_twice_creates_one_job() {
    let p = Platform::start("ci-twice").await;
    let github = [
        ("GITHUB_ACTIONS", "true"),
        ("GITHUB_REPOSITORY", "acme/vision"),
        ("GITHUB_RUN_ID", "9876"),
        ("GITHUB_RUN_ATTEMPT", "1"),
        ("GITHUB_JOB", "train"),
    ];
    let flags = job_flags("nightly", 600, 0);
    let submit = |flags: &[String]| {
        let mut cmd = p.fairway(&args(&["submit"], flags));
        cmd.envs(github);
        cmd
    };
    let first = p.run(&mut submit(&flags)).await;
    let retried = p.run(&mut submit(&flags)).await;
    assert_eq!(first.code, Some(0), "{first}");
    assert_eq!(retried.code, Some(0), "{retried}");
    assert_eq!(first.stdout, retried.stdout, "a retried step submitted again:\n{first}\n{retried}");
    assert!(retried.stderr.contains("earlier try"), "{retried}");
    let listed = p.run(&mut p.fairway(&["list", "--output", "json"])).await;
    let page: Value = serde_json::from_str(&listed.stdout).unwrap_or_else(|e| panic!("{e}: {listed}"));
    assert_eq!(page["items"].as_array().map(Vec::len), Some(1), "{listed}");
    // Another submission in the same CI job is another job.
    let other = p.run(&mut submit(&job_flags("nightly-eval", 600, 0))).await;
    assert_eq!(other.code, Some(0), "{other}");
    assert_ne!(other.stdout, first.stdout);
}

#[tokio::test]
async fn a_refused_submission_exits_65_and_names_the_field() {
    let p = Platform::start("refused").await;
    let mut flags = job_flags("no-gpus", 20, 0);
    let gpus = flags.iter().position(|f| f == "--gpus").unwrap();
    flags[gpus + 1] = "0".to_owned();
    let run = p.run(&mut p.fairway(&args(&["submit"], &flags))).await;
    assert_eq!(run.code, Some(65), "{run}");
    assert!(run.stderr.contains("gpus_per_replica:"), "the field is not named: {run}");
    assert!(run.stdout.is_empty(), "{run}");
    // A token the server does not know is another matter: 77.
    let mut unknown = p.fairway(&["list"]);
    unknown.env("FAIRWAY_TOKEN", "fwy_notatoken");
    let run = p.run(&mut unknown).await;
    assert_eq!(run.code, Some(77), "{run}");
}

#[tokio::test]
async fn a_saved_template_submits_with_only_what_changes_and_waits_for_its_outcome() {
    let p = Platform::start("template").await;
    let flags = job_flags("nightly-eval", 20, 0);
    let saved = p.run(&mut p.fairway(&args(&["template", "save", "nightly"], &flags))).await;
    assert_eq!(saved.code, Some(0), "{saved}");
    assert_eq!(saved.stdout, "nightly saved (version 1)\n", "{saved}");
    let listed = p.run(&mut p.fairway(&["template", "list"])).await;
    assert!(listed.stdout.lines().nth(1).is_some_and(|l| l.starts_with("nightly ")), "{listed}");

    // From the template, with a changed exit code: the job's outcome is the client's.
    let run =
        p.run(&mut p.fairway(&["submit", "--template", "nightly", "--env", "FAIRWAY_SIM_EXIT_CODE=4", "--wait"])).await;
    assert_eq!(run.code, Some(4), "{run}\n{}", p.log_tail());
    let job = p.job(run.stdout.trim()).await;
    assert_eq!(job["name"], "nightly-eval");
    assert_eq!(job["labels"]["fairway.dev/template"], "nightly");
    assert_eq!(job["env"]["FAIRWAY_SIM_RUNTIME_SECONDS"], "20", "the template's env is kept: {job}");
    assert_eq!(job["command"], json!(["python", "train.py"]));

    // `show` prints a job file that `submit -f` takes back.
    let shown = p.run(&mut p.fairway(&["template", "show", "nightly"])).await;
    let file = p.home.join("nightly.json");
    std::fs::write(&file, &shown.stdout).unwrap();
    let again = p.run(&mut p.fairway(&["submit", "-f", file.to_str().unwrap(), "--name", "from-file"])).await;
    assert_eq!(again.code, Some(0), "{shown}\n{again}");
    assert_eq!(p.job(again.stdout.trim()).await["gpu_class"], CLASS);

    // A template that does not exist, or a bad name, is refused with the field named.
    let missing = p.run(&mut p.fairway(&["submit", "--template", "nope"])).await;
    assert_eq!(missing.code, Some(65), "{missing}");
    let bad = p.run(&mut p.fairway(&args(&["template", "save", "Nightly Eval"], &flags))).await;
    assert_eq!(bad.code, Some(65), "{bad}");
    assert!(bad.stderr.contains("template:"), "{bad}");
    let deleted = p.run(&mut p.fairway(&["template", "delete", "nightly"])).await;
    assert_eq!(deleted.code, Some(0), "{deleted}");
    let gone = p.run(&mut p.fairway(&["template", "show", "nightly"])).await;
    assert_eq!(gone.code, Some(65), "{gone}");
}

#[tokio::test]
async fn json_output_is_the_servers_job() {
    let p = Platform::start("json").await;
    let flags = job_flags("inspected", 600, 0);
    let submitted = p.run(&mut p.fairway(&args(&["submit"], &flags))).await;
    assert_eq!(submitted.code, Some(0), "{submitted}");
    let id = submitted.stdout.trim().to_owned();
    let status = p.run(&mut p.fairway(&["status", &id, "--output", "json"])).await;
    assert_eq!(status.code, Some(0), "{status}");
    let job: Value = serde_json::from_str(&status.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {status}"));
    assert_eq!(job["id"], id.as_str());
    assert!(job["state"].is_string(), "{job}");
    assert_eq!(job["team"], TEAM);
    // The client's file gives what flags and variables do not, and they beat it.
    let config = p.home.join(".config/fairway");
    std::fs::create_dir_all(&config).unwrap();
    std::fs::write(config.join("client.toml"), "output = \"json\"\nurl = \"http://127.0.0.1:1\"\n").unwrap();
    let from_file = p.run(&mut p.fairway(&["status", &id])).await;
    assert_eq!(from_file.code, Some(0), "FAIRWAY_URL must beat the file's url: {from_file}");
    assert!(serde_json::from_str::<Value>(&from_file.stdout).is_ok(), "the file's output is json: {from_file}");
    let flag = p.run(&mut p.fairway(&["--output", "text", "status", &id])).await;
    assert!(flag.stdout.starts_with("job "), "--output text beats the file: {flag}");
    // A wait bounded by --timeout leaves the job running and says so with 124.
    let waited = p.run(&mut p.fairway(&["wait", &id, "--timeout", "1"])).await;
    assert_eq!(waited.code, Some(124), "{waited}");
    assert_ne!(p.job(&id).await["state"], "cancelled");
}

/// A stand-in for the server's stream, to hold the client to the parts a healthy server does
/// not show: a connection dropped mid-stream, keepalives, the resumption after the last event,
/// and the log's tail after the end. It answers each connection from a script and closes it.
async fn scripted_server(answers: Vec<(&'static str, String)>) -> (String, tokio::task::JoinHandle<Vec<String>>) {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let served = tokio::spawn(async move {
        let mut requests = Vec::new();
        for (content_type, body) in answers {
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut head = Vec::new();
            while !head.ends_with(b"\r\n\r\n") {
                let mut byte = [0u8; 1];
                if socket.read(&mut byte).await.unwrap() == 0 {
                    break;
                }
                head.push(byte[0]);
            }
            requests.push(String::from_utf8_lossy(&head).into_owned());
            let answer = format!("HTTP/1.1 200 OK\r\ncontent-type: {content_type}\r\nconnection: close\r\n\r\n{body}");
            socket.write_all(answer.as_bytes()).await.unwrap();
            socket.shutdown().await.unwrap();
        }
        requests
    });
    (base, served)
}

#[tokio::test]
async fn a_dropped_stream_resumes_after_the_last_event_and_the_logs_tail_follows_the_end() {
    let id = "0b9c6d6e-5a8f-4a53-9d4c-5d2b0a4f1c7e";
    let event = |n: u32, kind: &str, message: &str| {
        let data = json!({"id": n, "at": format!("2026-05-01T12:00:0{n}Z"), "kind": kind, "attempt": 1, "reason": null, "message": message, "data": null});
        format!("id: {n}\nevent: job_event\ndata: {data}\n\n")
    };
    let job = json!({"id": id, "state": "failed", "exit_code": 7, "attempt": 1});
    let (base, served) = scripted_server(vec![
        // The first connection breaks after one event, with no end.
        ("text/event-stream", event(1, "running", "every replica runs")),
        (
            "text/event-stream",
            format!(": keepalive\n\n{}event: end\ndata: {job}\n\n", event(2, "failed", "exited with code 7")),
        ),
        ("text/plain; charset=utf-8", "epoch 1\r\nloss: nan\n".to_owned()),
    ])
    .await;
    let home = fresh_dir("client-scripted");
    let output =
        tokio::time::timeout(LIMIT, client(&base, "fwy_test", &home, &["wait", id, "--logs", "tail"]).output())
            .await
            .unwrap()
            .unwrap();
    let run = Run::from(output);
    assert_eq!(run.code, Some(7), "{run}");
    let requests = served.await.unwrap();
    assert!(requests[0].starts_with(&format!("GET /api/v1/jobs/{id}/events:stream?after=0 ")), "{}", requests[0]);
    assert!(requests[1].starts_with(&format!("GET /api/v1/jobs/{id}/events:stream?after=1 ")), "{}", requests[1]);
    assert!(requests[1].to_ascii_lowercase().contains("last-event-id: 1\r\n"), "{}", requests[1]);
    assert!(requests[1].to_ascii_lowercase().contains("authorization: bearer fwy_test\r\n"), "{}", requests[1]);
    assert!(requests[2].starts_with(&format!("GET /api/v1/jobs/{id}/logs?attempt=1&follow=false ")), "{}", requests[2]);
    let lines: Vec<&str> = run.stderr.lines().collect();
    assert_eq!(
        lines,
        [
            "12:00:01  running    every replica runs",
            "12:00:02  failed     exited with code 7",
            &format!("job {id} failed with exit code 7"),
            "--- last 2 lines of attempt 1's log ---",
            "epoch 1",
            "loss: nan",
        ],
        "{run}"
    );
}

/// A platform whose server trusts the OpenID peer's CI issuer, with team `vision`'s policy
/// `train`: tokens of repository `acme/train`, audience `fairway`, exchange for member tokens.
async fn federated(test: &str) -> (Platform, oidc::OidcPeer) {
    let peer = oidc::OidcPeer::start(&[], &[]).await;
    let dir = fresh_dir(&format!("client-{test}-config"));
    let config = dir.join("fairway.toml");
    std::fs::write(&config, format!("[[ci_issuers]]\nissuer = \"{}\"\n", peer.ci_issuer)).unwrap();
    let p = Platform::start_with(test, &[("FAIRWAY_CONFIG", config.to_str().unwrap())]).await;
    let admin = p.server.sign_in().await;
    let created = p
        .server
        .http
        .post(p.server.url(&format!("/api/v1/teams/{TEAM}/ci-trusts")))
        .bearer_auth(&admin)
        .json(&json!({"name": "train", "issuer": peer.ci_issuer, "conditions": {"repository": "acme/train"}, "role": "member"}))
        .send()
        .await
        .unwrap();
    assert_eq!(created.status(), 201, "{}", created.text().await.unwrap());
    (p, peer)
}

#[tokio::test]
async fn submit_with_only_the_ci_jobs_id_token_in_fairway_id_token_runs_as_the_team_that_trusts_it() {
    let (p, peer) = federated("id-token").await;
    let id_token = peer.ci_token(json!({})).await;
    let flags = job_flags("federated", 20, 0);
    let mut submit = tokenless_client(&p.server.base, &p.home, &args(&["submit"], &flags));
    submit.env("FAIRWAY_ID_TOKEN", &id_token);
    let run = p.run(&mut submit).await;
    assert_eq!(run.code, Some(0), "{run}\n{}", p.log_tail());
    let id = run.stdout.trim().to_owned();
    let job = p.job(&id).await;
    assert_eq!(job["team"], TEAM, "{job}");
    assert!(job["submitted_by"].as_str().unwrap().contains("ci:train"), "{job}");
    // GitLab gives a job one ID token for its whole run: a second command exchanges it again.
    let mut status = tokenless_client(&p.server.base, &p.home, &["status", &id, "--output", "json"]);
    status.env("FAIRWAY_ID_TOKEN", &id_token);
    let run = p.run(&mut status).await;
    assert_eq!(run.code, Some(0), "{run}");
    // Another repository's job is not let in, and the client says why.
    let stranger = peer.ci_token(json!({"claims": {"repository": "evil/train"}})).await;
    let mut refused = tokenless_client(&p.server.base, &p.home, &args(&["submit"], &flags));
    refused.env("FAIRWAY_ID_TOKEN", &stranger);
    let run = p.run(&mut refused).await;
    assert_eq!(run.code, Some(77), "{run}");
    assert!(run.stderr.contains("no CI trust policy admits this token"), "{run}");
}

#[tokio::test]
async fn submit_in_github_actions_asks_the_runner_for_an_id_token_for_fairway() {
    let (p, peer) = federated("github").await;
    let (url, request_token) = peer.arm_github(json!({})).await;
    let flags = job_flags("from-github", 20, 0);
    let mut submit = tokenless_client(&p.server.base, &p.home, &args(&["submit"], &flags));
    submit.env("ACTIONS_ID_TOKEN_REQUEST_URL", &url).env("ACTIONS_ID_TOKEN_REQUEST_TOKEN", &request_token);
    let run = p.run(&mut submit).await;
    assert_eq!(run.code, Some(0), "{run}\n{}", p.log_tail());
    assert_eq!(p.job(run.stdout.trim()).await["team"], TEAM);
    // Asked for another audience, the runner's token fits no policy.
    let mut other = tokenless_client(&p.server.base, &p.home, &args(&["submit"], &flags));
    other
        .env("ACTIONS_ID_TOKEN_REQUEST_URL", &url)
        .env("ACTIONS_ID_TOKEN_REQUEST_TOKEN", &request_token)
        .env("FAIRWAY_ID_TOKEN_AUDIENCE", "https://elsewhere.example");
    let run = p.run(&mut other).await;
    assert_eq!(run.code, Some(77), "{run}");
    assert!(run.stderr.contains("another audience"), "{run}");
    // Without the runner's request token (no `id-token: write`), there is nothing to exchange.
    let mut bare = tokenless_client(&p.server.base, &p.home, &args(&["submit"], &flags));
    bare.env("ACTIONS_ID_TOKEN_REQUEST_URL", &url);
    let run = p.run(&mut bare).await;
    assert_eq!(run.code, Some(77), "{run}");
    assert!(run.stderr.contains("no token"), "{run}");
}
