//! The manifests under `deploy/kubernetes`, as an operator meets them: what `kubectl apply -k
//! deploy/kubernetes` sends is accepted by a real API server (`common::kube_peer`, v1.20) and
//! kept field for field, applying it never overwrites a Secret the operator created, and the
//! pieces that must agree do: the disruption budget, network policy and PodMonitor with the
//! Deployment's pods and port, the metrics token with what Fairway checks, and the
//! highly available PostgreSQL examples with `deploy/README.md`.

mod common;

use std::{
    collections::BTreeSet,
    fs,
    path::{Path, PathBuf},
};

use common::kube_peer;
use kube::{
    api::{Api, DynamicObject, GroupVersionKind, PostParams},
    discovery::{self, Scope},
};
use serde_json::{Map, Value};

fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy")
}

fn base_dir() -> PathBuf {
    deploy_dir().join("kubernetes")
}

fn read(path: &Path) -> String {
    fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Every non-empty YAML document of a file.
fn documents(path: &Path) -> Vec<Value> {
    serde_yaml::Deserializer::from_str(&read(path))
        .map(|doc| serde::Deserialize::deserialize(doc).unwrap_or_else(|e| panic!("{}: {e}", path.display())))
        .filter(|object: &Value| !object.is_null())
        .collect()
}

/// The `resources` of the kustomization in `dir`, as written.
fn resources(dir: &Path) -> Vec<String> {
    let kustomization = documents(&dir.join("kustomization.yaml"));
    assert_eq!(kustomization.len(), 1, "one document in {}/kustomization.yaml", dir.display());
    kustomization[0]["resources"]
        .as_array()
        .expect("a list of resources")
        .iter()
        .map(|r| r.as_str().expect("a path").to_owned())
        .collect()
}

/// Every object the base kustomization applies, with the file it comes from.
fn base() -> Vec<(String, Value)> {
    let dir = base_dir();
    resources(&dir)
        .into_iter()
        .flat_map(|file| documents(&dir.join(&file)).into_iter().map(move |object| (file.clone(), object)))
        .collect()
}

/// The one object of `kind` among `objects`.
fn the<'a>(objects: impl IntoIterator<Item = &'a Value>, kind: &str) -> &'a Value {
    let found: Vec<&Value> = objects.into_iter().filter(|o| o["kind"] == kind).collect();
    assert_eq!(found.len(), 1, "exactly one {kind}");
    found[0]
}

fn base_one(objects: &[(String, Value)], kind: &str) -> Value {
    the(objects.iter().map(|(_, o)| o), kind).clone()
}

fn labels(deployment: &Value) -> &Map<String, Value> {
    deployment["spec"]["template"]["metadata"]["labels"].as_object().expect("pod template labels")
}

/// Whether a label selector (matchLabels only, which is all the manifests use) picks pods
/// carrying `labels`. An empty selector would pick every pod in the namespace: not ours.
fn selects(selector: &Value, labels: &Map<String, Value>) -> bool {
    assert!(selector.get("matchExpressions").is_none(), "matchLabels only: {selector}");
    let wanted = selector["matchLabels"].as_object().expect("matchLabels");
    !wanted.is_empty() && wanted.iter().all(|(k, v)| labels.get(k) == Some(v))
}

/// The server container of the Deployment.
fn server(deployment: &Value) -> &Value {
    let containers = deployment["spec"]["template"]["spec"]["containers"].as_array().expect("containers");
    containers.iter().find(|c| c["name"] == "fairway").expect("a container named fairway")
}

/// Every container of the pod template, init containers included.
fn all_containers(deployment: &Value) -> impl Iterator<Item = &Value> {
    let pod = &deployment["spec"]["template"]["spec"];
    ["initContainers", "containers"].into_iter().flat_map(move |k| pod[k].as_array().into_iter().flatten())
}

/// The Secret, key and `optional` flag an env variable of `container` is read from.
fn secret_key_of(container: &Value, variable: &str) -> (String, String, bool) {
    let env = container["env"].as_array().expect("env");
    let var = env.iter().find(|e| e["name"] == variable).unwrap_or_else(|| panic!("no {variable}"));
    let r = &var["valueFrom"]["secretKeyRef"];
    (
        r["name"].as_str().expect("secret name").to_owned(),
        r["key"].as_str().expect("secret key").to_owned(),
        r["optional"].as_bool().unwrap_or(false),
    )
}

/// The object as the peer can take it. policy/v1 PodDisruptionBudget is what clusters of
/// 1.21 and newer need (1.25 removed v1beta1), so the file keeps it; the peer is a v1.20
/// API server, which serves only policy/v1beta1, whose PodDisruptionBudget has the same
/// fields but for `unhealthyPodEvictionPolicy` (1.26). Anything else is sent unchanged.
fn as_served_by_peer(mut object: Value) -> Value {
    if object["apiVersion"] == "policy/v1" && object["kind"] == "PodDisruptionBudget" {
        object["apiVersion"] = "policy/v1beta1".into();
        if let Some(spec) = object["spec"].as_object_mut() {
            spec.remove("unhealthyPodEvictionPolicy");
        }
    }
    object
}

/// Paths of `sent` that `stored` lacks or holds differently. A v1.20 API server drops
/// unknown (misspelt, misplaced) fields without an error (strict field validation came in
/// 1.25), so only comparing what it stored with what was sent catches them.
fn dropped(sent: &Value, stored: &Value, path: &str, out: &mut Vec<String>) {
    match (sent, stored) {
        (Value::Object(sent), Value::Object(stored)) => {
            for (k, v) in sent {
                match stored.get(k) {
                    Some(w) => dropped(v, w, &format!("{path}.{k}"), out),
                    None => out.push(format!("{path}.{k} (dropped)")),
                }
            }
        }
        (Value::Array(sent), Value::Array(stored)) if sent.len() == stored.len() => {
            for (i, (v, w)) in sent.iter().zip(stored).enumerate() {
                dropped(v, w, &format!("{path}[{i}]"), out);
            }
        }
        _ if sent == stored => {}
        _ => out.push(format!("{path}: sent {sent}, stored {stored}")),
    }
}

/// `kubectl apply -k deploy/kubernetes` would succeed: every object the base kustomization
/// lists is a kind the API server serves, passes its validation and admission in a
/// server-side dry run, and is stored with every field it was sent. This also proves the
/// kustomization names only files that exist and lists no kind from a CRD (a PodMonitor, a
/// CloudNativePG Cluster) that a cluster may lack.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_object_of_the_base_kustomization_is_accepted_and_kept_whole_by_a_real_api_server() {
    let client = kube_peer::peer().admin().await;
    let mut objects = base();
    assert!(objects.len() >= 8, "the base lists the manifests of deploy/README.md: {}", objects.len());
    // A dry run creates nothing, and namespaced objects need their namespace to exist, so
    // the Namespace is created for real, first (as kustomize orders it).
    objects.sort_by_key(|(_, o)| o["kind"] != "Namespace");
    for (file, object) in objects {
        let object = as_served_by_peer(object);
        let (api_version, kind) = (object["apiVersion"].as_str().unwrap(), object["kind"].as_str().unwrap());
        let name = object["metadata"]["name"].as_str().unwrap_or_else(|| panic!("{file}: {kind} without a name"));
        let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
        let (resource, capabilities) = discovery::pinned_kind(&client, &GroupVersionKind::gvk(group, version, kind))
            .await
            .unwrap_or_else(|e| panic!("{file}: the API server does not serve {api_version} {kind}: {e}"));
        let api: Api<DynamicObject> = match capabilities.scope {
            Scope::Cluster => Api::all_with(client.clone(), &resource),
            Scope::Namespaced => {
                // The kustomization sets no namespace, so one left out would land in `default`.
                let ns = object["metadata"]["namespace"].as_str();
                Api::namespaced_with(
                    client.clone(),
                    ns.unwrap_or_else(|| panic!("{file}: {kind} {name} names no namespace")),
                    &resource,
                )
            }
        };
        let dynamic: DynamicObject = serde_json::from_value(object.clone()).expect("an object");
        let for_real = kind == "Namespace";
        let created = api.create(&PostParams { dry_run: !for_real, field_manager: None }, &dynamic).await;
        let stored = match created {
            Ok(stored) => stored,
            Err(kube::Error::Api(status)) if for_real && status.code == 409 => api.get(name).await.expect("namespace"),
            Err(e) => panic!("{file}: the API server refused {kind} {name}: {e}"),
        };
        let mut lost = Vec::new();
        dropped(&object, &serde_json::to_value(stored).expect("json"), "", &mut lost);
        assert!(lost.is_empty(), "{file}: {kind} {name} was not stored as sent: {lost:#?}");
    }
}

/// `kubectl apply -k` must never overwrite the Secrets the operator created, so the base
/// lists none; the Deployment reads exactly the Secrets that `deploy/README.md` tells the
/// operator to create, with the keys `secret.example.yaml` documents.
#[test]
fn applying_the_base_kustomization_never_overwrites_a_secret_the_operator_created() {
    let objects = base();
    let secrets: Vec<&String> = objects.iter().filter(|(_, o)| o["kind"] == "Secret").map(|(f, _)| f).collect();
    assert!(secrets.is_empty(), "Secrets listed by the kustomization, in {secrets:?}");

    let deployment = base_one(&objects, "Deployment");
    let mut read: BTreeSet<String> = BTreeSet::new();
    for container in all_containers(&deployment) {
        for from in container["envFrom"].as_array().into_iter().flatten() {
            read.extend(from["secretRef"]["name"].as_str().map(str::to_owned));
        }
        for var in container["env"].as_array().into_iter().flatten() {
            read.extend(var["valueFrom"]["secretKeyRef"]["name"].as_str().map(str::to_owned));
        }
    }
    assert!(read.contains("fairway-secrets"), "the Deployment reads fairway-secrets: {read:?}");

    let examples = documents(&base_dir().join("secret.example.yaml"));
    let documented: BTreeSet<String> =
        examples.iter().map(|s| s["metadata"]["name"].as_str().expect("name").to_owned()).collect();
    assert_eq!(documented, read, "secret.example.yaml documents the Secrets the Deployment reads");

    let readme = read_readme();
    for secret in &examples {
        assert_eq!(secret["kind"], "Secret");
        let name = secret["metadata"]["name"].as_str().unwrap();
        assert!(readme.contains(&format!("create secret generic {name}")), "README creates {name}");
        for key in secret["stringData"].as_object().expect("stringData").keys() {
            assert!(readme.contains(&format!("--from-literal={key}=")), "README's {name} sets {key}");
        }
    }
}

/// A file in `deploy/kubernetes` that the kustomization forgets is a manifest nobody
/// applies; examples (`*.example.yaml`) are the deliberate exception.
#[test]
fn every_manifest_beside_the_base_kustomization_is_applied_by_it_unless_it_is_an_example() {
    let dir = base_dir();
    let listed: BTreeSet<String> = resources(&dir).into_iter().collect();
    let mut manifests = BTreeSet::new();
    for entry in fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_str().unwrap().to_owned();
        if path.is_file() && name.ends_with(".yaml") && name != "kustomization.yaml" && !name.ends_with(".example.yaml")
        {
            manifests.insert(name);
        }
    }
    assert_eq!(manifests, listed);
}

/// A drain or an upgrade takes at most one server pod at a time, so one replica keeps
/// serving, and can always take one, so a drain never waits forever.
#[test]
fn the_disruption_budget_covers_the_server_pods_and_keeps_one_serving_through_a_drain() {
    let objects = base();
    let deployment = base_one(&objects, "Deployment");
    let budget = base_one(&objects, "PodDisruptionBudget");
    assert_eq!(budget["metadata"]["namespace"], deployment["metadata"]["namespace"]);
    assert!(selects(&budget["spec"]["selector"], labels(&deployment)), "the budget selects the server pods");
    let replicas = deployment["spec"]["replicas"].as_i64().expect("replicas");
    let spec = &budget["spec"];
    let disrupted = match (spec["maxUnavailable"].as_i64(), spec["minAvailable"].as_i64()) {
        (Some(max_unavailable), None) => max_unavailable,
        (None, Some(min_available)) => replicas - min_available,
        _ => panic!("one of maxUnavailable and minAvailable, as a number: {spec}"),
    };
    assert!(disrupted >= 1, "a drain may take a pod");
    assert!(replicas - disrupted >= 1, "one of {replicas} replicas keeps serving");
}

/// The policy selects Fairway's server pods and lets in only what reaches the port the
/// server listens on (FAIRWAY_LISTEN), which is also where Prometheus scrapes /metrics.
#[test]
fn the_network_policy_admits_traffic_only_to_the_port_fairway_listens_on() {
    let objects = base();
    let deployment = base_one(&objects, "Deployment");
    let policy = base_one(&objects, "NetworkPolicy");
    assert_eq!(policy["metadata"]["namespace"], deployment["metadata"]["namespace"]);
    assert!(selects(&policy["spec"]["podSelector"], labels(&deployment)), "the policy selects the server pods");
    let types = policy["spec"]["policyTypes"].as_array().expect("policyTypes");
    assert!(types.contains(&"Ingress".into()) && types.contains(&"Egress".into()), "{types:?}");

    let container = server(&deployment);
    let http = container["ports"].as_array().unwrap().iter().find(|p| p["name"] == "http").expect("port http");
    let listen = container["env"].as_array().unwrap().iter().find(|e| e["name"] == "FAIRWAY_LISTEN").unwrap();
    let listen_port: i64 = listen["value"].as_str().unwrap().rsplit_once(':').unwrap().1.parse().unwrap();
    assert_eq!(http["containerPort"], listen_port, "the port named http is where the server listens");

    let rules = policy["spec"]["ingress"].as_array().expect("ingress rules");
    assert!(!rules.is_empty(), "some ingress is allowed");
    for rule in rules {
        // A rule without ports admits every port.
        let ports = rule["ports"].as_array().unwrap_or_else(|| panic!("a rule without ports: {rule}"));
        for port in ports {
            assert!(port["port"] == "http" || port["port"] == listen_port, "ingress to another port: {port}");
            assert!(port.get("protocol").is_none_or(|p| p == "TCP"), "{port}");
        }
    }
}

/// Whether an egress rule lets the pods reach `port`/`protocol` at any address.
fn egress_anywhere(policy: &Value, port: i64, protocol: &str) -> bool {
    policy["spec"]["egress"].as_array().expect("egress rules").iter().any(|rule| {
        rule.get("to").is_none()
            && rule["ports"].as_array().is_none_or(|ports| {
                ports
                    .iter()
                    .any(|p| p["port"] == port && p.get("protocol").map_or("TCP", |p| p.as_str().unwrap()) == protocol)
            })
    })
}

/// Fairway's own traffic gets out: names resolve, the database answers, the `kubernetes`
/// backend reaches the API server (443 on the Service, 6443 on kubeadm-style servers), the
/// cloud batch backends reach their HTTPS APIs and the metadata service for credentials.
#[test]
fn the_network_policy_lets_fairway_reach_dns_postgresql_the_kubernetes_api_and_https() {
    let objects = base();
    let policy = base_one(&objects, "NetworkPolicy");
    for (port, protocol) in [(53, "UDP"), (53, "TCP"), (5432, "TCP"), (443, "TCP"), (6443, "TCP")] {
        assert!(egress_anywhere(&policy, port, protocol), "egress to {port}/{protocol}");
    }
    let metadata = policy["spec"]["egress"].as_array().unwrap().iter().any(|rule| {
        let to = rule["to"].as_array().into_iter().flatten();
        to.clone().any(|t| t["ipBlock"]["cidr"] == "169.254.169.254/32")
            && rule["ports"].as_array().unwrap().iter().any(|p| p["port"] == 80)
    });
    assert!(metadata, "egress to the instance metadata service");
}

/// With the Prometheus Operator, the `monitoring` Component adds a PodMonitor to the base:
/// it scrapes /metrics on the server container's port, sending the token Fairway checks
/// (the same Secret key the Deployment reads as FAIRWAY_METRICS_TOKEN), and the base itself
/// leaves it out so that it applies where that CRD is missing.
#[test]
fn the_pod_monitor_scrapes_metrics_on_the_fairway_port_with_the_token_fairway_checks() {
    let dir = base_dir().join("monitoring");
    let component = documents(&dir.join("kustomization.yaml"));
    assert_eq!(component[0]["kind"], "Component", "used from an overlay beside the base");
    let files: Vec<Value> = resources(&dir).iter().flat_map(|r| documents(&dir.join(r))).collect();
    let monitor = the(&files, "PodMonitor");
    assert_eq!(monitor["apiVersion"], "monitoring.coreos.com/v1");

    let objects = base();
    assert!(
        objects.iter().all(|(_, o)| !o["apiVersion"].as_str().unwrap().starts_with("monitoring.coreos.com/")),
        "the base applies without the Prometheus Operator"
    );
    let deployment = base_one(&objects, "Deployment");
    // Without a namespaceSelector a PodMonitor finds pods in its own namespace only, and the
    // Secret it names must be there too.
    assert_eq!(monitor["metadata"]["namespace"], deployment["metadata"]["namespace"]);
    assert!(monitor["spec"].get("namespaceSelector").is_none());
    assert!(selects(&monitor["spec"]["selector"], labels(&deployment)), "it selects the server pods");

    let container = server(&deployment);
    let port_names: Vec<&Value> = container["ports"].as_array().unwrap().iter().map(|p| &p["name"]).collect();
    let (secret, key, optional) = secret_key_of(container, "FAIRWAY_METRICS_TOKEN");
    assert!(optional, "pods start where no metrics Secret was created");
    let openapi: Value = serde_json::from_str(&read(&deploy_dir().join("../openapi/openapi.json"))).unwrap();

    let endpoints = monitor["spec"]["podMetricsEndpoints"].as_array().expect("endpoints");
    assert!(!endpoints.is_empty());
    for endpoint in endpoints {
        assert!(port_names.contains(&&endpoint["port"]), "{} is a port of the container", endpoint["port"]);
        let path = endpoint["path"].as_str().expect("path");
        assert!(openapi["paths"].get(path).is_some(), "Fairway serves {path}");
        assert_eq!(path, "/metrics");
        let auth = &endpoint["authorization"];
        assert_eq!(auth["type"], "Bearer");
        assert_eq!(
            (auth["credentials"]["name"].as_str(), auth["credentials"]["key"].as_str()),
            (Some(&*secret), Some(&*key))
        );
    }
}

fn read_readme() -> String {
    read(&deploy_dir().join("README.md"))
}

fn postgres(file: &str) -> Vec<Value> {
    documents(&base_dir().join("postgres").join(file))
}

/// The CloudNativePG example is a highly available cluster for Fairway: a primary and at
/// least two standbys, the database `fairway` owned by `fairway`, in Fairway's namespace
/// (where the README's commands read its Secret), and commits confirmed by a standby, since
/// the README promises that a failover loses no acknowledged commit.
#[test]
fn the_cloudnativepg_example_runs_three_instances_of_the_fairway_database_with_synchronous_commits() {
    let docs = postgres("cloudnativepg-cluster.yaml");
    let cluster = the(&docs, "Cluster");
    assert_eq!(cluster["apiVersion"], "postgresql.cnpg.io/v1");
    assert!(cluster["spec"]["instances"].as_i64().expect("instances") >= 3, "a primary and two standbys");
    let initdb = &cluster["spec"]["bootstrap"]["initdb"];
    assert_eq!((initdb["database"].as_str(), initdb["owner"].as_str()), (Some("fairway"), Some("fairway")));
    let deployment = base_one(&base(), "Deployment");
    assert_eq!(cluster["metadata"]["namespace"], deployment["metadata"]["namespace"]);
    let synchronous = &cluster["spec"]["postgresql"]["synchronous"];
    assert!(synchronous["number"].as_i64().is_some_and(|n| n >= 1), "synchronous: {synchronous}");
    // `required` is CloudNativePG's default; `preferred` would drop to asynchronous commits.
    assert_ne!(synchronous["dataDurability"], "preferred");
}

/// Transaction pooling breaks Fairway's leadership lock and LISTEN, so the optional
/// PgBouncer pools sessions, in front of the primary of the example's Cluster.
#[test]
fn the_pgbouncer_pooler_example_pools_sessions_in_front_of_the_primary() {
    let cluster = postgres("cloudnativepg-cluster.yaml").into_iter().find(|o| o["kind"] == "Cluster").unwrap();
    let docs = postgres("pgbouncer-pooler.yaml");
    let pooler = the(&docs, "Pooler");
    assert_eq!(pooler["apiVersion"], "postgresql.cnpg.io/v1");
    assert_eq!(pooler["spec"]["cluster"]["name"], cluster["metadata"]["name"]);
    assert_eq!(pooler["metadata"]["namespace"], cluster["metadata"]["namespace"], "a Pooler lives beside its Cluster");
    assert_ne!(pooler["metadata"]["name"], cluster["metadata"]["name"], "the two Services' names differ");
    assert_eq!(pooler["spec"]["type"], "rw", "the primary");
    assert_eq!(pooler["spec"]["pgbouncer"]["poolMode"], "session");
}

/// The README sends DATABASE_URL to the example Cluster's `-rw` Service (through the
/// `uri` of its `-app` Secret), names the pooler's Service as the alternative, and no URL
/// anywhere in the deploy docs points at a read-only Service.
#[test]
fn the_readme_points_database_url_at_the_primarys_rw_service() {
    let cluster = postgres("cloudnativepg-cluster.yaml").into_iter().find(|o| o["kind"] == "Cluster").unwrap();
    let name = cluster["metadata"]["name"].as_str().unwrap();
    let pooler = postgres("pgbouncer-pooler.yaml").into_iter().find(|o| o["kind"] == "Pooler").unwrap();
    let readme = read_readme();
    let start = readme.find("\n## Highly available PostgreSQL\n").expect("the section");
    let end = readme[start + 1..].find("\n## ").map_or(readme.len(), |e| start + 1 + e);
    let section = readme[start..end].split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(section.contains(&format!("`DATABASE_URL` must point at `{name}-rw`")), "{section}");
    assert!(section.contains(&format!("get secret {name}-app")) && section.contains("{.data.uri}"));
    assert!(section.contains(&format!("`{}`", pooler["metadata"]["name"].as_str().unwrap())));

    let mut texts = vec![readme.clone()];
    for path in [base_dir().join("secret.example.yaml"), base_dir().join("postgres/cloudnativepg-cluster.yaml")] {
        texts.push(read(&path));
    }
    for text in texts {
        for read_only in [format!("@{name}-ro"), format!("@{name}-r."), format!("@{name}-r:")] {
            assert!(!text.contains(&read_only), "a URL to a read-only Service: {read_only}");
        }
    }
}
