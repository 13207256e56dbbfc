//! Inference services from the client: `fairway service create | list | status | scale |
//! update | delete | wait`. A wait polls the service until every replica asked for runs the
//! current revision (a deploy step in CI: `fairway service update chat --image ... --wait`).

use std::{collections::BTreeMap, path::PathBuf, time::Duration};

use serde_json::{json, Map, Value};
use tokio::time::{sleep, Instant};

use super::{
    exit::{Exit, Finish},
    http::{Api, Error},
    output,
};

/// How often a wait reads the service.
const POLL: Duration = Duration::from_secs(1);

/// The flags that describe a service, over a file holding the API's fields.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct ServiceArgs {
    /// A file holding the service's API fields (`name`, `min_replicas`, `max_replicas`,
    /// `replica: {gpu_class, gpus, image, ...}`): .toml, .yaml/.yml or .json (`-` reads YAML
    /// or JSON from standard input). Flags override its fields.
    #[arg(short = 'f', long, value_name = "FILE")]
    pub file: Option<PathBuf>,
    /// The service's name: lowercase letters, digits and `-`, starting with a letter.
    #[arg(long)]
    pub name: Option<String>,
    /// GPU class of each replica, e.g. `h100-80gb`.
    #[arg(long, value_name = "CLASS")]
    pub gpu_class: Option<String>,
    /// GPUs per replica [server's default: 1].
    #[arg(long, value_name = "N")]
    pub gpus: Option<u32>,
    /// Container image.
    #[arg(long)]
    pub image: Option<String>,
    /// Replicas always kept, never preempted; they must fit the team's reserved quota
    /// [server's default: 1].
    #[arg(long = "min", value_name = "N")]
    pub min_replicas: Option<u32>,
    /// Most replicas it may be scaled to [server's default: the minimum].
    #[arg(long = "max", value_name = "N")]
    pub max_replicas: Option<u32>,
    /// Replicas to run now [server's default: the minimum].
    #[arg(long, value_name = "N")]
    pub replicas: Option<u32>,
    /// The port replicas listen on (told in PORT) [server's default: 8000].
    #[arg(long, value_name = "PORT")]
    pub port: Option<u32>,
    /// Restarts each replica gets after the application fails [server's default: 5].
    #[arg(long, value_name = "N")]
    pub restart_budget: Option<u32>,
    /// An environment variable of every replica; repeat for more.
    #[arg(long = "env", value_name = "K=V", value_parser = super::spec::pair)]
    pub env: Vec<(String, String)>,
}

/// The body of a service to create: the file's fields, then the flags over them.
pub fn body(args: &ServiceArgs) -> Result<Value, Error> {
    let mut service = match &args.file {
        Some(path) => super::spec::read_file(path)?,
        None => Map::new(),
    };
    let mut replica = match service.remove("replica") {
        Some(Value::Object(fields)) => fields,
        Some(_) => return Err(Error::Usage("the service file's `replica` is not a table".to_owned())),
        None => Map::new(),
    };
    for (key, value) in [
        ("name", args.name.clone().map(Value::from)),
        ("min_replicas", args.min_replicas.map(Value::from)),
        ("max_replicas", args.max_replicas.map(Value::from)),
        ("replicas", args.replicas.map(Value::from)),
        ("port", args.port.map(Value::from)),
        ("restart_budget", args.restart_budget.map(Value::from)),
    ] {
        if let Some(value) = value {
            service.insert(key.to_owned(), value);
        }
    }
    for (key, value) in [
        ("gpu_class", args.gpu_class.clone().map(Value::from)),
        ("gpus", args.gpus.map(Value::from)),
        ("image", args.image.clone().map(Value::from)),
    ] {
        if let Some(value) = value {
            replica.insert(key.to_owned(), value);
        }
    }
    if !args.env.is_empty() {
        let env = replica.entry("env").or_insert_with(|| json!({}));
        let Value::Object(env) = env else {
            return Err(Error::Usage("the service file's `replica.env` is not a table".to_owned()));
        };
        for (k, v) in &args.env {
            env.insert(k.clone(), Value::from(v.clone()));
        }
    }
    service.insert("replica".to_owned(), Value::Object(replica));
    Ok(Value::Object(service))
}

/// The body of an update: a new size, or what replicas run.
pub fn update_body(
    replicas: Option<u32>,
    image: Option<String>,
    env: &[(String, String)],
    command: &[String],
) -> Result<Value, Error> {
    let mut body = Map::new();
    if let Some(n) = replicas {
        body.insert("replicas".to_owned(), n.into());
    }
    if let Some(image) = image {
        body.insert("image".to_owned(), image.into());
    }
    if !env.is_empty() {
        let env: BTreeMap<&str, &str> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        body.insert("env".to_owned(), json!(env));
    }
    if !command.is_empty() {
        body.insert("command".to_owned(), json!(command));
    }
    if body.is_empty() {
        return Err(Error::Usage("nothing to change: give --image, --env or a command after --".to_owned()));
    }
    Ok(Value::Object(body))
}

/// One line for a service: its state, its replicas and where it is reached.
pub fn summary(service: &Value) -> String {
    let count = |k: &str| service.get("counts").and_then(|c| c.get(k)).and_then(Value::as_i64).unwrap_or(0);
    let mut parts = vec![format!(
        "{} of {} running revision {}",
        count("current"),
        output::field(service, "replicas"),
        output::field(service, "revision")
    )];
    for (k, what) in
        [("starting", "starting"), ("waiting", "waiting"), ("stopping", "stopping"), ("given_up", "out of restarts")]
    {
        if count(k) > 0 {
            parts.push(format!("{} {what}", count(k)));
        }
    }
    let endpoints: Vec<String> = service
        .get("endpoints")
        .and_then(Value::as_array)
        .map(|e| {
            e.iter().map(|e| format!("{} ({})", output::field(e, "address"), output::field(e, "cluster"))).collect()
        })
        .unwrap_or_default();
    format!(
        "service {} ({}..{} replicas): {}; {}{}",
        output::field(service, "name"),
        output::field(service, "min_replicas"),
        output::field(service, "max_replicas"),
        output::field(service, "state"),
        parts.join(", "),
        if endpoints.is_empty() { String::new() } else { format!("; at {}", endpoints.join(", ")) }
    )
}

/// The text of a service list: one line each.
pub fn list(items: &[Value]) -> String {
    if items.is_empty() {
        return "no services\n".to_owned();
    }
    items.iter().map(|s| summary(s) + "\n").collect()
}

/// Follows service `name` of `team` until every replica asked for runs its current
/// revision (0), a replica runs out of restarts (1: `degraded`), or `timeout` elapses
/// (124). Prints its line to standard error whenever it changes.
pub async fn wait(api: &Api, team: &str, name: &str, timeout: Option<Duration>) -> Result<(Finish, Value), Error> {
    let url = api.url(&["teams", team, "services", name]);
    let deadline = timeout.map(|t| Instant::now() + t);
    let mut last = String::new();
    loop {
        let service = api.get(url.clone()).await?;
        let line = summary(&service);
        if line != last {
            eprintln!("{line}");
            last = line;
        }
        match output::field(&service, "state").as_str() {
            "ready" => return Ok((Exit::Success.into(), service)),
            "degraded" => {
                eprintln!("fairway: service {name} is degraded: a replica ran out of restarts (fairway service status {name})");
                return Ok((Finish::Job(1), service));
            }
            _ => {}
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            let after = timeout.map_or(0, |t| t.as_secs());
            eprintln!("fairway: --timeout of {after}s elapsed; service {name} goes on (fairway service status {name})");
            return Ok((Exit::TimedOut.into(), service));
        }
        sleep(POLL).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_go_over_the_files_fields_and_into_the_replica_where_they_belong() {
        let args = ServiceArgs {
            name: Some("chat".into()),
            gpu_class: Some("h100-80gb".into()),
            gpus: Some(2),
            image: Some("ghcr.io/acme/chat:1".into()),
            min_replicas: Some(2),
            max_replicas: Some(4),
            env: vec![("MODEL".into(), "llama".into())],
            ..ServiceArgs::default()
        };
        let body = body(&args).unwrap();
        assert_eq!(
            body,
            json!({"name": "chat", "min_replicas": 2, "max_replicas": 4,
                   "replica": {"gpu_class": "h100-80gb", "gpus": 2, "image": "ghcr.io/acme/chat:1", "env": {"MODEL": "llama"}}})
        );
    }

    #[test]
    fn an_update_says_what_changes_and_refuses_to_say_nothing() {
        let b = update_body(None, Some("ghcr.io/acme/chat:2".into()), &[], &[]).unwrap();
        assert_eq!(b, json!({"image": "ghcr.io/acme/chat:2"}));
        assert!(matches!(update_body(None, None, &[], &[]), Err(Error::Usage(_))));
    }

    #[test]
    fn a_line_says_the_state_the_replicas_and_the_endpoint() {
        let s = json!({"name": "chat", "min_replicas": 2, "max_replicas": 4, "replicas": 4, "revision": 2,
                       "state": "scaling", "counts": {"current": 2, "waiting": 2},
                       "endpoints": [{"cluster": "sim", "address": "chat.ml.sim.sim.fairway.internal:8000"}]});
        assert_eq!(
            summary(&s),
            "service chat (2..4 replicas): scaling; 2 of 4 running revision 2, 2 waiting; at chat.ml.sim.sim.fairway.internal:8000 (sim)"
        );
    }
}
