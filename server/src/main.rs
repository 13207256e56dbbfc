//! The `fairway` command: serve the API, migrate the database, print the OpenAPI document.

use std::{path::PathBuf, process::ExitCode};

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use fairway::{app, config::Config, db, telemetry};

#[derive(Parser)]
#[command(name = "fairway", version, about = "Multi-tenant GPU platform")]
struct Cli {
    /// TOML configuration file (also FAIRWAY_CONFIG).
    #[arg(long, global = true)]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Runs the service. With no DATABASE_URL it starts an embedded PostgreSQL.
    Serve,
    /// Applies or reverts schema migrations.
    Migrate {
        #[command(subcommand)]
        direction: Direction,
    },
    /// Prints the OpenAPI document.
    Openapi,
    /// Runs the embedded PostgreSQL alone and prints its URL (for tools and sqlx's
    /// compile-time checks), until interrupted.
    EmbeddedDb {
        /// Database to create and migrate.
        #[arg(long, default_value = "fairway")]
        database: String,
    },
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

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let config = match Config::load(cli.config) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("fairway: {e}");
            return ExitCode::from(2);
        }
    };
    telemetry::init(config.log_json);
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
        Command::Serve => app::serve(config).await,
        Command::Openapi => {
            print!("{}", fairway::api::openapi_json());
            Ok(())
        }
        Command::Migrate { direction } => {
            let database = app::Database::open(&config).await?;
            let result = migrate(&database.pool, direction).await;
            database.close().await;
            result
        }
        Command::EmbeddedDb { database } => {
            let pgdata = config.data_dir.join("postgres");
            let server =
                db::embedded::EmbeddedPostgres::start(&pgdata, db::embedded::Durability { fsync: true }).await?;
            let outcome = async {
                server.create_database(&database, None).await?;
                let pool = db::connect(server.connect_options(&database), 2).await?;
                db::MIGRATOR.run(&pool).await.context("applying migrations")?;
                pool.close().await;
                println!("DATABASE_URL={}", server.url(&database));
                app::shutdown_signal().await;
                anyhow::Ok(())
            }
            .await;
            server.stop().await;
            outcome
        }
    }
}

async fn migrate(pool: &sqlx::PgPool, direction: Direction) -> anyhow::Result<()> {
    match direction {
        Direction::Up => {
            db::MIGRATOR.run(pool).await.context("applying migrations")?;
            println!("migrations applied");
        }
        Direction::Down { target } => {
            let target = match target {
                Some(t) => t,
                None => {
                    // One step: the newest applied migration's predecessor.
                    let applied: Vec<i64> =
                        sqlx::query_scalar("select version from _sqlx_migrations order by version desc limit 2")
                            .fetch_all(pool)
                            .await
                            .unwrap_or_default();
                    applied.get(1).copied().unwrap_or(0)
                }
            };
            db::MIGRATOR.undo(pool, target).await.context("reverting migrations")?;
            println!("migrations reverted to version {target}");
        }
    }
    Ok(())
}
