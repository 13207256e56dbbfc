//! The `fairway` command: serve the API, migrate the database, print the OpenAPI document;
//! and, as a client of a running server, submit jobs and follow them (`fairway submit`, ...).

use std::{path::PathBuf, process::ExitCode};

use anyhow::Context as _;
use clap::{CommandFactory as _, FromArgMatches as _, Parser, Subcommand};
use fairway::{client, config::Config, db, serve, telemetry};

#[derive(Parser)]
#[command(name = "fairway", version, about = "Multi-tenant GPU platform")]
struct Cli {
    /// TOML configuration file (also FAIRWAY_CONFIG).
    #[arg(long, global = true)]
    config: Option<PathBuf>,
    #[command(flatten)]
    client: client::config::Flags,
    #[command(subcommand)]
    command: Command,
}

/// The command line. Clap gives a global flag to every subcommand that has no argument of the
/// same id; a hidden argument with that id, which refuses any value, keeps the client's flags
/// (`--url`, `--output text|json`, ...) off the server's commands (where `export` has an
/// `--output FILE` of its own) and the server's `--config` off the client's.
fn command_line() -> clap::Command {
    use clap::Subcommand as _;
    let client_commands = client::Command::augment_subcommands(clap::Command::new("client"));
    let is_client = |name: &str| client_commands.find_subcommand(name).is_some();
    let mut root = Cli::command();
    let names: Vec<String> = root.get_subcommands().map(|c| c.get_name().to_owned()).collect();
    for name in names {
        let foreign: &[&'static str] = if is_client(&name) { &["config"] } else { &client::config::IDS };
        root = root
            .mut_subcommand(&name, |command| foreign.iter().fold(command, |command, id| command.arg(placeholder(id))));
    }
    root
}

/// A hidden argument that takes the id `id` in a subcommand the global flag of that id is
/// not for. Its flag is the id itself, so `fairway serve --url ...` is refused with a
/// sentence rather than accepted and ignored.
fn placeholder(id: &'static str) -> clap::Arg {
    clap::Arg::new(id).long(id).hide(true).value_parser(|_: &str| Err::<String, _>("not an option of this command"))
}

#[derive(Subcommand)]
enum Command {
    /// Runs the service. With no DATABASE_URL it starts an embedded PostgreSQL.
    Serve {
        /// Seed demo teams, quotas, a rate card and users, run the simulated cluster at 10×
        /// speed and keep submitting jobs, so the platform is busy at once.
        #[arg(long)]
        demo: bool,
    },
    /// Applies or reverts schema migrations.
    Migrate {
        #[command(subcommand)]
        direction: Direction,
    },
    /// Prints the OpenAPI document.
    Openapi,
    /// Replays a job trace through the admission engine under Fairway, strict FIFO and
    /// quota-without-history, and prints utilisation, delays, fairness and sharing anomalies.
    Simulate {
        /// `alibaba` (the Alibaba GPU v2023 pods on its node list, teams from Helios Venus) or
        /// a job trace CSV (`submit_s,team,gpu_class,replicas,gpus_per_replica,duration_s,priority_class`).
        #[arg(long, default_value = "alibaba")]
        trace: String,
        /// Cluster description (TOML); required with a CSV trace.
        #[arg(long)]
        cluster: Option<PathBuf>,
        /// Divide arrival times by this factor; by default it is searched (1, 2, 4, ...) until
        /// FIFO's utilisation reaches 70%.
        #[arg(long)]
        compress: Option<f64>,
        /// Keep one node in this many (an even sample), scaling quotas with it; by default
        /// searched (1, 2, 4, ...) together with the compression.
        #[arg(long)]
        shrink: Option<u32>,
        /// Directory of the public traces [default: the copies built into the binary, from
        /// server/data/traces].
        #[arg(long)]
        traces_dir: Option<PathBuf>,
        /// Measure expected starts instead: replay under Fairway with forecasts and print
        /// their calibration beside the naive maximum-runtime estimate (at shrink 8 and
        /// compression 512 unless given).
        #[arg(long)]
        eta: bool,
        /// With --eta, predict every this many jobs only (by id), to save time.
        #[arg(long, default_value_t = 1)]
        eta_every: u64,
    },
    /// Places the Alibaba pod lists on the Alibaba GPU nodes, CPU and memory included, with
    /// plain best-fit, Fairway's best-fit and Fairway by fragmentation (FGD), and prints GPUs
    /// allocated and stranded, the fragmentation ratio and the CPU taken.
    Fragmentation {
        /// Directory of the public traces [default: the copies built into the binary, from
        /// server/data/traces].
        #[arg(long)]
        traces_dir: Option<PathBuf>,
    },
    /// Runs the embedded PostgreSQL alone and prints its URL (for tools and sqlx's
    /// compile-time checks), until interrupted.
    EmbeddedDb {
        /// Database to create and migrate.
        #[arg(long, default_value = "fairway")]
        database: String,
    },
    /// Exports one billing period of the ledger, as `GET /api/v1/billing/exports` does. Its
    /// control record (row count, totals, SHA-256) goes to `<output>.control.json`, or to
    /// standard error when the export goes to standard output.
    Export {
        /// The billing period, YYYY-MM.
        #[arg(long)]
        period: String,
        /// Output format.
        #[arg(long, value_enum, default_value = "focus")]
        format: fairway::billing::export::Format,
        /// Write here instead of to standard output.
        #[arg(long)]
        output: Option<PathBuf>,
    },
    /// Runs a benchmark and prints its table (build with --release for real numbers).
    Bench {
        /// What to measure.
        #[arg(value_enum)]
        what: fairway::bench::Target,
    },
    #[command(flatten)]
    Client(client::Command),
}

#[derive(Subcommand)]
enum Direction {
    /// Applies every pending migration.
    Up,
    /// Reverts migrations: the latest one, or all above --target.
    Down {
        /// Revert down to this version (0 reverts everything).
        #[arg(long)]
        target: Option<i64>,
    },
}

fn main() -> ExitCode {
    let matches = command_line().get_matches();
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    // The client reads neither the server's configuration nor its logging, and needs no
    // thread pool: one thread starts faster, which a CI step calling it often notices.
    if let Command::Client(command) = cli.command {
        let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
            Ok(runtime) => runtime,
            Err(e) => {
                eprintln!("fairway: cannot start: {e}");
                return ExitCode::FAILURE;
            }
        };
        let finish = runtime.block_on(client::run(command, cli.client, command_line));
        return ExitCode::from(finish.code());
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("fairway: cannot start: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(server_main(cli))
}

async fn server_main(cli: Cli) -> ExitCode {
    let config = match Config::load(cli.config) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("fairway: {e}");
            return ExitCode::from(2);
        }
    };
    // A benchmark logs only trouble: a line per request would be measured too.
    let quiet = matches!(cli.command, Command::Bench { .. });
    telemetry::init(config.log_json, if quiet { "warn,sqlx=error" } else { "info,sqlx=warn" });
    match run(cli.command, config).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("fairway: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(command: Command, config: Config) -> anyhow::Result<()> {
    match command {
        // Dispatched in `main`, before the server's configuration is read.
        Command::Client(_) => Ok(()),
        Command::Serve { demo } => serve::serve(config, demo).await,
        Command::Openapi => {
            print!("{}", fairway::api::openapi_json());
            Ok(())
        }
        Command::Simulate { trace, cluster, compress, shrink, traces_dir, eta, eta_every } => {
            let traces = fairway::simulate::traces::Traces::from_dir(traces_dir);
            let options =
                fairway::simulate::SimulateOptions { trace, cluster, compress, shrink, traces, eta, eta_every };
            fairway::simulate::simulate_command(&options, &mut std::io::stdout().lock())
        }
        Command::Fragmentation { traces_dir } => {
            let traces = fairway::simulate::traces::Traces::from_dir(traces_dir);
            fairway::simulate::fragmentation_command(&traces, &mut std::io::stdout().lock())
        }
        Command::Bench { what } => fairway::bench::run(what, &mut std::io::stdout()).await,
        Command::Export { period, format, output } => {
            let period = fairway::domain::BudgetPeriod::parse("--period", &period)
                .map_err(|e| anyhow::anyhow!("{}: {}", e.field, e.message))?
                .first_day();
            let database = serve::Database::open(&config).await?;
            let result = export(&database.pool, period, format, &config.currency, output).await;
            database.close().await;
            result
        }
        Command::Migrate { direction } => {
            let database = serve::Database::open(&config).await?;
            let result = migrate(&database.pool, direction).await;
            database.close().await;
            result
        }
        Command::EmbeddedDb { database } => {
            let pgdata = config.data_dir.join("postgres");
            let server = db::embedded::EmbeddedPostgres::start(&pgdata, db::embedded::Tuning::DURABLE).await?;
            let outcome = async {
                server.create_database(&database, None).await?;
                let pool = db::connect(server.connect_options(&database), 2).await?;
                db::MIGRATOR.run(&pool).await.context("applying migrations")?;
                pool.close().await;
                println!("DATABASE_URL={}", server.url(&database));
                serve::shutdown_signal().await;
                anyhow::Ok(())
            }
            .await;
            server.stop().await;
            outcome
        }
    }
}

async fn export(
    pool: &sqlx::PgPool,
    period: chrono::NaiveDate,
    format: fairway::billing::export::Format,
    currency: &str,
    output: Option<PathBuf>,
) -> anyhow::Result<()> {
    use std::io::Write as _;
    let mut out: Box<dyn std::io::Write + Send> = match &output {
        Some(path) => Box::new(std::io::BufWriter::new(
            std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?,
        )),
        None => Box::new(std::io::BufWriter::new(std::io::stdout())),
    };
    let mut failed = None;
    let sink = |chunk: Vec<u8>| {
        let ok = match out.write_all(&chunk) {
            Ok(()) => true,
            Err(e) => {
                failed = Some(e);
                false
            }
        };
        std::future::ready(ok)
    };
    let result = fairway::billing::export::write(pool, period, format, currency, sink).await;
    if let Some(e) = failed {
        return Err(e).context("writing the export");
    }
    let control = serde_json::to_string_pretty(&result?)? + "\n";
    out.flush().context("writing the export")?;
    match output {
        Some(path) => {
            let mut name = path.into_os_string();
            name.push(".control.json");
            std::fs::write(&name, control).with_context(|| format!("writing {}", name.to_string_lossy()))?;
        }
        None => eprint!("{control}"),
    }
    Ok(())
}

async fn migrate(pool: &sqlx::PgPool, direction: Direction) -> anyhow::Result<()> {
    match direction {
        Direction::Up => {
            db::MIGRATOR.run(pool).await.context("applying migrations")?;
            println!("migrations applied");
        }
        Direction::Down { target } => match db::schema::migrate_down(pool, target).await? {
            Some(at) => println!("migrations reverted to version {at}"),
            None => println!("no migration is applied; nothing to revert"),
        },
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::FromArgMatches as _;

    use super::{command_line, Cli, Command};

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        let matches = command_line().try_get_matches_from(args)?;
        Cli::from_arg_matches(&matches)
    }

    #[test]
    fn the_command_line_is_well_formed() {
        command_line().debug_assert();
    }

    #[test]
    fn each_sides_flags_stay_on_its_own_commands() {
        // `export --output` is a file, the client's `--output` a format; neither takes the other.
        let export = parse(&["fairway", "export", "--period", "2026-01", "--output", "x.csv"]).unwrap();
        assert!(matches!(export.command, Command::Export { output: Some(ref p), .. } if p.as_os_str() == "x.csv"));
        assert_eq!(export.client.output, None);
        assert!(parse(&["fairway", "serve", "--url", "http://x"]).is_err());
        assert!(parse(&["fairway", "submit", "--config", "server.toml"]).is_err());
        let client = parse(&["fairway", "list", "--output", "json"]).unwrap();
        assert_eq!(client.client.output.as_deref(), Some("json"));
    }
}
