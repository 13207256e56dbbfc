//! What the cloud batch backends share: an elastic pool (an AWS Batch job queue, a Google
//! Cloud Batch machine type) is offered to the engine as one node of `gpus_per_instance ×
//! max_instances` GPUs, and checked the same way whoever provides it.

use std::collections::HashSet;

use super::{BackendError, Gang, InventoryNode};
use crate::domain::workload::{self, CloudSecretStore};

/// The provider-independent part of a pool's declaration.
pub trait ElasticPool {
    /// The pool's name; the engine sees it as a node of the cluster.
    fn name(&self) -> &str;
    /// The GPU class its instances offer.
    fn gpu_class(&self) -> &str;
    /// GPUs per instance.
    fn gpus_per_instance(&self) -> u32;
    /// Instances that may run for Fairway at once.
    fn max_instances(&self) -> u32;
    /// Spot capacity: only jobs that allow spot run here.
    fn spot(&self) -> bool;
    /// Price per GPU-hour in the platform currency.
    fn price_per_gpu_hour(&self) -> f64;
    /// The NVIDIA driver and CUDA version its instances' image runs, as declared (a cloud
    /// pool has no GPU Feature Discovery to say): jobs that require a minimum are placed by it.
    fn drivers(&self) -> (Option<&str>, Option<&str>) {
        (None, None)
    }
}

/// The cloud secret references of `gang` for a pool of `kind` (`AWS Batch`, `Google Cloud
/// Batch`) whose store is `store`, as (variable, reference) pairs; refused, with the reason,
/// when the gang asks for what only Kubernetes has (claims, Kubernetes Secrets, pull secrets,
/// a node selector), names another cloud's secrets, or names a secret outside its team's
/// prefix (submission refuses that already; checked again where the reference is used).
pub fn cloud_secrets(
    gang: &Gang,
    cluster: &str,
    kind: &str,
    store: CloudSecretStore,
) -> Result<Vec<(String, String)>, BackendError> {
    let w = &gang.workload;
    let mut unsupported = Vec::new();
    for (asked, what) in [
        (!w.volumes.is_empty(), "mount PersistentVolumeClaims"),
        (!w.secret_env.is_empty(), "read Kubernetes Secrets (use cloud_secret_env)"),
        (!w.image_pull_secrets.is_empty(), "use image pull secrets"),
        (!w.node_selector.is_empty(), "select nodes by label"),
    ] {
        if asked {
            unsupported.push(what);
        }
    }
    if !unsupported.is_empty() {
        return Err(BackendError::Rejected(format!(
            "cluster {cluster} is {kind}, which cannot {}: only a Kubernetes cluster runs this job",
            unsupported.join(", ")
        )));
    }
    let prefix = match store {
        CloudSecretStore::Aws => workload::aws_secret_prefix(&gang.team),
        CloudSecretStore::Gcp => workload::gcp_secret_prefix(&gang.team),
    };
    w.cloud_secret_env
        .iter()
        .map(|s| match CloudSecretStore::of(&s.reference) {
            Some((found, name)) if found == store && name.starts_with(&prefix) && name.len() > prefix.len() => {
                Ok((s.name.clone(), s.reference.clone()))
            }
            Some((found, _)) if found != store => Err(BackendError::Rejected(format!(
                "cluster {cluster} is {kind} and cannot read secret {} of another cloud (variable {})",
                s.reference, s.name
            ))),
            _ => Err(BackendError::Rejected(format!(
                "cluster {cluster}: secret {} is not under team {}'s prefix {prefix} (variable {})",
                s.reference, gang.team, s.name
            ))),
        })
        .collect()
}

/// The most GPUs one pool may offer: the engine places a replica within one node.
const MAX_POOL_GPUS: u32 = 64;

/// The pools as the engine's inventory: one node each, as large as the pool may grow.
pub fn inventory<P: ElasticPool>(pools: &[P]) -> Vec<InventoryNode> {
    pools
        .iter()
        .map(|p| {
            let (driver, cuda) = p.drivers();
            InventoryNode {
                driver_version: driver.map(str::to_owned),
                cuda_version: cuda.map(str::to_owned),
                ..InventoryNode::pool(
                    p.name(),
                    p.gpu_class(),
                    p.gpus_per_instance() * p.max_instances(),
                    p.spot(),
                    p.price_per_gpu_hour(),
                )
            }
        })
        .collect()
}

/// Checks what the engine and the service would refuse later: at least one pool, unique
/// names, 1 to 64 GPUs per pool, a finite non-negative price, versions that are versions.
pub fn validate<P: ElasticPool>(cluster: &str, pools: &[P]) -> Result<(), String> {
    if pools.is_empty() {
        return Err(format!("cluster {cluster}: no [[cluster.pool]]"));
    }
    let mut names = HashSet::new();
    for p in pools {
        let bad = |why: &str| Err(format!("cluster {cluster} pool {:?}: {why}", p.name()));
        if !names.insert(p.name()) {
            return bad("declared twice");
        }
        if p.gpus_per_instance() == 0 || p.max_instances() == 0 {
            return bad("gpus_per_instance and max_instances must be at least 1");
        }
        if p.gpus_per_instance().saturating_mul(p.max_instances()) > MAX_POOL_GPUS {
            return bad("a pool offers at most 64 GPUs (gpus_per_instance × max_instances)");
        }
        let price = p.price_per_gpu_hour();
        if !(price.is_finite() && (0.0..1e6).contains(&price)) {
            return bad("price_per_gpu_hour must be a price");
        }
        let (driver, cuda) = p.drivers();
        for (field, version) in [("driver_version", driver), ("cuda_version", cuda)] {
            if let Some(Err(e)) = version.map(str::parse::<crate::domain::driver::Version>) {
                return bad(&format!("{field} {e}"));
            }
        }
    }
    Ok(())
}

/// Implements [`ElasticPool`] for a pool config with the usual field names.
macro_rules! elastic_pool {
    ($config:ty) => {
        impl $crate::backends::pools::ElasticPool for $config {
            fn name(&self) -> &str {
                &self.name
            }
            fn gpu_class(&self) -> &str {
                &self.gpu_class
            }
            fn gpus_per_instance(&self) -> u32 {
                self.gpus_per_instance
            }
            fn max_instances(&self) -> u32 {
                self.max_instances
            }
            fn spot(&self) -> bool {
                self.spot
            }
            fn price_per_gpu_hour(&self) -> f64 {
                self.price_per_gpu_hour
            }
            fn drivers(&self) -> (Option<&str>, Option<&str>) {
                (self.driver_version.as_deref(), self.cuda_version.as_deref())
            }
        }
    };
}
pub(crate) use elastic_pool;

#[cfg(test)]
mod tests {
    use super::*;

    struct Pool(&'static str, u32, u32, f64);

    impl ElasticPool for Pool {
        fn name(&self) -> &str {
            self.0
        }
        fn gpu_class(&self) -> &str {
            "h100-80gb"
        }
        fn gpus_per_instance(&self) -> u32 {
            self.1
        }
        fn max_instances(&self) -> u32 {
            self.2
        }
        fn spot(&self) -> bool {
            false
        }
        fn price_per_gpu_hour(&self) -> f64 {
            self.3
        }
    }

    #[test]
    fn a_pool_is_one_node_as_large_as_it_may_grow_and_bad_pools_are_named() {
        let nodes = inventory(&[Pool("p5", 8, 4, 3.5)]);
        assert_eq!(nodes.len(), 1);
        assert!(validate("aws", &[Pool("p5", 8, 4, 3.5)]).is_ok());
        let too_big = validate("aws", &[Pool("p5", 8, 9, 3.5)]).unwrap_err();
        assert!(too_big.contains("\"p5\"") && too_big.contains("at most 64"), "{too_big}");
        assert!(validate("aws", &[Pool("a", 1, 1, 1.0), Pool("a", 1, 1, 1.0)]).unwrap_err().contains("twice"));
        assert!(validate("aws", &[Pool("a", 1, 1, f64::NAN)]).unwrap_err().contains("price"));
        assert!(validate("aws", &[Pool("a", 0, 1, 1.0)]).unwrap_err().contains("at least 1"));
        assert!(validate::<Pool>("aws", &[]).unwrap_err().contains("no [[cluster.pool]]"));
    }

    fn gang(workload: crate::domain::workload::Workload) -> Gang {
        Gang {
            object: "fw-1-1".into(),
            job_id: crate::domain::JobId::from_u128(1),
            attempt: 1,
            team: "ml".into(),
            job_name: "train".into(),
            gpu_class: "h100-80gb".into(),
            priority_class: "experiment".into(),
            image: "img:1".into(),
            command: Vec::new(),
            env: Default::default(),
            labels: Default::default(),
            max_runtime: std::time::Duration::from_secs(60),
            cpu_millis: None,
            memory_mib: None,
            workload,
            replicas: Vec::new(),
            array: None,
            service: None,
            extra_of: None,
        }
    }

    #[test]
    fn a_cloud_pool_passes_its_own_clouds_secrets_of_the_team_and_refuses_what_only_kubernetes_has() {
        use crate::domain::workload::{CloudSecretEnv, Volume, Workload};
        let secret = |reference: &str| CloudSecretEnv { name: "TOKEN".into(), reference: reference.into() };
        let aws = "arn:aws:secretsmanager:us-east-1:1:secret:fairway/ml/token";
        let gcp = "projects/p/secrets/fairway_ml_token/versions/1";
        let both = gang(Workload { cloud_secret_env: vec![secret(aws)], ..Workload::default() });
        assert_eq!(
            cloud_secrets(&both, "aws", "AWS Batch", CloudSecretStore::Aws).unwrap(),
            [("TOKEN".to_owned(), aws.to_owned())]
        );
        let refused = |g: &Gang, store| match cloud_secrets(g, "c", "a batch service", store) {
            Err(BackendError::Rejected(m)) => m,
            other => panic!("{other:?}"),
        };
        assert!(refused(&both, CloudSecretStore::Gcp).contains("of another cloud"));
        let gcp_gang = gang(Workload { cloud_secret_env: vec![secret(gcp)], ..Workload::default() });
        assert!(cloud_secrets(&gcp_gang, "g", "Google Cloud Batch", CloudSecretStore::Gcp).is_ok());
        // A row that slipped past submission is still held to the team's prefix.
        let other = gang(Workload {
            cloud_secret_env: vec![secret("arn:aws:secretsmanager:us-east-1:1:secret:fairway/cv/token")],
            ..Workload::default()
        });
        assert!(refused(&other, CloudSecretStore::Aws).contains("not under team ml's prefix fairway/ml/"));
        let claim = gang(Workload {
            volumes: vec![Volume { claim: "data".into(), mount_path: "/data".into(), read_only: false }],
            ..Workload::default()
        });
        let m = refused(&claim, CloudSecretStore::Aws);
        assert!(m.contains("cannot mount PersistentVolumeClaims") && m.contains("only a Kubernetes cluster"), "{m}");
    }
}
