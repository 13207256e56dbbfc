//! End-to-end tests of the `fairway` binary over a real socket: the embedded database's
//! lifecycle across restarts, and the refusals that protect a production deployment.

use std::{
    fs,
    net::TcpListener,
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
    process::{Child, Command, ExitStatus, Stdio},
    time::{Duration, Instant},
};

use base64::Engine as _;
use serde_json::{json, Value};

const BIN: &str = env!("CARGO_BIN_EXE_fairway");
const ADMIN_PASSWORD: &str = "serve-test-admin-password";
const READY_TIMEOUT: Duration = Duration::from_secs(60);
const EXIT_TIMEOUT: Duration = Duration::from_secs(60);

/// A fresh, world-traversable directory for one test under cargo's per-target temp dir.
/// World-traversable because, when the tests run as root, PostgreSQL runs as another user.
fn fresh_dir(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(name);
    if dir.exists() {
        fs::remove_dir_all(&dir).unwrap_or_else(|e| panic!("cannot remove {}: {e}", dir.display()));
    }
    fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.display()));
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).unwrap();
    dir
}

fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral port");
    listener.local_addr().unwrap().port()
}

/// `fairway serve` with a clean environment: no inherited `FAIRWAY_*` settings and no
/// `DATABASE_URL` (the build itself may export one for sqlx), output into `log`.
fn fairway_serve(log: &Path) -> Command {
    let mut cmd = Command::new(BIN);
    cmd.arg("serve");
    for (name, _) in std::env::vars_os() {
        if name.to_str().is_some_and(|n| n.starts_with("FAIRWAY_")) {
            cmd.env_remove(&name);
        }
    }
    cmd.env_remove("DATABASE_URL");
    let out = fs::File::create(log).unwrap_or_else(|e| panic!("cannot create {}: {e}", log.display()));
    cmd.stdin(Stdio::null()).stdout(out.try_clone().unwrap()).stderr(out);
    cmd
}

fn read_log(log: &Path) -> String {
    fs::read_to_string(log).unwrap_or_else(|e| format!("<cannot read {}: {e}>", log.display()))
}

/// A running `fairway serve`. Dropping it (as a panicking test does) kills the process.
struct Server {
    child: Option<Child>,
    base: String,
    log: PathBuf,
    http: reqwest::Client,
}

impl Server {
    /// Starts `fairway serve` on the embedded database in `data_dir` and waits until
    /// `/readyz` answers 200.
    async fn start(data_dir: &Path, log_name: &str) -> Self {
        let port = free_port();
        let log = data_dir.join(log_name);
        let child = fairway_serve(&log)
            .env("FAIRWAY_DATA_DIR", data_dir)
            .env("FAIRWAY_LISTEN", format!("127.0.0.1:{port}"))
            .env("FAIRWAY_ADMIN_PASSWORD", ADMIN_PASSWORD)
            .spawn()
            .expect("spawn fairway serve");
        let http = reqwest::Client::builder().no_proxy().timeout(Duration::from_secs(10)).build().unwrap();
        let mut server = Self { child: Some(child), base: format!("http://127.0.0.1:{port}"), log, http };
        server.wait_ready().await;
        server
    }

    async fn wait_ready(&mut self) {
        let started = Instant::now();
        loop {
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                panic!("fairway serve exited with {status} before it was ready:\n{}", read_log(&self.log));
            }
            if let Ok(r) = self.http.get(self.url("/readyz")).send().await {
                if r.status() == reqwest::StatusCode::OK {
                    return;
                }
            }
            assert!(
                started.elapsed() <= READY_TIMEOUT,
                "fairway serve was not ready within {READY_TIMEOUT:?}:\n{}",
                read_log(&self.log)
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// Signs in as the platform admin and returns the access token.
    async fn sign_in(&self) -> String {
        let response = self
            .http
            .post(self.url("/api/v1/auth/token"))
            .json(&json!({"username": "admin", "password": ADMIN_PASSWORD}))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), reqwest::StatusCode::OK, "sign-in failed: {}", response.text().await.unwrap());
        let body: Value = response.json().await.unwrap();
        assert_eq!(body["token_type"], "Bearer", "{body}");
        body["access_token"].as_str().expect("access_token").to_owned()
    }

    /// The names of the teams `token` can see.
    async fn team_names(&self, token: &str) -> Vec<String> {
        let response = self.http.get(self.url("/api/v1/teams")).bearer_auth(token).send().await.unwrap();
        assert_eq!(response.status(), reqwest::StatusCode::OK, "{}", response.text().await.unwrap());
        let body: Value = response.json().await.unwrap();
        body["items"]
            .as_array()
            .unwrap_or_else(|| panic!("no items in {body}"))
            .iter()
            .map(|t| t["name"].as_str().unwrap().to_owned())
            .collect()
    }

    /// Sends SIGTERM and waits for the process to exit.
    async fn terminate(mut self) -> (ExitStatus, String) {
        let mut child = self.child.take().unwrap();
        let pid = child.id().to_string();
        let sent = std::process::Command::new("kill").args(["-TERM", &pid]).status().unwrap();
        assert!(sent.success(), "cannot signal fairway serve");
        let started = Instant::now();
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                return (status, read_log(&self.log));
            }
            if started.elapsed() > EXIT_TIMEOUT {
                let _ = child.kill();
                let _ = child.wait();
                panic!("fairway serve did not exit within {EXIT_TIMEOUT:?} of SIGTERM:\n{}", read_log(&self.log));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

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
