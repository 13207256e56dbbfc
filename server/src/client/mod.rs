//! The client for CI pipelines and terminals: `fairway submit`, `rerun`, `template`, `array`,
//! `status`, `wait`, `cancel`, `list`, `queue`, `dry-run`, `logs` and `completions`, subcommands of the same binary as
//! `fairway serve` (as Nomad and Vault ship theirs).
//!
//! A face that talks only HTTP: it names no other module of the crate, so it could move to a
//! binary of its own (the `layers` test holds it to that). Its settings come from flags,
//! `FAIRWAY_*` variables and `~/.config/fairway/client.toml` ([`config`]); its exit statuses are
//! [`exit::Exit`], documented in `fairway submit --help`.

pub mod arrays;
pub mod ci;
pub mod config;
pub mod duration;
pub mod exit;
pub mod federation;
pub mod http;
pub mod output;
pub mod services;
pub mod spec;
pub mod sse;
pub mod wait;

use std::io::Write as _;

use chrono::Utc;
use reqwest::{header, Method};
use serde_json::Value;

use self::{
    config::{Flags, Output, Settings},
    exit::{Exit, Finish},
    http::{Api, Error, Repeat},
    spec::JobArgs,
};

/// The client's subcommands, flattened into the binary's.
#[derive(clap::Subcommand, Debug)]
pub enum Command {
    /// Submits a job; with --wait, follows it to its end and exits with its outcome.
    #[command(after_help = SUBMIT_HELP)]
    Submit(Box<SubmitArgs>),
    /// Runs a job again: a new job asking for what this one asked for, submitted by you;
    /// with --wait, follows it to its end and exits with its outcome.
    #[command(after_help = RERUN_HELP)]
    Rerun(RerunArgs),
    /// The team's job templates: saved requests a job is submitted from with only what
    /// changes (`fairway submit --template NAME`).
    #[command(subcommand)]
    Template(TemplateCommand),
    /// The team's job arrays (`fairway submit --array N[%P]`): an array's state and counts,
    /// its tasks, cancelling it whole, waiting for it.
    #[command(subcommand)]
    Array(ArrayCommand),
    /// The team's inference services: replicas with no maximum runtime at one endpoint,
    /// kept between a minimum and a maximum, scaled, rolled to a new image, deleted.
    #[command(subcommand)]
    Service(ServiceCommand),
    /// Shows a job: why it waits and when it should start, or how it ended.
    #[command(
        after_help = "Examples:\n  fairway status 0b9c6d6e-5a8f-4a53-9d4c-5d2b0a4f1c7e\n  fairway status $JOB --output json | jq -r .state"
    )]
    Status {
        /// The job's id, as `fairway submit` prints it.
        #[arg(value_parser = job_id, value_name = "JOB")]
        job: String,
    },
    /// Cancels a job: a waiting job ends at once, a running one is stopped.
    #[command(after_help = "Example:\n  fairway cancel 0b9c6d6e-5a8f-4a53-9d4c-5d2b0a4f1c7e")]
    Cancel {
        /// The job's id.
        #[arg(value_parser = job_id, value_name = "JOB")]
        job: String,
    },
    /// Lists the team's jobs, newest first.
    #[command(
        after_help = "Examples:\n  fairway list\n  fairway list --state running --limit 20\n  fairway list --team vision --output json | jq -r '.items[].id'"
    )]
    List {
        /// Only jobs in this state: pending, admitted, running, succeeded, failed,
        /// cancelled or preempted.
        #[arg(long)]
        state: Option<String>,
        /// At most this many jobs.
        #[arg(long, value_name = "N")]
        limit: Option<u32>,
    },
    /// Shows the team's waiting jobs in admission order, with why each waits and when it
    /// should start.
    #[command(after_help = "Example:\n  fairway queue --team vision")]
    Queue,
    /// Asks what the scheduler would do with a job submitted now (where it would run, whom it
    /// would preempt, when it would start, what it may cost) without submitting it.
    #[command(
        after_help = "Example:\n  fairway dry-run --gpu-class h100-80gb --gpus 8 --replicas 4 --priority production \\\n    --name pretrain --image ghcr.io/acme/train:1"
    )]
    DryRun(Box<JobArgs>),
    /// Prints a job's log: what its replicas wrote, as the server keeps it.
    #[command(
        after_help = "Examples:\n  fairway logs $JOB\n  fairway logs $JOB -f --replica 0\n  fairway logs $JOB --attempt 1 --timestamps\n\nWith -f, the command ends when the attempt is over."
    )]
    Logs {
        /// The job's id.
        #[arg(value_parser = job_id, value_name = "JOB")]
        job: String,
        /// Keep printing as the job writes.
        #[arg(short, long)]
        follow: bool,
        /// Only this replica [server's default: every replica].
        #[arg(long, value_name = "N")]
        replica: Option<u32>,
        /// This attempt [server's default: the latest].
        #[arg(long, value_name = "K")]
        attempt: Option<u32>,
        /// Start each line with the time it was written (RFC 3339).
        #[arg(long)]
        timestamps: bool,
    },
    /// Waits for an existing job to end, as `submit --wait` does, and exits with its outcome.
    #[command(after_help = WAIT_HELP)]
    Wait {
        /// The job's id.
        #[arg(value_parser = job_id, value_name = "JOB")]
        job: String,
        #[command(flatten)]
        options: WaitArgs,
    },
    /// Prints a shell completion script.
    #[command(
        after_help = "Examples:\n  fairway completions bash > ~/.local/share/bash-completion/completions/fairway\n  fairway completions zsh > \"${fpath[1]}/_fairway\"\n  fairway completions fish > ~/.config/fish/completions/fairway.fish"
    )]
    Completions {
        /// The shell.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
}

/// `fairway submit`'s own flags.
#[derive(clap::Args, Debug)]
pub struct SubmitArgs {
    /// Start from the team's saved template NAME: the job file's fields and the flags change
    /// it (`--env` and `--label` add to its own).
    #[arg(long, value_name = "NAME")]
    template: Option<String>,
    /// Submit an array of N tasks of this job (indices 0 to N-1, in FAIRWAY_ARRAY_TASK_ID),
    /// at most P at once with N%P, as Slurm's --array=0-(N-1)%P. Prints the array's id;
    /// with --wait, follows the array to its end.
    #[arg(long, value_name = "N[%P]", value_parser = arrays::shape, conflicts_with = "template")]
    array: Option<(u32, Option<u32>)>,
    #[command(flatten)]
    job: JobArgs,
    #[command(flatten)]
    create: CreateArgs,
}

/// `fairway rerun`'s flags.
#[derive(clap::Args, Debug)]
pub struct RerunArgs {
    /// The job to run again.
    #[arg(value_parser = job_id, value_name = "JOB")]
    job: String,
    #[command(flatten)]
    create: CreateArgs,
}

/// The flags of every command that creates a job.
#[derive(clap::Args, Debug)]
pub struct CreateArgs {
    /// Makes retries safe: a second request with the same key returns the job the first
    /// made. In GitHub Actions, GitLab CI, Jenkins and Buildkite it defaults to one derived
    /// from the CI job and the request, so a retried step never creates two.
    #[arg(long, env = "FAIRWAY_IDEMPOTENCY_KEY", value_name = "KEY")]
    idempotency_key: Option<String>,
    /// Follow the job to its end, printing its events to standard error, and exit with
    /// its outcome.
    #[arg(long)]
    wait: bool,
    #[command(flatten)]
    options: WaitArgs,
}

/// `fairway template`'s subcommands.
#[derive(clap::Subcommand, Debug)]
pub enum TemplateCommand {
    /// Saves a job request as the team's template NAME, from a job file and flags (as
    /// `submit` takes them), replacing the template of that name.
    #[command(
        after_help = "Examples:\n  fairway template save nightly-eval -f eval.toml\n  fairway template save smoke --name smoke --gpu-class l4-24gb --image ghcr.io/acme/test:1 -- pytest -x\n\nThe request is checked as a submission of it would be; budgets are checked when a job is\nsubmitted from it (fairway submit --template NAME)."
    )]
    Save {
        /// The template's name: lowercase letters, digits, '-', '_' and '.'.
        #[arg(value_name = "NAME")]
        template: String,
        #[command(flatten)]
        job: Box<JobArgs>,
    },
    /// Lists the team's templates.
    #[command(after_help = "Example:\n  fairway template list --team vision")]
    List,
    /// Prints a template's job fields as JSON: a job file for `submit -f`.
    #[command(after_help = "Example:\n  fairway template show nightly-eval > eval.json")]
    Show {
        /// The template's name.
        #[arg(value_name = "NAME")]
        name: String,
    },
    /// Deletes a template; jobs submitted from it stay.
    #[command(after_help = "Example:\n  fairway template delete nightly-eval")]
    Delete {
        /// The template's name.
        #[arg(value_name = "NAME")]
        name: String,
    },
}

/// `fairway array`'s subcommands.
#[derive(clap::Subcommand, Debug)]
pub enum ArrayCommand {
    /// Shows an array: its state and how many tasks are in each state.
    #[command(after_help = "Example:\n  fairway array status $ARRAY --output json | jq .counts")]
    Status {
        /// The array's id, as `fairway submit --array` prints it.
        #[arg(value_parser = array_id, value_name = "ARRAY")]
        array: String,
    },
    /// Lists an array's tasks in index order.
    #[command(after_help = "Example:\n  fairway array tasks $ARRAY --state failed")]
    Tasks {
        /// The array's id.
        #[arg(value_parser = array_id, value_name = "ARRAY")]
        array: String,
        /// Only tasks in this state.
        #[arg(long)]
        state: Option<String>,
        /// At most this many tasks [default: 50].
        #[arg(long, value_name = "N")]
        limit: Option<u32>,
    },
    /// Cancels every task of the array that has not ended (one task: `fairway cancel TASK`).
    #[command(after_help = "Example:\n  fairway array cancel $ARRAY")]
    Cancel {
        /// The array's id.
        #[arg(value_parser = array_id, value_name = "ARRAY")]
        array: String,
    },
    /// Waits for an array to end, printing its counts as they change, and exits with its
    /// outcome.
    #[command(after_help = ARRAY_WAIT_HELP)]
    Wait {
        /// The array's id.
        #[arg(value_parser = array_id, value_name = "ARRAY")]
        array: String,
        #[command(flatten)]
        options: WaitArgs,
    },
}

const ARRAY_WAIT_HELP: &str = "Example:
  fairway array wait $ARRAY --timeout 2h

Exit status: 0 every task succeeded; 125 the array was cancelled; when a task failed, the
exit code of the lowest-indexed failed task when it has one, else 127; 126 when the only
failures are tasks preempted beyond their retries; 124 --timeout; 130/143 interrupted (the array is cancelled
first, unless --detach). `fairway submit --array ... --wait` ends the same way.";

/// `fairway service`'s subcommands.
#[derive(clap::Subcommand, Debug)]
pub enum ServiceCommand {
    /// Creates a service from flags, or a file of the API's fields with flags over it.
    #[command(after_help = "Examples:
  fairway service create --name chat --gpu-class h100-80gb --image ghcr.io/acme/chat:1 --min 2 --max 4
  fairway service create -f chat.yaml --wait --timeout 10m")]
    Create {
        #[command(flatten)]
        args: services::ServiceArgs,
        /// Wait until every replica runs (exit 0), one runs out of restarts (1), or --timeout (124).
        #[arg(long)]
        wait: bool,
        /// With --wait, stop waiting after this long: seconds, or e.g. 5m.
        #[arg(long, value_name = "DURATION", value_parser = duration::parse, requires = "wait")]
        timeout: Option<std::time::Duration>,
    },
    /// Lists the team's services with their state and replicas.
    List,
    /// Shows a service: its state, replicas, revision and endpoints.
    #[command(after_help = "Example:\n  fairway service status chat --output json | jq .endpoints")]
    Status {
        /// The service's name.
        name: String,
    },
    /// Sets how many replicas run, between the service's minimum and maximum.
    #[command(after_help = "Example:\n  fairway service scale chat 4 --wait")]
    Scale {
        /// The service's name.
        name: String,
        /// Replicas to run.
        replicas: u32,
        /// Wait until every replica runs (exit 0), one runs out of restarts (1), or --timeout (124).
        #[arg(long)]
        wait: bool,
        /// With --wait, stop waiting after this long.
        #[arg(long, value_name = "DURATION", value_parser = duration::parse, requires = "wait")]
        timeout: Option<std::time::Duration>,
    },
    /// Rolls the service to a new image, environment or command, one replica at a time and
    /// never beyond the team's quota.
    #[command(after_help = "Examples:
  fairway service update chat --image ghcr.io/acme/chat:2 --wait --timeout 15m
  fairway service update chat -- vllm serve --max-model-len 8192")]
    Update {
        /// The service's name.
        name: String,
        /// The new image.
        #[arg(long)]
        image: Option<String>,
        /// The replicas' environment, replacing the old one whole; repeat for more.
        #[arg(long = "env", value_name = "K=V", value_parser = spec::pair)]
        env: Vec<(String, String)>,
        /// Wait until every replica runs the new revision (exit 0), one runs out of restarts
        /// (1), or --timeout (124).
        #[arg(long)]
        wait: bool,
        /// With --wait, stop waiting after this long.
        #[arg(long, value_name = "DURATION", value_parser = duration::parse, requires = "wait")]
        timeout: Option<std::time::Duration>,
        /// A new command and its arguments, after `--`.
        #[arg(last = true)]
        command: Vec<String>,
    },
    /// Deletes a service: its replicas stop; its bills remain.
    Delete {
        /// The service's name.
        name: String,
    },
    /// Waits until every replica of the service runs its current revision.
    #[command(after_help = "Exit status: 0 ready; 1 degraded (a replica ran out of restarts); 124 --timeout.")]
    Wait {
        /// The service's name.
        name: String,
        /// Stop waiting after this long.
        #[arg(long, value_name = "DURATION", value_parser = duration::parse)]
        timeout: Option<std::time::Duration>,
    },
}

/// An array reference: the array's UUID.
fn array_id(text: &str) -> Result<String, String> {
    uuid::Uuid::parse_str(text.trim())
        .map(|id| id.to_string())
        .map_err(|_| format!("`{text}` is not an array id (the UUID `fairway submit --array` prints)"))
}

/// How a wait may end early.
#[derive(clap::Args, Debug, Clone, Copy)]
pub struct WaitArgs {
    /// Stop waiting after this long (exit 124) and leave the job running: seconds, or e.g.
    /// 30m, 2h.
    #[arg(long, value_name = "DURATION", value_parser = duration::parse)]
    timeout: Option<std::time::Duration>,
    /// On SIGINT or SIGTERM, leave the job running instead of cancelling it.
    #[arg(long)]
    detach: bool,
    /// The job's log while waiting: `follow` streams each attempt's lines to standard error
    /// as they are written, `tail` shows only the last lines once the job ended, `none`
    /// shows none.
    #[arg(long, value_enum, default_value_t = wait::Logs::Follow)]
    logs: wait::Logs,
}

const SUBMIT_HELP: &str = concat!(
    "Examples:
  fairway submit --name resnet --gpu-class a100-80gb --gpus 4 --image ghcr.io/acme/train:1 \\
    --max-runtime 2h --env SEED=1 -- python train.py --epochs 10
  fairway submit -f job.toml --priority production --wait --timeout 3h
  fairway submit --template nightly-eval --image ghcr.io/acme/eval:$GIT_SHA --wait
  JOB=$(fairway submit -f job.yaml) && fairway status \"$JOB\"
  PRE=$(fairway submit -f preprocess.toml) && fairway submit -f train.toml --after \"$PRE\"

--after JOB waits for JOB to succeed, --after-any for it to end in any state, --after-failed
for it to fail (failed, cancelled or preempted out of retries); each repeats. A job whose
dependency can no longer be met is cancelled (reason dependency_failed), or with
--if-dependency-fails keep stays pending.

The job file (TOML, YAML or JSON) holds the API's fields: name, gpu_class, image,
gpus_per_replica, replicas, priority_class, max_runtime_seconds, command, env, labels, ...
Flags override them. Without --wait, standard output gets the job's id (or, with
--output json, the job); warnings go to standard error. With --wait, events and the job's
log lines go to standard error as they happen (--logs tail: only the log's last lines once
it ended); SIGINT or SIGTERM (a CI system cancelling the step) cancels the job,
waits up to 60s for it to end, and exits 130 or 143.

CI without a stored secret: with no token configured, the client exchanges the CI job's own
ID token for a short-lived token of the team whose CI trust policy admits it (see the
README, \"CI without secrets\"). The ID token comes from FAIRWAY_ID_TOKEN (GitLab CI's
`id_tokens:`, Buildkite's `buildkite-agent oidc request-token`), else from GitHub Actions
(`permissions: id-token: write`), asked for the audience FAIRWAY_ID_TOKEN_AUDIENCE
[default: fairway]. --team names the team when several teams trust the job.

",
    exit::exit_status_help!()
);

const RERUN_HELP: &str = "Examples:
  fairway rerun 0b9c6d6e-5a8f-4a53-9d4c-5d2b0a4f1c7e
  fairway rerun $JOB --wait --timeout 2h

The new job has the label fairway.dev/rerun-of=<JOB>. It is checked as a new submission:
quotas and budgets as they are now. Standard output and exit status: as `fairway submit`.";

const WAIT_HELP: &str = concat!(
    "Examples:
  fairway wait 0b9c6d6e-5a8f-4a53-9d4c-5d2b0a4f1c7e
  fairway wait $JOB --timeout 30m --detach

",
    "Exit status: as `fairway submit --wait` (see `fairway submit --help`): 0 succeeded, the
job's own exit code, 124 --timeout, 125 cancelled, 126 preempted, 127 failed without a code,
130/143 interrupted."
);

/// A job reference: the job's UUID.
fn job_id(text: &str) -> Result<String, String> {
    uuid::Uuid::parse_str(text.trim())
        .map(|id| id.to_string())
        .map_err(|_| format!("`{text}` is not a job id (the UUID `fairway submit` prints)"))
}

/// Runs a client command and says how the process should exit. `root` builds the whole
/// command line, for completion scripts.
pub async fn run(command: Command, flags: Flags, root: impl FnOnce() -> clap::Command) -> Finish {
    if let Command::Completions { shell } = command {
        let mut root = root();
        clap_complete::generate(shell, &mut root, "fairway", &mut std::io::stdout());
        return Exit::Success.into();
    }
    match execute(command, &flags).await {
        Ok(finish) => finish,
        Err(error) => {
            eprintln!("{}", error.report());
            error.exit().into()
        }
    }
}

/// What every command needs: the settings and the API.
struct Context {
    settings: Settings,
    api: Api,
}

impl Context {
    /// The team to act for: the one named, else the API token's own.
    async fn team(&self) -> Result<String, Error> {
        if let Some(team) = &self.settings.team {
            return Ok(team.clone());
        }
        let me = self.api.get(self.api.url(&["me"])).await?;
        match me.get("team").and_then(Value::as_str) {
            Some(team) => Ok(team.to_owned()),
            None => Err(Error::Usage(format!(
                "{} `{}` is not scoped to a team: name one with --team, FAIRWAY_TEAM or `team` in client.toml",
                if me.get("kind").and_then(Value::as_str) == Some("user") { "the user" } else { "the caller" },
                output::field(&me, "name")
            ))),
        }
    }

    /// Prints the server's JSON, or the text made of it.
    fn print(&self, value: &Value, text: impl FnOnce(&Value) -> String) {
        match self.settings.output {
            Output::Json => stdout(&format!("{value}\n")),
            Output::Text => stdout(&text(value)),
        }
    }
}

/// Writes to standard output; a closed pipe (`fairway list | head -1`) is not an error.
fn stdout(text: &str) {
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(text.as_bytes()).and_then(|()| out.flush());
}

async fn execute(command: Command, flags: &Flags) -> Result<Finish, Error> {
    let file = config::load(|name| std::env::var(name).ok()).map_err(Error::Usage)?;
    let mut settings = config::resolve(flags, &file).map_err(Error::Usage)?;
    if settings.token.is_none() {
        // In CI, the job's own ID token stands in for a stored secret.
        let Some(source) = federation::source(|name| std::env::var(name).ok()) else {
            return Err(Error::Unauthenticated(
                "no token: give one with --token, FAIRWAY_TOKEN or `token` in client.toml, or run in CI with \
                 FAIRWAY_ID_TOKEN or GitHub Actions' `permissions: id-token: write` (see `fairway submit --help`)"
                    .to_owned(),
            ));
        };
        let id_token = federation::id_token(source).await?;
        let exchanged = federation::exchange(&Api::new(&settings)?, &id_token, settings.team.as_deref()).await?;
        settings.token = Some(exchanged.token);
        settings.team = Some(exchanged.team);
    }
    let api = Api::new(&settings)?;
    let ctx = Context { settings, api };
    let api = &ctx.api;
    let now = Utc::now();
    match command {
        Command::Submit(args) => submit(&ctx, args).await,
        Command::Rerun(args) => rerun(&ctx, args).await,
        Command::Template(command) => template(&ctx, command).await,
        Command::Array(command) => array(&ctx, command).await,
        Command::Service(command) => service(&ctx, command).await,
        Command::Status { job } => {
            let job = api.get(api.url(&["jobs", &job])).await?;
            ctx.print(&job, |j| output::job(j, now));
            Ok(Exit::Success.into())
        }
        Command::Cancel { job: id } => {
            let job = api.post(api.url(&["jobs", &id, "cancel"]), None, None, Repeat::Safe).await?;
            ctx.print(&job, |j| {
                // A running job is marked cancelled at once; its replicas take their grace
                // period to stop.
                let stopping =
                    j.get("stop_requested_at").is_some_and(|s| !s.is_null()) && !j["finished_at"].is_string();
                format!("{id}: {}{}\n", output::field(j, "state"), if stopping { ", stopping" } else { "" })
            });
            Ok(Exit::Success.into())
        }
        Command::List { state, limit } => {
            let mut url = api.url(&["teams", &ctx.team().await?, "jobs"]);
            if let Some(state) = state {
                url.query_pairs_mut().append_pair("state", &state);
            }
            if let Some(limit) = limit {
                url.query_pairs_mut().append_pair("limit", &limit.to_string());
            }
            let page = api.get(url).await?;
            ctx.print(&page, |p| {
                output::jobs(p.get("items").and_then(Value::as_array).map_or(&[], Vec::as_slice), now)
            });
            if ctx.settings.output == Output::Text && page.get("next_cursor").is_some_and(Value::is_string) {
                eprintln!("(more jobs: raise --limit, or use --output json and the API's cursor)");
            }
            Ok(Exit::Success.into())
        }
        Command::Queue => {
            let queue = api.get(api.url(&["teams", &ctx.team().await?, "queue"])).await?;
            ctx.print(&queue, |q| output::queue(q.as_array().map_or(&[], Vec::as_slice), now));
            Ok(Exit::Success.into())
        }
        Command::DryRun(job) => {
            let body = serde_json::to_vec(&spec::body(&job)?).map_err(|e| Error::Usage(e.to_string()))?;
            let url = api.url(&["teams", &ctx.team().await?, "jobs:dry-run"]);
            let result = api.post(url, Some(&body), None, Repeat::Safe).await?;
            ctx.print(&result, |r| output::dry_run(r, now));
            Ok(Exit::Success.into())
        }
        Command::Logs { job, follow, replica, attempt, timestamps } => {
            logs(api, &job, LogFlags { follow, replica, attempt, timestamps }).await
        }
        Command::Wait { job, options } => {
            let mut signals = wait::Signals::install()?;
            let ended = wait::wait(api, &job, options.into(), &mut signals).await?;
            print_final(&ctx, &job, ended.job).await;
            Ok(ended.finish)
        }
        Command::Completions { .. } => Ok(Exit::Success.into()),
    }
}

impl From<WaitArgs> for wait::Options {
    fn from(args: WaitArgs) -> Self {
        wait::Options { timeout: args.timeout, detach: args.detach, logs: args.logs }
    }
}

async fn submit(ctx: &Context, args: Box<SubmitArgs>) -> Result<Finish, Error> {
    // From a template, the body holds only what changes; the template's name is part of
    // what a CI key is derived from, so two templates with the same changes stay two jobs.
    let body = serde_json::to_vec(&spec::body(&args.job)?).map_err(|e| Error::Usage(e.to_string()))?;
    let team = ctx.team().await?;
    if let Some((count, parallelism)) = args.array {
        return submit_array(ctx, &team, &body, count, parallelism, args.create).await;
    }
    let (url, request) = match &args.template {
        Some(name) => {
            let url = ctx.api.url(&["teams", &team, "job-templates", name, "jobs"]);
            (url, [name.as_bytes(), b"\0", &body].concat())
        }
        None => (ctx.api.url(&["teams", &team, "jobs"]), body.clone()),
    };
    let key = idempotency_key(args.create.idempotency_key, &request);
    create(ctx, url, Some(body), key, args.create.wait.then_some(args.create.options)).await
}

/// Submits `body` as the task of an array of `count` tasks, `parallelism` at once; prints the
/// array's id (or, with `--output json`, the array) and with `--wait` follows it to its end.
async fn submit_array(
    ctx: &Context,
    team: &str,
    body: &[u8],
    count: u32,
    parallelism: Option<u32>,
    create: CreateArgs,
) -> Result<Finish, Error> {
    let task: Value = serde_json::from_slice(body).map_err(|e| Error::Usage(e.to_string()))?;
    let mut request = serde_json::json!({"count": count, "task": task});
    if let Some(p) = parallelism {
        request["parallelism"] = p.into();
    }
    let request = serde_json::to_vec(&request).map_err(|e| Error::Usage(e.to_string()))?;
    let key = idempotency_key(create.idempotency_key, &[b"array\0".as_slice(), &request].concat());
    let mut signals = if create.wait { Some(wait::Signals::install()?) } else { None };
    let url = ctx.api.url(&["teams", team, "arrays"]);
    let repeat = if key.is_some() { Repeat::Safe } else { Repeat::Unsafe };
    let submitted = ctx.api.post(url, Some(&request), key.as_deref(), repeat).await?;
    let Some(id) = submitted.get("id").and_then(Value::as_str).map(str::to_owned) else {
        return Err(Error::Unavailable(format!("the server's answer names no array: {submitted}")));
    };
    for warning in submitted.get("warnings").and_then(Value::as_array).into_iter().flatten() {
        eprintln!("fairway: warning: {}: {}", output::field(warning, "field"), output::field(warning, "message"));
    }
    let Some(signals) = signals.as_mut() else {
        ctx.print(&submitted, |_| format!("{id}\n"));
        return Ok(Exit::Success.into());
    };
    if ctx.settings.output == Output::Text {
        stdout(&format!("{id}\n"));
    }
    let ended = arrays::wait(&ctx.api, team, &id, create.options.into(), signals).await?;
    print_final_array(ctx, team, &id, ended.array).await;
    Ok(ended.finish)
}

async fn array(ctx: &Context, command: ArrayCommand) -> Result<Finish, Error> {
    let api = &ctx.api;
    let team = ctx.team().await?;
    match command {
        ArrayCommand::Status { array } => {
            let array = api.get(api.url(&["teams", &team, "arrays", &array])).await?;
            ctx.print(&array, |a| arrays::summary(a) + "\n");
        }
        ArrayCommand::Tasks { array, state, limit } => {
            let mut url = api.url(&["teams", &team, "arrays", &array, "tasks"]);
            if let Some(state) = state {
                url.query_pairs_mut().append_pair("state", &state);
            }
            if let Some(limit) = limit {
                url.query_pairs_mut().append_pair("limit", &limit.to_string());
            }
            let page = api.get(url).await?;
            let now = Utc::now();
            ctx.print(&page, |p| {
                output::jobs(p.get("items").and_then(Value::as_array).map_or(&[], Vec::as_slice), now)
            });
        }
        ArrayCommand::Cancel { array } => {
            let url = api.url(&["teams", &team, "arrays", &array, "cancel"]);
            let answer = api.post(url, None, None, Repeat::Safe).await?;
            ctx.print(&answer, |a| {
                format!(
                    "{}\n(cancelled {} waiting tasks; {} running tasks stopping)\n",
                    arrays::summary(&a["array"]),
                    output::field(&a["done"], "cancelled"),
                    output::field(&a["done"], "stopping")
                )
            });
        }
        ArrayCommand::Wait { array, options } => {
            let mut signals = wait::Signals::install()?;
            let ended = arrays::wait(api, &team, &array, options.into(), &mut signals).await?;
            print_final_array(ctx, &team, &array, ended.array).await;
            return Ok(ended.finish);
        }
    }
    Ok(Exit::Success.into())
}

async fn service(ctx: &Context, command: ServiceCommand) -> Result<Finish, Error> {
    let api = &ctx.api;
    let team = ctx.team().await?;
    let (name, answer, wait_for) = match command {
        ServiceCommand::Create { args, wait, timeout } => {
            let body = serde_json::to_vec(&services::body(&args)?).map_err(|e| Error::Usage(e.to_string()))?;
            let key = idempotency_key(None, &body);
            let url = api.url(&["teams", &team, "services"]);
            let created = api.post(url, Some(&body), key.as_deref(), Repeat::Unsafe).await?;
            (output::field(&created, "name"), created, wait.then_some(timeout))
        }
        ServiceCommand::List => {
            let mut url = api.url(&["teams", &team, "services"]);
            url.query_pairs_mut().append_pair("limit", "200");
            let page = api.get(url).await?;
            ctx.print(&page, |p| services::list(p.get("items").and_then(Value::as_array).map_or(&[], Vec::as_slice)));
            return Ok(Exit::Success.into());
        }
        ServiceCommand::Status { name } => {
            let service = api.get(api.url(&["teams", &team, "services", &name])).await?;
            (name, service, None)
        }
        ServiceCommand::Scale { name, replicas, wait, timeout } => {
            let body = services::update_body(Some(replicas), None, &[], &[])?;
            let changed = patch(api, &["teams", &team, "services", &name], &body).await?;
            (name, changed, wait.then_some(timeout))
        }
        ServiceCommand::Update { name, image, env, wait, timeout, command } => {
            let body = services::update_body(None, image, &env, &command)?;
            let changed = patch(api, &["teams", &team, "services", &name], &body).await?;
            (name, changed, wait.then_some(timeout))
        }
        ServiceCommand::Delete { name } => {
            let url = api.url(&["teams", &team, "services", &name]);
            let response = api.send(|| api.request(Method::DELETE, url.clone()), Repeat::Unsafe).await?;
            let deleted = http::json(response).await?;
            (name, deleted, None)
        }
        ServiceCommand::Wait { name, timeout } => {
            let service = api.get(api.url(&["teams", &team, "services", &name])).await?;
            (name, service, Some(timeout))
        }
    };
    let Some(timeout) = wait_for else {
        ctx.print(&answer, |s| services::summary(s) + "\n");
        return Ok(Exit::Success.into());
    };
    let (finish, last) = services::wait(api, &team, &name, timeout).await?;
    ctx.print(&last, |s| services::summary(s) + "\n");
    Ok(finish)
}

/// PATCHes a JSON body to the path of `segments`. Not repeated after a failure: a change
/// sent twice could undo a change made in between.
async fn patch(api: &Api, segments: &[&str], body: &Value) -> Result<Value, Error> {
    let url = api.url(segments);
    let bytes = serde_json::to_vec(body).map_err(|e| Error::Usage(e.to_string()))?;
    let build =
        || api.request(Method::PATCH, url.clone()).header(header::CONTENT_TYPE, "application/json").body(bytes.clone());
    http::json(api.send(build, Repeat::Unsafe).await?).await
}

/// With `--output json`, a wait for an array prints the array as it ended, or as it is now
/// when the wait was cut short.
async fn print_final_array(ctx: &Context, team: &str, id: &str, last: Option<Value>) {
    if ctx.settings.output != Output::Json {
        return;
    }
    let array = match last {
        Some(array) => Some(array),
        None => ctx.api.get(ctx.api.url(&["teams", team, "arrays", id])).await.ok(),
    };
    if let Some(array) = array {
        stdout(&format!("{array}\n"));
    }
}

async fn rerun(ctx: &Context, args: RerunArgs) -> Result<Finish, Error> {
    // In CI the key is derived from the job run again: a retried step reruns it once.
    let key = idempotency_key(args.create.idempotency_key, args.job.as_bytes());
    let url = ctx.api.url(&["jobs", &args.job, "rerun"]);
    create(ctx, url, None, key, args.create.wait.then_some(args.create.options)).await
}

async fn template(ctx: &Context, command: TemplateCommand) -> Result<Finish, Error> {
    let api = &ctx.api;
    let team = ctx.team().await?;
    match command {
        TemplateCommand::Save { template, job } => {
            let body = serde_json::to_vec(&spec::body(&job)?).map_err(|e| Error::Usage(e.to_string()))?;
            let url = api.url(&["teams", &team, "job-templates", &template]);
            let build = || {
                api.request(Method::PUT, url.clone())
                    .timeout(std::time::Duration::from_secs(30))
                    .header(header::CONTENT_TYPE, "application/json")
                    .body(body.clone())
            };
            // Saving the same request again is harmless: it may be repeated.
            let saved = http::json(api.send(build, Repeat::Safe).await?).await?;
            for warning in saved.get("warnings").and_then(Value::as_array).into_iter().flatten() {
                eprintln!(
                    "fairway: warning: {}: {}",
                    output::field(warning, "field"),
                    output::field(warning, "message")
                );
            }
            ctx.print(&saved, |t| {
                format!("{} saved (version {})\n", output::field(t, "name"), output::field(t, "version"))
            });
        }
        TemplateCommand::List => {
            let mut url = api.url(&["teams", &team, "job-templates"]);
            url.query_pairs_mut().append_pair("limit", "200");
            let page = api.get(url).await?;
            ctx.print(&page, |p| {
                output::templates(p.get("items").and_then(Value::as_array).map_or(&[], Vec::as_slice), Utc::now())
            });
        }
        TemplateCommand::Show { name } => {
            let template = api.get(api.url(&["teams", &team, "job-templates", &name])).await?;
            ctx.print(&template, |t| {
                let spec = t.get("spec").cloned().unwrap_or(Value::Null);
                serde_json::to_string_pretty(&spec).unwrap_or_default() + "\n"
            });
        }
        TemplateCommand::Delete { name } => {
            let url = api.url(&["teams", &team, "job-templates", &name]);
            api.send(|| api.request(Method::DELETE, url.clone()), Repeat::Unsafe).await?;
            if ctx.settings.output == Output::Text {
                stdout(&format!("{name} deleted\n"));
            }
        }
    }
    Ok(Exit::Success.into())
}

/// The key given, else one derived from the CI job and `request`, else none.
fn idempotency_key(given: Option<String>, request: &[u8]) -> Option<String> {
    if let Some(key) = given.filter(|k| !k.is_empty()) {
        return Some(key);
    }
    match ci::idempotency_key(|name| std::env::var(name).ok(), request) {
        ci::Detected::Key(key) => Some(key),
        ci::Detected::None => None,
        ci::Detected::Incomplete { system, missing } => {
            eprintln!("fairway: warning: {system} CI without {missing}: submitting without an idempotency key");
            None
        }
    }
}

/// Posts to `url` what creates a job (`body`, when the request has one), prints it, and
/// with `wait` follows it to its end.
async fn create(
    ctx: &Context,
    url: reqwest::Url,
    body: Option<Vec<u8>>,
    key: Option<String>,
    wait: Option<WaitArgs>,
) -> Result<Finish, Error> {
    let api = &ctx.api;
    // Caught before the job exists, so an interruption from here on cancels it.
    let mut signals = if wait.is_some() { Some(wait::Signals::install()?) } else { None };
    let repeat = if key.is_some() { Repeat::Safe } else { Repeat::Unsafe };
    let build = || {
        let mut request = api.request(Method::POST, url.clone()).timeout(std::time::Duration::from_secs(30));
        if let Some(body) = &body {
            request = request.header(header::CONTENT_TYPE, "application/json").body(body.clone());
        }
        match &key {
            Some(key) => request.header("idempotency-key", key),
            None => request,
        }
    };
    let response = api.send(build, repeat).await?;
    let replayed = response.headers().get("idempotent-replayed").is_some_and(|v| v == "true");
    let job = http::json(response).await?;
    let Some(id) = job.get("id").and_then(Value::as_str).map(str::to_owned) else {
        return Err(Error::Unavailable(format!("the server's answer names no job: {job}")));
    };
    if replayed {
        eprintln!("fairway: job {id} was submitted by an earlier try with the same idempotency key");
    }
    for warning in job.get("warnings").and_then(Value::as_array).into_iter().flatten() {
        eprintln!("fairway: warning: {}: {}", output::field(warning, "field"), output::field(warning, "message"));
    }
    let (Some(signals), Some(options)) = (signals.as_mut(), wait) else {
        ctx.print(&job, |_| format!("{id}\n"));
        return Ok(Exit::Success.into());
    };
    // The id first, so a script has it even if the wait is cut short; JSON waits for the end.
    if ctx.settings.output == Output::Text {
        stdout(&format!("{id}\n"));
    }
    let ended = wait::wait(api, &id, options.into(), signals).await?;
    print_final(ctx, &id, ended.job).await;
    Ok(ended.finish)
}

/// With `--output json`, a wait prints the job as it ended, or as it is now when the wait
/// was cut short.
async fn print_final(ctx: &Context, id: &str, last: Option<Value>) {
    if ctx.settings.output != Output::Json {
        return;
    }
    let job = match last {
        Some(job) => Some(job),
        None => ctx.api.get(ctx.api.url(&["jobs", id])).await.ok(),
    };
    if let Some(job) = job {
        stdout(&format!("{job}\n"));
    }
}

/// What `fairway logs` asks for.
struct LogFlags {
    follow: bool,
    replica: Option<u32>,
    attempt: Option<u32>,
    timestamps: bool,
}

async fn logs(api: &Api, job: &str, flags: LogFlags) -> Result<Finish, Error> {
    let mut url = api.url(&["jobs", job, "logs"]);
    {
        let mut query = url.query_pairs_mut();
        if let Some(attempt) = flags.attempt {
            query.append_pair("attempt", &attempt.to_string());
        }
        if let Some(replica) = flags.replica {
            query.append_pair("replica", &replica.to_string());
        }
        query.append_pair("follow", if flags.follow { "true" } else { "false" });
        if flags.timestamps {
            query.append_pair("timestamps", "true");
        }
    }
    let mut response = api.send(|| api.request(Method::GET, url.clone()), Repeat::Safe).await?;
    let mut out = std::io::stdout().lock();
    loop {
        match response.chunk().await {
            Ok(Some(bytes)) => {
                // A closed pipe (`| head`) ends the command quietly.
                if out.write_all(&bytes).and_then(|()| out.flush()).is_err() {
                    return Ok(Exit::Success.into());
                }
            }
            Ok(None) => return Ok(Exit::Success.into()),
            Err(e) => return Err(api.unreachable(&e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::{CommandFactory as _, Parser};

    use super::*;

    /// The client's part of the binary's command line.
    #[derive(Parser, Debug)]
    #[command(name = "fairway")]
    struct Cli {
        #[command(flatten)]
        flags: Flags,
        #[command(subcommand)]
        command: Command,
    }

    #[test]
    fn the_command_line_is_well_formed() {
        Cli::command().debug_assert();
    }

    #[test]
    fn connection_flags_go_before_or_after_the_command() {
        let before = Cli::try_parse_from([
            "fairway",
            "--team",
            "a",
            "--output",
            "json",
            "status",
            "0b9c6d6e-5a8f-4a53-9d4c-5d2b0a4f1c7e",
        ])
        .unwrap();
        let after = Cli::try_parse_from([
            "fairway",
            "status",
            "0b9c6d6e-5a8f-4a53-9d4c-5d2b0a4f1c7e",
            "--team",
            "a",
            "--output",
            "json",
        ])
        .unwrap();
        assert_eq!(before.flags, after.flags);
        assert_eq!(before.flags.team.as_deref(), Some("a"));
        assert_eq!(before.flags.output.as_deref(), Some("json"));
    }

    #[test]
    fn a_job_is_named_by_its_uuid() {
        assert!(Cli::try_parse_from(["fairway", "status", "not-a-job"]).is_err());
        let Command::Status { job } =
            Cli::try_parse_from(["fairway", "status", "0B9C6D6E-5A8F-4A53-9D4C-5D2B0A4F1C7E"]).unwrap().command
        else {
            panic!("not status");
        };
        assert_eq!(job, "0b9c6d6e-5a8f-4a53-9d4c-5d2b0a4f1c7e");
    }

    #[test]
    fn submit_takes_the_command_after_a_double_dash_and_repeated_pairs() {
        let cli = Cli::try_parse_from([
            "fairway",
            "submit",
            "--name",
            "n",
            "--env",
            "A=1",
            "--env",
            "B=2",
            "--max-runtime",
            "90m",
            "--wait",
            "--timeout",
            "1h",
            "--",
            "python",
            "train.py",
            "--epochs",
            "3",
        ])
        .unwrap();
        let Command::Submit(args) = cli.command else { panic!("not submit") };
        assert_eq!(args.job.command, ["python", "train.py", "--epochs", "3"]);
        assert_eq!(args.job.env.len(), 2);
        assert_eq!(args.job.max_runtime.map(|d| d.as_secs()), Some(5_400));
        assert!(args.create.wait);
        assert_eq!(args.create.options.timeout.map(|d| d.as_secs()), Some(3_600));
    }

    #[test]
    fn submit_help_documents_every_exit_status() {
        let help = Cli::command().find_subcommand_mut("submit").unwrap().render_long_help().to_string();
        for line in exit::HELP.lines().skip(1) {
            assert!(help.contains(line), "`fairway submit --help` lacks `{line}`");
        }
    }
}
