//! The Kubernetes permissions the backend uses, and no more. `deploy/kubernetes/rbac.yaml`
//! grants exactly these to Fairway's ServiceAccount (a test holds the two equal), and the
//! integration tests run the backend under an account bound to nothing else.
//!
//! Cluster-wide because teams' namespaces are created on demand and the watches span them.

/// One rule: API group, resource, verbs.
pub type Rule = (&'static str, &'static str, &'static [&'static str]);

/// Every permission the backend's calls need.
pub const RULES: &[Rule] = &[
    // The inventory watch.
    ("", "nodes", &["list", "watch"]),
    // Team namespaces, applied server-side (a create when missing).
    ("", "namespaces", &["create", "patch"]),
    // The per-team GPU fence and network isolation.
    ("", "resourcequotas", &["create", "patch"]),
    ("networking.k8s.io", "networkpolicies", &["create", "patch"]),
    // Gang anchors: applied, read before a re-apply, found by label, watched, deleted.
    ("", "services", &["get", "list", "watch", "create", "patch", "delete"]),
    // Replicas: applied, watched, found by label, stopped with grace as a collection.
    ("", "pods", &["list", "watch", "create", "patch", "deletecollection"]),
    // Each replica's log, read while it runs and once more at its end.
    ("", "pods/log", &["get"]),
];
