//! A whole platform for the multi-process tests: a fresh database, a real `fairway serve`
//! with a clusters file, and an admin session over real HTTP, with the API calls the tests
//! share.

use std::time::{Duration, Instant};

use fairway::db::{self, embedded::EmbeddedPostgres};
use serde_json::{json, Value};

use super::{fresh_dir, Replica};

/// The admin password every platform starts with.
pub const ADMIN_PASSWORD: &str = "failover-admin-password";

/// One test's Fairway: its database, its `fairway serve` (with a clusters file) and an admin
/// session over real HTTP.
pub struct Platform {
    pub test: String,
    pub dir: std::path::PathBuf,
    pub url: String,
    pub env: Vec<(String, String)>,
    pub server: Option<Replica>,
    pub http: reqwest::Client,
    pub token: String,
    pub pool: sqlx::PgPool,
    pub pg: EmbeddedPostgres,
}

impl Platform {
    /// Starts Fairway on a fresh database with the clusters file `clusters` (TOML) and
    /// extra environment.
    pub async fn start(test: &str, clusters: &str, extra_env: &[(&str, &str)]) -> Self {
        let dir = fresh_dir(&format!("platform-{test}"));
        let pg = EmbeddedPostgres::start(&dir.join("pg"), db::embedded::Tuning::THROWAWAY).await.unwrap();
        pg.create_database("fairway", None).await.unwrap();
        let url = pg.url("fairway");
        let pool = db::connect(pg.connect_options("fairway"), 4).await.unwrap();
        db::MIGRATOR.run(&pool).await.unwrap();
        let clusters_file = dir.join("clusters.toml");
        std::fs::write(&clusters_file, clusters).unwrap();
        let mut env = vec![
            ("FAIRWAY_CLUSTERS".to_owned(), clusters_file.display().to_string()),
            ("FAIRWAY_CYCLE_INTERVAL_MS".to_owned(), "100".to_owned()),
            ("FAIRWAY_MIN_RUNTIME_BEFORE_PREEMPTION_SECONDS".to_owned(), "0".to_owned()),
        ];
        env.extend(extra_env.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())));
        let http = reqwest::Client::builder().no_proxy().timeout(Duration::from_secs(30)).build().unwrap();
        let mut platform =
            Platform { test: test.to_owned(), dir, url, env, server: None, http, token: String::new(), pool, pg };
        platform.restart();
        platform.login().await;
        platform
    }

    pub fn restart(&mut self) {
        self.server = None;
        let env: Vec<(&str, &str)> = self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        self.server = Some(Replica::start_with(&self.dir, "server", &self.url, &env));
    }

    pub fn log(&self) -> String {
        self.server.as_ref().map(Replica::log).unwrap_or_default()
    }

    pub fn base(&self) -> String {
        self.server.as_ref().expect("running").base.clone()
    }

    pub async fn login(&mut self) {
        let started = Instant::now();
        loop {
            let r = self
                .http
                .post(format!("{}/api/v1/auth/token", self.base()))
                .json(&json!({"username": "admin", "password": ADMIN_PASSWORD}))
                .send()
                .await;
            if let Ok(r) = r.and_then(reqwest::Response::error_for_status) {
                self.token = r.json::<Value>().await.unwrap()["access_token"].as_str().unwrap().to_owned();
                return;
            }
            assert!(started.elapsed() < Duration::from_secs(30), "fairway did not start:\n{}", self.log());
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    pub async fn send(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> (u16, Value) {
        let mut request = self.http.request(method, format!("{}{path}", self.base())).bearer_auth(&self.token);
        if let Some(body) = body {
            request = request.json(&body);
        }
        let r = request.send().await.unwrap_or_else(|e| panic!("{path}: {e}\n{}", self.log()));
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or(Value::Null))
    }

    pub async fn ok(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
        let (status, body) = self.send(method, path, body).await;
        assert!((200..300).contains(&status), "{path}: {status} {body:#}");
        body
    }

    /// Waits for the cluster's inventory to bring `class`, then gives `team` a quota of it.
    pub async fn team(&self, team: &str, class: &str, reserved: i64, burst: i64) {
        self.wait("the inventory", Duration::from_secs(30), || async move {
            let classes = self.ok(reqwest::Method::GET, "/api/v1/gpu-classes", None).await;
            classes.to_string().contains(&format!("\"{class}\"")).then_some(())
        })
        .await;
        let (status, _) = self.send(reqwest::Method::POST, "/api/v1/teams", Some(json!({"name": team}))).await;
        assert!(status == 201 || status == 409, "create team {team}: {status}");
        self.ok(
            reqwest::Method::PUT,
            &format!("/api/v1/teams/{team}/quotas/{class}"),
            Some(json!({"reserved": reserved, "burst": burst})),
        )
        .await;
    }

    pub async fn submit(&self, team: &str, body: Value) -> String {
        let r = self.ok(reqwest::Method::POST, &format!("/api/v1/teams/{team}/jobs"), Some(body)).await;
        r["id"].as_str().unwrap().to_owned()
    }

    pub async fn job(&self, id: &str) -> Value {
        self.ok(reqwest::Method::GET, &format!("/api/v1/jobs/{id}"), None).await
    }

    pub async fn event_kinds(&self, id: &str) -> Vec<String> {
        let events = self.ok(reqwest::Method::GET, &format!("/api/v1/jobs/{id}/events"), None).await;
        events.as_array().unwrap().iter().map(|e| e["kind"].as_str().unwrap().to_owned()).collect()
    }

    /// The job's timeline as (kind, reason).
    pub async fn events(&self, id: &str) -> Vec<(String, String)> {
        let events = self.ok(reqwest::Method::GET, &format!("/api/v1/jobs/{id}/events"), None).await;
        let text = |v: &Value| v.as_str().unwrap_or_default().to_owned();
        events.as_array().unwrap().iter().map(|e| (text(&e["kind"]), text(&e["reason"]))).collect()
    }

    pub async fn wait_state(&self, id: &str, state: &str, within: Duration) -> Value {
        self.wait(&format!("job {id} to be {state}"), within, || async move {
            let job = self.job(id).await;
            (job["state"] == state).then_some(job)
        })
        .await
    }

    /// Polls `check` until it gives a value, failing after `within` with the server's log.
    pub async fn wait<T, F: std::future::Future<Output = Option<T>>>(
        &self,
        what: &str,
        within: Duration,
        check: impl Fn() -> F,
    ) -> T {
        let started = Instant::now();
        loop {
            if let Some(v) = check().await {
                return v;
            }
            assert!(started.elapsed() < within, "waited {within:?} for {what}\n--- fairway log ---\n{}", self.log());
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Stops the server and its database.
    pub async fn stop(mut self) {
        self.server = None;
        self.pool.close().await;
        self.pg.stop().await;
    }
}
