//! Test harness: a real PostgreSQL per test run, a fresh database per test, and the real
//! router driven in-process.
//!
//! With no `DATABASE_URL`, one embedded PostgreSQL is started per test process (the same
//! code `fairway serve` uses) and stops when the process exits. Every test gets its own
//! database, copied from a migrated template, so tests run in parallel without sharing rows.

pub mod browser;
pub mod oidc;
pub mod prometheus;

use std::{
    sync::{
        atomic::{AtomicU32, Ordering},
        Arc, Mutex, OnceLock,
    },
    time::Duration,
};

use axum::{
    body::Body,
    http::{header, HeaderMap, HeaderName, HeaderValue, Method, Request, StatusCode},
    Router,
};
use fairway::{
    config::{Config, Secret},
    db::{self, embedded::EmbeddedPostgres},
    serve,
    state::AppState,
};
use http_body_util::BodyExt as _;
use serde_json::{json, Value};
use sqlx::{postgres::PgConnectOptions, ConnectOptions as _, PgPool};
use tower::ServiceExt as _;

/// The password of the bootstrap `admin` in every test app.
pub const ADMIN_PASSWORD: &str = "admin-password-for-tests";
/// The password of every user the helpers create.
pub const USER_PASSWORD: &str = "user-password-for-tests";
/// The signing key of every test app (32 bytes).
pub const SIGNING_KEY: [u8; 32] = [42; 32];

const TEMPLATE: &str = "fairway_template";

/// Where test databases live: the embedded server, or `DATABASE_URL`'s.
struct Server {
    options: PgConnectOptions,
    /// Kept alive for the whole process; its supervisor thread stops it at exit.
    embedded: Option<EmbeddedPostgres>,
}

impl Server {
    /// The end of the embedded server's log, to show when it stops answering (a full disk, a
    /// crash): otherwise every later test fails with nothing but "connection refused".
    fn log_tail(&self) -> String {
        let Some(embedded) = &self.embedded else { return String::new() };
        let log = std::fs::read_to_string(embedded.pgdata().with_extension("log")).unwrap_or_default();
        let start = log.len().saturating_sub(4000);
        let start = (start..log.len()).find(|&i| log.is_char_boundary(i)).unwrap_or(log.len());
        format!("\n--- the end of the test database's log ---\n{}", &log[start..])
    }
}

static SERVER: OnceLock<Server> = OnceLock::new();
static NEXT_DB: AtomicU32 = AtomicU32::new(0);
/// Databases of tests that have ended, dropped by the next `fresh_database`: a run of hundreds
/// of tests would otherwise keep ~10 MB per test on disk until the process exits.
static ENDED: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// Held by every clone of a [`TestApp`]; when the last one goes, the test is over and its
/// database may be dropped.
struct DatabaseInUse(String);

impl Drop for DatabaseInUse {
    fn drop(&mut self) {
        ENDED.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push(std::mem::take(&mut self.0));
    }
}

fn server() -> &'static Server {
    SERVER.get_or_init(|| {
        // Started on its own thread and runtime: the test's runtime may not block, and the
        // server must outlive any one test.
        std::thread::spawn(start_server).join().expect("starting the test database panicked")
    })
}

fn start_server() -> Server {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    rt.block_on(async {
        let (options, embedded) = match std::env::var("DATABASE_URL").ok().filter(|u| !u.is_empty()) {
            Some(url) => (url.parse::<PgConnectOptions>().expect("DATABASE_URL"), None),
            None => {
                let root = std::env::temp_dir().join("fairway-tests");
                remove_stale_clusters(&root);
                let pgdata = root.join(format!("pg-{}", std::process::id()));
                let server = EmbeddedPostgres::start(&pgdata, db::embedded::Tuning::THROWAWAY)
                    .await
                    .unwrap_or_else(|e| panic!("cannot start the test database: {e}"));
                (server.connect_options("postgres"), Some(server))
            }
        };
        let mut admin = options.clone().database("postgres").connect().await.expect("connect to postgres");
        let _ = sqlx::query(&format!("drop database if exists {TEMPLATE}_{}", std::process::id()))
            .execute(&mut admin)
            .await;
        let template = format!("{TEMPLATE}_{}", std::process::id());
        sqlx::query(&format!("create database {template}")).execute(&mut admin).await.expect("create template");
        let pool = db::connect(options.clone().database(&template), 2).await.expect("connect template");
        db::MIGRATOR.run(&pool).await.expect("migrate template");
        pool.close().await;
        Server { options, embedded }
    })
}

/// Removes clusters of earlier test processes that are gone.
fn remove_stale_clusters(root: &std::path::Path) {
    let Ok(entries) = std::fs::read_dir(root) else { return };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let pid = name.strip_prefix("pg-").and_then(|p| p.split('.').next()).and_then(|p| p.parse::<u32>().ok());
        if let Some(pid) = pid {
            if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
                let _ = if entry.path().is_dir() {
                    std::fs::remove_dir_all(entry.path())
                } else {
                    std::fs::remove_file(entry.path())
                };
            }
        }
    }
}

/// A fresh, migrated database for one test.
pub async fn fresh_database() -> PgPool {
    fresh_named_database().await.1
}

async fn fresh_named_database() -> (String, PgPool) {
    let server = server();
    let name = format!("t{}_{}", std::process::id(), NEXT_DB.fetch_add(1, Ordering::Relaxed));
    let mut admin = server
        .options
        .clone()
        .database("postgres")
        .connect()
        .await
        .unwrap_or_else(|e| panic!("connect to the test database server: {e}{}", server.log_tail()));
    let ended = std::mem::take(&mut *ENDED.lock().unwrap_or_else(std::sync::PoisonError::into_inner));
    for done in ended {
        // `force` ends what connections an ended test's tasks still hold.
        if let Err(e) = sqlx::query(&format!("drop database if exists {done} with (force)")).execute(&mut admin).await {
            panic!("drop the database of an ended test: {e}{}", server.log_tail());
        }
    }
    sqlx::query(&format!("create database {name} template {TEMPLATE}_{}", std::process::id()))
        .execute(&mut admin)
        .await
        .unwrap_or_else(|e| panic!("create test database: {e}{}", server.log_tail()));
    let pool = db::connect(server.options.clone().database(&name), 8)
        .await
        .unwrap_or_else(|e| panic!("connect test database: {e}{}", server.log_tail()));
    (name, pool)
}

/// The configuration of a test app: fixed keys and admin password.
pub fn test_config() -> Config {
    Config {
        signing_key: Some(Secret::new(base64_key(&SIGNING_KEY))),
        admin_password: Some(Secret::new(ADMIN_PASSWORD)),
        database_url: Some(Secret::new("postgres://test")),
        ..Config::default()
    }
}

fn base64_key(key: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(key)
}

/// The service on a fresh database, driven in-process. Clones drive the same service.
#[derive(Clone)]
pub struct TestApp {
    pub router: Router,
    pub pool: PgPool,
    pub state: AppState,
    /// The test's database is dropped once every clone of the app is gone.
    _database: Arc<DatabaseInUse>,
}

/// A response, fully read.
#[derive(Debug)]
pub struct TestResponse {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Vec<u8>,
}

impl TestResponse {
    /// The body as JSON; panics with the body when it is not.
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|_| panic!("not JSON ({}): {}", self.status, String::from_utf8_lossy(&self.body)))
    }

    /// A header's value as text.
    pub fn header(&self, name: &str) -> Option<String> {
        self.headers.get(name).and_then(|v| v.to_str().ok()).map(str::to_owned)
    }

    /// Asserts the status, showing the body when it differs.
    #[track_caller]
    pub fn assert_status(&self, status: u16) -> &Self {
        assert_eq!(self.status.as_u16(), status, "body: {}", String::from_utf8_lossy(&self.body));
        self
    }

    /// Asserts an RFC 9457 problem with this status and code; returns the document.
    #[track_caller]
    pub fn assert_problem(&self, status: u16, code: &str) -> Value {
        self.assert_status(status);
        assert_eq!(self.header("content-type").as_deref(), Some("application/problem+json"));
        let doc = self.json();
        assert_eq!(doc["code"], code, "{doc}");
        assert_eq!(doc["status"], status, "{doc}");
        doc
    }
}

/// A request to send.
pub struct Call {
    method: Method,
    path: String,
    token: Option<String>,
    headers: Vec<(HeaderName, HeaderValue)>,
    body: Option<Vec<u8>>,
}

impl Call {
    /// Signs the request with a bearer token.
    pub fn token(mut self, token: &str) -> Self {
        self.token = Some(token.to_owned());
        self
    }

    /// Signs the request when a token is given.
    pub fn maybe_token(mut self, token: Option<&str>) -> Self {
        self.token = token.map(str::to_owned);
        self
    }

    /// A JSON body.
    pub fn json(mut self, body: &Value) -> Self {
        self.body = Some(serde_json::to_vec(body).expect("json"));
        self.headers.push((header::CONTENT_TYPE, HeaderValue::from_static("application/json")));
        self
    }

    /// A raw body with its content type.
    pub fn raw(mut self, content_type: &'static str, body: Vec<u8>) -> Self {
        self.body = Some(body);
        self.headers.push((header::CONTENT_TYPE, HeaderValue::from_static(content_type)));
        self
    }

    /// Any header.
    pub fn header(mut self, name: &'static str, value: &str) -> Self {
        self.headers.push((HeaderName::from_static(name), HeaderValue::from_str(value).expect("header value")));
        self
    }
}

/// Starts a call.
pub fn call(method: &str, path: &str) -> Call {
    Call {
        method: Method::from_bytes(method.as_bytes()).expect("method"),
        path: path.to_owned(),
        token: None,
        headers: Vec::new(),
        body: None,
    }
}

impl TestApp {
    /// The service on a fresh database with the test configuration.
    pub async fn spawn() -> Self {
        Self::spawn_with(|_| {}).await
    }

    /// The service with a changed configuration.
    pub async fn spawn_with(change: impl FnOnce(&mut Config)) -> Self {
        let (name, pool) = fresh_named_database().await;
        let database = Arc::new(DatabaseInUse(name));
        let mut config = test_config();
        change(&mut config);
        serve::bootstrap_admin(&pool, &config).await.expect("bootstrap admin");
        let state = AppState::new(pool.clone(), config, &SIGNING_KEY).expect("state");
        Self { router: serve::app(state.clone()), pool, state, _database: database }
    }

    /// Sends a request through the router.
    pub async fn send(&self, call: Call) -> TestResponse {
        let mut builder = Request::builder().method(call.method).uri(&call.path);
        if let Some(token) = &call.token {
            builder = builder.header(header::AUTHORIZATION, format!("Bearer {token}"));
        }
        for (name, value) in call.headers {
            builder = builder.header(name, value);
        }
        let request = builder.body(call.body.map_or_else(Body::empty, Body::from)).expect("request");
        let response = tokio::time::timeout(Duration::from_secs(60), self.router.clone().oneshot(request))
            .await
            .expect("request took over 60 s")
            .expect("infallible");
        let (parts, mut body) = response.into_parts();
        let streamed = parts.headers.get(header::CONTENT_TYPE).is_some_and(|v| v.as_bytes() == b"text/event-stream");
        let body = if streamed {
            // An event stream ends only when its job does: take what it sends at once.
            let mut read = Vec::new();
            while let Ok(Some(frame)) = tokio::time::timeout(Duration::from_millis(500), body.frame()).await {
                read.extend_from_slice(frame.expect("body").data_ref().map_or(&[][..], |d| &d[..]));
            }
            read
        } else {
            body.collect().await.expect("body").to_bytes().to_vec()
        };
        TestResponse { status: parts.status, headers: parts.headers, body }
    }

    /// Serves the app on a real socket on a free loopback port (with the peer address, as
    /// `fairway serve` does) until the test ends; returns the address.
    pub async fn listen(&self) -> std::net::SocketAddr {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind a loopback port");
        let addr = listener.local_addr().expect("local address");
        let service = self.router.clone().into_make_service_with_connect_info::<std::net::SocketAddr>();
        tokio::spawn(async move { axum::serve(listener, service).await.expect("serve") });
        addr
    }

    /// Signs in with a password and returns the access token.
    pub async fn login(&self, username: &str, password: &str) -> String {
        let r = self
            .send(call("POST", "/api/v1/auth/token").json(&json!({"username": username, "password": password})))
            .await;
        r.assert_status(200);
        r.json()["access_token"].as_str().expect("access_token").to_owned()
    }

    /// The platform admin's access token.
    pub async fn admin(&self) -> String {
        self.login("admin", ADMIN_PASSWORD).await
    }

    /// Creates a user (optionally with a platform role) and returns its access token.
    pub async fn user(&self, admin: &str, username: &str, platform_role: Option<&str>) -> String {
        self.send(
            call("POST", "/api/v1/users")
                .token(admin)
                .json(&json!({"username": username, "password": USER_PASSWORD, "platform_role": platform_role})),
        )
        .await
        .assert_status(201);
        self.login(username, USER_PASSWORD).await
    }

    /// Creates a team.
    pub async fn team(&self, admin: &str, name: &str, parent: Option<&str>) -> Value {
        let r =
            self.send(call("POST", "/api/v1/teams").token(admin).json(&json!({"name": name, "parent": parent}))).await;
        r.assert_status(201);
        r.json()
    }

    /// Gives `username` a role in `team`.
    pub async fn member(&self, admin: &str, team: &str, username: &str, role: &str) {
        self.send(
            call("PUT", &format!("/api/v1/teams/{team}/members/{username}")).token(admin).json(&json!({"role": role})),
        )
        .await
        .assert_status(200);
    }

    /// Creates a whole-GPU class.
    pub async fn gpu_class(&self, admin: &str, name: &str) {
        self.send(
            call("POST", "/api/v1/gpu-classes").token(admin).json(
                &json!({"name": name, "kind": "whole", "memory_mib": 81920, "rate_micros_per_gpu_hour": 2_500_000}),
            ),
        )
        .await
        .assert_status(201);
    }

    /// Sets `team`'s quota of `class`, in GPUs.
    pub async fn quota(&self, admin: &str, team: &str, class: &str, reserved: i64, burst: i64) {
        self.send(
            call("PUT", &format!("/api/v1/teams/{team}/quotas/{class}"))
                .token(admin)
                .json(&json!({"reserved": reserved, "burst": burst})),
        )
        .await
        .assert_status(200);
    }

    /// Mints an API token for `team`; returns (id, secret).
    pub async fn api_token(&self, admin: &str, team: &str, role: &str) -> (String, String) {
        let expires = (chrono::Utc::now() + chrono::Duration::days(30)).to_rfc3339();
        let r = self
            .send(
                call("POST", &format!("/api/v1/teams/{team}/tokens"))
                    .token(admin)
                    .json(&json!({"name": "ci", "role": role, "expires_at": expires})),
            )
            .await;
        r.assert_status(201);
        let v = r.json();
        (v["id"].as_str().expect("id").to_owned(), v["secret"].as_str().expect("secret").to_owned())
    }
}

/// An access token for the bootstrap admin, signed directly with the test key: for apps
/// whose limits (e.g. a tiny request timeout) would refuse the sign-in itself.
pub async fn test_admin_token(app: &TestApp) -> String {
    let admin = fairway::db::users::by_username(&app.pool, "admin").await.expect("query").expect("admin exists");
    app.state.keys.issue(admin.id, chrono::Utc::now().timestamp())
}

/// The fields of one line of a CSV export.
pub use fairway::billing::export::csv_fields;
