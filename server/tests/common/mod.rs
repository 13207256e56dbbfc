//! What the multi-process tests share: a `fairway serve` replica on a shared database.

#![allow(dead_code, reason = "each test binary uses part of it")]

use std::{
    fs,
    net::TcpListener,
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::Duration,
};

use base64::Engine as _;

pub mod embedded;
pub mod gcp_fake;
pub mod kube_peer;
pub mod ledger;
pub mod moto;
pub mod platform;
pub mod proxy;
pub mod readme;

pub const BIN: &str = env!("CARGO_BIN_EXE_fairway");

pub fn fresh_dir(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(name);
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).unwrap();
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).unwrap();
    dir
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// A `fairway serve` replica on the shared database.
pub struct Replica {
    pub child: Child,
    pub base: String,
    pub log: PathBuf,
}

impl Replica {
    pub fn start(dir: &Path, name: &str, url: &str) -> Self {
        Self::start_with(dir, name, url, &[])
    }

    /// Starts a replica with extra environment variables.
    pub fn start_with(dir: &Path, name: &str, url: &str, extra: &[(&str, &str)]) -> Self {
        let port = free_port();
        let log = dir.join(format!("{name}.log"));
        let out = fs::File::create(&log).unwrap();
        let key = base64::engine::general_purpose::STANDARD.encode([7u8; 32]);
        let mut cmd = Command::new(BIN);
        for (var, _) in std::env::vars_os() {
            if var.to_str().is_some_and(|n| n.starts_with("FAIRWAY_")) {
                cmd.env_remove(&var);
            }
        }
        let child = cmd
            .arg("serve")
            .env("DATABASE_URL", url)
            .env("FAIRWAY_SIGNING_KEY", key)
            .env("FAIRWAY_ADMIN_PASSWORD", "failover-admin-password")
            .env("FAIRWAY_LISTEN", format!("127.0.0.1:{port}"))
            .env("FAIRWAY_LEADER_LEASE_SECONDS", "3")
            .env("FAIRWAY_CYCLE_INTERVAL_MS", "200")
            .envs(extra.iter().copied())
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .expect("spawn fairway serve");
        Self { child, base: format!("http://127.0.0.1:{port}"), log }
    }

    /// Whether it says it leads, from its own `/metrics`; `None` while it does not answer.
    pub async fn leads(&self) -> Option<bool> {
        let http = reqwest::Client::builder().no_proxy().timeout(Duration::from_secs(2)).build().ok()?;
        let text = http.get(format!("{}/metrics", self.base)).send().await.ok()?.text().await.ok()?;
        let line = text.lines().find(|l| l.starts_with("fairway_scheduler_leader "))?;
        Some(line.ends_with(" 1"))
    }

    pub fn signal(&self, signal: i32) {
        let sent = std::process::Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(self.child.id().to_string())
            .status()
            .expect("running kill");
        assert!(sent.success(), "kill({signal})");
    }

    pub fn log(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
