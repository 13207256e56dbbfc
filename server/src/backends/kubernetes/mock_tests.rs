//! Exact request shapes, and the answers a real API server in a test cannot be made to give
//! (throttling, server errors, quota refusals), through kube-rs' `tower-test` mock: a fake
//! server that answers the watches' lists with nothing and records every other request.

use crate::domain::JobId;
use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use axum::http::{Request, Response, StatusCode};
use kube::client::Body;
use serde_json::{json, Value};

use super::*;
use crate::backends::ReplicaSlot;

/// A request as the fake server saw it.
#[derive(Debug, Clone)]
struct Seen {
    method: String,
    path: String,
    query: String,
    content_type: String,
    body: Value,
}

/// Answers: lists and watches get empty results, `GET` of a Service 404, and every write the
/// next scripted answer (status, body), or 200 echoing the object when the script is empty.
fn fake_server(script: Vec<(u16, Value)>) -> (Client, Arc<Mutex<Vec<Seen>>>) {
    let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let record = seen.clone();
    tokio::spawn(async move {
        let mut script = script.into_iter();
        while let Some((request, respond)) = handle.next_request().await {
            let (parts, body) = request.into_parts();
            let bytes = body.collect_bytes().await.unwrap_or_default();
            let query = parts.uri.query().unwrap_or_default().to_owned();
            let path = parts.uri.path().to_owned();
            let method = parts.method.to_string();
            let reply = |status: u16, body: Value| {
                Response::builder()
                    .status(StatusCode::from_u16(status).unwrap())
                    .header("content-type", "application/json")
                    .body(Body::from(serde_json::to_vec(&body).unwrap()))
                    .unwrap()
            };
            if method == "GET" && query.contains("watch=true") {
                // A watch that stays open with nothing to say: dropping the responder would
                // end it, so hold it until the test ends.
                std::mem::forget(respond);
                continue;
            }
            if method == "GET" && !path.contains("/services/") {
                let list =
                    json!({"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": "1"}, "items": []});
                respond.send_response(reply(200, list));
                continue;
            }
            if method == "GET" {
                respond.send_response(reply(
                    404,
                    json!({"kind": "Status", "code": 404, "reason": "NotFound", "message": "not found"}),
                ));
                continue;
            }
            let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
            let content_type =
                parts.headers.get("content-type").and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
            record.lock().unwrap().push(Seen { method, path, query, content_type, body: body.clone() });
            let (status, answer) = script.next().unwrap_or_else(|| {
                let mut echo = body;
                echo["metadata"]["uid"] = json!("uid-1");
                (200, echo)
            });
            respond.send_response(reply(status, answer));
        }
    });
    (Client::new(service, "default"), seen)
}

fn config() -> KubeClusterConfig {
    toml::from_str("name = \"gpu\"\nserver = \"https://example.invalid\"").unwrap()
}

fn gang(replicas: usize) -> Gang {
    Gang {
        object: crate::backends::object_name(JobId::from_u128(9), 1),
        job_id: JobId::from_u128(9),
        attempt: 1,
        team: "vision".into(),
        job_name: "train".into(),
        gpu_class: "h100-80gb".into(),
        priority_class: "production".into(),
        image: "nvcr.io/nvidia/pytorch:24.05-py3".into(),
        command: vec![],
        env: BTreeMap::new(),
        labels: BTreeMap::new(),
        max_runtime: Duration::from_secs(600),
        cpu_millis: None,
        memory_mib: None,
        workload: Default::default(),
        replicas: (0..replicas).map(|i| ReplicaSlot { node: format!("n{i}"), gpus: vec![0, 1] }).collect(),
        array: None,
        service: None,
        extra_of: None,
    }
}

fn backend(client: Client) -> KubeBackend {
    let wake = Wake { reconcile: Arc::default(), inventory: Arc::default() };
    KubeBackend::start(client, config(), wake)
}

fn status(code: u16, reason: &str, message: &str) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code, "reason": reason, "message": message})
}

#[tokio::test]
async fn a_gang_is_written_by_server_side_apply_with_one_field_manager_service_first_then_marked_complete() {
    let (client, seen) = fake_server(vec![]);
    backend(client).submit(&gang(2)).await.unwrap();
    let seen = seen.lock().unwrap().clone();
    let writes: Vec<(String, String)> = seen.iter().map(|s| (s.method.clone(), s.path.clone())).collect();
    let object = gang(1).object;
    assert_eq!(
        writes,
        [
            ("PATCH".to_owned(), "/api/v1/namespaces/fw-vision".to_owned()),
            (
                "PATCH".into(),
                "/apis/networking.k8s.io/v1/namespaces/fw-vision/networkpolicies/fairway-team-isolation".into()
            ),
            ("PATCH".into(), format!("/api/v1/namespaces/fw-vision/services/{object}")),
            ("PATCH".into(), format!("/api/v1/namespaces/fw-vision/pods/{object}-0")),
            ("PATCH".into(), format!("/api/v1/namespaces/fw-vision/pods/{object}-1")),
            ("PATCH".into(), format!("/api/v1/namespaces/fw-vision/services/{object}")),
        ]
    );
    for s in &seen {
        assert_eq!(s.content_type, "application/apply-patch+yaml", "{s:?}");
        assert!(s.query.contains("fieldManager=fairway") && s.query.contains("force=true"), "{s:?}");
    }
    assert!(seen[2].body["metadata"]["annotations"].get(manifest::COMPLETE_ANNOTATION).is_none());
    assert_eq!(seen[5].body["metadata"]["annotations"][manifest::COMPLETE_ANNOTATION], "true");
    // The pods are owned by the Service the server answered with.
    assert_eq!(seen[3].body["metadata"]["ownerReferences"][0]["uid"], "uid-1");
    // Not in the inventory cache: pinned by the node's name, whole GPUs requested.
    assert_eq!(seen[4].body["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"], "2");
}

#[tokio::test]
async fn api_answers_map_to_the_dispatchers_retry_classes() {
    let cases = [
        (status(429, "TooManyRequests", "rate limited, retry after 1s"), "transient"),
        (status(500, "InternalError", "etcd leader changed"), "transient"),
        (status(409, "Conflict", "the object has been modified"), "transient"),
        (status(403, "Forbidden", "pods \"x\" is forbidden: exceeded quota: fairway-gpus"), "capacity"),
        (status(422, "Invalid", "Pod \"x\" is invalid: spec.containers[0].image: Required value"), "rejected"),
    ];
    for (answer, expected) in cases {
        let code = answer["code"].as_u64().unwrap() as u16;
        // Namespace and policy succeed; the Service apply gets the answer.
        let (client, _) = fake_server(vec![(200, json!({})), (200, json!({})), (code, answer.clone())]);
        let err = backend(client).submit(&gang(1)).await.unwrap_err();
        let class = match &err {
            BackendError::Transient(_) => "transient",
            BackendError::CapacityUnavailable(_) => "capacity",
            BackendError::Rejected(_) => "rejected",
        };
        assert_eq!(class, expected, "{answer}: {err}");
        assert!(err.to_string().contains("cluster gpu: apply service"), "{err}");
    }
}

#[tokio::test]
async fn stopping_a_gang_the_cluster_never_had_succeeds_without_writing() {
    let (client, seen) = fake_server(vec![]);
    backend(client).stop("fw-00000000000000000000000000000009-1", Duration::from_secs(30)).await.unwrap();
    assert!(seen.lock().unwrap().is_empty());
}

/// The log requests a fake server saw: path and query.
type LogRequests = Arc<Mutex<Vec<(String, String)>>>;

/// A server that knows one gang, in namespace `fw-vision`, and answers its pods' logs with
/// `(status, text)`; records the log requests' paths and queries.
fn log_server(status: u16, text: &'static str) -> (Client, LogRequests) {
    let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let record = seen.clone();
    tokio::spawn(async move {
        while let Some((request, respond)) = handle.next_request().await {
            let (path, query) = (request.uri().path().to_owned(), request.uri().query().unwrap_or_default().to_owned());
            if query.contains("watch=true") {
                std::mem::forget(respond);
                continue;
            }
            let (status, content_type, body) = if path.ends_with("/log") {
                record.lock().unwrap().push((path, query));
                let body = if status == 200 {
                    text.as_bytes().to_vec()
                } else {
                    serde_json::to_vec(&status_body(status, text)).unwrap()
                };
                (status, if status == 200 { "text/plain" } else { "application/json" }, body)
            } else if path == "/api/v1/services" && query.contains("fairway.dev%2Fobject") {
                let service = json!({"metadata": {"name": gang(1).object, "namespace": "fw-vision"}});
                let list = json!({"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": "1"}, "items": [service]});
                (200, "application/json", serde_json::to_vec(&list).unwrap())
            } else {
                let list =
                    json!({"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": "1"}, "items": []});
                (200, "application/json", serde_json::to_vec(&list).unwrap())
            };
            let response = Response::builder()
                .status(StatusCode::from_u16(status).unwrap())
                .header("content-type", content_type)
                .body(Body::from(body))
                .unwrap();
            respond.send_response(response);
        }
    });
    (Client::new(service, "default"), seen)
}

fn log_query(replica: u32, since: Option<chrono::DateTime<Utc>>) -> LogQuery {
    LogQuery { object: gang(1).object, replica, since, limit: 100 }
}

#[tokio::test]
async fn a_replicas_log_is_its_pods_main_container_read_with_timestamps_from_the_second_of_since() {
    let text = "2026-11-25T10:00:00.250Z step 1\n2026-11-25T10:00:00.750Z step 2\n";
    let (client, seen) = log_server(200, text);
    // Half past the second: the server is asked from the second itself, never the next.
    let since = chrono::DateTime::parse_from_rfc3339("2026-11-25T10:00:00.600Z").unwrap().with_timezone(&Utc);
    let lines = backend(client).logs(&log_query(1, Some(since))).await.unwrap();
    let texts: Vec<&str> = lines.iter().map(|l| l.text.as_str()).collect();
    assert_eq!(texts, ["step 1", "step 2"]);
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 1, "{seen:?}");
    let (path, query) = &seen[0];
    assert_eq!(path, &format!("/api/v1/namespaces/fw-vision/pods/{}-1/log", gang(1).object));
    let mut pairs: Vec<&str> = query.split('&').filter(|p| !p.is_empty()).collect();
    pairs.sort_unstable();
    assert_eq!(
        pairs,
        ["container=main", "limitBytes=1048576", "sinceTime=2026-11-25T10%3A00%3A00Z", "timestamps=true"]
    );
}

#[tokio::test]
async fn a_pod_that_is_gone_or_not_started_has_no_lines_and_a_server_error_is_transient() {
    let (client, _) = log_server(404, "pods \"x\" not found");
    assert_eq!(backend(client).logs(&log_query(0, None)).await.unwrap(), []);
    let (client, _) = log_server(400, "container \"main\" in pod \"x\" is waiting to start: ContainerCreating");
    assert_eq!(backend(client).logs(&log_query(0, None)).await.unwrap(), []);
    let (client, _) = log_server(500, "Get \"https://10.0.0.7:10250/containerLogs\": dial tcp: i/o timeout");
    let err = backend(client).logs(&log_query(0, None)).await.unwrap_err();
    assert!(matches!(err, BackendError::Transient(_)), "{err}");
    assert!(err.to_string().contains("read pod log"), "{err}");
}

fn status_body(code: u16, message: &str) -> Value {
    status(code, if code == 404 { "NotFound" } else { "BadRequest" }, message)
}
