//! What a job asks for beyond GPUs: CPU and memory per replica (with defaults per GPU
//! class), PersistentVolumeClaims, secrets by reference, image pull secrets and a node
//! selector: refused with the field named when wrong, read back as asked, and carried by a
//! rerun and a template. No control loop runs here; what the backends make of it is tested
//! beside them (`server/tests/kubernetes.rs` against a real API server).

use fairway_tests::{call, TestApp, TestResponse};
use serde_json::{json, Value};

/// Team `ml` (a member, alice) with 16 reserved GPUs of `h100` and of `a100`.
async fn setup() -> (TestApp, String, String) {
    let app = TestApp::spawn().await;
    let admin = app.admin().await;
    app.gpu_class(&admin, "h100").await;
    app.gpu_class(&admin, "a100").await;
    app.team(&admin, "ml", None).await;
    app.quota(&admin, "ml", "h100", 16, 0).await;
    app.quota(&admin, "ml", "a100", 16, 0).await;
    let alice = app.user(&admin, "alice", None).await;
    app.member(&admin, "ml", "alice", "member").await;
    (app, admin, alice)
}

fn spec(changes: Value) -> Value {
    let mut body = json!({"name": "train", "gpu_class": "h100", "image": "registry.example/train:1"});
    for (key, value) in changes.as_object().expect("changes are an object") {
        body[key] = value.clone();
    }
    body
}

async fn submit(app: &TestApp, token: &str, body: &Value) -> TestResponse {
    app.send(call("POST", "/api/v1/teams/ml/jobs").token(token).json(body)).await
}

async fn get_job(app: &TestApp, token: &str, id: &str) -> Value {
    let r = app.send(call("GET", &format!("/api/v1/jobs/{id}")).token(token)).await;
    r.assert_status(200);
    r.json()
}

/// Every field the problem names, with its code.
fn fields(r: &TestResponse) -> Vec<(String, String)> {
    let doc = r.assert_problem(422, "validation_failed");
    doc["errors"]
        .as_array()
        .expect("errors")
        .iter()
        .map(|e| {
            (e["field"].as_str().unwrap_or_default().to_owned(), e["code"].as_str().unwrap_or_default().to_owned())
        })
        .collect()
}

/// A spec with every new field set.
fn complete() -> Value {
    spec(json!({
        "gpus_per_replica": 2,
        "cpu": "12",
        "memory": "96Gi",
        "env": {"SEED": "7"},
        "volumes": [
            {"claim": "datasets", "mount_path": "/data", "read_only": true},
            {"claim": "checkpoints", "mount_path": "/ckpt"},
        ],
        "secret_env": [{"name": "HF_TOKEN", "secret": "hf", "key": "token"}],
        "cloud_secret_env": [
            {"name": "WANDB_KEY", "reference": "arn:aws:secretsmanager:us-east-1:123456789012:secret:fairway/ml/wandb-AbCdEf"},
            {"name": "GCS_KEY", "reference": "projects/acme/secrets/fairway_ml_gcs/versions/latest"},
        ],
        "image_pull_secrets": ["regcred"],
        "node_selector": {"example.com/fabric": "infiniband"},
    }))
}

#[tokio::test]
async fn a_jobs_cpu_memory_volumes_secret_references_and_node_selector_read_back_as_asked_and_a_rerun_keeps_them() {
    let (app, _, alice) = setup().await;
    let r = submit(&app, &alice, &complete()).await;
    r.assert_status(201);
    let id = r.json()["id"].as_str().expect("id").to_owned();
    let job = get_job(&app, &alice, &id).await;
    assert_eq!((job["cpu"].as_str(), job["cpu_millis"].as_i64()), (Some("12"), Some(12_000)), "{job:#}");
    assert_eq!((job["memory"].as_str(), job["memory_mib"].as_i64()), (Some("96Gi"), Some(96 * 1024)));
    let asked = complete();
    assert_eq!(
        job["volumes"],
        json!([
            {"claim": "datasets", "mount_path": "/data", "read_only": true},
            {"claim": "checkpoints", "mount_path": "/ckpt", "read_only": false},
        ])
    );
    for field in ["secret_env", "cloud_secret_env", "image_pull_secrets", "node_selector"] {
        assert_eq!(job[field], asked[field], "{field}");
    }
    // A rerun asks for the same.
    let r = app.send(call("POST", &format!("/api/v1/jobs/{id}/rerun")).token(&alice)).await;
    r.assert_status(201);
    let again = get_job(&app, &alice, r.json()["id"].as_str().expect("id")).await;
    for field in ["cpu", "memory", "volumes", "secret_env", "cloud_secret_env", "image_pull_secrets", "node_selector"] {
        assert_eq!(again[field], job[field], "{field}");
    }
    // A job that names none of it reads back empty lists, not missing fields.
    let r = submit(&app, &alice, &spec(json!({}))).await;
    r.assert_status(201);
    let plain = r.json();
    assert_eq!(
        (&plain["volumes"], &plain["secret_env"], &plain["node_selector"]),
        (&json!([]), &json!([]), &json!({}))
    );
}

#[tokio::test]
async fn a_job_that_names_no_cpu_or_memory_gets_its_gpu_classs_defaults_per_gpu() {
    let (app, admin, alice) = setup().await;
    // Unset, a class gives the platform's default: 4 cores and 16Gi per GPU.
    let r = app.send(call("GET", "/api/v1/gpu-classes/a100").token(&alice)).await;
    r.assert_status(200);
    assert_eq!((r.json()["cpu_per_gpu"].as_str(), r.json()["memory_per_gpu"].as_str()), (Some("4"), Some("16Gi")));
    let r = app
        .send(
            call("PATCH", "/api/v1/gpu-classes/h100")
                .token(&admin)
                .json(&json!({"cpu_per_gpu": "12", "memory_per_gpu": "120Gi"})),
        )
        .await;
    r.assert_status(200);
    assert_eq!((r.json()["cpu_per_gpu"].as_str(), r.json()["memory_per_gpu"].as_str()), (Some("12"), Some("120Gi")));
    let r = submit(&app, &alice, &spec(json!({"gpus_per_replica": 2}))).await;
    r.assert_status(201);
    let job = get_job(&app, &alice, r.json()["id"].as_str().expect("id")).await;
    assert_eq!((job["cpu"].as_str(), job["memory"].as_str()), (Some("24"), Some("240Gi")), "{job:#}");
    let r = submit(&app, &alice, &spec(json!({"gpu_class": "a100", "gpus_per_replica": 4}))).await;
    r.assert_status(201);
    assert_eq!((r.json()["cpu"].as_str(), r.json()["memory"].as_str()), (Some("16"), Some("64Gi")));
    // What the job names wins over the class.
    let r = submit(&app, &alice, &spec(json!({"cpu": "500m", "memory": "512Mi"}))).await;
    r.assert_status(201);
    assert_eq!((r.json()["cpu"].as_str(), r.json()["memory"].as_str()), (Some("500m"), Some("512Mi")));
    // The defaults are parsed as a job's amounts are.
    let r = app
        .send(call("PATCH", "/api/v1/gpu-classes/h100").token(&admin).json(&json!({"memory_per_gpu": "120GB"})))
        .await;
    assert_eq!(fields(&r), [("memory_per_gpu".to_owned(), "invalid_quantity".to_owned())]);
}

#[tokio::test]
async fn wrong_resources_volumes_and_secret_references_are_refused_naming_the_field() {
    let (app, _, alice) = setup().await;
    let volumes = |n: usize| -> Value {
        (0..n).map(|i| json!({"claim": format!("c{i}"), "mount_path": format!("/m{i}")})).collect()
    };
    let cases = [
        (json!({"memory": "32GB"}), "memory", "invalid_quantity"),
        (json!({"memory": "0Gi"}), "memory", "out_of_range"),
        (json!({"cpu": "four"}), "cpu", "invalid_quantity"),
        (json!({"volumes": [{"claim": "data", "mount_path": "data"}]}), "volumes[0].mount_path", "not_absolute"),
        (
            json!({"volumes": [{"claim": "data", "mount_path": "/data/../etc"}]}),
            "volumes[0].mount_path",
            "invalid_path",
        ),
        (
            json!({"volumes": [{"claim": "other-team/data", "mount_path": "/data"}]}),
            "volumes[0].claim",
            "other_namespace",
        ),
        (
            json!({"volumes": [{"claim": "a", "mount_path": "/data"}, {"claim": "b", "mount_path": "/data"}]}),
            "volumes[1].mount_path",
            "duplicate",
        ),
        (json!({"volumes": volumes(17)}), "volumes", "too_many"),
        (
            json!({"secret_env": [{"name": "TOKEN", "secret": "other-ns/secret", "key": "t"}]}),
            "secret_env[0].secret",
            "other_namespace",
        ),
        (
            json!({"secret_env": [{"name": "TOKEN", "secret": "Bad_Name", "key": "t"}]}),
            "secret_env[0].secret",
            "invalid_name",
        ),
        (
            json!({"secret_env": [{"name": "FAIRWAY_RANK", "secret": "s", "key": "t"}]}),
            "secret_env[0].name",
            "reserved",
        ),
        (
            json!({"env": {"TOKEN": "x"}, "secret_env": [{"name": "TOKEN", "secret": "s", "key": "t"}]}),
            "secret_env[0].name",
            "duplicate",
        ),
        (
            json!({"cloud_secret_env": [{"name": "T", "reference": "arn:aws:secretsmanager:us-east-1:1:secret:fairway/cv/token"}]}),
            "cloud_secret_env[0].reference",
            "outside_team_prefix",
        ),
        (
            json!({"cloud_secret_env": [{"name": "T", "reference": "projects/p/secrets/prod-db/versions/1"}]}),
            "cloud_secret_env[0].reference",
            "outside_team_prefix",
        ),
        (
            json!({"cloud_secret_env": [{"name": "T", "reference": "prod-db"}]}),
            "cloud_secret_env[0].reference",
            "invalid_reference",
        ),
        (json!({"image_pull_secrets": ["kube-system/regcred"]}), "image_pull_secrets[0]", "other_namespace"),
        (json!({"node_selector": {"bad key": "x"}}), "node_selector.bad key", "invalid_name"),
        (
            json!({"node_selector": {"kubernetes.io/hostname": "n1"}}),
            "node_selector.kubernetes.io/hostname",
            "reserved",
        ),
    ];
    for (changes, field, code) in cases {
        let r = submit(&app, &alice, &spec(changes.clone())).await;
        assert_eq!(fields(&r), [(field.to_owned(), code.to_owned())], "{changes}");
    }
    // Every wrong field at once, and in a batch under the job's index.
    let batch = json!({"jobs": [spec(json!({})), spec(json!({"memory": "1.5Gi", "volumes": [{"claim": "x", "mount_path": "rel"}]}))]});
    let r = app.send(call("POST", "/api/v1/teams/ml/jobs:batch").token(&alice).json(&batch)).await;
    assert_eq!(
        fields(&r),
        [
            ("jobs[1].memory".to_owned(), "invalid_quantity".to_owned()),
            ("jobs[1].volumes[0].mount_path".to_owned(), "not_absolute".to_owned()),
        ]
    );
    let count: i64 = sqlx::query_scalar("select count(*) from jobs").fetch_one(&app.pool).await.expect("count");
    assert_eq!(count, 0, "nothing refused was stored");
}

/// The simulated cluster offers `l4-24gb` only as an elastic pool (cloud batch), which can
/// honour no claim, Kubernetes Secret, pull secret or node selector.
#[tokio::test]
async fn a_job_that_needs_kubernetes_is_refused_for_a_class_only_cloud_pools_offer_and_placed_on_nodes_otherwise() {
    let app = TestApp::spawn().await;
    crate::lifecycle::start_control(&app).await;
    crate::lifecycle::wait_for_inventory(&app).await;
    let admin = app.admin().await;
    app.team(&admin, "ml", None).await;
    app.quota(&admin, "ml", "l4-24gb", 4, 0).await;
    app.quota(&admin, "ml", "h100-80gb", 8, 0).await;
    let ml = app.api_token(&admin, "ml", "member").await.1;
    let l4 = |changes: Value| {
        let mut body = json!({"name": "infer", "gpu_class": "l4-24gb", "image": "registry.example/infer:1"});
        for (k, v) in changes.as_object().unwrap() {
            body[k] = v.clone();
        }
        body
    };
    let p = submit(&app, &ml, &l4(json!({"volumes": [{"claim": "models", "mount_path": "/models"}]})))
        .await
        .assert_problem(422, "validation_failed");
    assert_eq!(
        (p["errors"][0]["field"].as_str(), p["errors"][0]["code"].as_str()),
        (Some("volumes"), Some("cloud_pools_only")),
        "{p:#}"
    );
    assert!(
        p["errors"][0]["message"].as_str().unwrap().contains("l4-24gb is offered only by cloud batch pools"),
        "{p:#}"
    );
    let batch = json!({"jobs": [l4(json!({})), l4(json!({"node_selector": {"zone": "a"}}))]});
    let p = app
        .send(call("POST", "/api/v1/teams/ml/jobs:batch").token(&ml).json(&batch))
        .await
        .assert_problem(422, "validation_failed");
    assert_eq!(p["errors"][0]["field"], "jobs[1].node_selector", "{p:#}");
    // Without them it goes to the pool; on a class nodes offer, it is accepted and runs there.
    submit(&app, &ml, &l4(json!({}))).await.assert_status(201);
    let on_nodes = json!({"name": "train", "gpu_class": "h100-80gb", "image": "registry.example/train:1",
                          "volumes": [{"claim": "data", "mount_path": "/data"}],
                          "env": {"FAIRWAY_SIM_RUNTIME_SECONDS": "600"}});
    let r = submit(&app, &ml, &on_nodes).await;
    r.assert_status(201);
    let id = r.json()["id"].as_str().unwrap().to_owned();
    let job =
        crate::lifecycle::wait_for(&app, &ml, &id, std::time::Duration::from_secs(60), |j| j["state"] == "running")
            .await;
    assert!(job["placement"][0]["node"].as_str().unwrap().contains("h100"), "{job:#}");
}
