//! `fairway serve` on its embedded database, as a user or a supervisor runs it: started in a
//! data directory with a clean environment, ready when `/readyz` says so, signed into.

use std::{
    fs,
    path::{Path, PathBuf},
    process::{Child, Command, ExitStatus, Stdio},
    time::{Duration, Instant},
};

use serde_json::{json, Value};

use super::{free_port, BIN};

pub const ADMIN_PASSWORD: &str = "serve-test-admin-password";
pub const READY_TIMEOUT: Duration = Duration::from_secs(60);
pub const EXIT_TIMEOUT: Duration = Duration::from_secs(60);

/// `fairway serve` with a clean environment: no inherited `FAIRWAY_*` settings and no
/// `DATABASE_URL` (the build itself may export one for sqlx), output into `log`.
pub fn fairway_serve(log: &Path) -> Command {
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

pub fn read_log(log: &Path) -> String {
    fs::read_to_string(log).unwrap_or_else(|e| format!("<cannot read {}: {e}>", log.display()))
}

/// A running `fairway serve`. Dropping it (as a panicking test does) kills the process.
pub struct Server {
    pub child: Option<Child>,
    pub base: String,
    pub log: PathBuf,
    pub http: reqwest::Client,
}

impl Server {
    /// Starts `fairway serve` on the embedded database in `data_dir` and waits until
    /// `/readyz` answers 200.
    pub async fn start(data_dir: &Path, log_name: &str) -> Self {
        Self::start_with(data_dir, log_name, &[]).await
    }

    /// [`Server::start`] with extra environment variables.
    pub async fn start_with(data_dir: &Path, log_name: &str, extra: &[(&str, &str)]) -> Self {
        Self::start_args(data_dir, log_name, &[], extra).await
    }

    /// `fairway serve --demo`, as a newcomer runs it.
    pub async fn start_demo(data_dir: &Path, log_name: &str) -> Self {
        Self::start_args(data_dir, log_name, &["--demo"], &[]).await
    }

    async fn start_args(data_dir: &Path, log_name: &str, args: &[&str], extra: &[(&str, &str)]) -> Self {
        let port = free_port();
        let log = data_dir.join(log_name);
        let child = fairway_serve(&log)
            .args(args)
            .env("FAIRWAY_DATA_DIR", data_dir)
            .env("FAIRWAY_LISTEN", format!("127.0.0.1:{port}"))
            .env("FAIRWAY_ADMIN_PASSWORD", ADMIN_PASSWORD)
            .envs(extra.iter().copied())
            .spawn()
            .expect("spawn fairway serve");
        let http = reqwest::Client::builder().no_proxy().timeout(Duration::from_secs(10)).build().unwrap();
        let mut server = Self { child: Some(child), base: format!("http://127.0.0.1:{port}"), log, http };
        server.wait_ready().await;
        server
    }

    /// SIGKILLs the process and reaps it.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill().expect("SIGKILL fairway serve");
            child.wait().unwrap();
        }
    }

    /// Waits until `/readyz` answers 200.
    pub async fn wait_ready(&mut self) {
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

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// Signs in as the platform admin and returns the access token.
    pub async fn sign_in(&self) -> String {
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
    pub async fn team_names(&self, token: &str) -> Vec<String> {
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
    pub async fn terminate(mut self) -> (ExitStatus, String) {
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
