//! End-to-end tests of the `fairway` binary over a real socket: the embedded database's
//! lifecycle across restarts, the refusals that protect a production deployment, and the
//! demo a newcomer starts first.

mod common;

use std::{
    collections::BTreeMap,
    fs,
    process::ExitStatus,
    time::{Duration, Instant},
};

use base64::Engine as _;
use common::{
    embedded::{fairway_serve, read_log, Server, ADMIN_PASSWORD, EXIT_TIMEOUT},
    free_port, fresh_dir,
};
use serde_json::{json, Value};

#[tokio::test]
async fn serve_uses_the_embedded_database_and_keeps_data_across_restarts() {
    let data_dir = fresh_dir("serve-embedded");
    let postmaster_pid = data_dir.join("postgres").join("postmaster.pid");

    let server = Server::start(&data_dir, "first.log").await;
    assert!(postmaster_pid.is_file(), "the embedded PostgreSQL runs in {}", data_dir.join("postgres").display());
    let token = server.sign_in().await;
    let created = server
        .http
        .post(server.url("/api/v1/teams"))
        .bearer_auth(&token)
        .json(&json!({"name": "persisted-team", "parent": null, "display_name": "Persisted Team"}))
        .send()
        .await
        .unwrap();
    assert_eq!(created.status(), reqwest::StatusCode::CREATED, "{}", created.text().await.unwrap());
    assert_eq!(server.team_names(&token).await, ["persisted-team"]);

    let (status, log) = server.terminate().await;
    assert!(status.success(), "fairway serve exited with {status} after SIGTERM:\n{log}");
    assert!(!postmaster_pid.exists(), "PostgreSQL was not stopped cleanly: postmaster.pid is left:\n{log}");
    assert!(!log.contains(ADMIN_PASSWORD), "the admin password must not be printed or logged:\n{log}");

    let server = Server::start(&data_dir, "second.log").await;
    let fresh_token = server.sign_in().await;
    assert_eq!(server.team_names(&fresh_token).await, ["persisted-team"]);
    // The development signing key is kept in the data directory, so an access token
    // issued before the restart is still accepted.
    assert_eq!(server.team_names(&token).await, ["persisted-team"]);

    let (status, log) = server.terminate().await;
    assert!(status.success(), "fairway serve exited with {status} after SIGTERM:\n{log}");
    assert!(!postmaster_pid.exists(), "PostgreSQL was not stopped cleanly: postmaster.pid is left:\n{log}");
}

#[tokio::test]
async fn a_sigkilled_serve_takes_its_embedded_database_down_with_it_and_restarts_cleanly() {
    let data_dir = fresh_dir("serve-sigkill");
    let postmaster_pid = data_dir.join("postgres").join("postmaster.pid");

    let mut server = Server::start(&data_dir, "first.log").await;
    let token = server.sign_in().await;
    assert_eq!(server.team_names(&token).await, Vec::<String>::new());
    let mut child = server.child.take().unwrap();
    child.kill().expect("SIGKILL fairway serve");
    child.wait().unwrap();

    // The parent-death signal asks PostgreSQL for a fast shutdown, which removes its pid file.
    let started = Instant::now();
    while postmaster_pid.exists() {
        assert!(
            started.elapsed() <= EXIT_TIMEOUT,
            "PostgreSQL outlived the SIGKILLed fairway by {EXIT_TIMEOUT:?}:\n{}",
            fs::read_to_string(data_dir.join("postgres.log")).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let server = Server::start(&data_dir, "second.log").await;
    assert_eq!(server.team_names(&server.sign_in().await).await, Vec::<String>::new());
    let (status, log) = server.terminate().await;
    assert!(status.success(), "fairway serve exited with {status} after SIGTERM:\n{log}");
    assert!(!postmaster_pid.exists(), "PostgreSQL was not stopped cleanly: postmaster.pid is left:\n{log}");
}

#[tokio::test]
async fn a_serve_restarted_at_once_after_each_of_ten_sigkills_comes_back_every_time() {
    let data_dir = fresh_dir("serve-restart-loop");
    let mut server = Server::start(&data_dir, "start-0.log").await;
    let token = server.sign_in().await;
    let created = server
        .http
        .post(server.url("/api/v1/teams"))
        .bearer_auth(&token)
        .json(&json!({"name": "survivor", "parent": null, "display_name": "Survivor"}))
        .send()
        .await
        .unwrap();
    assert_eq!(created.status(), reqwest::StatusCode::CREATED);
    for round in 1..=10 {
        let mut child = server.child.take().unwrap();
        child.kill().expect("SIGKILL fairway serve");
        child.wait().unwrap();
        // As a supervisor would: no pause, while the old PostgreSQL may still be exiting.
        let started = Instant::now();
        server = Server::start(&data_dir, &format!("start-{round}.log")).await;
        println!("restart {round}: serving after {:?}", started.elapsed());
        let token = server.sign_in().await;
        assert_eq!(server.team_names(&token).await, ["survivor"], "restart {round}");
    }
    let (status, log) = server.terminate().await;
    assert!(status.success(), "fairway serve exited with {status} after SIGTERM:\n{log}");
}

/// Runs `fairway serve` against an unreachable external database with `signing_key` (or
/// none), expects it to give up at once, and returns what it wrote to stderr.
fn serve_with_external_database(dir_name: &str, signing_key: Option<&str>) -> (ExitStatus, String) {
    let dir = fresh_dir(dir_name);
    let log = dir.join("stderr.log");
    let mut cmd = fairway_serve(&dir.join("stdout.log"));
    cmd.stderr(fs::File::create(&log).unwrap())
        .env("DATABASE_URL", "postgres://nobody@127.0.0.1:1/none")
        .env("FAIRWAY_DATA_DIR", &dir)
        .env("FAIRWAY_LISTEN", format!("127.0.0.1:{}", free_port()));
    if let Some(key) = signing_key {
        cmd.env("FAIRWAY_SIGNING_KEY", key);
    }
    let mut child = cmd.spawn().expect("spawn fairway serve");
    let limit = Duration::from_secs(10);
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return (status, read_log(&log));
        }
        if started.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("fairway serve was still running after {limit:?}:\n{}", read_log(&log));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[tokio::test]
async fn serve_refuses_an_external_database_without_a_signing_key() {
    let (status, output) = serve_with_external_database("serve-no-signing-key", None);
    assert!(!status.success(), "expected a failure, got {status}:\n{output}");
    assert!(output.contains("FAIRWAY_SIGNING_KEY"), "the error should name FAIRWAY_SIGNING_KEY:\n{output}");
    assert!(!output.contains("fairway listening"), "it must not serve at all:\n{output}");
}

#[tokio::test]
async fn a_short_signing_key_is_refused() {
    let short = base64::engine::general_purpose::STANDARD.encode([0x5a_u8; 16]);
    let (status, output) = serve_with_external_database("serve-short-signing-key", Some(&short));
    assert!(!status.success(), "expected a failure, got {status}:\n{output}");
    assert!(output.contains("FAIRWAY_SIGNING_KEY"), "the error should name FAIRWAY_SIGNING_KEY:\n{output}");
    assert!(output.contains("256"), "the error should state the 256-bit minimum:\n{output}");
    assert!(!output.contains(&short), "the key itself must not be echoed:\n{output}");
}

/// The value of an unlabelled series, or of one with exactly `labels`, in an OpenMetrics text.
fn series(metrics: &str, name_and_labels: &str) -> f64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(name_and_labels).and_then(|rest| rest.strip_prefix(' ')))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no series {name_and_labels} in:\n{metrics}"))
}

/// What a newcomer sees in the first minutes of `fairway serve --demo` (the simulator at the
/// demo's 10×, the demo's 30 s minimum runtime before preemption): the four decisions the
/// product is about, each counted in `/metrics`, and every waiting job, in every team's
/// queue, either expected at a time inside its interval or naming what no forecast can know,
/// from the second cycle after it was first seen.
#[tokio::test]
async fn a_fresh_demo_shows_fair_share_a_backfill_a_reclaim_and_a_priority_preemption_and_every_waiting_job_says_when()
{
    const WITHIN: Duration = Duration::from_secs(300);
    const DECISIONS: [&str; 4] = [
        "fairway_preemptions_total{reason=\"fair_share\"}",
        "fairway_backfills_total",
        "fairway_preemptions_total{reason=\"reclaim\"}",
        "fairway_preemptions_total{reason=\"priority\"}",
    ];
    let data_dir = fresh_dir("serve-demo");
    let server = Server::start_demo(&data_dir, "demo.log").await;
    let token = server.sign_in().await;
    let started = Instant::now();
    // Jobs seen waiting with neither an expected start nor a cause in every poll since, and
    // the number of cycles that had run when they were first seen so. A job that is answered,
    // admitted or gone in between starts afresh: one preempted and requeued waits without a
    // reason again until the next cycle.
    let mut unanswered: BTreeMap<String, f64> = BTreeMap::new();
    let mut checked = 0usize;
    loop {
        let metrics = server.http.get(server.url("/metrics")).send().await.unwrap().text().await.unwrap();
        let cycles = series(&metrics, "fairway_scheduling_cycle_duration_seconds_count");
        let mut still_unanswered = BTreeMap::new();
        for team in ["nlp", "vision", "prod-inference", "research"] {
            let r = server
                .http
                .get(server.url(&format!("/api/v1/teams/{team}/queue?limit=1000")))
                .bearer_auth(&token)
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), reqwest::StatusCode::OK);
            let queue: Value = r.json().await.unwrap();
            for job in queue.as_array().expect("the queue is a list") {
                let id = job["id"].as_str().unwrap().to_owned();
                let expected = job["expected_start_at"].as_str();
                let cause = job["figures"]["unforeseeable"].as_str();
                if let Some(expected) = expected {
                    let (earliest, latest) = (job["earliest_start_at"].as_str(), job["latest_start_at"].as_str());
                    let at = |t: Option<&str>| chrono::DateTime::parse_from_rfc3339(t.expect("an interval")).unwrap();
                    assert!(at(earliest) <= at(Some(expected)) && at(Some(expected)) <= at(latest), "{job}");
                    assert!(cause.is_none(), "an expected start and a cause: {job}");
                    checked += 1;
                } else if let Some(cause) = cause {
                    assert!(["quota_change", "budget_change", "capacity_change"].contains(&cause), "{job}");
                    assert!(job["message"].as_str().is_some_and(|m| !m.is_empty()), "the cause in words: {job}");
                    checked += 1;
                } else {
                    let seen = unanswered.get(&id).copied().unwrap_or(cycles);
                    still_unanswered.insert(id, seen);
                    assert!(
                        cycles < seen + 3.0,
                        "{job} waits two cycles after it was seen with no expected start and no cause\n{}",
                        read_log(&server.log)
                    );
                }
            }
        }
        unanswered = still_unanswered;
        let counts: Vec<f64> = DECISIONS.iter().map(|d| series(&metrics, d)).collect();
        if counts.iter().all(|&n| n >= 1.0) {
            break;
        }
        assert!(
            started.elapsed() < WITHIN,
            "in {WITHIN:?} of the demo, {:?} happened {counts:?} times\n{}",
            DECISIONS,
            read_log(&server.log)
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    assert!(checked > 0, "no waiting job was ever seen: the demo showed no queue");
    // The priority preemption lost one run's work, not two: once nlp's evaluation runs, it
    // has stopped exactly one of nlp's sweeps (another team's burst job once took the GPUs
    // its first victim freed, and it stopped a second).
    let nlp_jobs = |server: &Server, token: &str| {
        let request = server.http.get(server.url("/api/v1/teams/nlp/jobs?limit=200")).bearer_auth(token);
        async move { request.send().await.unwrap().json::<Value>().await.unwrap()["items"].as_array().unwrap().clone() }
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    let (eval, jobs) = loop {
        let jobs = nlp_jobs(&server, &token).await;
        let eval = jobs.iter().find(|j| j["name"] == "nlp-nightly-eval").expect("act four submitted the evaluation");
        if eval["state"] == "running" {
            break (eval["id"].as_str().unwrap().to_owned(), jobs);
        }
        assert!(Instant::now() < deadline, "nlp's evaluation never ran: {eval:#}\n{}", read_log(&server.log));
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    let mut stopped_for_eval = Vec::new();
    for job in &jobs {
        let r = server.http.get(server.url(&format!("/api/v1/jobs/{}/events", job["id"].as_str().unwrap())));
        let events: Value = r.bearer_auth(&token).send().await.unwrap().json().await.unwrap();
        let events = events.get("items").unwrap_or(&events).as_array().unwrap().clone();
        stopped_for_eval.extend(
            events
                .iter()
                .filter(|e| e["kind"] == "preempted" && e["data"]["by_job"] == eval.as_str())
                .map(|_| job["name"].clone()),
        );
    }
    assert_eq!(stopped_for_eval.len(), 1, "the evaluation stopped {stopped_for_eval:?}");
    // Its GPUs have activity to show, read from the simulated cluster's dcgm-exporter: the
    // stalled detector's nearly idle GPUs, with the MIG slice that would have held it.
    let get = |path: String| {
        let (server, token) = (&server, &token);
        async move {
            let r = server.http.get(server.url(&path)).bearer_auth(token).send().await.unwrap();
            r.json::<Value>().await.unwrap()
        }
    };
    let jobs = get("/api/v1/teams/vision/jobs?limit=200".into()).await;
    let stalled = jobs["items"].as_array().unwrap().iter().find(|j| j["name"] == "vision-detector-b").unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let deadline = Instant::now() + Duration::from_secs(60);
    let activity = loop {
        let u = get(format!("/api/v1/jobs/{stalled}/utilisation")).await;
        if u["now"].is_object() {
            break u;
        }
        assert!(Instant::now() < deadline, "the demo's GPU activity was never read: {u:#}");
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    assert_eq!(
        (activity["measured"].as_bool(), activity["now"]["sm_active_percent"].as_f64()),
        (Some(true), Some(1.5))
    );
    assert!(activity["recommendation"]["message"].as_str().is_some_and(|m| m.contains("mig-1g.10gb")), "{activity:#}");
    let (status, log) = server.terminate().await;
    assert!(status.success(), "fairway serve --demo exited with {status}:\n{log}");
}

/// The README, read when the test is built: its examples are the test's script.
const README: &str = include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md"));

/// The request id of the test's own polling, so that the log's tail can leave it out.
const WAITING: &str = "readme-test-waiting";

/// The last 60 lines of the server's log, without the test's own polling.
fn log_tail(server: &Server) -> String {
    let log = read_log(&server.log);
    let lines: Vec<&str> = log.lines().filter(|l| !l.contains(WAITING)).collect();
    lines[lines.len().saturating_sub(60)..].join("\n")
}

/// Waits until job `id`, as the README's CI token `ci` reads it, has started `runs` times:
/// the moment the README's timeline shows, whenever this machine gets there.
async fn wait_until_started(server: &Server, id: &str, ci: &str, runs: usize, within: Duration) -> Result<(), String> {
    let started = Instant::now();
    let mut events = Value::Null;
    while started.elapsed() < within {
        let url = server.url(&format!("/api/v1/jobs/{id}/events"));
        let r = server.http.get(url).bearer_auth(ci).header("x-request-id", WAITING).send().await;
        if let Ok(r) = r {
            events = r.json().await.unwrap_or(Value::Null);
            let running = events.as_array().map_or(0, |e| e.iter().filter(|e| e["kind"] == "running").count());
            if running >= runs {
                return Ok(());
            }
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    Err(format!("job {id} had not started {runs} times within {within:?}; its events:\n{events:#}"))
}

/// The tour and "Jobs end to end", as a newcomer runs them on a fresh `fairway serve` started
/// as the README says: every block in one bash, in order, each printing what the README shows
/// beneath it (or nothing where it shows nothing), with ids, times and secrets matched by kind.
#[tokio::test]
async fn the_readmes_tour_and_jobs_examples_print_what_the_readme_shows() {
    use common::readme::{blocks, compare, examples, Bindings, Shell, README_ADDRESS};
    const BLOCK_LIMIT: Duration = Duration::from_secs(60);

    let tools = std::process::Command::new("bash").args(["-c", "command -v curl && command -v jq"]).output();
    assert!(
        tools.is_ok_and(|o| o.status.success()),
        "the README's examples need bash, curl and jq on PATH (apt-get install curl jq)"
    );
    let readme = examples(blocks(README, "## Five-minute tour with curl", "### How a job moves"));
    assert!(
        README.contains(&format!("API={README_ADDRESS}/api/v1")),
        "the tour no longer sets API={README_ADDRESS}/api/v1, which this test points at its server"
    );

    let data_dir = fresh_dir("serve-readme");
    let env: Vec<(&str, &str)> = readme.serve_env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let server = Server::start_with(&data_dir, "serve.log", &env).await;
    let shell_dir = data_dir.join("shell");
    fs::create_dir_all(&shell_dir).unwrap();
    let mut shell = Shell::start(&shell_dir).await;
    let mut bindings = Bindings::default();
    let mut failures: Vec<String> = Vec::new();
    let mut timeline_waited = false;
    for example in &readme.examples {
        let script = example.commands.text.replace(README_ADDRESS, &server.base);
        // The events block shows the reclaim's whole timeline, which ends when the sweep has
        // the GPUs back (its second start); a reader runs it later than a script would.
        if script.contains("$ID/events") {
            let ids = shell.run(r#"printf '%s\n' "$ID" "$CI""#, BLOCK_LIMIT).await.unwrap();
            let (id, ci) = ids.split_once('\n').unwrap_or_else(|| panic!("no $ID and $CI in the shell: {ids:?}"));
            if let Err(why) = wait_until_started(&server, id, ci, 2, Duration::from_secs(90)).await {
                panic!("{why}\n\nserver log:\n{}", log_tail(&server));
            }
            timeline_waited = true;
        }
        let shown = example.shown.as_ref().map_or("(no output)", |b| b.text.as_str());
        let printed = match shell.run(&script, BLOCK_LIMIT).await {
            Ok(printed) => printed,
            Err(why) => panic!(
                "README line {}: the block\n{}\n{why}\n\nthe README shows:\n{shown}\n\nserver log:\n{}",
                example.commands.line,
                example.commands.text,
                log_tail(&server)
            ),
        };
        let outcome = compare(example.shown.as_ref(), &printed, &mut bindings);
        println!("README line {}: {}", example.commands.line, if outcome.is_ok() { "as shown" } else { "differs" });
        if let Err(why) = outcome {
            failures.push(format!(
                "README line {}: the block\n{}\nthe README shows:\n{shown}\nthe server printed:\n{printed}\n\n{why}",
                example.commands.line, example.commands.text
            ));
        }
    }
    shell.stop().await;
    assert!(timeline_waited, "the README no longer reads the sweep's events ($ID/events); this test waits for them");
    assert!(
        failures.is_empty(),
        "{} of the README's {} examples print something else:\n\n{}\n\nserver log:\n{}",
        failures.len(),
        readme.examples.len(),
        failures.join("\n\n----------------\n\n"),
        log_tail(&server)
    );
    let (status, log) = server.terminate().await;
    assert!(status.success(), "fairway serve exited with {status}:\n{log}");
}

/// A fresh server's simulated cluster brings GPU classes with no price: the server says so,
/// and how to set one, instead of billing 0 in silence.
#[tokio::test]
async fn a_fresh_server_says_which_gpu_classes_have_no_price_and_how_to_set_one() {
    let data_dir = fresh_dir("serve-unpriced");
    let server = Server::start(&data_dir, "serve.log").await;
    let started = Instant::now();
    let line = loop {
        if let Some(line) = read_log(&server.log).lines().find(|l| l.contains("GPU classes without a price")) {
            break line.to_owned();
        }
        assert!(started.elapsed() < Duration::from_secs(60), "never said:\n{}", read_log(&server.log));
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(line.contains("h100-80gb") && line.contains("l4-24gb"), "{line}");
    assert!(line.contains("POST /api/v1/gpu-classes/{class}/rates"), "{line}");
    let (status, _) = server.terminate().await;
    assert!(status.success());
}
