//! A job's request body, from a file (TOML, YAML or JSON, holding the API's fields) and flags
//! over it. The client checks only what it must to build the body; the server judges the
//! job, and its problem names any field it refuses.

use std::{io::Read as _, path::PathBuf};

use serde_json::{Map, Value};

use super::{duration, http::Error};

/// The flags that describe a job, shared by `submit` and `dry-run`.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct JobArgs {
    /// A file holding the job's API fields: .toml, .yaml/.yml or .json (`-` reads YAML or JSON
    /// from standard input). Flags override its fields.
    #[arg(short = 'f', long, value_name = "FILE")]
    pub file: Option<PathBuf>,
    /// Name shown to people.
    #[arg(long)]
    pub name: Option<String>,
    /// GPU class, e.g. `h100-80gb`.
    #[arg(long, value_name = "CLASS")]
    pub gpu_class: Option<String>,
    /// GPUs per replica [server's default: 1].
    #[arg(long, value_name = "N")]
    pub gpus: Option<u32>,
    /// Replicas of the gang, all or none running [server's default: 1].
    #[arg(long, value_name = "N")]
    pub replicas: Option<u32>,
    /// Make it an elastic gang: it grows from --replicas up to N replicas into GPUs no waiting
    /// job needs, and gives the extras back first when one does.
    #[arg(long, value_name = "N")]
    pub max_replicas: Option<u32>,
    /// How long it waits for capacity before it may preempt anyone [its priority class's]:
    /// seconds, or e.g. 5m.
    #[arg(long, value_name = "DURATION", value_parser = duration::parse)]
    pub preemption_delay: Option<std::time::Duration>,
    /// Priority class [server's default: experiment].
    #[arg(long, value_name = "CLASS")]
    pub priority: Option<String>,
    /// Container image.
    #[arg(long)]
    pub image: Option<String>,
    /// Longest the job may run: seconds, or e.g. 90m, 2h, 1h30m.
    #[arg(long, value_name = "DURATION", value_parser = duration::parse)]
    pub max_runtime: Option<std::time::Duration>,
    /// What the job expects to run (feeds its expected start): seconds, or e.g. 45m.
    #[arg(long, value_name = "DURATION", value_parser = duration::parse)]
    pub expected_runtime: Option<std::time::Duration>,
    /// An environment variable of the job; repeat for more.
    #[arg(long = "env", value_name = "K=V", value_parser = pair)]
    pub env: Vec<(String, String)>,
    /// A label of the job; repeat for more.
    #[arg(long = "label", value_name = "K=V", value_parser = pair)]
    pub labels: Vec<(String, String)>,
    /// Times to rerun the job after it fails [server's default: 0].
    #[arg(long, value_name = "N")]
    pub max_retries: Option<u32>,
    /// The job may run on spot capacity (cheaper; an interruption requeues it).
    #[arg(long)]
    pub allow_spot: bool,
    /// Accept the job even when it exceeds the team's quota now; it waits for quota.
    #[arg(long)]
    pub wait_for_quota: bool,
    /// Start only after job JOB succeeded (Slurm's afterok); repeat for more.
    #[arg(long = "after", value_name = "JOB", value_parser = super::job_id)]
    pub after: Vec<String>,
    /// Start only after job JOB ended, in any state (afterany); repeat for more.
    #[arg(long = "after-any", value_name = "JOB", value_parser = super::job_id)]
    pub after_any: Vec<String>,
    /// Start only after job JOB failed, was cancelled or was preempted out of retries
    /// (afternotok); repeat for more.
    #[arg(long = "after-failed", value_name = "JOB", value_parser = super::job_id)]
    pub after_failed: Vec<String>,
    /// When a dependency can no longer be met: `cancel` the job [server's default] or `keep`
    /// it pending.
    #[arg(long, value_name = "cancel|keep", value_parser = ["cancel", "keep"])]
    pub if_dependency_fails: Option<String>,
    /// CPU per replica: cores (`4`, `0.5`) or millicores (`500m`) [server's default: the GPU
    /// class's CPU per GPU times the GPUs].
    #[arg(long, value_name = "QUANTITY")]
    pub cpu: Option<String>,
    /// Memory per replica, e.g. `32Gi` or `512Mi` [server's default: the class's per GPU].
    #[arg(long, value_name = "QUANTITY")]
    pub memory: Option<String>,
    /// Mount a PersistentVolumeClaim of the team's namespace at an absolute path, read-only
    /// with `:ro` (Kubernetes only); repeat for more.
    #[arg(long = "volume", value_name = "CLAIM:/PATH[:ro]", value_parser = volume)]
    pub volumes: Vec<Value>,
    /// An environment variable from a key of a Kubernetes Secret of the team's namespace;
    /// repeat for more.
    #[arg(long = "secret-env", value_name = "NAME=SECRET:KEY", value_parser = secret_env)]
    pub secret_env: Vec<Value>,
    /// An environment variable a cloud batch pool reads from its secret store: an AWS
    /// Secrets Manager or SSM ARN under `fairway/<team>/`, or a Google Secret Manager version
    /// of a secret `fairway_<team>_...`; repeat for more.
    #[arg(long = "cloud-secret-env", value_name = "NAME=REFERENCE", value_parser = pair)]
    pub cloud_secret_env: Vec<(String, String)>,
    /// A Secret of the team's namespace with registry credentials; repeat for more.
    #[arg(long = "image-pull-secret", value_name = "SECRET")]
    pub image_pull_secrets: Vec<String>,
    /// A label each replica's node must carry; repeat for more.
    #[arg(long = "node-selector", value_name = "K=V", value_parser = pair)]
    pub node_selector: Vec<(String, String)>,
    /// The least NVIDIA driver version its nodes must run, e.g. `550.54` [server's default: any].
    #[arg(long, value_name = "VERSION")]
    pub min_driver: Option<String>,
    /// The least CUDA version its nodes' driver must support, e.g. `12.4` [server's default: any].
    #[arg(long, value_name = "VERSION")]
    pub min_cuda: Option<String>,
    /// The command and its arguments, after `--`.
    #[arg(last = true, value_name = "COMMAND")]
    pub command: Vec<String>,
}

/// `CLAIM:/PATH` or `CLAIM:/PATH:ro` (`:rw` too), as a volume of the API.
fn volume(text: &str) -> Result<Value, String> {
    let (claim, rest) = text.split_once(':').ok_or_else(|| format!("`{text}` is not CLAIM:/PATH[:ro]"))?;
    let (path, read_only) = match rest.rsplit_once(':') {
        Some((path, "ro")) => (path, true),
        Some((path, "rw")) => (path, false),
        _ => (rest, false),
    };
    if claim.is_empty() || path.is_empty() {
        return Err(format!("`{text}` is not CLAIM:/PATH[:ro]"));
    }
    Ok(serde_json::json!({"claim": claim, "mount_path": path, "read_only": read_only}))
}

/// `NAME=SECRET:KEY`, as a `secret_env` entry of the API.
fn secret_env(text: &str) -> Result<Value, String> {
    let usage = || format!("`{text}` is not NAME=SECRET:KEY");
    let (name, reference) = pair(text).map_err(|_| usage())?;
    match reference.split_once(':') {
        Some((secret, key)) if !secret.is_empty() && !key.is_empty() => {
            Ok(serde_json::json!({"name": name, "secret": secret, "key": key}))
        }
        _ => Err(usage()),
    }
}

/// `K=V`, with `K` not empty (`V` may be).
pub(super) fn pair(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((key, value)) if !key.is_empty() => Ok((key.to_owned(), value.to_owned())),
        _ => Err(format!("`{text}` is not KEY=VALUE")),
    }
}

/// The body: the file's fields, then each flag given. Serialized by the caller, once: the
/// bytes sent are the bytes a CI key is derived from.
pub fn body(args: &JobArgs) -> Result<Value, Error> {
    let mut job = match &args.file {
        Some(path) => read_file(path)?,
        None => Map::new(),
    };
    let mut set = |field: &str, value: Option<Value>| {
        if let Some(value) = value {
            job.insert(field.to_owned(), value);
        }
    };
    set("name", args.name.clone().map(Value::from));
    set("gpu_class", args.gpu_class.clone().map(Value::from));
    set("gpus_per_replica", args.gpus.map(Value::from));
    set("replicas", args.replicas.map(Value::from));
    set("max_replicas", args.max_replicas.map(Value::from));
    set("preemption_delay_seconds", args.preemption_delay.map(|d| Value::from(d.as_secs())));
    set("priority_class", args.priority.clone().map(Value::from));
    set("image", args.image.clone().map(Value::from));
    set("max_runtime_seconds", args.max_runtime.map(|d| Value::from(d.as_secs())));
    set("expected_runtime_seconds", args.expected_runtime.map(|d| Value::from(d.as_secs())));
    set("max_retries", args.max_retries.map(Value::from));
    set("allow_spot", args.allow_spot.then_some(Value::Bool(true)));
    set("wait_for_quota", args.wait_for_quota.then_some(Value::Bool(true)));
    set("if_dependency_fails", args.if_dependency_fails.clone().map(Value::from));
    set("cpu", args.cpu.clone().map(Value::from));
    set("memory", args.memory.clone().map(Value::from));
    set("min_driver_version", args.min_driver.clone().map(Value::from));
    set("min_cuda_version", args.min_cuda.clone().map(Value::from));
    if !args.command.is_empty() {
        set("command", Some(Value::from(args.command.clone())));
    }
    // `--env` and `--label` add to the file's maps, a flag winning over the file's value.
    for (field, pairs) in [("env", &args.env), ("labels", &args.labels), ("node_selector", &args.node_selector)] {
        if pairs.is_empty() {
            continue;
        }
        let map = job.entry(field).or_insert_with(|| Value::Object(Map::new()));
        let Some(map) = map.as_object_mut() else {
            return Err(Error::Usage(format!("the job file's `{field}` is not a table of strings")));
        };
        for (key, value) in pairs {
            map.insert(key.clone(), Value::from(value.clone()));
        }
    }
    // `--volume`, `--secret-env`, `--cloud-secret-env` and `--image-pull-secret` add to the
    // file's lists.
    let cloud: Vec<Value> = args
        .cloud_secret_env
        .iter()
        .map(|(name, reference)| serde_json::json!({"name": name, "reference": reference}))
        .collect();
    let pulls: Vec<Value> = args.image_pull_secrets.iter().cloned().map(Value::from).collect();
    for (field, items) in [
        ("volumes", &args.volumes),
        ("secret_env", &args.secret_env),
        ("cloud_secret_env", &cloud),
        ("image_pull_secrets", &pulls),
    ] {
        if items.is_empty() {
            continue;
        }
        let list = job.entry(field).or_insert_with(|| Value::Array(Vec::new()));
        let Some(list) = list.as_array_mut() else {
            return Err(Error::Usage(format!("the job file's `{field}` is not a list")));
        };
        list.extend(items.iter().cloned());
    }
    // `--after`, `--after-any` and `--after-failed` add to the file's `depends_on`.
    let flagged: Vec<Value> =
        [("succeeded", &args.after), ("finished", &args.after_any), ("failed", &args.after_failed)]
            .into_iter()
            .flat_map(|(after, jobs)| jobs.iter().map(move |job| serde_json::json!({"job": job, "after": after})))
            .collect();
    if !flagged.is_empty() {
        let list = job.entry("depends_on").or_insert_with(|| Value::Array(Vec::new()));
        let Some(list) = list.as_array_mut() else {
            return Err(Error::Usage("the job file's `depends_on` is not a list".to_owned()));
        };
        list.extend(flagged);
    }
    Ok(Value::Object(job))
}

/// Reads a job file into its fields, by its extension.
pub(super) fn read_file(path: &std::path::Path) -> Result<Map<String, Value>, Error> {
    let shown = path.display();
    let text = if path.as_os_str() == "-" {
        let mut text = String::new();
        std::io::stdin().read_to_string(&mut text).map_err(|e| Error::Usage(format!("reading standard input: {e}")))?;
        text
    } else {
        std::fs::read_to_string(path).map_err(|e| Error::Usage(format!("cannot read {shown}: {e}")))?
    };
    let extension = path.extension().and_then(|e| e.to_str()).unwrap_or_default().to_ascii_lowercase();
    let value: Value = match extension.as_str() {
        "toml" => toml::from_str(&text).map_err(|e| Error::Usage(format!("{shown}: {e}")))?,
        "json" => serde_json::from_str(&text).map_err(|e| Error::Usage(format!("{shown}: {e}")))?,
        // YAML reads JSON too, so standard input may hold either.
        "yaml" | "yml" | "" => serde_yaml::from_str(&text).map_err(|e| Error::Usage(format!("{shown}: {e}")))?,
        other => {
            return Err(Error::Usage(format!("{shown}: unknown job file type `.{other}`; use .toml, .yaml or .json")))
        }
    };
    match value {
        Value::Object(fields) => Ok(fields),
        _ => Err(Error::Usage(format!("{shown} does not hold a table of job fields"))),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn file(name: &str, text: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("fairway-client-spec-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        path
    }

    #[test]
    fn flags_make_the_apis_fields() {
        let args = JobArgs {
            name: Some("train".to_owned()),
            gpu_class: Some("h100-80gb".to_owned()),
            gpus: Some(8),
            replicas: Some(2),
            max_replicas: Some(6),
            preemption_delay: Some(duration::parse("5m").unwrap()),
            priority: Some("production".to_owned()),
            image: Some("ghcr.io/acme/train:1".to_owned()),
            max_runtime: Some(duration::parse("2h").unwrap()),
            expected_runtime: Some(duration::parse("90m").unwrap()),
            env: vec![("SEED".to_owned(), "1".to_owned())],
            labels: vec![("project".to_owned(), "vision".to_owned())],
            max_retries: Some(2),
            allow_spot: true,
            wait_for_quota: true,
            after: vec!["0b9c6d6e-5a8f-4a53-9d4c-5d2b0a4f1c7e".to_owned()],
            after_any: vec!["1b9c6d6e-5a8f-4a53-9d4c-5d2b0a4f1c7e".to_owned()],
            after_failed: vec!["2b9c6d6e-5a8f-4a53-9d4c-5d2b0a4f1c7e".to_owned()],
            if_dependency_fails: Some("keep".to_owned()),
            command: vec!["python".to_owned(), "train.py".to_owned()],
            file: None,
            ..JobArgs::default()
        };
        assert_eq!(
            body(&args).unwrap(),
            json!({
                "name": "train", "gpu_class": "h100-80gb", "gpus_per_replica": 8, "replicas": 2,
                "max_replicas": 6, "preemption_delay_seconds": 300,
                "priority_class": "production", "image": "ghcr.io/acme/train:1",
                "max_runtime_seconds": 7200, "expected_runtime_seconds": 5400,
                "env": {"SEED": "1"}, "labels": {"project": "vision"}, "max_retries": 2,
                "allow_spot": true, "wait_for_quota": true, "command": ["python", "train.py"],
                "if_dependency_fails": "keep",
                "depends_on": [
                    {"job": "0b9c6d6e-5a8f-4a53-9d4c-5d2b0a4f1c7e", "after": "succeeded"},
                    {"job": "1b9c6d6e-5a8f-4a53-9d4c-5d2b0a4f1c7e", "after": "finished"},
                    {"job": "2b9c6d6e-5a8f-4a53-9d4c-5d2b0a4f1c7e", "after": "failed"}
                ]
            })
        );
    }

    #[test]
    fn flags_override_the_files_fields_and_add_to_its_maps() {
        let toml = file(
            "job.toml",
            "name = \"from-file\"\ngpu_class = \"a100-80gb\"\nimage = \"img\"\ncommand = [\"a\"]\n[env]\nA = \"1\"\nB = \"2\"\n",
        );
        let args = JobArgs {
            file: Some(toml),
            name: Some("from-flag".to_owned()),
            env: vec![("B".to_owned(), "3".to_owned())],
            ..JobArgs::default()
        };
        assert_eq!(
            body(&args).unwrap(),
            json!({"name": "from-flag", "gpu_class": "a100-80gb", "image": "img", "command": ["a"], "env": {"A": "1", "B": "3"}})
        );
    }

    #[test]
    fn yaml_and_json_files_read_alike_and_other_files_are_refused() {
        let yaml = file("job.yaml", "name: y\ngpu_class: l4-24gb\nreplicas: 2\n");
        let json_file = file("job.json", r#"{"name": "y", "gpu_class": "l4-24gb", "replicas": 2}"#);
        let read = |path| body(&JobArgs { file: Some(path), ..JobArgs::default() }).unwrap();
        assert_eq!(read(yaml), read(json_file));
        let list = file("list.yaml", "- a\n- b\n");
        assert!(body(&JobArgs { file: Some(list), ..JobArgs::default() }).unwrap_err().report().contains("table"));
        let ini = file("job.ini", "name=x");
        assert!(body(&JobArgs { file: Some(ini), ..JobArgs::default() }).unwrap_err().report().contains(".ini"));
    }

    #[test]
    fn resource_volume_and_secret_flags_make_the_apis_fields_and_add_to_the_files_lists() {
        let toml = file(
            "spec.toml",
            "name = \"f\"\n[[volumes]]\nclaim = \"home\"\nmount_path = \"/home/jovyan\"\n[node_selector]\nzone = \"a\"\n",
        );
        let args = JobArgs {
            file: Some(toml),
            cpu: Some("4".to_owned()),
            memory: Some("32Gi".to_owned()),
            volumes: vec![volume("datasets:/data:ro").unwrap(), volume("scratch:/scratch").unwrap()],
            secret_env: vec![secret_env("HF_TOKEN=hf:token").unwrap()],
            cloud_secret_env: vec![pair("KEY=arn:aws:secretsmanager:us-east-1:1:secret:fairway/ml/k").unwrap()],
            image_pull_secrets: vec!["regcred".to_owned()],
            node_selector: vec![("example.com/fabric".to_owned(), "ib".to_owned())],
            min_driver: Some("550.54".to_owned()),
            min_cuda: Some("12.4".to_owned()),
            ..JobArgs::default()
        };
        assert_eq!(
            body(&args).unwrap(),
            json!({
                "name": "f", "cpu": "4", "memory": "32Gi", "min_driver_version": "550.54", "min_cuda_version": "12.4",
                "volumes": [
                    {"claim": "home", "mount_path": "/home/jovyan"},
                    {"claim": "datasets", "mount_path": "/data", "read_only": true},
                    {"claim": "scratch", "mount_path": "/scratch", "read_only": false}
                ],
                "secret_env": [{"name": "HF_TOKEN", "secret": "hf", "key": "token"}],
                "cloud_secret_env": [{"name": "KEY", "reference": "arn:aws:secretsmanager:us-east-1:1:secret:fairway/ml/k"}],
                "image_pull_secrets": ["regcred"],
                "node_selector": {"zone": "a", "example.com/fabric": "ib"}
            })
        );
        assert!(volume("datasets").is_err());
        assert!(volume(":/data").is_err());
        assert!(secret_env("HF_TOKEN=hf").is_err());
        assert!(secret_env("HF_TOKEN=:token").is_err());
    }

    #[test]
    fn a_pair_needs_a_key_and_an_equals_sign() {
        assert_eq!(pair("A=b=c"), Ok(("A".to_owned(), "b=c".to_owned())));
        assert_eq!(pair("A="), Ok(("A".to_owned(), String::new())));
        assert!(pair("=b").is_err());
        assert!(pair("A").is_err());
    }
}
