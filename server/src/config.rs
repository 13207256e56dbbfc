//! Service configuration: built-in defaults, then an optional TOML file, then `FAIRWAY_*`
//! environment variables, each layer overriding the one before.
//!
//! Secrets (the database URL, signing keys, the admin password) are held in [`Secret`], whose
//! `Debug` and `Display` never show the value, so a logged `Config` cannot leak them.

use std::{fmt, net::SocketAddr, path::PathBuf, time::Duration};

use base64::Engine as _;
use serde::Deserialize;

/// A value that must never be printed: `Debug` shows `Secret([redacted])`.
#[derive(Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    /// Wraps a secret value.
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The secret itself; call only where it is used, never to log it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret([redacted])")
    }
}

/// Why the configuration cannot be used; each names the setting that is wrong.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    ReadFile { path: PathBuf, source: std::io::Error },
    #[error("config file {path} is not valid: {source}")]
    ParseFile { path: PathBuf, source: toml::de::Error },
    #[error("{name} is not valid: {reason}")]
    Invalid { name: &'static str, reason: String },
}

/// The effective configuration of one `fairway` process.
#[derive(Debug, Clone)]
pub struct Config {
    /// Address the HTTP server binds (`FAIRWAY_LISTEN`).
    pub listen: SocketAddr,
    /// Where the embedded database and generated dev keys live (`FAIRWAY_DATA_DIR`).
    pub data_dir: PathBuf,
    /// External database; `None` selects the embedded PostgreSQL (`DATABASE_URL`).
    pub database_url: Option<Secret>,
    /// Key that signs access tokens (`FAIRWAY_SIGNING_KEY`, base64, at least 256 bits).
    /// Required unless the embedded development database is in use.
    pub signing_key: Option<Secret>,
    /// Earlier signing keys still accepted for verification while tokens they signed
    /// expire (`FAIRWAY_PREVIOUS_SIGNING_KEYS`, comma-separated base64).
    pub previous_signing_keys: Vec<Secret>,
    /// `iss` claim of issued access tokens (`FAIRWAY_JWT_ISSUER`).
    pub jwt_issuer: String,
    /// `aud` claim of issued access tokens (`FAIRWAY_JWT_AUDIENCE`).
    pub jwt_audience: String,
    /// Lifetime of an access token (`FAIRWAY_ACCESS_TOKEN_TTL_SECONDS`).
    pub access_token_ttl: Duration,
    /// Initial password of the `admin` user (`FAIRWAY_ADMIN_PASSWORD`); random if unset.
    pub admin_password: Option<Secret>,
    /// Bearer token that unlocks the per-team series of `/metrics` (`FAIRWAY_METRICS_TOKEN`).
    /// Without it (and by default) `/metrics` names no team: a tenant's existence does not
    /// leak to anonymous callers.
    pub metrics_token: Option<Secret>,
    /// Longest a request may take before it is answered 503 (`FAIRWAY_REQUEST_TIMEOUT_SECONDS`).
    pub request_timeout: Duration,
    /// Largest accepted request body in bytes (`FAIRWAY_MAX_BODY_BYTES`).
    pub max_body_bytes: usize,
    /// How long a repeated `Idempotency-Key` waits for the first request to finish before
    /// answering 409 (`FAIRWAY_IDEMPOTENCY_WAIT_MS`).
    pub idempotency_wait: Duration,
    /// Currency of every price and budget, ISO 4217 (`FAIRWAY_CURRENCY`).
    pub currency: String,
    /// How teams are charged: `usage` or `reserved-plus-burst` (`FAIRWAY_CHARGEBACK_MODEL`).
    pub chargeback: crate::metering::Chargeback,
    /// Log as JSON lines instead of compact text (`FAIRWAY_LOG_FORMAT=json`).
    pub log_json: bool,
    /// Take the client's address from the last `X-Forwarded-For` entry, which the proxy in
    /// front of Fairway appends (`FAIRWAY_TRUST_FORWARDED_FOR=on`); off, the peer address is
    /// the client. Only turn it on behind a proxy that sets the header: a client could
    /// otherwise name any address it likes and escape sign-in throttling.
    pub trust_forwarded_for: bool,
    /// Run the scheduler (leader election, cycles, dispatch); off for API-only replicas
    /// (`FAIRWAY_SCHEDULER=off`).
    pub scheduler: bool,
    /// A scheduling cycle runs at least this often (`FAIRWAY_CYCLE_INTERVAL_MS`).
    pub cycle_interval: Duration,
    /// A leader silent this long is replaced (`FAIRWAY_LEADER_LEASE_SECONDS`).
    pub leader_lease: Duration,
    /// Inventory of the built-in simulated cluster, TOML (`FAIRWAY_SIM_INVENTORY`); the
    /// embedded default when unset.
    pub sim_inventory: Option<PathBuf>,
    /// Speed-up of simulated job time, for demos (`FAIRWAY_SIM_SPEEDUP`).
    pub sim_speedup: Option<f64>,
    /// The clusters jobs run on, TOML (`FAIRWAY_CLUSTERS`; format in `backends::clusters`);
    /// the built-in simulated cluster alone when unset.
    pub clusters: Option<PathBuf>,
    /// A job runs at least this long before it may be preempted
    /// (`FAIRWAY_MIN_RUNTIME_BEFORE_PREEMPTION_SECONDS`).
    pub min_runtime_before_preemption: Duration,
    /// How a team's waiting jobs of one priority are ordered (`FAIRWAY_QUEUE_ORDER`:
    /// `arrival`, oldest first, the default; or `service`, least expected GPU-time first),
    /// and for `service` how long a job waits before it goes first regardless
    /// (`FAIRWAY_STARVATION_SECONDS`, 4 hours by default).
    pub queue_order: crate::scheduler::QueueOrder,
    /// Where replicas go on the nodes (`FAIRWAY_PLACEMENT`: `best-fit`, the default; or
    /// `fragmentation`, least growth of the expected fragmentation of the shapes that arrive,
    /// as FGD, counting the CPU and memory nodes report).
    pub placement: crate::scheduler::Placement,
    /// Check the quota invariant after every cycle and log breaches
    /// (`FAIRWAY_CHECK_INVARIANTS=1`; for tests).
    pub check_invariants: bool,
    /// Lines of each replica's log kept per attempt, the newest (`FAIRWAY_LOG_TAIL_LINES`,
    /// 1 to 1,000,000; lines are cut at 4 KiB).
    pub log_tail_lines: u32,
    /// The Prometheus server that scrapes the clusters' dcgm-exporters, base URL
    /// (`FAIRWAY_PROMETHEUS_URL`, e.g. `http://prometheus:9090`): where jobs' GPU activity is
    /// read from. Unset, no activity is read.
    pub prometheus_url: Option<String>,
    /// dcgm-exporter endpoints read directly, without a Prometheus server
    /// (`FAIRWAY_DCGM_EXPORTER_URLS`, comma-separated, e.g. `http://gpu-node-1:9400/metrics`):
    /// for a small fleet or the simulated cluster. Not with `prometheus_url`.
    pub dcgm_exporter_urls: Vec<String>,
    /// The label of DCGM series that names the pod (`FAIRWAY_DCGM_POD_LABEL`, default `pod`;
    /// `exported_pod` where the scrape's own labels took the name).
    pub dcgm_pod_label: String,
    /// The label of DCGM series that holds a cloud batch job's name (`fw-<job>-<attempt>`),
    /// as the scrape's relabelling sets it from instance or job tags
    /// (`FAIRWAY_DCGM_OBJECT_LABEL`); unset, only pods are read.
    pub dcgm_object_label: Option<String>,
    /// With it, the label holding the replica's index (`FAIRWAY_DCGM_REPLICA_LABEL`; absent,
    /// replica 0).
    pub dcgm_replica_label: Option<String>,
    /// How often jobs' GPU activity is read (`FAIRWAY_UTILISATION_INTERVAL_MS`, default 15 s,
    /// dcgm-exporter's own collection interval is 30 s by default).
    pub utilisation_interval: Duration,
    /// Where the simulated clusters publish their GPUs' DCGM fields for a Prometheus server
    /// to scrape (`FAIRWAY_SIM_DCGM_LISTEN`, e.g. `127.0.0.1:9400`); not served when unset.
    pub sim_dcgm_listen: Option<SocketAddr>,
    /// The unit of the webhook retry schedule, a second by default
    /// (`FAIRWAY_WEBHOOK_RETRY_UNIT_MS`; for tests, which make retries come in milliseconds).
    pub webhook_retry_unit: Duration,
    /// How long a claimed webhook delivery is held before a process that died sending it is
    /// taken to have failed (`FAIRWAY_WEBHOOK_LEASE_MS`, default 60 s).
    pub webhook_lease: Duration,
    /// The address people and providers reach Fairway at, scheme and host without a trailing
    /// slash (`FAIRWAY_PUBLIC_URL`): sign-in redirect URIs are made from it. `http://` and the
    /// listen address when unset.
    pub public_url: Option<String>,
    /// Whether people may sign in with a password (`FAIRWAY_PASSWORD_SIGN_IN=on|off`, on by
    /// default). Off, only the providers below sign people in; API tokens still work.
    pub password_sign_in: bool,
    /// OpenID providers people sign in with (the file's `[[oidc_providers]]`).
    pub oidc_providers: Vec<OidcProvider>,
    /// CI systems whose ID tokens teams may trust (the file's `[[ci_issuers]]`).
    pub ci_issuers: Vec<CiIssuer>,
}

/// An OpenID provider people sign in with: the authorization code flow with PKCE.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OidcProvider {
    /// A short name in URLs (`/login/oidc/{id}`) and where memberships came from
    /// (`oidc:{id}`): lowercase letters, digits and `-`, at most 32.
    pub id: String,
    /// What the sign-in button says: "Sign in with {display_name}".
    pub display_name: String,
    /// The issuer, exactly as the provider's discovery document names it.
    pub issuer: String,
    /// Fairway's client id at the provider.
    pub client_id: String,
    /// Fairway's client secret (client_secret_basic).
    pub client_secret: Secret,
    /// Scopes asked for; `openid` is always among them.
    #[serde(default = "default_scopes")]
    pub scopes: Vec<String>,
    /// ID token signature algorithms accepted, asymmetric only (`RS256` by default).
    #[serde(default = "default_algorithms")]
    pub algorithms: Vec<String>,
    /// The claim that names the user (`preferred_username`; `email` and `sub` follow when it
    /// is missing).
    #[serde(default = "default_username_claim")]
    pub username_claim: String,
    /// The claim listing the person's groups (`groups`).
    #[serde(default = "default_groups_claim")]
    pub groups_claim: String,
    /// What each group grants, applied at every sign-in (`[[oidc_providers.groups]]`).
    #[serde(default)]
    pub groups: Vec<GroupGrant>,
}

/// What one provider group grants: a role in a team, or a platform role.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GroupGrant {
    /// The group, as the groups claim lists it.
    pub group: String,
    /// The team it makes the person a member of (with `role`).
    pub team: Option<String>,
    /// The role in `team`.
    pub role: Option<crate::domain::TeamRole>,
    /// The platform role it grants instead.
    pub platform_role: Option<crate::domain::PlatformRole>,
}

/// A CI system's OpenID issuer (GitHub Actions: `https://token.actions.githubusercontent.com`),
/// whose ID tokens teams may trust under their own policies.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CiIssuer {
    /// The issuer, exactly as its tokens' `iss` and its discovery document name it.
    pub issuer: String,
    /// Signature algorithms accepted (`RS256` by default).
    #[serde(default = "default_algorithms")]
    pub algorithms: Vec<String>,
}

fn default_scopes() -> Vec<String> {
    ["openid", "profile", "email", "groups"].map(String::from).to_vec()
}

fn default_algorithms() -> Vec<String> {
    vec!["RS256".into()]
}

fn default_username_claim() -> String {
    "preferred_username".into()
}

fn default_groups_claim() -> String {
    "groups".into()
}

/// The signature algorithms a provider may be configured with: asymmetric ones, as JOSE names
/// them. A symmetric one would make the provider's public keys a signing secret.
const ALGORITHMS: &[&str] = &["RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "EdDSA"];

impl Config {
    /// Whether jobs' GPU activity and health are read (from Prometheus or dcgm-exporters).
    pub fn reads_gpu_activity(&self) -> bool {
        self.prometheus_url.is_some() || !self.dcgm_exporter_urls.is_empty()
    }

    /// The base of Fairway's own URLs as people and providers reach it.
    pub fn public_url(&self) -> String {
        self.public_url.clone().unwrap_or_else(|| format!("http://{}", self.listen))
    }

    /// The provider `id`.
    pub fn oidc_provider(&self, id: &str) -> Option<&OidcProvider> {
        self.oidc_providers.iter().find(|p| p.id == id)
    }
}

impl Default for Config {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            data_dir: PathBuf::from(".fairway"),
            database_url: None,
            signing_key: None,
            previous_signing_keys: Vec::new(),
            jwt_issuer: "fairway".into(),
            jwt_audience: "fairway-api".into(),
            access_token_ttl: Duration::from_secs(15 * 60),
            admin_password: None,
            metrics_token: None,
            request_timeout: Duration::from_secs(30),
            max_body_bytes: 2 * 1024 * 1024,
            idempotency_wait: Duration::from_secs(5),
            currency: "USD".into(),
            chargeback: crate::metering::Chargeback::Usage,
            log_json: false,
            trust_forwarded_for: false,
            scheduler: true,
            cycle_interval: Duration::from_secs(2),
            leader_lease: Duration::from_secs(10),
            sim_inventory: None,
            sim_speedup: None,
            clusters: None,
            min_runtime_before_preemption: Duration::from_secs(300),
            queue_order: crate::scheduler::QueueOrder::Arrival,
            placement: crate::scheduler::Placement::BestFit,
            check_invariants: false,
            log_tail_lines: 5_000,
            prometheus_url: None,
            dcgm_exporter_urls: Vec::new(),
            dcgm_pod_label: "pod".into(),
            dcgm_object_label: None,
            dcgm_replica_label: None,
            utilisation_interval: Duration::from_secs(15),
            sim_dcgm_listen: None,
            webhook_retry_unit: Duration::from_secs(1),
            webhook_lease: Duration::from_secs(60),
            public_url: None,
            password_sign_in: true,
            oidc_providers: Vec::new(),
            ci_issuers: Vec::new(),
        }
    }
}

/// The TOML file's shape: every field optional, names as in the environment without the
/// `FAIRWAY_` prefix, lowercased.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    listen: Option<String>,
    data_dir: Option<PathBuf>,
    database_url: Option<Secret>,
    signing_key: Option<Secret>,
    previous_signing_keys: Option<Vec<Secret>>,
    jwt_issuer: Option<String>,
    jwt_audience: Option<String>,
    access_token_ttl_seconds: Option<u64>,
    admin_password: Option<Secret>,
    metrics_token: Option<Secret>,
    request_timeout_seconds: Option<u64>,
    max_body_bytes: Option<usize>,
    idempotency_wait_ms: Option<u64>,
    currency: Option<String>,
    chargeback_model: Option<String>,
    log_format: Option<String>,
    trust_forwarded_for: Option<String>,
    scheduler: Option<String>,
    cycle_interval_ms: Option<u64>,
    leader_lease_seconds: Option<u64>,
    sim_inventory: Option<PathBuf>,
    sim_speedup: Option<f64>,
    clusters: Option<PathBuf>,
    min_runtime_before_preemption_seconds: Option<u64>,
    queue_order: Option<String>,
    placement: Option<String>,
    starvation_seconds: Option<u64>,
    service_threshold_gpu_seconds: Option<u64>,
    log_tail_lines: Option<u64>,
    prometheus_url: Option<String>,
    dcgm_exporter_urls: Option<String>,
    dcgm_pod_label: Option<String>,
    dcgm_object_label: Option<String>,
    dcgm_replica_label: Option<String>,
    utilisation_interval_ms: Option<u64>,
    sim_dcgm_listen: Option<String>,
    webhook_retry_unit_ms: Option<u64>,
    webhook_lease_ms: Option<u64>,
    public_url: Option<String>,
    password_sign_in: Option<String>,
    #[serde(default)]
    oidc_providers: Vec<OidcProvider>,
    #[serde(default)]
    ci_issuers: Vec<CiIssuer>,
}

impl Config {
    /// Loads the configuration from the optional file (`FAIRWAY_CONFIG` when `file` is
    /// `None`) and the process environment.
    pub fn load(file: Option<PathBuf>) -> Result<Self, ConfigError> {
        let env = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        let file = file.or_else(|| env("FAIRWAY_CONFIG").map(PathBuf::from));
        let from_file = match file {
            Some(path) => {
                let text = std::fs::read_to_string(&path)
                    .map_err(|source| ConfigError::ReadFile { path: path.clone(), source })?;
                toml::from_str(&text).map_err(|source| ConfigError::ParseFile { path, source })?
            }
            None => FileConfig::default(),
        };
        Self::from_layers(from_file, &env)
    }

    fn from_layers(file: FileConfig, env: &dyn Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let mut config = Config::default();
        let listen = env("FAIRWAY_LISTEN").or(file.listen);
        if let Some(listen) = listen {
            config.listen = listen.parse().map_err(|e| ConfigError::Invalid {
                name: "FAIRWAY_LISTEN",
                reason: format!("{e} (expected host:port, e.g. 127.0.0.1:8080)"),
            })?;
        }
        if let Some(dir) = env("FAIRWAY_DATA_DIR").map(PathBuf::from).or(file.data_dir) {
            config.data_dir = dir;
        }
        config.database_url = env("DATABASE_URL").map(Secret::new).or(file.database_url);
        config.signing_key = env("FAIRWAY_SIGNING_KEY").map(Secret::new).or(file.signing_key);
        config.previous_signing_keys = match env("FAIRWAY_PREVIOUS_SIGNING_KEYS") {
            Some(list) => list.split(',').map(|k| Secret::new(k.trim())).collect(),
            None => file.previous_signing_keys.unwrap_or_default(),
        };
        if let Some(v) = env("FAIRWAY_JWT_ISSUER").or(file.jwt_issuer) {
            config.jwt_issuer = v;
        }
        if let Some(v) = env("FAIRWAY_JWT_AUDIENCE").or(file.jwt_audience) {
            config.jwt_audience = v;
        }
        let number = |name: &'static str, from_file: Option<u64>| -> Result<Option<u64>, ConfigError> {
            match env(name) {
                Some(v) => v
                    .parse()
                    .map(Some)
                    .map_err(|_| ConfigError::Invalid { name, reason: format!("{v:?} is not a whole number") }),
                None => Ok(from_file),
            }
        };
        if let Some(s) = number("FAIRWAY_ACCESS_TOKEN_TTL_SECONDS", file.access_token_ttl_seconds)? {
            if !(60..=86_400).contains(&s) {
                return Err(ConfigError::Invalid {
                    name: "FAIRWAY_ACCESS_TOKEN_TTL_SECONDS",
                    reason: "must be between 60 and 86400".into(),
                });
            }
            config.access_token_ttl = Duration::from_secs(s);
        }
        if let Some(s) = number("FAIRWAY_REQUEST_TIMEOUT_SECONDS", file.request_timeout_seconds)? {
            config.request_timeout = Duration::from_secs(s.max(1));
        }
        if let Some(b) = number("FAIRWAY_MAX_BODY_BYTES", file.max_body_bytes.map(|b| b as u64))? {
            config.max_body_bytes = usize::try_from(b).unwrap_or(usize::MAX);
        }
        if let Some(ms) = number("FAIRWAY_IDEMPOTENCY_WAIT_MS", file.idempotency_wait_ms)? {
            config.idempotency_wait = Duration::from_millis(ms);
        }
        config.admin_password = env("FAIRWAY_ADMIN_PASSWORD").map(Secret::new).or(file.admin_password);
        config.metrics_token = env("FAIRWAY_METRICS_TOKEN").map(Secret::new).or(file.metrics_token);
        if let Some(c) = env("FAIRWAY_CURRENCY").or(file.currency) {
            if c.len() != 3 || !c.bytes().all(|b| b.is_ascii_uppercase()) {
                return Err(ConfigError::Invalid {
                    name: "FAIRWAY_CURRENCY",
                    reason: "must be an ISO 4217 code such as USD".into(),
                });
            }
            config.currency = c;
        }
        if let Some(model) = env("FAIRWAY_CHARGEBACK_MODEL").or(file.chargeback_model) {
            config.chargeback = crate::metering::Chargeback::parse(&model).ok_or_else(|| ConfigError::Invalid {
                name: "FAIRWAY_CHARGEBACK_MODEL",
                reason: format!("{model:?} is neither \"usage\" nor \"reserved-plus-burst\""),
            })?;
        }
        config.log_json =
            choice("FAIRWAY_LOG_FORMAT", env("FAIRWAY_LOG_FORMAT").or(file.log_format), ("text", "json"), false)?;
        config.trust_forwarded_for = choice(
            "FAIRWAY_TRUST_FORWARDED_FOR",
            env("FAIRWAY_TRUST_FORWARDED_FOR").or(file.trust_forwarded_for),
            ("off", "on"),
            false,
        )?;
        config.scheduler =
            choice("FAIRWAY_SCHEDULER", env("FAIRWAY_SCHEDULER").or(file.scheduler), ("off", "on"), true)?;
        if let Some(ms) = number("FAIRWAY_CYCLE_INTERVAL_MS", file.cycle_interval_ms)? {
            config.cycle_interval = Duration::from_millis(ms.clamp(10, 600_000));
        }
        if let Some(s) = number("FAIRWAY_LEADER_LEASE_SECONDS", file.leader_lease_seconds)? {
            if !(2..=600).contains(&s) {
                return Err(ConfigError::Invalid {
                    name: "FAIRWAY_LEADER_LEASE_SECONDS",
                    reason: "must be between 2 and 600".into(),
                });
            }
            config.leader_lease = Duration::from_secs(s);
        }
        config.sim_inventory = env("FAIRWAY_SIM_INVENTORY").map(PathBuf::from).or(file.sim_inventory);
        config.clusters = env("FAIRWAY_CLUSTERS").map(PathBuf::from).or(file.clusters);
        let speedup = match env("FAIRWAY_SIM_SPEEDUP") {
            Some(v) => Some(v.parse::<f64>().map_err(|_| ConfigError::Invalid {
                name: "FAIRWAY_SIM_SPEEDUP",
                reason: format!("{v:?} is not a number"),
            })?),
            None => file.sim_speedup,
        };
        if let Some(x) = speedup {
            if !(x.is_finite() && x > 0.0 && x <= 100_000.0) {
                return Err(ConfigError::Invalid {
                    name: "FAIRWAY_SIM_SPEEDUP",
                    reason: "must be a number above 0 and at most 100000".into(),
                });
            }
        }
        config.sim_speedup = speedup;
        if let Some(s) =
            number("FAIRWAY_MIN_RUNTIME_BEFORE_PREEMPTION_SECONDS", file.min_runtime_before_preemption_seconds)?
        {
            config.min_runtime_before_preemption = Duration::from_secs(s.min(7 * 86_400));
        }
        let starvation = number("FAIRWAY_STARVATION_SECONDS", file.starvation_seconds)?;
        if starvation.is_some_and(|s| !(60..=30 * 86_400).contains(&s)) {
            return Err(ConfigError::Invalid {
                name: "FAIRWAY_STARVATION_SECONDS",
                reason: "must be from 60 (a minute) to 2592000 (30 days)".into(),
            });
        }
        let starvation_ms = starvation.map_or(crate::scheduler::DEFAULT_STARVATION_MS, |s| s as i64 * 1000);
        let threshold = number("FAIRWAY_SERVICE_THRESHOLD_GPU_SECONDS", file.service_threshold_gpu_seconds)?;
        if threshold.is_some_and(|t| t > 365 * 86_400) {
            return Err(ConfigError::Invalid {
                name: "FAIRWAY_SERVICE_THRESHOLD_GPU_SECONDS",
                reason: "must be at most 31536000 (a GPU-year); 0 turns least-attained-service preemption off".into(),
            });
        }
        let threshold_gpu_ms = match threshold {
            None => Some(crate::scheduler::DEFAULT_SERVICE_THRESHOLD_GPU_MS),
            Some(0) => None,
            Some(t) => Some(t as i64 * 1000),
        };
        config.queue_order = match env("FAIRWAY_QUEUE_ORDER").or(file.queue_order).as_deref() {
            Some("service") => crate::scheduler::QueueOrder::ServiceIndex { starvation_ms, threshold_gpu_ms },
            None | Some("arrival") if starvation.is_none() && threshold.is_none() => {
                crate::scheduler::QueueOrder::Arrival
            }
            None | Some("arrival") => {
                return Err(ConfigError::Invalid {
                    name: if starvation.is_some() {
                        "FAIRWAY_STARVATION_SECONDS"
                    } else {
                        "FAIRWAY_SERVICE_THRESHOLD_GPU_SECONDS"
                    },
                    reason: "applies to FAIRWAY_QUEUE_ORDER=service only: in arrival order no job is overtaken".into(),
                })
            }
            Some(other) => {
                return Err(ConfigError::Invalid {
                    name: "FAIRWAY_QUEUE_ORDER",
                    reason: format!("{other:?} is neither `service` nor `arrival`"),
                })
            }
        };
        config.placement = match env("FAIRWAY_PLACEMENT").or(file.placement).as_deref() {
            None | Some("best-fit") => crate::scheduler::Placement::BestFit,
            Some("fragmentation") => crate::scheduler::Placement::Fragmentation,
            Some(other) => {
                return Err(ConfigError::Invalid {
                    name: "FAIRWAY_PLACEMENT",
                    reason: format!("{other:?} is neither `best-fit` nor `fragmentation`"),
                })
            }
        };
        if let Some(n) = number("FAIRWAY_LOG_TAIL_LINES", file.log_tail_lines)? {
            config.log_tail_lines = u32::try_from(n).ok().filter(|n| (1..=1_000_000).contains(n)).ok_or_else(|| {
                ConfigError::Invalid { name: "FAIRWAY_LOG_TAIL_LINES", reason: "must be from 1 to 1000000".into() }
            })?;
        }
        if let Some(url) = env("FAIRWAY_PROMETHEUS_URL").or(file.prometheus_url) {
            let url = url.trim_end_matches('/').to_owned();
            if !(url.starts_with("https://") || url.starts_with("http://")) {
                return Err(ConfigError::Invalid {
                    name: "FAIRWAY_PROMETHEUS_URL",
                    reason: format!("{url:?} is not an http(s) URL such as http://prometheus:9090"),
                });
            }
            config.prometheus_url = Some(url);
        }
        if let Some(urls) = env("FAIRWAY_DCGM_EXPORTER_URLS").or(file.dcgm_exporter_urls) {
            let invalid = |reason: String| ConfigError::Invalid { name: "FAIRWAY_DCGM_EXPORTER_URLS", reason };
            if config.prometheus_url.is_some() {
                return Err(invalid("set it or FAIRWAY_PROMETHEUS_URL, not both".into()));
            }
            for url in urls.split(',').map(str::trim).filter(|u| !u.is_empty()) {
                if !(url.starts_with("https://") || url.starts_with("http://")) {
                    return Err(invalid(format!(
                        "{url:?} is not an http(s) URL such as http://gpu-node-1:9400/metrics"
                    )));
                }
                config.dcgm_exporter_urls.push(url.to_owned());
            }
        }
        // Prometheus label names: they go into a query as they are.
        let label_name = |name: &'static str, label: String| {
            let valid = label.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                && label.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
            if valid {
                Ok(label)
            } else {
                Err(ConfigError::Invalid {
                    name,
                    reason: format!("{label:?} is not a Prometheus label name ([a-zA-Z_][a-zA-Z0-9_]*)"),
                })
            }
        };
        if let Some(label) = env("FAIRWAY_DCGM_POD_LABEL").or(file.dcgm_pod_label) {
            config.dcgm_pod_label = label_name("FAIRWAY_DCGM_POD_LABEL", label)?;
        }
        if let Some(label) = env("FAIRWAY_DCGM_OBJECT_LABEL").or(file.dcgm_object_label) {
            config.dcgm_object_label = Some(label_name("FAIRWAY_DCGM_OBJECT_LABEL", label)?);
        }
        if let Some(label) = env("FAIRWAY_DCGM_REPLICA_LABEL").or(file.dcgm_replica_label) {
            config.dcgm_replica_label = Some(label_name("FAIRWAY_DCGM_REPLICA_LABEL", label)?);
        }
        if let Some(ms) = number("FAIRWAY_UTILISATION_INTERVAL_MS", file.utilisation_interval_ms)? {
            config.utilisation_interval = Duration::from_millis(ms.clamp(100, 3_600_000));
        }
        if let Some(addr) = env("FAIRWAY_SIM_DCGM_LISTEN").or(file.sim_dcgm_listen) {
            config.sim_dcgm_listen = Some(addr.parse().map_err(|_| ConfigError::Invalid {
                name: "FAIRWAY_SIM_DCGM_LISTEN",
                reason: format!("{addr:?} is not an address such as 127.0.0.1:9400"),
            })?);
        }
        if let Some(ms) = number("FAIRWAY_WEBHOOK_RETRY_UNIT_MS", file.webhook_retry_unit_ms)? {
            config.webhook_retry_unit = Duration::from_millis(ms.clamp(1, 60_000));
        }
        // Shorter than a receiver may take to answer (10 s), a lease would send a slow
        // delivery again while the first request still waits; tests accept that.
        if let Some(ms) = number("FAIRWAY_WEBHOOK_LEASE_MS", file.webhook_lease_ms)? {
            config.webhook_lease = Duration::from_millis(ms.clamp(100, 3_600_000));
        }
        if let Some(url) = env("FAIRWAY_PUBLIC_URL").or(file.public_url) {
            let url = url.trim_end_matches('/').to_owned();
            if !(url.starts_with("https://") || url.starts_with("http://"))
                || url[url.find("://").unwrap_or(0) + 3..].is_empty()
            {
                return Err(ConfigError::Invalid {
                    name: "FAIRWAY_PUBLIC_URL",
                    reason: format!("{url:?} is not an http(s) URL such as https://fairway.example.com"),
                });
            }
            config.public_url = Some(url);
        }
        config.password_sign_in = choice(
            "FAIRWAY_PASSWORD_SIGN_IN",
            env("FAIRWAY_PASSWORD_SIGN_IN").or(file.password_sign_in),
            ("off", "on"),
            true,
        )?;
        config.oidc_providers = file.oidc_providers;
        config.ci_issuers = file.ci_issuers;
        config.check_identity()?;
        config.check_invariants = env("FAIRWAY_CHECK_INVARIANTS").is_some_and(|v| v == "1" || v == "true");
        Ok(config)
    }

    /// Checks the providers and CI issuers: ids, issuers, algorithms and group grants.
    pub fn check_identity(&self) -> Result<(), ConfigError> {
        let bad = |name: &'static str, reason: String| Err(ConfigError::Invalid { name, reason });
        let mut ids = std::collections::HashSet::new();
        for p in &self.oidc_providers {
            let id_ok = !p.id.is_empty()
                && p.id.len() <= 32
                && p.id.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
            if !id_ok {
                return bad("oidc_providers.id", format!("{:?} must be 1 to 32 lowercase letters, digits or -", p.id));
            }
            if !ids.insert(p.id.as_str()) {
                return bad("oidc_providers.id", format!("{:?} is used by two providers", p.id));
            }
            check_issuer("oidc_providers.issuer", &p.issuer)?;
            check_algorithms("oidc_providers.algorithms", &p.algorithms)?;
            if p.client_id.is_empty() {
                return bad("oidc_providers.client_id", format!("provider {:?} has no client id", p.id));
            }
            if !p.scopes.iter().any(|s| s == "openid") {
                return bad("oidc_providers.scopes", format!("provider {:?}: the scopes must include openid", p.id));
            }
            for g in &p.groups {
                match (&g.team, g.role, g.platform_role) {
                    (Some(team), Some(_), None) if !team.is_empty() => {}
                    (None, None, Some(_)) => {}
                    _ => {
                        return bad(
                            "oidc_providers.groups",
                            format!("group {:?} must grant either a team and a role or a platform role", g.group),
                        )
                    }
                }
            }
        }
        for ci in &self.ci_issuers {
            check_issuer("ci_issuers.issuer", &ci.issuer)?;
            check_algorithms("ci_issuers.algorithms", &ci.algorithms)?;
        }
        Ok(())
    }

    /// True when no external database is configured: the embedded development mode.
    pub fn embedded_database(&self) -> bool {
        self.database_url.is_none()
    }
}

/// An issuer must be an `https` URL; plain `http` only on the loopback interface (tests, a
/// provider beside the service).
fn check_issuer(name: &'static str, issuer: &str) -> Result<(), ConfigError> {
    let loopback = ["http://127.0.0.1:", "http://localhost:", "http://[::1]:"].iter().any(|p| issuer.starts_with(p));
    if (issuer.starts_with("https://") && issuer.len() > "https://".len()) || loopback {
        Ok(())
    } else {
        Err(ConfigError::Invalid { name, reason: format!("{issuer:?} must be an https URL") })
    }
}

fn check_algorithms(name: &'static str, algorithms: &[String]) -> Result<(), ConfigError> {
    match algorithms.iter().find(|a| !ALGORITHMS.contains(&a.as_str())) {
        _ if algorithms.is_empty() => Err(ConfigError::Invalid { name, reason: "names no algorithm".into() }),
        Some(a) => Err(ConfigError::Invalid { name, reason: format!("{a:?} is not one of {}", ALGORITHMS.join(", ")) }),
        None => Ok(()),
    }
}

/// Decodes a base64 signing key and insists on at least 256 bits.
pub fn decode_signing_key(name: &'static str, key: &Secret) -> Result<Vec<u8>, ConfigError> {
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(key.expose().trim())
        .or_else(|_| base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(key.expose().trim()))
        .map_err(|_| ConfigError::Invalid { name, reason: "is not base64".into() })?;
    if bytes.len() < 32 {
        return Err(ConfigError::Invalid {
            name,
            reason: format!("is {} bits; at least 256 are required", bytes.len() * 8),
        });
    }
    Ok(bytes)
}

/// A setting with two spellings, `(no, yes)`: `false` for the first, `true` for the second,
/// `default` when unset, and an error naming the setting for anything else.
fn choice(
    name: &'static str,
    value: Option<String>,
    (no, yes): (&str, &str),
    default: bool,
) -> Result<bool, ConfigError> {
    match value.as_deref() {
        None => Ok(default),
        Some(v) if v == no => Ok(false),
        Some(v) if v == yes => Ok(true),
        Some(other) => Err(ConfigError::Invalid { name, reason: format!("{other:?} is neither {no:?} nor {yes:?}") }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env_of<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |name| pairs.iter().find(|(k, _)| *k == name).map(|(_, v)| v.to_string())
    }

    #[test]
    fn debug_output_never_shows_secrets() {
        let env = env_of(&[
            ("DATABASE_URL", "postgres://u:hunter2@db/fairway"),
            ("FAIRWAY_SIGNING_KEY", "c2VjcmV0c2VjcmV0c2VjcmV0c2VjcmV0c2VjcmV0MTI="),
            ("FAIRWAY_ADMIN_PASSWORD", "correct-horse"),
        ]);
        let config = Config::from_layers(FileConfig::default(), &env).unwrap();
        let shown = format!("{config:?}");
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(!shown.contains("c2VjcmV0"), "{shown}");
        assert!(!shown.contains("correct-horse"), "{shown}");
        assert!(shown.contains("[redacted]"));
    }

    #[test]
    fn environment_overrides_the_file_and_defaults_apply_otherwise() {
        let file: FileConfig = toml::from_str("listen = \"0.0.0.0:9000\"\njwt_issuer = \"from-file\"").unwrap();
        let env = env_of(&[("FAIRWAY_LISTEN", "127.0.0.1:7000")]);
        let config = Config::from_layers(file, &env).unwrap();
        assert_eq!(config.listen.to_string(), "127.0.0.1:7000");
        assert_eq!(config.jwt_issuer, "from-file");
        assert_eq!(config.data_dir, PathBuf::from(".fairway"));
        assert!(config.embedded_database());
    }

    #[test]
    fn where_gpu_activity_is_read_from_is_checked_and_names_the_variable_at_fault() {
        let config = |pairs: &[(&str, &str)]| Config::from_layers(FileConfig::default(), &env_of(pairs));
        let direct = config(&[
            ("FAIRWAY_DCGM_EXPORTER_URLS", "http://n1:9400/metrics, http://n2:9400/metrics"),
            ("FAIRWAY_DCGM_OBJECT_LABEL", "batch_job"),
        ])
        .unwrap();
        assert_eq!(direct.dcgm_exporter_urls, ["http://n1:9400/metrics", "http://n2:9400/metrics"]);
        assert_eq!(direct.dcgm_object_label.as_deref(), Some("batch_job"));
        assert!(direct.reads_gpu_activity() && !config(&[]).unwrap().reads_gpu_activity());
        for (pairs, variable) in [
            (&[("FAIRWAY_DCGM_EXPORTER_URLS", "n1:9400")][..], "FAIRWAY_DCGM_EXPORTER_URLS"),
            (
                &[
                    ("FAIRWAY_PROMETHEUS_URL", "http://prom:9090"),
                    ("FAIRWAY_DCGM_EXPORTER_URLS", "http://n1:9400/metrics"),
                ],
                "FAIRWAY_DCGM_EXPORTER_URLS",
            ),
            (&[("FAIRWAY_DCGM_OBJECT_LABEL", "batch-job")], "FAIRWAY_DCGM_OBJECT_LABEL"),
            (&[("FAIRWAY_DCGM_REPLICA_LABEL", "0index")], "FAIRWAY_DCGM_REPLICA_LABEL"),
        ] {
            let err = config(pairs).unwrap_err();
            assert!(err.to_string().starts_with(variable), "{pairs:?}: {err}");
        }
    }

    #[test]
    fn the_queue_order_defaults_to_arrival_and_is_checked() {
        use crate::scheduler::QueueOrder;
        let config = |pairs: &[(&str, &str)]| Config::from_layers(FileConfig::default(), &env_of(pairs));
        assert_eq!(config(&[]).unwrap().queue_order, QueueOrder::Arrival);
        assert_eq!(config(&[("FAIRWAY_QUEUE_ORDER", "service")]).unwrap().queue_order, QueueOrder::SERVICE);
        assert_eq!(
            config(&[("FAIRWAY_QUEUE_ORDER", "service"), ("FAIRWAY_STARVATION_SECONDS", "600")]).unwrap().queue_order,
            QueueOrder::ServiceIndex {
                starvation_ms: 600_000,
                threshold_gpu_ms: Some(crate::scheduler::DEFAULT_SERVICE_THRESHOLD_GPU_MS)
            }
        );
        assert_eq!(
            config(&[("FAIRWAY_QUEUE_ORDER", "service"), ("FAIRWAY_SERVICE_THRESHOLD_GPU_SECONDS", "0")])
                .unwrap()
                .queue_order,
            QueueOrder::ServiceIndex { starvation_ms: crate::scheduler::DEFAULT_STARVATION_MS, threshold_gpu_ms: None },
            "0 turns least-attained-service preemption off"
        );
        assert_eq!(
            config(&[("FAIRWAY_QUEUE_ORDER", "service"), ("FAIRWAY_SERVICE_THRESHOLD_GPU_SECONDS", "7200")])
                .unwrap()
                .queue_order,
            QueueOrder::ServiceIndex {
                starvation_ms: crate::scheduler::DEFAULT_STARVATION_MS,
                threshold_gpu_ms: Some(7_200_000)
            }
        );
        for (pairs, variable) in [
            (&[("FAIRWAY_QUEUE_ORDER", "fifo")][..], "FAIRWAY_QUEUE_ORDER"),
            (
                &[("FAIRWAY_QUEUE_ORDER", "service"), ("FAIRWAY_STARVATION_SECONDS", "5")][..],
                "FAIRWAY_STARVATION_SECONDS",
            ),
            (&[("FAIRWAY_STARVATION_SECONDS", "600")][..], "FAIRWAY_STARVATION_SECONDS"),
            (&[("FAIRWAY_SERVICE_THRESHOLD_GPU_SECONDS", "600")][..], "FAIRWAY_SERVICE_THRESHOLD_GPU_SECONDS"),
            (
                &[("FAIRWAY_QUEUE_ORDER", "service"), ("FAIRWAY_SERVICE_THRESHOLD_GPU_SECONDS", "99999999999")][..],
                "FAIRWAY_SERVICE_THRESHOLD_GPU_SECONDS",
            ),
            (
                &[("FAIRWAY_QUEUE_ORDER", "arrival"), ("FAIRWAY_STARVATION_SECONDS", "600")][..],
                "FAIRWAY_STARVATION_SECONDS",
            ),
        ] {
            let err = config(pairs).unwrap_err();
            assert!(err.to_string().starts_with(variable), "{pairs:?}: {err}");
        }
    }

    #[test]
    fn placement_defaults_to_best_fit_and_is_checked() {
        use crate::scheduler::Placement;
        let config = |pairs: &[(&str, &str)]| Config::from_layers(FileConfig::default(), &env_of(pairs));
        assert_eq!(config(&[]).unwrap().placement, Placement::BestFit);
        assert_eq!(config(&[("FAIRWAY_PLACEMENT", "fragmentation")]).unwrap().placement, Placement::Fragmentation);
        let err = config(&[("FAIRWAY_PLACEMENT", "fgd")]).unwrap_err();
        assert!(err.to_string().starts_with("FAIRWAY_PLACEMENT"), "{err}");
    }

    #[test]
    fn a_bad_listen_address_names_the_variable() {
        let env = env_of(&[("FAIRWAY_LISTEN", "not-an-address")]);
        let err = Config::from_layers(FileConfig::default(), &env).unwrap_err();
        assert!(err.to_string().starts_with("FAIRWAY_LISTEN"), "{err}");
    }

    #[test]
    fn two_way_settings_take_their_two_spellings_default_when_unset_and_name_themselves_otherwise() {
        let config = |pairs: &[(&str, &str)]| Config::from_layers(FileConfig::default(), &env_of(pairs));
        let defaults = config(&[]).unwrap();
        assert!(defaults.scheduler && !defaults.trust_forwarded_for && !defaults.log_json);
        let set = config(&[
            ("FAIRWAY_SCHEDULER", "off"),
            ("FAIRWAY_TRUST_FORWARDED_FOR", "on"),
            ("FAIRWAY_LOG_FORMAT", "json"),
        ])
        .unwrap();
        assert!(!set.scheduler && set.trust_forwarded_for && set.log_json);
        for name in ["FAIRWAY_SCHEDULER", "FAIRWAY_TRUST_FORWARDED_FOR", "FAIRWAY_LOG_FORMAT"] {
            let err = config(&[(name, "yes")]).unwrap_err().to_string();
            assert!(err.starts_with(name) && err.contains("\"yes\" is neither"), "{err}");
        }
    }

    #[test]
    fn providers_and_ci_issuers_come_from_the_file_and_bad_ones_name_the_setting() {
        let text = r#"
            public_url = "https://fairway.example/"
            password_sign_in = "off"
            [[oidc_providers]]
            id = "corp"
            display_name = "Acme SSO"
            issuer = "https://sso.acme.example"
            client_id = "fairway"
            client_secret = "s3cret"
            [[oidc_providers.groups]]
            group = "ml-admins"
            team = "ml"
            role = "admin"
            [[oidc_providers.groups]]
            group = "ops"
            platform_role = "platform-admin"
            [[ci_issuers]]
            issuer = "https://token.actions.githubusercontent.com"
        "#;
        let config = Config::from_layers(toml::from_str(text).unwrap(), &env_of(&[])).unwrap();
        assert_eq!(config.public_url(), "https://fairway.example");
        assert!(!config.password_sign_in);
        let corp = config.oidc_provider("corp").unwrap();
        assert_eq!(corp.scopes, ["openid", "profile", "email", "groups"]);
        assert_eq!(corp.algorithms, ["RS256"]);
        assert_eq!(corp.groups.len(), 2);
        assert!(!format!("{config:?}").contains("s3cret"));
        assert_eq!(config.ci_issuers[0].issuer, "https://token.actions.githubusercontent.com");
        for (bad, setting) in [
            (text.replace("https://sso.acme.example", "http://sso.acme.example"), "oidc_providers.issuer"),
            (text.replace("id = \"corp\"", "id = \"Corp!\""), "oidc_providers.id"),
            (
                text.replace("platform_role = \"platform-admin\"", "platform_role = \"platform-admin\"\nteam = \"ml\""),
                "oidc_providers.groups",
            ),
            (text.replace("[[ci_issuers]]", "[[ci_issuers]]\nalgorithms = [\"HS256\"]"), "ci_issuers.algorithms"),
        ] {
            let err = Config::from_layers(toml::from_str(&bad).unwrap(), &env_of(&[])).unwrap_err().to_string();
            assert!(err.starts_with(setting), "{err}");
        }
    }

    #[test]
    fn unknown_keys_in_the_file_are_rejected() {
        assert!(toml::from_str::<FileConfig>("lisen = \"x\"").is_err());
    }

    #[test]
    fn signing_keys_shorter_than_256_bits_are_refused() {
        let short = Secret::new(base64::engine::general_purpose::STANDARD.encode([7u8; 31]));
        let err = decode_signing_key("FAIRWAY_SIGNING_KEY", &short).unwrap_err();
        assert!(err.to_string().contains("248 bits"), "{err}");
        let long = Secret::new(base64::engine::general_purpose::STANDARD.encode([7u8; 32]));
        assert_eq!(decode_signing_key("FAIRWAY_SIGNING_KEY", &long).unwrap().len(), 32);
    }
}
