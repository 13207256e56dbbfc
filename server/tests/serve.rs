//! End-to-end tests of the `fairway` binary over a real socket: the embedded database's
//! lifecycle across restarts, and the refusals that protect a production deployment.

mod common;

use std::{
    fs,
    process::ExitStatus,
    time::{Duration, Instant},
};

use base64::Engine as _;
use common::{
    embedded::{fairway_serve, read_log, Server, ADMIN_PASSWORD, EXIT_TIMEOUT},
    free_port, fresh_dir,
};
use serde_json::json;

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
