//! What a job's replicas get beyond GPUs, image and command: CPU and memory, volumes
//! (Kubernetes PersistentVolumeClaims), secrets by reference (Kubernetes Secrets, AWS
//! Secrets Manager or SSM parameters, Google Secret Manager secrets), image pull secrets and
//! a node selector; the wire forms, their parsers and the checks that need no catalogue.
//!
//! Fairway never stores a secret's value, only where the backend finds it. A reference never
//! reaches another team's secrets: a Kubernetes name is a bare name, looked up in the team's
//! own namespace (a `namespace/name` form is refused), and a cloud reference must name a
//! secret under its team's prefix ([`aws_secret_prefix`], [`gcp_secret_prefix`]).

use std::collections::{BTreeMap, HashSet};

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::FieldError;

/// CPU a replica gets per GPU of its class when neither the job nor the class says: 4 cores.
pub const DEFAULT_CPU_MILLIS_PER_GPU: i32 = 4_000;
/// Memory a replica gets per GPU of its class when neither the job nor the class says: 16 GiB.
pub const DEFAULT_MEMORY_MIB_PER_GPU: i32 = 16 * 1024;
/// Most CPU one replica may ask for: 1024 cores, in millicores.
pub const MAX_CPU_MILLIS: i64 = 1_024_000;
/// Most memory one replica may ask for: 16 TiB, in MiB.
pub const MAX_MEMORY_MIB: i64 = 16 * 1024 * 1024;
/// Most volumes a job may mount.
pub const MAX_VOLUMES: usize = 16;
/// Most secret references (Kubernetes and cloud together) a job may name.
pub const MAX_SECRETS: usize = 64;
/// Most image pull secrets a job may name.
pub const MAX_PULL_SECRETS: usize = 8;
/// Most node selector labels a job may name.
pub const MAX_NODE_SELECTOR: usize = 16;
const MAX_MOUNT_PATH: usize = 1024;

/// The parts of a job's spec that only its backend acts on, stored as they were validated
/// (`jobs.workload`) and carried to the backend with the gang.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Workload {
    /// PersistentVolumeClaims of the team's namespace, mounted into every replica.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<Volume>,
    /// Environment variables read from Kubernetes Secrets of the team's namespace.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub secret_env: Vec<SecretEnv>,
    /// Environment variables read from a cloud secret store (AWS Batch, Google Cloud Batch).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cloud_secret_env: Vec<CloudSecretEnv>,
    /// Secrets of the team's namespace holding registry credentials for the image.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub image_pull_secrets: Vec<String>,
    /// Node labels every replica's node must carry, on top of the node the scheduler chose.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_selector: BTreeMap<String, String>,
}

impl Workload {
    /// Whether only a Kubernetes cluster can honour it: it mounts claims, reads Kubernetes
    /// Secrets, pulls with a pull secret or selects nodes by label, which cloud batch pools
    /// do not have.
    pub fn needs_kubernetes(&self) -> bool {
        !self.volumes.is_empty()
            || !self.secret_env.is_empty()
            || !self.image_pull_secrets.is_empty()
            || !self.node_selector.is_empty()
    }
}

/// A PersistentVolumeClaim mounted into every replica.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Volume {
    /// The claim's name in the team's namespace (a DNS-1123 subdomain; no `namespace/`).
    pub claim: String,
    /// Where it appears in the container: an absolute path, no `..`, no two volumes alike.
    pub mount_path: String,
    /// Mounted read-only. Default false.
    #[serde(default)]
    pub read_only: bool,
}

impl Volume {
    /// The volume as one line of the portal's form: `CLAIM:/PATH`, `:ro` when read-only.
    pub fn line(&self) -> String {
        format!("{}:{}{}", self.claim, self.mount_path, if self.read_only { ":ro" } else { "" })
    }

    /// Reads [`Volume::line`]'s form back (`:rw` too); `None` when it is not `CLAIM:PATH`.
    /// The parts are checked where every volume is ([`check`]).
    pub fn parse_line(text: &str) -> Option<Self> {
        let (claim, rest) = text.trim().split_once(':')?;
        let (path, read_only) = match rest.rsplit_once(':') {
            Some((path, "ro")) => (path, true),
            Some((path, "rw")) => (path, false),
            _ => (rest, false),
        };
        (!claim.is_empty() && !path.is_empty()).then(|| Self {
            claim: claim.to_owned(),
            mount_path: path.to_owned(),
            read_only,
        })
    }
}

/// An environment variable whose value is one key of a Kubernetes Secret.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SecretEnv {
    /// The variable's name (the rules of `env`).
    pub name: String,
    /// The Secret's name in the team's namespace (a DNS-1123 subdomain; no `namespace/`).
    pub secret: String,
    /// The key in the Secret's data.
    pub key: String,
}

impl SecretEnv {
    /// The variable as one line of the portal's form: `NAME=SECRET:KEY`.
    pub fn line(&self) -> String {
        format!("{}={}:{}", self.name, self.secret, self.key)
    }

    /// Reads [`SecretEnv::line`]'s form back; `None` when it is not `NAME=SECRET:KEY`.
    pub fn parse_line(text: &str) -> Option<Self> {
        let (name, reference) = text.trim().split_once('=')?;
        let (secret, key) = reference.split_once(':')?;
        (!name.is_empty() && !secret.is_empty() && !key.is_empty()).then(|| Self {
            name: name.to_owned(),
            secret: secret.to_owned(),
            key: key.to_owned(),
        })
    }
}

/// An environment variable whose value a cloud batch service reads from its secret store.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CloudSecretEnv {
    /// The variable's name (the rules of `env`).
    pub name: String,
    /// An AWS Secrets Manager secret or SSM parameter ARN whose name starts with
    /// `fairway/<team>/`, or a Google Secret Manager version
    /// `projects/<project>/secrets/fairway_<team>_<name>/versions/<version>`.
    pub reference: String,
}

/// The cloud a [`CloudSecretEnv::reference`] points into.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CloudSecretStore {
    /// AWS Secrets Manager or SSM Parameter Store (AWS Batch `secrets`/`valueFrom`).
    Aws,
    /// Google Secret Manager (Google Cloud Batch `secretVariables`).
    Gcp,
}

impl CloudSecretStore {
    /// Which store `reference` names, and the secret's name in it.
    pub fn of(reference: &str) -> Option<(Self, &str)> {
        if let Some(rest) = reference.strip_prefix("arn:") {
            // arn:<partition>:<service>:<region>:<account>:<resource>
            let mut parts = rest.splitn(5, ':');
            let (_partition, service, _region, _account, resource) =
                (parts.next()?, parts.next()?, parts.next()?, parts.next()?, parts.next()?);
            let name = match service {
                "secretsmanager" => resource.strip_prefix("secret:")?,
                "ssm" => resource.strip_prefix("parameter")?.trim_start_matches('/'),
                _ => return None,
            };
            return Some((Self::Aws, name));
        }
        // projects/<project>/secrets/<id>/versions/<version>
        let parts: Vec<&str> = reference.split('/').collect();
        match parts.as_slice() {
            ["projects", project, "secrets", id, "versions", version]
                if !project.is_empty() && !id.is_empty() && !version.is_empty() =>
            {
                Some((Self::Gcp, id))
            }
            _ => None,
        }
    }
}

/// The prefix every AWS secret name a job of `team` reads must start with. Team names hold
/// no `/`, so one team's prefix never starts another's.
pub fn aws_secret_prefix(team: &str) -> String {
    format!("fairway/{team}/")
}

/// The prefix every Google secret id a job of `team` reads must start with. Secret ids hold
/// no `/`, so `_` separates; team names hold no `_`, so one team's prefix never starts
/// another's.
pub fn gcp_secret_prefix(team: &str) -> String {
    format!("fairway_{team}_")
}

/// Parses a CPU amount, Kubernetes style but strict: whole or decimal cores (`4`, `0.5`, at
/// most three decimals) or millicores (`500m`). Millicores, 1 to [`MAX_CPU_MILLIS`].
pub fn parse_cpu(field: &str, text: &str) -> Result<i32, FieldError> {
    let invalid = || FieldError::new(field, "invalid_quantity", "must be cores (`4`, `0.5`) or millicores (`500m`)");
    let digits = |s: &str| !s.is_empty() && s.len() <= 9 && s.bytes().all(|b| b.is_ascii_digit());
    let millis: i64 = if let Some(m) = text.strip_suffix('m') {
        if !digits(m) {
            return Err(invalid());
        }
        m.parse().map_err(|_| invalid())?
    } else {
        let (whole, fraction) = text.split_once('.').unwrap_or((text, ""));
        if !digits(whole) || fraction.len() > 3 || !fraction.bytes().all(|b| b.is_ascii_digit()) {
            return Err(invalid());
        }
        if text.ends_with('.') {
            return Err(invalid());
        }
        let whole: i64 = whole.parse().map_err(|_| invalid())?;
        let fraction: i64 = format!("{fraction:0<3}").parse().map_err(|_| invalid())?;
        whole * 1000 + fraction
    };
    if !(1..=MAX_CPU_MILLIS).contains(&millis) {
        return Err(FieldError::new(field, "out_of_range", "must be at least 1m and at most 1024 cores"));
    }
    // Bounded above by MAX_CPU_MILLIS, an i32.
    Ok(millis as i32)
}

/// Parses a memory amount in binary units, Kubernetes style but strict: a whole number and
/// `Mi`, `Gi` or `Ti` (`512Mi`, `32Gi`). MiB, 1 to [`MAX_MEMORY_MIB`].
pub fn parse_memory(field: &str, text: &str) -> Result<i32, FieldError> {
    let invalid = || FieldError::new(field, "invalid_quantity", "must be a whole number of Mi, Gi or Ti (`32Gi`)");
    let (number, factor) = if let Some(n) = text.strip_suffix("Mi") {
        (n, 1)
    } else if let Some(n) = text.strip_suffix("Gi") {
        (n, 1024)
    } else if let Some(n) = text.strip_suffix("Ti") {
        (n, 1024 * 1024)
    } else {
        return Err(invalid());
    };
    if number.is_empty() || number.len() > 9 || !number.bytes().all(|b| b.is_ascii_digit()) {
        return Err(invalid());
    }
    let mib = number.parse::<i64>().map_err(|_| invalid())? * factor;
    if !(1..=MAX_MEMORY_MIB).contains(&mib) {
        return Err(FieldError::new(field, "out_of_range", "must be at least 1Mi and at most 16Ti"));
    }
    // Bounded above by MAX_MEMORY_MIB, an i32.
    Ok(mib as i32)
}

/// A CPU amount as [`parse_cpu`] reads it back: whole cores when whole, millicores otherwise.
pub fn format_cpu(millis: i32) -> String {
    if millis % 1000 == 0 {
        (millis / 1000).to_string()
    } else {
        format!("{millis}m")
    }
}

/// A memory amount as [`parse_memory`] reads it back, in the largest unit that is exact.
pub fn format_memory(mib: i32) -> String {
    if mib % (1024 * 1024) == 0 {
        format!("{}Ti", mib / (1024 * 1024))
    } else if mib % 1024 == 0 {
        format!("{}Gi", mib / 1024)
    } else {
        format!("{mib}Mi")
    }
}

/// Checks the name of an object of the team's own namespace (a claim, a Secret): a DNS-1123
/// subdomain. A `namespace/name` form is refused by name, since it would reach another
/// namespace's object if any backend read it so.
pub fn check_object_name(field: &str, name: &str) -> Result<(), FieldError> {
    if name.contains('/') {
        return Err(FieldError::new(
            field,
            "other_namespace",
            "must name an object of the team's own namespace: `namespace/name` is not allowed",
        ));
    }
    let label = |s: &str| {
        !s.is_empty()
            && s.len() <= 63
            && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !s.starts_with('-')
            && !s.ends_with('-')
    };
    if name.is_empty() || name.len() > 253 || !name.split('.').all(label) {
        return Err(FieldError::new(
            field,
            "invalid_name",
            "must be a DNS-1123 name: lower-case letters, digits, '-' and '.', at most 253, starting and ending alphanumeric",
        ));
    }
    Ok(())
}

/// Checks a mount path: absolute, no `..` or empty components, no `:`, not `/` itself.
pub fn check_mount_path(field: &str, path: &str) -> Result<(), FieldError> {
    if !path.starts_with('/') {
        return Err(FieldError::new(field, "not_absolute", "must be an absolute path, starting with /"));
    }
    if path.len() > MAX_MOUNT_PATH {
        return Err(FieldError::new(field, "too_long", format!("must be at most {MAX_MOUNT_PATH} bytes")));
    }
    let parts: Vec<&str> = path[1..].trim_end_matches('/').split('/').collect();
    if path == "/" || parts.iter().any(|p| p.is_empty() || *p == "." || *p == "..") {
        return Err(FieldError::new(
            field,
            "invalid_path",
            "must name a directory below /, with no empty, . or .. parts",
        ));
    }
    if path.chars().any(|c| c == ':' || c.is_control()) {
        return Err(FieldError::new(field, "invalid_characters", "must not contain ':' or control characters"));
    }
    Ok(())
}

/// Checks an environment variable's name by the rules of a job's `env`.
fn check_env_name(field: &str, name: &str) -> Result<(), FieldError> {
    let single = BTreeMap::from([(name.to_owned(), String::new())]);
    super::job::check_env(field, &single).map_err(|e| e.at(field))
}

/// Checks the workload under `prefix` (field names such as `volumes[0].mount_path`), with
/// `env` the job's plain variables (a secret variable may not have the same name) and `team`
/// the team whose cloud secrets it may read. Every failing field is reported.
pub fn check(prefix: &str, workload: &Workload, env: &BTreeMap<String, String>, team: &str) -> Vec<FieldError> {
    let at = |f: &str| format!("{prefix}{f}");
    let mut errors = Vec::new();
    if workload.volumes.len() > MAX_VOLUMES {
        errors.push(FieldError::new(at("volumes"), "too_many", format!("must have at most {MAX_VOLUMES} volumes")));
    }
    let mut paths = HashSet::new();
    for (i, v) in workload.volumes.iter().enumerate() {
        errors.extend(check_object_name(&at(&format!("volumes[{i}].claim")), &v.claim).err());
        let field = at(&format!("volumes[{i}].mount_path"));
        match check_mount_path(&field, &v.mount_path) {
            Err(e) => errors.push(e),
            Ok(()) if !paths.insert(v.mount_path.trim_end_matches('/')) => {
                errors.push(FieldError::new(field, "duplicate", format!("{} is mounted twice", v.mount_path)));
            }
            Ok(()) => {}
        }
    }
    let secrets = workload.secret_env.len() + workload.cloud_secret_env.len();
    if secrets > MAX_SECRETS {
        errors.push(FieldError::new(
            at("secret_env"),
            "too_many",
            format!("secret_env and cloud_secret_env together must have at most {MAX_SECRETS} variables"),
        ));
    }
    let mut names: HashSet<String> = env.keys().cloned().collect();
    let mut name_once = |field: String, name: &str, errors: &mut Vec<FieldError>| match check_env_name(&field, name) {
        Err(e) => errors.push(e),
        Ok(()) if !names.insert(name.to_owned()) => {
            errors.push(FieldError::new(field, "duplicate", format!("variable {name} is set twice")));
        }
        Ok(()) => {}
    };
    for (i, s) in workload.secret_env.iter().enumerate() {
        name_once(at(&format!("secret_env[{i}].name")), &s.name, &mut errors);
        errors.extend(check_object_name(&at(&format!("secret_env[{i}].secret")), &s.secret).err());
        let key_ok = !s.key.is_empty()
            && s.key.len() <= 253
            && s.key.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
        if !key_ok {
            errors.push(FieldError::new(
                at(&format!("secret_env[{i}].key")),
                "invalid_name",
                "must be 1 to 253 letters, digits, '-', '_' or '.'",
            ));
        }
    }
    for (i, s) in workload.cloud_secret_env.iter().enumerate() {
        name_once(at(&format!("cloud_secret_env[{i}].name")), &s.name, &mut errors);
        let field = at(&format!("cloud_secret_env[{i}].reference"));
        match CloudSecretStore::of(&s.reference) {
            None => errors.push(FieldError::new(
                field,
                "invalid_reference",
                "must be an AWS Secrets Manager or SSM parameter ARN, or a Google Secret Manager version (projects/<p>/secrets/<id>/versions/<v>)",
            )),
            Some((store, name)) => {
                let prefix = match store {
                    CloudSecretStore::Aws => aws_secret_prefix(team),
                    CloudSecretStore::Gcp => gcp_secret_prefix(team),
                };
                if !name.starts_with(&prefix) || name.len() == prefix.len() {
                    errors.push(FieldError::new(
                        field,
                        "outside_team_prefix",
                        format!("team {team} may read only secrets whose names start with {prefix}"),
                    ));
                }
            }
        }
    }
    if workload.image_pull_secrets.len() > MAX_PULL_SECRETS {
        errors.push(FieldError::new(
            at("image_pull_secrets"),
            "too_many",
            format!("must have at most {MAX_PULL_SECRETS} secrets"),
        ));
    }
    for (i, name) in workload.image_pull_secrets.iter().enumerate() {
        let field = at(&format!("image_pull_secrets[{i}]"));
        match check_object_name(&field, name) {
            Err(e) => errors.push(e),
            Ok(()) if workload.image_pull_secrets[..i].contains(name) => {
                errors.push(FieldError::new(field, "duplicate", format!("{name} is named twice")));
            }
            Ok(()) => {}
        }
    }
    if workload.node_selector.len() > MAX_NODE_SELECTOR {
        errors.push(FieldError::new(
            at("node_selector"),
            "too_many",
            format!("must have at most {MAX_NODE_SELECTOR} labels"),
        ));
    } else {
        errors.extend(super::job::check_labels(&at("node_selector"), &workload.node_selector).err());
    }
    // The scheduler pins each replica to the node it chose; a selector on the node's name
    // could only contradict that.
    if workload.node_selector.contains_key("kubernetes.io/hostname") {
        errors.push(FieldError::new(
            at("node_selector.kubernetes.io/hostname"),
            "reserved",
            "the scheduler chooses the node; select nodes by their other labels",
        ));
    }
    errors
}

#[cfg(test)]
mod tests {
    use super::*;

    fn codes(errors: &[FieldError]) -> Vec<(&str, &str)> {
        errors.iter().map(|e| (e.field.as_str(), e.code.as_str())).collect()
    }

    #[test]
    fn cpu_is_read_as_cores_or_millicores_and_nothing_looser() {
        assert_eq!(parse_cpu("cpu", "4"), Ok(4000));
        assert_eq!(parse_cpu("cpu", "0.5"), Ok(500));
        assert_eq!(parse_cpu("cpu", "2.25"), Ok(2250));
        assert_eq!(parse_cpu("cpu", "500m"), Ok(500));
        for bad in ["", "4 ", "-1", "1e3", "0.0001", "4.", ".5", "4Gi", "m", "1.5m", "four"] {
            assert_eq!(parse_cpu("cpu", bad).unwrap_err().code, "invalid_quantity", "{bad:?}");
        }
        assert_eq!(parse_cpu("cpu", "0").unwrap_err().code, "out_of_range");
        assert_eq!(parse_cpu("cpu", "1025").unwrap_err().code, "out_of_range");
        for millis in [1, 500, 1000, 2250, 64_000] {
            assert_eq!(parse_cpu("cpu", &format_cpu(millis)), Ok(millis));
        }
    }

    #[test]
    fn memory_is_read_in_binary_units_only() {
        assert_eq!(parse_memory("memory", "512Mi"), Ok(512));
        assert_eq!(parse_memory("memory", "32Gi"), Ok(32 * 1024));
        assert_eq!(parse_memory("memory", "1Ti"), Ok(1024 * 1024));
        for bad in ["32", "32G", "32gi", "1.5Gi", "Gi", "-1Gi", " 1Gi", "32GiB"] {
            assert_eq!(parse_memory("memory", bad).unwrap_err().code, "invalid_quantity", "{bad:?}");
        }
        assert_eq!(parse_memory("memory", "0Mi").unwrap_err().code, "out_of_range");
        assert_eq!(parse_memory("memory", "17Ti").unwrap_err().code, "out_of_range");
        for mib in [1, 512, 1024, 32 * 1024, 1024 * 1024, 1536] {
            assert_eq!(parse_memory("memory", &format_memory(mib)), Ok(mib));
        }
    }

    #[test]
    fn objects_of_another_namespace_are_refused_by_name() {
        assert!(check_object_name("s", "hf-token").is_ok());
        assert!(check_object_name("s", "registry.creds").is_ok());
        assert_eq!(check_object_name("s", "other-team/hf-token").unwrap_err().code, "other_namespace");
        assert_eq!(check_object_name("s", "/hf-token").unwrap_err().code, "other_namespace");
        for bad in ["", "HF", "a_b", "-a", "a-", "a..b", &"a".repeat(64)] {
            assert_eq!(check_object_name("s", bad).unwrap_err().code, "invalid_name", "{bad:?}");
        }
    }

    #[test]
    fn mount_paths_are_absolute_and_plain() {
        assert!(check_mount_path("p", "/data").is_ok());
        assert!(check_mount_path("p", "/data/models/").is_ok());
        assert_eq!(check_mount_path("p", "data").unwrap_err().code, "not_absolute");
        for bad in ["/", "/data/../etc", "/a//b", "/./a"] {
            assert_eq!(check_mount_path("p", bad).unwrap_err().code, "invalid_path", "{bad:?}");
        }
        assert_eq!(check_mount_path("p", "/c:/x").unwrap_err().code, "invalid_characters");
    }

    #[test]
    fn the_forms_lines_read_back_as_the_volumes_and_secret_variables_they_show() {
        let volume = Volume { claim: "data".into(), mount_path: "/data".into(), read_only: true };
        assert_eq!(Volume::parse_line(&volume.line()), Some(volume.clone()));
        assert_eq!(volume.line(), "data:/data:ro");
        assert_eq!(Volume::parse_line(" data:/data:rw ").map(|v| v.read_only), Some(false));
        assert_eq!(Volume::parse_line("data:/a:b").map(|v| v.mount_path), Some("/a:b".to_owned()));
        assert_eq!(Volume::parse_line("data"), None);
        assert_eq!(Volume::parse_line(":/data"), None);
        let secret = SecretEnv { name: "HF_TOKEN".into(), secret: "hf".into(), key: "token".into() };
        assert_eq!(SecretEnv::parse_line(&secret.line()), Some(secret));
        assert_eq!(SecretEnv::parse_line("HF_TOKEN=hf"), None);
        assert_eq!(SecretEnv::parse_line("=hf:token"), None);
    }

    #[test]
    fn cloud_references_name_their_store_and_secret() {
        let aws = "arn:aws:secretsmanager:us-east-1:123456789012:secret:fairway/vision/hf-AbCdEf";
        assert_eq!(CloudSecretStore::of(aws), Some((CloudSecretStore::Aws, "fairway/vision/hf-AbCdEf")));
        let ssm = "arn:aws:ssm:us-east-1:123456789012:parameter/fairway/vision/db";
        assert_eq!(CloudSecretStore::of(ssm), Some((CloudSecretStore::Aws, "fairway/vision/db")));
        let gcp = "projects/p1/secrets/fairway_vision_hf/versions/latest";
        assert_eq!(CloudSecretStore::of(gcp), Some((CloudSecretStore::Gcp, "fairway_vision_hf")));
        assert_eq!(CloudSecretStore::of("fairway/vision/hf"), None);
        assert_eq!(CloudSecretStore::of("arn:aws:s3:::bucket"), None);
        assert_eq!(CloudSecretStore::of("projects/p1/secrets/x"), None);
    }

    #[test]
    fn a_team_reads_only_cloud_secrets_under_its_own_prefix() {
        let refer = |reference: &str| Workload {
            cloud_secret_env: vec![CloudSecretEnv { name: "TOKEN".into(), reference: reference.into() }],
            ..Workload::default()
        };
        let ok = [
            "arn:aws:secretsmanager:us-east-1:1:secret:fairway/vision/hf",
            "projects/p/secrets/fairway_vision_hf/versions/3",
        ];
        for r in ok {
            assert!(check("", &refer(r), &BTreeMap::new(), "vision").is_empty(), "{r}");
        }
        // `vision-x` is another team; its prefix must not pass for `vision`'s, nor the other way.
        let outside = [
            "arn:aws:secretsmanager:us-east-1:1:secret:fairway/vision-x/hf",
            "arn:aws:secretsmanager:us-east-1:1:secret:fairway/vision/",
            "arn:aws:ssm:us-east-1:1:parameter/prod/db",
            "projects/p/secrets/fairway_vision-x_hf/versions/1",
        ];
        for r in outside {
            let errors = check("", &refer(r), &BTreeMap::new(), "vision");
            assert_eq!(codes(&errors), [("cloud_secret_env[0].reference", "outside_team_prefix")], "{r}");
        }
    }

    #[test]
    fn every_bad_field_of_a_workload_is_named() {
        let workload = Workload {
            volumes: vec![
                Volume { claim: "data".into(), mount_path: "/data".into(), read_only: false },
                Volume { claim: "other/data".into(), mount_path: "/data/".into(), read_only: true },
                Volume { claim: "ok".into(), mount_path: "relative".into(), read_only: false },
            ],
            secret_env: vec![
                SecretEnv { name: "LR".into(), secret: "s".into(), key: "k".into() },
                SecretEnv { name: "TOKEN".into(), secret: "ns/s".into(), key: "bad key".into() },
            ],
            cloud_secret_env: Vec::new(),
            image_pull_secrets: vec!["regcred".into(), "regcred".into()],
            node_selector: BTreeMap::from([("kubernetes.io/hostname".into(), "n1".into())]),
        };
        let env = BTreeMap::from([("LR".to_owned(), "0.1".to_owned())]);
        let errors = check("jobs[0].", &workload, &env, "vision");
        assert_eq!(
            codes(&errors),
            [
                ("jobs[0].volumes[1].claim", "other_namespace"),
                ("jobs[0].volumes[1].mount_path", "duplicate"),
                ("jobs[0].volumes[2].mount_path", "not_absolute"),
                ("jobs[0].secret_env[0].name", "duplicate"),
                ("jobs[0].secret_env[1].secret", "other_namespace"),
                ("jobs[0].secret_env[1].key", "invalid_name"),
                ("jobs[0].image_pull_secrets[1]", "duplicate"),
                ("jobs[0].node_selector.kubernetes.io/hostname", "reserved"),
            ]
        );
        let many = Workload {
            volumes: (0..=MAX_VOLUMES)
                .map(|i| Volume { claim: format!("c{i}"), mount_path: format!("/m{i}"), read_only: false })
                .collect(),
            ..Workload::default()
        };
        assert_eq!(codes(&check("", &many, &BTreeMap::new(), "vision")), [("volumes", "too_many")]);
        assert!(!Workload::default().needs_kubernetes());
        assert!(workload.needs_kubernetes());
    }
}
