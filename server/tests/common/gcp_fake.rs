//! A contract-test server for Google Cloud Batch: not an emulator, a fake that keeps jobs in
//! memory, implements only the calls Fairway makes (create, get, list, cancel, delete), moves
//! job states when the test says so, and holds both sides to Google's contract: every request
//! body Fairway sends and every answer this fake gives is validated against the schemas of
//! the official discovery document (`batch.v1.json`, fetched by `.ci/fetch-gcp-discovery`).
//! Violations are recorded and the tests assert there are none.
//!
//! It is Cloud Logging's `entries:list` too, on the same address, held to `logging.v2.json`
//! the same way: it serves the task log lines a test writes ([`GcpFake::write_log`]) as Batch
//! labels them, selected by the filter Fairway sends, which it evaluates clause by clause
//! (the clauses Fairway writes; any other is a violation).

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::{Arc, Mutex},
};

use axum::{
    extract::{Path as UrlPath, Query, State},
    http::{HeaderMap, StatusCode},
    routing::{get, post},
    Json, Router,
};
use serde_json::{json, Value};

/// The Batch discovery document: `FAIRWAY_GCP_DISCOVERY`, or what `.ci/fetch-gcp-discovery`
/// fetches (once per machine).
pub fn discovery() -> Value {
    let path = batch_discovery_path();
    serde_json::from_slice(&std::fs::read(&path).expect("batch.v1.json")).expect("discovery JSON")
}

/// The Cloud Logging discovery document: `logging.v2.json` beside the Batch one.
pub fn logging_discovery() -> Value {
    let path = batch_discovery_path().with_file_name("logging.v2.json");
    let text = std::fs::read(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (.ci/fetch-gcp-discovery puts it there)", path.display()));
    serde_json::from_slice(&text).expect("discovery JSON")
}

fn batch_discovery_path() -> PathBuf {
    match std::env::var_os("FAIRWAY_GCP_DISCOVERY") {
        Some(p) => PathBuf::from(p),
        None => {
            let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("workspace root").to_owned();
            let out = Command::new("bash")
                .arg(root.join(".ci/fetch-gcp-discovery"))
                .stderr(Stdio::inherit())
                .output()
                .expect("run .ci/fetch-gcp-discovery");
            assert!(out.status.success(), ".ci/fetch-gcp-discovery failed; see its output above");
            PathBuf::from(String::from_utf8_lossy(&out.stdout).lines().last().expect("path").trim())
        }
    }
}

/// Whether the value is sent by a client (output-only fields must not be) or answered.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    Request,
    Response,
}

/// Checks `value` against discovery schema `schema`; returns every violation with its path.
pub fn validate(doc: &Value, schema: &str, value: &Value, direction: Direction) -> Vec<String> {
    let mut errors = Vec::new();
    check(doc, &json!({ "$ref": schema }), value, schema, direction, &mut errors);
    errors
}

fn check(doc: &Value, schema: &Value, value: &Value, path: &str, dir: Direction, errors: &mut Vec<String>) {
    if let Some(name) = schema["$ref"].as_str() {
        let Some(target) = doc["schemas"].get(name) else {
            errors.push(format!("{path}: unknown schema {name}"));
            return;
        };
        return check(doc, target, value, path, dir, errors);
    }
    let kind = schema["type"].as_str().unwrap_or("any");
    match kind {
        "object" => {
            let Some(map) = value.as_object() else {
                errors.push(format!("{path}: expected an object, got {value}"));
                return;
            };
            let properties = schema["properties"].as_object();
            for (key, v) in map {
                match (properties.and_then(|p| p.get(key)), schema.get("additionalProperties")) {
                    (Some(field), _) => {
                        let described = field["description"].as_str().unwrap_or_default();
                        if dir == Direction::Request && described.starts_with("Output only") {
                            errors.push(format!("{path}.{key}: output-only field sent in a request"));
                        }
                        check(doc, field, v, &format!("{path}.{key}"), dir, errors);
                    }
                    (None, Some(extra)) => check(doc, extra, v, &format!("{path}.{key}"), dir, errors),
                    (None, None) => errors.push(format!("{path}.{key}: no such field")),
                }
            }
        }
        "array" => match value.as_array() {
            Some(items) => {
                for (i, item) in items.iter().enumerate() {
                    check(doc, &schema["items"], item, &format!("{path}[{i}]"), dir, errors);
                }
            }
            None => errors.push(format!("{path}: expected an array, got {value}")),
        },
        "string" => {
            let Some(s) = value.as_str() else {
                errors.push(format!("{path}: expected a string, got {value}"));
                return;
            };
            if let Some(allowed) = schema["enum"].as_array() {
                if !allowed.iter().any(|a| a == s) {
                    errors.push(format!("{path}: {s:?} is not one of {allowed:?}"));
                }
            }
            match schema["format"].as_str() {
                // Google's JSON mapping: 64-bit integers travel as decimal strings.
                Some("int64" | "uint64") if s.parse::<i128>().is_err() => {
                    errors.push(format!("{path}: {s:?} is not a 64-bit integer"));
                }
                Some("google-duration") if !(s.ends_with('s') && s[..s.len() - 1].parse::<f64>().is_ok()) => {
                    errors.push(format!("{path}: {s:?} is not a duration like \"3600s\""));
                }
                Some("google-datetime") if chrono::DateTime::parse_from_rfc3339(s).is_err() => {
                    errors.push(format!("{path}: {s:?} is not an RFC 3339 time"));
                }
                _ => {}
            }
        }
        "integer" if !value.is_i64() && !value.is_u64() => {
            errors.push(format!("{path}: expected an integer, got {value}"));
        }
        "number" if !value.is_number() => errors.push(format!("{path}: expected a number, got {value}")),
        "boolean" if !value.is_boolean() => errors.push(format!("{path}: expected a boolean, got {value}")),
        _ => {}
    }
}

/// What the fake holds.
#[derive(Default)]
struct FakeState {
    /// Jobs by id, as the API shows them.
    jobs: BTreeMap<String, Value>,
    /// Every create request accepted, in order: (job id, request id).
    creates: Vec<(String, String)>,
    violations: Vec<String>,
    /// Cloud Logging's entries of the task log, as Batch writes them.
    log_entries: Vec<Value>,
    /// Every `entries:list` request body, in order.
    log_requests: Vec<Value>,
}

/// The running fake.
#[derive(Clone)]
pub struct GcpFake {
    pub url: String,
    pub token: String,
    state: Arc<Mutex<FakeState>>,
    doc: Arc<Value>,
    logging_doc: Arc<Value>,
    project: String,
    parent: String,
}

#[derive(Clone)]
struct Shared {
    fake: GcpFake,
}

fn error(status: StatusCode, code: &str, message: &str) -> (StatusCode, Json<Value>) {
    (status, Json(json!({"error": {"code": status.as_u16(), "status": code, "message": message}})))
}

fn now() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

impl GcpFake {
    /// Starts the fake for `project` and `location` on a loopback port.
    pub async fn start(project: &str, location: &str) -> Self {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0)).await.expect("bind");
        let fake = GcpFake {
            url: format!("http://{}", listener.local_addr().expect("address")),
            token: "fake-access-token".into(),
            state: Arc::default(),
            doc: Arc::new(discovery()),
            logging_doc: Arc::new(logging_discovery()),
            project: project.to_owned(),
            parent: format!("projects/{project}/locations/{location}"),
        };
        let base = format!("/v1/{}/jobs", fake.parent);
        let router = Router::new()
            .route("/v2/entries:list", post(list_log_entries))
            .route(&base, get(list).post(create))
            .route(&format!("{base}/{{job}}"), get(get_job).post(cancel).delete(delete))
            .with_state(Shared { fake: fake.clone() });
        tokio::spawn(async move { axum::serve(listener, router).await.expect("serve") });
        fake
    }

    fn violation(&self, what: String) {
        self.state.lock().unwrap().violations.push(what);
    }

    /// Every contract violation seen, requests and answers alike.
    pub fn violations(&self) -> Vec<String> {
        self.state.lock().unwrap().violations.clone()
    }

    /// Accepted creates: (job id, request id).
    pub fn creates(&self) -> Vec<(String, String)> {
        self.state.lock().unwrap().creates.clone()
    }

    /// The jobs, by id.
    pub fn jobs(&self) -> BTreeMap<String, Value> {
        self.state.lock().unwrap().jobs.clone()
    }

    /// Moves a job to `to` as the service would, with a task exit code when given.
    pub fn drive(&self, job: &str, to: &str, exit_code: Option<i64>) {
        let mut state = self.state.lock().unwrap();
        let entry = state.jobs.get_mut(job).unwrap_or_else(|| panic!("no job {job}"));
        let from = entry["status"]["state"].as_str().unwrap_or_default().to_owned();
        let mut event = json!({
            "type": "STATUS_CHANGED",
            "eventTime": now(),
            "description": format!("Job state is set from {from} to {to} for job {}.", entry["name"].as_str().unwrap()),
        });
        if let Some(code) = exit_code {
            event["taskExecution"] = json!({"exitCode": code});
        }
        entry["status"]["state"] = json!(to);
        entry["status"]["statusEvents"].as_array_mut().unwrap().push(event);
        entry["updateTime"] = json!(now());
    }

    /// A line task `task_index` of the job of uid `job_uid` wrote at `at`, as Batch's agent
    /// hands it to Cloud Logging: a text payload, or a JSON one when the line was JSON.
    pub fn write_log(&self, job_uid: &str, task_index: u32, at: chrono::DateTime<chrono::Utc>, line: &str) {
        let mut state = self.state.lock().unwrap();
        let insert_id = format!("{:016x}", state.log_entries.len());
        let mut entry = json!({
            "logName": format!("projects/{}/logs/batch_task_logs", self.project),
            "resource": {"type": "generic_task", "labels": {"project_id": self.project}},
            "timestamp": at.to_rfc3339_opts(chrono::SecondsFormat::Nanos, true),
            "receiveTimestamp": now(),
            "insertId": insert_id,
            "severity": "INFO",
            "labels": {
                "job_uid": job_uid,
                "batch.googleapis.com/job_uid": job_uid,
                "task_id": format!("task/{job_uid}-group0-{task_index}/0/0"),
            },
        });
        match serde_json::from_str::<Value>(line) {
            Ok(payload @ Value::Object(_)) => entry["jsonPayload"] = payload,
            _ => entry["textPayload"] = json!(line),
        }
        state.log_entries.push(entry);
    }

    /// Every `entries:list` request body Fairway sent, in order.
    pub fn log_requests(&self) -> Vec<Value> {
        self.state.lock().unwrap().log_requests.clone()
    }

    fn authorized(&self, headers: &HeaderMap) -> bool {
        headers.get("authorization").and_then(|v| v.to_str().ok()) == Some(&format!("Bearer {}", self.token))
    }

    fn answer(&self, schema: &str, body: Value) -> (StatusCode, Json<Value>) {
        for v in validate(&self.doc, schema, &body, Direction::Response) {
            self.violation(format!("answer: {v}"));
        }
        (StatusCode::OK, Json(body))
    }
}

/// One clause of a Logging query, as Fairway writes them: `FIELD OP "VALUE"`.
struct Clause {
    field: String,
    op: String,
    value: String,
}

/// Parses `CLAUSE AND CLAUSE ...`; an error names what is not understood.
fn parse_filter(filter: &str) -> Result<Vec<Clause>, String> {
    filter
        .split(" AND ")
        .map(|clause| {
            let (field, rest) = clause
                .find(['=', '>', '<', '!', ':'])
                .map(|at| clause.split_at(at))
                .ok_or_else(|| format!("no operator in {clause:?}"))?;
            let op_len = rest.find('"').ok_or_else(|| format!("no quoted value in {clause:?}"))?;
            let (op, quoted) = rest.split_at(op_len);
            let inner = quoted
                .strip_prefix('"')
                .and_then(|q| q.strip_suffix('"'))
                .ok_or_else(|| format!("value not quoted in {clause:?}"))?;
            let value = inner.replace("\\\"", "\"").replace("\\\\", "\\");
            Ok(Clause { field: field.trim().to_owned(), op: op.trim().to_owned(), value })
        })
        .collect()
}

/// Whether an entry matches a clause; an error for a field or operator this fake does not know.
fn matches(entry: &Value, clause: &Clause) -> Result<bool, String> {
    let field = match clause.field.as_str() {
        "logName" => &entry["logName"],
        "timestamp" => &entry["timestamp"],
        label => match label.strip_prefix("labels.") {
            Some(key) => &entry["labels"][key.trim_matches('"')],
            None => return Err(format!("unknown field {label}")),
        },
    };
    let Some(actual) = field.as_str() else { return Ok(false) };
    match (clause.field.as_str(), clause.op.as_str()) {
        ("timestamp", ">=") => {
            let time = |t: &str| chrono::DateTime::parse_from_rfc3339(t).map_err(|e| format!("{t:?}: {e}"));
            Ok(time(actual)? >= time(&clause.value)?)
        }
        (_, "=") => Ok(actual == clause.value),
        (_, "=~") => {
            let regex = regex::Regex::new(&clause.value).map_err(|e| format!("{:?}: {e}", clause.value))?;
            Ok(regex.is_match(actual))
        }
        (field, op) => Err(format!("operator {op} on {field} is not one Fairway uses")),
    }
}

async fn list_log_entries(
    State(s): State<Shared>,
    headers: HeaderMap,
    Json(body): Json<Value>,
) -> (StatusCode, Json<Value>) {
    let fake = &s.fake;
    if !fake.authorized(&headers) {
        return error(StatusCode::UNAUTHORIZED, "UNAUTHENTICATED", "no valid access token");
    }
    for v in validate(&fake.logging_doc, "ListLogEntriesRequest", &body, Direction::Request) {
        fake.violation(format!("entries:list: {v}"));
    }
    fake.state.lock().unwrap().log_requests.push(body.clone());
    let project = format!("projects/{}", fake.project);
    if body["resourceNames"] != json!([project]) {
        fake.violation(format!("entries:list: resourceNames {} is not [{project:?}]", body["resourceNames"]));
    }
    if body["orderBy"] != "timestamp asc" {
        fake.violation(format!("entries:list: orderBy {} is not \"timestamp asc\"", body["orderBy"]));
    }
    let clauses = match parse_filter(body["filter"].as_str().unwrap_or_default()) {
        Ok(clauses) => clauses,
        Err(e) => {
            fake.violation(format!("entries:list: filter: {e}"));
            return error(StatusCode::BAD_REQUEST, "INVALID_ARGUMENT", &e);
        }
    };
    let entries = fake.state.lock().unwrap().log_entries.clone();
    let mut selected = Vec::new();
    for entry in &entries {
        match clauses.iter().map(|c| matches(entry, c)).collect::<Result<Vec<bool>, String>>() {
            Ok(all) if all.iter().all(|m| *m) => selected.push(entry.clone()),
            Ok(_) => {}
            Err(e) => {
                fake.violation(format!("entries:list: filter: {e}"));
                return error(StatusCode::BAD_REQUEST, "INVALID_ARGUMENT", &e);
            }
        }
    }
    // Oldest first, ties in insertion order (the service breaks them by insertId).
    selected.sort_by_key(|e| chrono::DateTime::parse_from_rfc3339(e["timestamp"].as_str().unwrap()).unwrap());
    let size = body["pageSize"].as_u64().unwrap_or(50).min(1000) as usize;
    let offset: usize = body["pageToken"].as_str().map_or(0, |t| t.parse().unwrap_or(0));
    let page: Vec<Value> = selected.iter().skip(offset).take(size).cloned().collect();
    let mut answer = json!({ "entries": page });
    if offset + size < selected.len() {
        answer["nextPageToken"] = json!((offset + size).to_string());
    }
    for v in validate(&fake.logging_doc, "ListLogEntriesResponse", &answer, Direction::Response) {
        fake.violation(format!("entries:list answer: {v}"));
    }
    (StatusCode::OK, Json(answer))
}

async fn create(
    State(s): State<Shared>,
    headers: HeaderMap,
    Query(query): Query<BTreeMap<String, String>>,
    Json(body): Json<Value>,
) -> (StatusCode, Json<Value>) {
    let fake = &s.fake;
    if !fake.authorized(&headers) {
        return error(StatusCode::UNAUTHORIZED, "UNAUTHENTICATED", "no valid access token");
    }
    for v in validate(&fake.doc, "Job", &body, Direction::Request) {
        fake.violation(format!("create: {v}"));
    }
    let Some(id) = query.get("jobId").cloned() else {
        return error(StatusCode::BAD_REQUEST, "INVALID_ARGUMENT", "jobId is required by Fairway's contract");
    };
    let valid_id = id.len() <= 63
        && id.starts_with(|c: char| c.is_ascii_lowercase())
        && id.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !id.ends_with('-');
    if !valid_id {
        fake.violation(format!("create: job id {id:?} breaks ^[a-z]([a-z0-9-]{{0,61}}[a-z0-9])?$"));
        return error(StatusCode::BAD_REQUEST, "INVALID_ARGUMENT", "invalid job id");
    }
    let request_id = query.get("requestId").cloned().unwrap_or_default();
    let mut state = fake.state.lock().unwrap();
    if state.jobs.contains_key(&id) {
        return error(StatusCode::CONFLICT, "ALREADY_EXISTS", &format!("job {id} already exists"));
    }
    let mut job = body;
    let name = format!("{}/jobs/{id}", fake.parent);
    job["name"] = json!(name);
    job["uid"] = json!(format!("{id}-uid"));
    job["createTime"] = json!(now());
    job["updateTime"] = json!(now());
    job["status"] = json!({"state": "QUEUED", "statusEvents": [{
        "type": "STATUS_CHANGED", "eventTime": now(), "description": format!("Job state is set to QUEUED for job {name}.")}]});
    state.jobs.insert(id.clone(), job.clone());
    state.creates.push((id, request_id));
    drop(state);
    fake.answer("Job", job)
}

async fn list(
    State(s): State<Shared>,
    headers: HeaderMap,
    Query(query): Query<BTreeMap<String, String>>,
) -> (StatusCode, Json<Value>) {
    let fake = &s.fake;
    if !fake.authorized(&headers) {
        return error(StatusCode::UNAUTHORIZED, "UNAUTHENTICATED", "no valid access token");
    }
    // The one filter Fairway sends: labels.KEY="VALUE".
    let wanted = query.get("filter").and_then(|f| {
        let (key, value) = f.strip_prefix("labels.")?.split_once('=')?;
        Some((key.to_owned(), value.trim_matches('"').to_owned()))
    });
    let jobs: Vec<Value> =
        fake.jobs().into_values().filter(|j| wanted.as_ref().is_none_or(|(k, v)| j["labels"][k] == json!(v))).collect();
    fake.answer("ListJobsResponse", json!({ "jobs": jobs }))
}

async fn get_job(
    State(s): State<Shared>,
    headers: HeaderMap,
    UrlPath(id): UrlPath<String>,
) -> (StatusCode, Json<Value>) {
    let fake = &s.fake;
    if !fake.authorized(&headers) {
        return error(StatusCode::UNAUTHORIZED, "UNAUTHENTICATED", "no valid access token");
    }
    match fake.jobs().remove(&id) {
        Some(job) => fake.answer("Job", job),
        None => error(StatusCode::NOT_FOUND, "NOT_FOUND", &format!("job {id} not found")),
    }
}

async fn cancel(
    State(s): State<Shared>,
    headers: HeaderMap,
    UrlPath(id): UrlPath<String>,
    Json(body): Json<Value>,
) -> (StatusCode, Json<Value>) {
    let fake = &s.fake;
    if !fake.authorized(&headers) {
        return error(StatusCode::UNAUTHORIZED, "UNAUTHENTICATED", "no valid access token");
    }
    let Some(id) = id.strip_suffix(":cancel") else {
        return error(StatusCode::NOT_FOUND, "NOT_FOUND", "no such method");
    };
    for v in validate(&fake.doc, "CancelJobRequest", &body, Direction::Request) {
        fake.violation(format!("cancel: {v}"));
    }
    let state = fake.jobs().get(id).map(|j| j["status"]["state"].as_str().unwrap_or_default().to_owned());
    match state.as_deref() {
        None => error(StatusCode::NOT_FOUND, "NOT_FOUND", &format!("job {id} not found")),
        Some("SUCCEEDED" | "FAILED" | "CANCELLED") => {
            error(StatusCode::BAD_REQUEST, "FAILED_PRECONDITION", "the job has already finished")
        }
        Some(_) => {
            // The VMs go at once here; the real service takes a while.
            fake.drive(id, "CANCELLED", None);
            fake.answer("Operation", json!({"name": format!("{}/operations/cancel-{id}", fake.parent), "done": true}))
        }
    }
}

async fn delete(
    State(s): State<Shared>,
    headers: HeaderMap,
    UrlPath(id): UrlPath<String>,
) -> (StatusCode, Json<Value>) {
    let fake = &s.fake;
    if !fake.authorized(&headers) {
        return error(StatusCode::UNAUTHORIZED, "UNAUTHENTICATED", "no valid access token");
    }
    match fake.state.lock().unwrap().jobs.remove(&id) {
        Some(_) => {}
        None => return error(StatusCode::NOT_FOUND, "NOT_FOUND", &format!("job {id} not found")),
    }
    fake.answer("Operation", json!({"name": format!("{}/operations/delete-{id}", fake.parent), "done": true}))
}
