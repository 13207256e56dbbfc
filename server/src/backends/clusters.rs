//! The clusters file (`FAIRWAY_CLUSTERS`): the clusters Fairway dispatches to, each with the
//! backend kind that drives it. Without the file the built-in simulated cluster is the one
//! cluster.
//!
//! ```toml
//! [[cluster]]
//! name = "sim"
//! kind = "sim"
//! inventory = "sim.toml"          # optional: the simulator's inventory (its own format)
//! speedup = 10.0                  # optional
//!
//! [[cluster]]
//! name = "gpu-east"
//! kind = "kubernetes"
//! kubeconfig = "/etc/fairway/kubeconfig"   # or `server` + `token_file`; in-cluster if neither
//! context = "gpu-east"
//! namespace_prefix = "fw-"
//! rack_label = "fairway.dev/rack"
//! [cluster.gpu_products]
//! "NVIDIA-H100-80GB-HBM3" = "h100-80gb"
//! ```
//!
//! An AWS Batch cluster offers elastic pools, one per job queue and GPU class:
//!
//! ```toml
//! [[cluster]]
//! name = "aws"
//! kind = "aws-batch"
//! region = "us-east-1"
//! [[cluster.pool]]
//! name = "aws-h100-spot"
//! job_queue = "fairway-p5-spot"
//! instance_type = "p5.48xlarge"
//! gpu_class = "h100-80gb"
//! gpus_per_instance = 8
//! max_instances = 4
//! price_per_gpu_hour = 3.10
//! spot = true
//! driver_version = "550.90.07"   # optional: the driver its image runs, for jobs that require one
//! cuda_version = "12.4"          # optional
//! ```
//!
//! A Google Cloud Batch cluster is alike, with a machine type and accelerator per pool
//! (`kind = "gcp-batch"`, `project`, `location`, `[[cluster.pool]]` with `machine_type`,
//! `accelerator_type`, `gpu_class`, `gpus_per_instance`, `max_instances`,
//! `price_per_gpu_hour`, `spot`, `driver_version`, `cuda_version`).
//!
//! The settings are documented on [`KubeClusterConfig`], [`AwsBatchConfig`] and
//! [`GcpBatchConfig`].

use std::{collections::HashSet, path::PathBuf};

use serde::Deserialize;

use super::{aws_batch::AwsBatchConfig, gcp_batch::GcpBatchConfig, kubernetes::KubeClusterConfig};
use crate::domain::ClusterName;

/// One cluster, by backend kind.
#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum ClusterConfig {
    Sim(SimClusterConfig),
    Kubernetes(Box<KubeClusterConfig>),
    AwsBatch(Box<AwsBatchConfig>),
    GcpBatch(Box<GcpBatchConfig>),
}

impl ClusterConfig {
    /// The cluster's name.
    pub fn name(&self) -> &str {
        match self {
            ClusterConfig::Sim(c) => &c.name,
            ClusterConfig::Kubernetes(c) => &c.name,
            ClusterConfig::AwsBatch(c) => &c.name,
            ClusterConfig::GcpBatch(c) => &c.name,
        }
    }
}

/// A simulated cluster.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SimClusterConfig {
    pub name: String,
    /// The simulator's inventory file; the built-in one when unset.
    pub inventory: Option<PathBuf>,
    pub speedup: Option<f64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ClustersFile {
    #[serde(rename = "cluster", default)]
    clusters: Vec<ClusterConfig>,
}

/// Why a clusters file cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("clusters file: {0}")]
pub struct ClustersError(String);

/// Parses a clusters file: at least one cluster, names valid and unique.
pub fn parse(text: &str) -> Result<Vec<ClusterConfig>, ClustersError> {
    let file: ClustersFile = toml::from_str(text).map_err(|e| ClustersError(e.to_string()))?;
    if file.clusters.is_empty() {
        return Err(ClustersError("no [[cluster]] is declared".into()));
    }
    let mut names = HashSet::new();
    for cluster in &file.clusters {
        ClusterName::parse("name", cluster.name())
            .map_err(|e| ClustersError(format!("cluster name {:?}: {}", cluster.name(), e.message)))?;
        if !names.insert(cluster.name().to_owned()) {
            return Err(ClustersError(format!("cluster {:?} is declared twice", cluster.name())));
        }
        match cluster {
            ClusterConfig::AwsBatch(c) => c.validate().map_err(ClustersError)?,
            ClusterConfig::GcpBatch(c) => c.validate().map_err(ClustersError)?,
            // The speed-up replaces the inventory's own, which is held to the same rule: every
            // simulated duration is divided by it, and the simulator refuses every job of a
            // cluster whose speed-up is 0, negative or NaN. Refused here, the server does not
            // start with it.
            ClusterConfig::Sim(c) => {
                if let Some(speedup) = c.speedup.filter(|s| !(s.is_finite() && *s > 0.0)) {
                    return Err(ClustersError(format!(
                        "cluster {:?}: speedup {speedup} is not a positive number",
                        c.name
                    )));
                }
            }
            ClusterConfig::Kubernetes(_) => {}
        }
    }
    Ok(file.clusters)
}

/// Reads and parses a clusters file.
pub fn load(path: &std::path::Path) -> Result<Vec<ClusterConfig>, ClustersError> {
    let text =
        std::fs::read_to_string(path).map_err(|e| ClustersError(format!("cannot read {}: {e}", path.display())))?;
    parse(&text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_clusters_file_declares_simulated_and_kubernetes_clusters_with_defaults() {
        let clusters = parse(
            r#"
            [[cluster]]
            name = "sim"
            kind = "sim"
            speedup = 5.0

            [[cluster]]
            name = "gpu-east"
            kind = "kubernetes"
            server = "https://127.0.0.1:6443"
            token_file = "/run/token"
            [cluster.gpu_products]
            "NVIDIA-H100-80GB-HBM3" = "h100-80gb"
            "#,
        )
        .unwrap();
        assert_eq!(clusters.len(), 2);
        let ClusterConfig::Kubernetes(k) = &clusters[1] else { panic!("{clusters:?}") };
        assert_eq!(k.namespace_prefix, "fw-");
        assert_eq!(k.tolerated_taints, vec!["nvidia.com/gpu".to_owned()]);
        assert_eq!(k.gpu_products["NVIDIA-H100-80GB-HBM3"], "h100-80gb");
        assert!(matches!(&clusters[0], ClusterConfig::Sim(s) if s.speedup == Some(5.0)));
    }

    #[test]
    fn a_cloud_pool_declares_the_driver_its_image_runs_and_the_inventory_carries_it() {
        let aws = |driver: &str| {
            format!(
                "[[cluster]]\nname = \"aws\"\nkind = \"aws-batch\"\nregion = \"us-east-1\"\n[[cluster.pool]]\n\
                 name = \"p5\"\njob_queue = \"q\"\ninstance_type = \"p5.48xlarge\"\ngpu_class = \"h100-80gb\"\n\
                 gpus_per_instance = 8\nmax_instances = 2\nprice_per_gpu_hour = 3.1\n\
                 driver_version = \"{driver}\"\ncuda_version = \"12.4\"\n"
            )
        };
        let clusters = parse(&aws("550.90.07")).unwrap();
        let ClusterConfig::AwsBatch(c) = &clusters[0] else { panic!("{clusters:?}") };
        let nodes = crate::backends::pools::inventory(&c.pools);
        assert_eq!(
            (nodes[0].driver_version.as_deref(), nodes[0].cuda_version.as_deref()),
            (Some("550.90.07"), Some("12.4"))
        );
        let bad = parse(&aws("latest")).unwrap_err().to_string();
        assert!(bad.contains("pool \"p5\": driver_version"), "{bad}");
    }

    #[test]
    fn a_clusters_file_names_what_is_wrong() {
        let unknown = parse("[[cluster]]\nname = \"a\"\nkind = \"kubernetes\"\nservr = \"x\"\n").unwrap_err();
        assert!(unknown.to_string().contains("servr"), "{unknown}");
        let kind = parse("[[cluster]]\nname = \"a\"\nkind = \"slurm\"\n").unwrap_err();
        assert!(kind.to_string().contains("slurm"), "{kind}");
        let twice = parse("[[cluster]]\nname = \"a\"\nkind = \"sim\"\n[[cluster]]\nname = \"a\"\nkind = \"sim\"\n");
        assert!(twice.unwrap_err().to_string().contains("twice"));
        assert!(parse("").unwrap_err().to_string().contains("no [[cluster]]"));
        let name = parse("[[cluster]]\nname = \"Bad Name\"\nkind = \"sim\"\n").unwrap_err();
        assert!(name.to_string().contains("name"), "{name}");
        for speedup in ["0.0", "-1.0", "nan", "inf"] {
            let bad = parse(&format!("[[cluster]]\nname = \"a\"\nkind = \"sim\"\nspeedup = {speedup}\n")).unwrap_err();
            assert!(bad.to_string().contains("cluster \"a\": speedup"), "{bad}");
        }
    }
}
