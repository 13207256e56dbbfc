//! The running service: the HTTP application with its middleware in order, the backends of
//! the control loop, and the `serve` lifecycle (database, bootstrap, listen, graceful
//! shutdown). The one place that wires the faces to the rest.

use std::{collections::BTreeMap, path::Path, sync::Arc, time::Duration};
use tower_http::compression::{
    predicate::{DefaultPredicate, Predicate as _, SizeAbove},
    CompressionLayer,
};

use anyhow::Context as _;
use axum::{
    extract::{DefaultBodyLimit, Request, State},
    middleware::{self, Next},
    response::{IntoResponse, Response},
    Router,
};
use base64::Engine as _;
use sqlx::PgPool;
use utoipa_swagger_ui::SwaggerUi;

use crate::{
    api,
    auth::password,
    backends::{
        aws_batch::AwsBatchBackend,
        clusters::ClusterConfig,
        gcp_batch::GcpBatchBackend,
        kubernetes::{KubeBackend, Wake},
        sim::{SimBackend, SimConfig},
        Backend,
    },
    config::{decode_signing_key, Config, Secret},
    control,
    db::{
        self,
        embedded::{EmbeddedPostgres, Tuning},
    },
    http::{self, authorize::Gate, error::ApiError, idempotency, trace},
    state::AppState,
    web,
};

/// The whole HTTP application. Middleware, outermost first: the request span and id, the
/// door (header limit, HSTS, `Connection: close`), refusal of unstorable text, the request
/// timeout, compression, the body limit; then, on API routes, metrics and the request log line,
/// authentication and authorization, idempotency keys.
pub fn app(state: AppState) -> Router {
    let (api, openapi) = api::split();
    let gate = Gate { state: state.clone(), routes: api::ROUTE_POLICIES };
    let api = api
        .route_layer(middleware::from_fn(http::conditional::not_modified))
        .route_layer(middleware::from_fn_with_state(state.clone(), idempotency::idempotency))
        .route_layer(middleware::from_fn_with_state(gate, http::authorize::authorize))
        .route_layer(middleware::from_fn_with_state(state.clone(), trace::observe));
    api.merge(SwaggerUi::new("/api/docs").url("/api/v1/openapi.json", openapi))
        .merge(web::router())
        // Unknown API paths get a problem document; anything else is a portal page.
        .fallback(|uri: axum::http::Uri| async move {
            if uri.path().starts_with("/api/") {
                ApiError::NotFound("route").into_response()
            } else {
                web::pages::not_found_page()
            }
        })
        // The router adds `Allow` to this answer.
        .method_not_allowed_fallback(|| async { ApiError::MethodNotAllowed })
        .layer(DefaultBodyLimit::max(state.config.max_body_bytes))
        // gzip when the client accepts it and the body is worth it: billing exports reach
        // hundreds of MiB, and streamed bodies (no length) are compressed as they stream.
        .layer(CompressionLayer::new().compress_when(DefaultPredicate::new().and(SizeAbove::new(1024)).and(
            |_: axum::http::StatusCode,
             _: axum::http::Version,
             headers: &axum::http::HeaderMap,
             _: &axum::http::Extensions| {
                // A response that asks not to be transformed (a followed log, whose lines must
                // not wait in a compressor's buffer) is sent as it is.
                !headers
                    .get(axum::http::header::CACHE_CONTROL)
                    .and_then(|v| v.to_str().ok())
                    .is_some_and(|v| v.contains("no-transform"))
            },
        )))
        .layer(middleware::from_fn_with_state(state.clone(), timeout))
        .layer(middleware::from_fn(http::hostile::refuse_unstorable_text))
        .layer(middleware::from_fn(http::edge::door))
        .layer(middleware::from_fn(trace::request_span))
        .with_state(state)
}

/// Answers 503 `request_timeout` when a request takes longer than the configured limit.
/// Dropping the handler's future rolls back any open transaction.
async fn timeout(State(state): State<AppState>, request: Request, next: Next) -> Response {
    match tokio::time::timeout(state.config.request_timeout, next.run(request)).await {
        Ok(response) => response,
        Err(_) => ApiError::Timeout.into_response(),
    }
}

/// The service's database: an external one, or the embedded server we started.
pub struct Database {
    /// Connection pool.
    pub pool: PgPool,
    /// How to open more connections (leader election holds one of its own).
    pub options: sqlx::postgres::PgConnectOptions,
    /// This process's name on its database sessions (`application_name`): unique per
    /// process, so a scheduler that takes over can end a stalled predecessor's sessions.
    pub instance: String,
    embedded: Option<EmbeddedPostgres>,
}

impl Database {
    /// Connects to `DATABASE_URL`, or starts the embedded server under the data directory.
    pub async fn open(config: &Config) -> anyhow::Result<Self> {
        let instance = format!("fairway-{}-{:08x}", std::process::id(), rand::random::<u32>());
        match &config.database_url {
            Some(url) => {
                let options: sqlx::postgres::PgConnectOptions =
                    url.expose().parse().context("DATABASE_URL is not a PostgreSQL URL")?;
                let options = options.application_name(&instance);
                let pool = db::connect(options.clone(), 20).await.context("cannot connect to DATABASE_URL")?;
                Ok(Self { pool, options, instance, embedded: None })
            }
            None => {
                let pgdata = config.data_dir.join("postgres");
                let server = EmbeddedPostgres::start(&pgdata, Tuning::DURABLE).await?;
                tracing::info!(pgdata = %server.pgdata().display(), "embedded PostgreSQL running");
                server.create_database("fairway", None).await?;
                let options = server.connect_options("fairway").application_name(&instance);
                let pool = db::connect(options.clone(), 20).await?;
                Ok(Self { pool, options, instance, embedded: Some(server) })
            }
        }
    }

    /// The embedded server, if we run one.
    pub fn embedded(&self) -> Option<&EmbeddedPostgres> {
        self.embedded.as_ref()
    }

    /// Closes the pool and stops the embedded server.
    pub async fn close(self) {
        self.pool.close().await;
        if let Some(server) = self.embedded {
            server.stop().await;
        }
    }
}

/// The key that signs access tokens: the configured one, or in the embedded development
/// mode a random key generated once and kept in the data directory (so sign-ins survive a
/// restart). Outside development mode a missing or short key is fatal.
pub fn signing_key(config: &Config) -> anyhow::Result<Vec<u8>> {
    if let Some(key) = &config.signing_key {
        return Ok(decode_signing_key("FAIRWAY_SIGNING_KEY", key)?);
    }
    if !config.embedded_database() {
        anyhow::bail!(
            "FAIRWAY_SIGNING_KEY is required with an external database: set it to at least 32 random bytes in base64 \
             (e.g. `openssl rand -base64 32`)"
        );
    }
    let path = config.data_dir.join("signing.key");
    if let Ok(text) = std::fs::read_to_string(&path) {
        return Ok(decode_signing_key("signing.key", &Secret::new(text.trim()))?);
    }
    let key: [u8; 32] = rand::random();
    write_private(&path, &base64::engine::general_purpose::STANDARD.encode(key))?;
    Ok(key.to_vec())
}

fn write_private(path: &Path, text: &str) -> anyhow::Result<()> {
    use std::{io::Write as _, os::unix::fs::OpenOptionsExt as _};
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("cannot create {}", path.display()))?;
    file.write_all(text.as_bytes())?;
    Ok(())
}

/// Creates the platform admin on first start. Prints a generated password once.
pub async fn bootstrap_admin(pool: &PgPool, config: &Config) -> anyhow::Result<()> {
    if db::users::by_username(pool, "admin").await?.is_some() {
        return Ok(());
    }
    let (secret, generated) = match &config.admin_password {
        Some(p) => {
            crate::domain::Password::parse("FAIRWAY_ADMIN_PASSWORD", p.expose())
                .map_err(|e| anyhow::anyhow!("{} {}", e.field, e.message))?;
            (p.expose().to_owned(), false)
        }
        None => (password::generate(), true),
    };
    let hash = tokio::task::spawn_blocking({
        let secret = secret.clone();
        move || password::hash(&secret)
    })
    .await?;
    if db::users::ensure_admin(pool, &hash).await? {
        if generated {
            // Printed, not logged: it must not end up in a log pipeline.
            println!("Created the platform admin `admin` with password: {secret}");
            println!("It is shown only this once; set FAIRWAY_ADMIN_PASSWORD to choose it instead.");
        } else {
            tracing::info!("created the platform admin `admin` with the password from FAIRWAY_ADMIN_PASSWORD");
        }
    }
    Ok(())
}

use crate::backends::sim::{POOL_OBJECT_LABEL as SIM_POOL_OBJECT_LABEL, POOL_REPLICA_LABEL as SIM_POOL_REPLICA_LABEL};

/// Where GPU activity and health are read from: a Prometheus server, dcgm-exporters read
/// directly, or nothing.
fn dcgm_source(config: &Config) -> anyhow::Result<Option<crate::backends::dcgm::DcgmSource>> {
    use crate::backends::dcgm::{DcgmSource, ExporterSource, PrometheusSource, SeriesLabels};
    let labels = SeriesLabels {
        pod: config.dcgm_pod_label.clone(),
        object: config.dcgm_object_label.clone(),
        replica: config.dcgm_replica_label.clone(),
    };
    Ok(match (&config.prometheus_url, config.dcgm_exporter_urls.as_slice()) {
        (Some(url), _) => Some(DcgmSource::Prometheus(PrometheusSource::new(url, labels)?)),
        (None, []) => None,
        (None, urls) => Some(DcgmSource::Exporters(ExporterSource::new(urls, labels)?)),
    })
}

/// Runs the service until SIGTERM or SIGINT.
pub async fn serve(mut config: Config, demo: bool) -> anyhow::Result<()> {
    if demo && config.sim_speedup.is_none() {
        config.sim_speedup = Some(10.0);
    }
    if demo && !config.reads_gpu_activity() && config.sim_dcgm_listen.is_none() {
        // The demo's GPUs have activity to show: the simulated cluster serves its
        // dcgm-exporter on a free port, read directly, as a small fleet without Prometheus is.
        let free = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr());
        if let Ok(addr) = free {
            config.sim_dcgm_listen = Some(addr);
            config.dcgm_exporter_urls = vec![format!("http://{addr}/metrics")];
            // Its cloud pool's GPUs are labelled as a cloud scrape's relabelling does.
            config.dcgm_object_label.get_or_insert_with(|| SIM_POOL_OBJECT_LABEL.to_owned());
            config.dcgm_replica_label.get_or_insert_with(|| SIM_POOL_REPLICA_LABEL.to_owned());
        }
    }
    if demo && std::env::var_os("FAIRWAY_MIN_RUNTIME_BEFORE_PREEMPTION_SECONDS").is_none() {
        // At 10× speed, 30 s is the default five minutes of simulated work.
        config.min_runtime_before_preemption = Duration::from_secs(30);
    }
    let key = signing_key(&config)?;
    let database = Database::open(&config).await?;
    let result = run(&database, config, &key, demo).await;
    database.close().await;
    result
}

async fn run(database: &Database, config: Config, key: &[u8], demo: bool) -> anyhow::Result<()> {
    if database.embedded().is_some() {
        db::MIGRATOR.run(&database.pool).await.context("applying migrations")?;
    } else {
        check_migrated(&database.pool).await?;
    }
    bootstrap_admin(&database.pool, &config).await?;
    let listen = config.listen;
    let state = AppState::new(database.pool.clone(), config, key)?;
    tokio::spawn(purge_idempotency_keys(state.db.clone()));
    if state.config.scheduler {
        let ctx = control_context(&state).await?;
        if demo {
            let fresh = crate::demo::seed(&ctx).await?;
            let pace = crate::demo::Pace {
                every: Duration::from_secs(3),
                min_runtime: state.config.min_runtime_before_preemption,
                speedup: state.config.sim_speedup.unwrap_or(1.0),
            };
            tokio::spawn(crate::demo::generate(state.db.clone(), pace, fresh));
        }
        control::spawn(ctx, database.options.clone(), database.instance.clone());
    } else if demo {
        anyhow::bail!("--demo needs the scheduler: unset FAIRWAY_SCHEDULER=off");
    }
    if !demo {
        tokio::spawn(say_which_classes_have_no_price(state.db.clone()));
    }
    let listener = tokio::net::TcpListener::bind(listen).await.with_context(|| format!("cannot listen on {listen}"))?;
    tracing::info!(address = %listener.local_addr()?, "fairway listening");
    // The peer address reaches handlers (sign-in throttling keys on it).
    let feed = state.feed.clone();
    let app = app(state).into_make_service_with_connect_info::<std::net::SocketAddr>();
    // Open event streams end when draining starts, or they would hold the drain until their
    // jobs ended; their clients reconnect elsewhere with the last id they saw.
    let drained = async move {
        shutdown_signal().await;
        feed.close();
    };
    axum::serve(listener, app).with_graceful_shutdown(drained).await?;
    tracing::info!("shut down");
    Ok(())
}

/// Says, once the catalogue has GPU classes (the clusters' inventories create them), which
/// have no price: their use is metered but billed at 0 until an admin sets a rate, which a
/// fresh server's operator would otherwise find out from a statement.
async fn say_which_classes_have_no_price(pool: sqlx::PgPool) {
    for _ in 0..120 {
        match db::gpu_classes::count(&pool).await {
            Ok(n) if n > 0 => break,
            Ok(_) => tokio::time::sleep(Duration::from_millis(500)).await,
            Err(_) => return,
        }
    }
    if let Ok(names) = db::gpu_classes::unpriced(&pool).await {
        if !names.is_empty() {
            tracing::warn!(
                classes = %names.join(", "),
                "GPU classes without a price: their use is metered but billed at 0 until a rate is set \
                 (POST /api/v1/gpu-classes/{{class}}/rates with rate_micros_per_gpu_hour, or the portal's platform page)"
            );
        }
    }
}

/// The control loop's context: the clusters' backends and the loop's timings. With no
/// clusters file (`FAIRWAY_CLUSTERS`), the built-in simulated cluster (`sim`) is the one
/// backend.
pub async fn control_context(state: &AppState) -> anyhow::Result<control::Ctx> {
    // The control loop and the simulated cluster get pools of their own: a burst of API
    // traffic must not starve the scheduler of connections, and a dispatcher holding its
    // transaction while it calls the simulator must not wait on its own pool.
    let options = (*state.db.connect_options()).clone();
    let pool_of = |size: u32| {
        sqlx::postgres::PgPoolOptions::new()
            .max_connections(size)
            .acquire_timeout(Duration::from_secs(10))
            .connect_lazy_with(options.clone())
    };
    let control_pool = pool_of(24);
    let reconcile_soon = Arc::new(tokio::sync::Notify::new());
    let inventory_soon = Arc::new(tokio::sync::Notify::new());
    let sim_config = |inventory: Option<&std::path::Path>, speedup: Option<f64>| -> anyhow::Result<SimConfig> {
        let mut sim = match inventory {
            Some(path) => SimConfig::load(path).with_context(|| format!("sim inventory {}", path.display()))?,
            None => SimConfig::default(),
        };
        if let Some(speedup) = speedup.or(state.config.sim_speedup) {
            sim.speedup = speedup;
        }
        Ok(sim)
    };
    let mut backends: BTreeMap<String, Arc<dyn Backend>> = BTreeMap::new();
    let mut sims = Vec::new();
    match &state.config.clusters {
        None => {
            let sim = sim_config(state.config.sim_inventory.as_deref(), None)?;
            let mut backend = SimBackend::new(pool_of(8), sim);
            if let Some(path) = &state.config.sim_inventory {
                backend = backend.following(path.clone());
            }
            sims.push(backend.clone());
            backends.insert(backend.config.cluster.clone(), Arc::new(backend));
        }
        Some(path) => {
            let clusters = crate::backends::clusters::load(path).context("FAIRWAY_CLUSTERS")?;
            for cluster in clusters {
                let name = cluster.name().to_owned();
                let backend: Arc<dyn Backend> = match cluster {
                    ClusterConfig::Sim(c) => {
                        let mut sim = sim_config(c.inventory.as_deref(), c.speedup)?;
                        sim.cluster = c.name.clone();
                        let mut backend = SimBackend::new(pool_of(8), sim);
                        if let Some(path) = &c.inventory {
                            backend = backend.following(path.clone());
                        }
                        sims.push(backend.clone());
                        Arc::new(backend)
                    }
                    ClusterConfig::GcpBatch(c) => Arc::new(GcpBatchBackend::new(*c)),
                    ClusterConfig::AwsBatch(c) => {
                        let client = c.client().await;
                        Arc::new(AwsBatchBackend::new(client, *c))
                    }
                    ClusterConfig::Kubernetes(c) => {
                        let client = c.client().await?;
                        let wake = Wake { reconcile: reconcile_soon.clone(), inventory: inventory_soon.clone() };
                        Arc::new(KubeBackend::start(client, *c, wake))
                    }
                };
                backends.insert(name, backend);
            }
        }
    }
    if let (Some(addr), false) = (state.config.sim_dcgm_listen, sims.is_empty()) {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("FAIRWAY_SIM_DCGM_LISTEN: cannot listen on {addr}"))?;
        tracing::info!(addr = %listener.local_addr()?, "the simulated clusters' dcgm-exporter serves /metrics");
        tokio::spawn(async move {
            if let Err(e) = crate::backends::sim::serve_dcgm_exporter(sims, listener).await {
                tracing::warn!(error = %e, "the simulated dcgm-exporter stopped");
            }
        });
    }
    let config = control::ControlConfig {
        cycle_interval: state.config.cycle_interval,
        lease: state.config.leader_lease,
        check_invariants: state.config.check_invariants,
        engine: control::engine_config(&state.config),
        log_tail_lines: state.config.log_tail_lines,
        dcgm: dcgm_source(&state.config)?,
        utilisation_interval: state.config.utilisation_interval,
        webhook_retry_unit: state.config.webhook_retry_unit,
        webhook_lease: state.config.webhook_lease,
        pricing: crate::metering::Pricing {
            currency: state.config.currency.clone(),
            chargeback: state.config.chargeback,
        },
        ..control::ControlConfig::default()
    };
    Ok(control::Ctx {
        pool: control_pool,
        backends: Arc::new(backends),
        metrics: state.metrics.clone(),
        config,
        reconcile_soon,
        inventory_soon,
    })
}

/// With an external database, migrations are an explicit step (`fairway migrate up`), so
/// several replicas never race to apply them; refuse to run on an older schema.
async fn check_migrated(pool: &PgPool) -> anyhow::Result<()> {
    let applied = db::schema::applied_versions(pool)
        .await
        .context("cannot read the applied migrations: run `fairway migrate up` first")?;
    if applied.first().copied().unwrap_or(0) < db::schema::latest_known() {
        anyhow::bail!("the database schema is behind this binary: run `fairway migrate up` first");
    }
    Ok(())
}

async fn purge_idempotency_keys(pool: PgPool) {
    let mut tick = tokio::time::interval(Duration::from_secs(3600));
    loop {
        tick.tick().await;
        match db::idempotency::purge_expired(&pool).await {
            Ok(n) if n > 0 => tracing::info!(rows = n, "purged expired idempotency keys"),
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "purging idempotency keys failed"),
        }
    }
}

/// Resolves on SIGTERM or SIGINT.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = ctrl_c => {}
        _ = term => {}
    }
    tracing::info!("shutdown signal received; draining requests");
}
