//! A private PostgreSQL server started from the machine's own PostgreSQL binaries.
//!
//! This is the embedded default: with no `DATABASE_URL`, `fairway serve` and the test harness
//! run their own cluster in a data directory, listening on a Unix socket only (no TCP port, so
//! nothing else on the machine can reach it over the network, and the socket is mode 0700).
//!
//! Lifecycle: `initdb` on first start, reused afterwards. The server process is watched by a
//! dedicated thread that lives exactly as long as the server does; the child asks the kernel
//! for `SIGINT` (PostgreSQL's fast shutdown) when that thread's process dies, so even a
//! `SIGKILL`ed `fairway` never leaves an orphaned server holding the data directory.
//! [`EmbeddedPostgres::stop`] shuts it down cleanly on a graceful exit.
//!
//! `initdb` and `postgres` refuse to run as root. When we are root the cluster belongs to the
//! `postgres` system user if there is one (Debian's server package creates it), else `nobody`.

use std::{
    ffi::CString,
    fs,
    io::{self, Read as _, Seek as _},
    os::unix::{
        fs::{chown, PermissionsExt as _},
        process::CommandExt as _,
    },
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Duration,
};

use sqlx::{postgres::PgConnectOptions, ConnectOptions as _, Connection as _};
use tokio::sync::oneshot;

/// The name of the superuser `initdb` creates; authentication is by socket ownership.
const SUPERUSER: &str = "fairway";
/// The socket file is `.s.PGSQL.<port>`; with no TCP listener the port only names it.
const PORT: u16 = 5432;
/// `sockaddr_un.sun_path` holds 108 bytes including the terminating NUL.
const MAX_SOCKET_PATH: usize = 107;

/// Why the embedded database could not be started.
#[derive(Debug, thiserror::Error)]
pub enum EmbeddedError {
    #[error(
        "no PostgreSQL server binaries found (looked on PATH, through pg_config and under \
         /usr/lib/postgresql/*/bin): install PostgreSQL 14 or newer, e.g. `apt-get install \
         postgresql`, or set DATABASE_URL"
    )]
    BinariesNotFound,
    #[error("{what}: {source}")]
    Io { what: String, source: io::Error },
    #[error("{command} failed: {log}")]
    CommandFailed { command: &'static str, log: String },
    #[error("PostgreSQL did not become ready within {0:?}: {1}")]
    NotReady(Duration, String),
    #[error("embedded PostgreSQL: {0}")]
    Sql(#[from] sqlx::Error),
}

fn io_err(what: impl Into<String>) -> impl FnOnce(io::Error) -> EmbeddedError {
    let what = what.into();
    move |source| EmbeddedError::Io { what, source }
}

/// Tuning for one embedded cluster.
#[derive(Debug, Clone, Copy)]
pub struct Durability {
    /// `false` turns off fsync and full-page writes: for throwaway test clusters only.
    pub fsync: bool,
}

/// A running embedded PostgreSQL server.
pub struct EmbeddedPostgres {
    pgdata: PathBuf,
    socket_dir: PathBuf,
    pid: libc::pid_t,
    /// Fires when the server process has exited.
    exited: Option<oneshot::Receiver<()>>,
}

impl std::fmt::Debug for EmbeddedPostgres {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmbeddedPostgres")
            .field("pgdata", &self.pgdata)
            .field("socket_dir", &self.socket_dir)
            .field("pid", &self.pid)
            .finish()
    }
}

/// The unprivileged account the cluster runs as when we are root.
#[derive(Debug, Clone, Copy)]
struct RunAs {
    uid: u32,
    gid: u32,
}

impl EmbeddedPostgres {
    /// Starts (and on first use creates) the cluster whose data lives in `pgdata`.
    pub async fn start(pgdata: &Path, durability: Durability) -> Result<Self, EmbeddedError> {
        let bin = find_binaries().ok_or(EmbeddedError::BinariesNotFound)?;
        let pgdata = absolute(pgdata)?;
        let run_as = unprivileged_account();
        prepare_dir(&pgdata, run_as)?;
        let socket_dir = socket_dir_for(&pgdata, run_as)?;
        let log_path = pgdata.with_extension("log");

        if !pgdata.join("PG_VERSION").exists() {
            initdb(&bin, &pgdata, &log_path, run_as)?;
        }

        let log = open_log(&log_path, run_as)?;
        let log_start = log.metadata().map_or(0, |m| m.len());
        let mut cmd = Command::new(bin.join("postgres"));
        cmd.arg("-D")
            .arg(&pgdata)
            .args(["-c", "listen_addresses="])
            .arg("-c")
            .arg(format!("unix_socket_directories={}", socket_dir.display()))
            .args(["-c", "unix_socket_permissions=0700", "-c", &format!("port={PORT}")])
            .args(["-c", "max_connections=200"]);
        if !durability.fsync {
            cmd.args(["-c", "fsync=off", "-c", "full_page_writes=off", "-c", "synchronous_commit=off"]);
        }
        cmd.current_dir(pgdata.parent().unwrap_or(Path::new("/")))
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(io_err("cannot reopen the PostgreSQL log"))?)
            .stderr(log);
        configure_child(&mut cmd, run_as);

        let (pid, exited) = supervise(cmd)?;
        let server = Self { pgdata, socket_dir, pid, exited: Some(exited) };
        server.wait_ready(&log_path, log_start).await?;
        Ok(server)
    }

    /// Options that connect to `database` on this server.
    pub fn connect_options(&self, database: &str) -> PgConnectOptions {
        PgConnectOptions::new().socket(&self.socket_dir).port(PORT).username(SUPERUSER).database(database)
    }

    /// A `postgres://` URL for `database`, for tools such as `psql` and sqlx's macros.
    pub fn url(&self, database: &str) -> String {
        format!("postgres://{SUPERUSER}@localhost:{PORT}/{database}?host={}", self.socket_dir.display())
    }

    /// Creates `database` unless it exists, optionally as a copy of `template`.
    pub async fn create_database(&self, database: &str, template: Option<&str>) -> Result<(), EmbeddedError> {
        assert_identifier(database);
        let mut conn = self.connect_options("postgres").connect().await?;
        let exists: Option<i32> = sqlx::query_scalar("select 1 from pg_database where datname = $1")
            .bind(database)
            .fetch_optional(&mut conn)
            .await?;
        if exists.is_none() {
            // Identifiers cannot be bind parameters; `assert_identifier` keeps this safe.
            let sql = match template {
                Some(t) => {
                    assert_identifier(t);
                    format!("create database \"{database}\" template \"{t}\"")
                }
                None => format!("create database \"{database}\""),
            };
            sqlx::query(&sql).execute(&mut conn).await?;
        }
        conn.close().await?;
        Ok(())
    }

    /// Fast shutdown: disconnects clients, checkpoints, exits. Waits up to 30 s, then
    /// falls back to an immediate shutdown.
    pub async fn stop(mut self) {
        let Some(exited) = self.exited.take() else { return };
        // The pid is our own child, which the supervisor thread has not reaped while
        // `exited` is pending.
        sys::signal(self.pid, libc::SIGINT);
        let mut exited = exited;
        if tokio::time::timeout(Duration::from_secs(30), &mut exited).await.is_err() {
            tracing::warn!(pid = self.pid, "embedded PostgreSQL ignored fast shutdown; sending SIGQUIT");
            sys::signal(self.pid, libc::SIGQUIT);
            let _ = tokio::time::timeout(Duration::from_secs(10), exited).await;
        }
    }

    /// The data directory.
    pub fn pgdata(&self) -> &Path {
        &self.pgdata
    }

    async fn wait_ready(&self, log_path: &Path, log_start: u64) -> Result<(), EmbeddedError> {
        let limit = Duration::from_secs(60);
        let started = tokio::time::Instant::now();
        loop {
            match self.connect_options("postgres").connect().await {
                Ok(conn) => {
                    let _ = conn.close().await;
                    return Ok(());
                }
                Err(_) if started.elapsed() < limit && !self.has_exited() => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(_) => {
                    let log = read_log_from(log_path, log_start);
                    return Err(if self.has_exited() {
                        EmbeddedError::CommandFailed { command: "postgres", log }
                    } else {
                        EmbeddedError::NotReady(limit, log)
                    });
                }
            }
        }
    }

    fn has_exited(&self) -> bool {
        !sys::alive(self.pid)
    }
}

/// Spawns `cmd` from a thread that then waits for it. The thread must outlive the child:
/// the parent-death signal is tied to the thread that forked, not to the process.
fn supervise(mut cmd: Command) -> Result<(libc::pid_t, oneshot::Receiver<()>), EmbeddedError> {
    let (pid_tx, pid_rx) = std::sync::mpsc::channel();
    let (exit_tx, exit_rx) = oneshot::channel();
    std::thread::Builder::new()
        .name("embedded-postgres".into())
        .spawn(move || match cmd.spawn() {
            Ok(mut child) => {
                let _ = pid_tx.send(Ok(child.id() as libc::pid_t));
                let _ = child.wait();
                let _ = exit_tx.send(());
            }
            Err(e) => {
                let _ = pid_tx.send(Err(e));
            }
        })
        .map_err(io_err("cannot start the PostgreSQL supervisor thread"))?;
    let pid = pid_rx
        .recv()
        .map_err(|_| EmbeddedError::Io {
            what: "PostgreSQL supervisor thread ended".into(),
            source: io::Error::other("no pid"),
        })?
        .map_err(io_err("cannot start postgres"))?;
    Ok((pid, exit_rx))
}

fn configure_child(cmd: &mut Command, run_as: Option<RunAs>) {
    if let Some(RunAs { uid, gid }) = run_as {
        cmd.uid(uid).gid(gid);
    }
    cmd.env_remove("PGDATA").env("LC_ALL", "C").env("LANG", "C");
    sys::die_with_parent(cmd, libc::SIGINT);
}

fn initdb(bin: &Path, pgdata: &Path, log_path: &Path, run_as: Option<RunAs>) -> Result<(), EmbeddedError> {
    let log = open_log(log_path, run_as)?;
    let start = log.metadata().map_or(0, |m| m.len());
    let mut cmd = Command::new(bin.join("initdb"));
    cmd.arg("-D")
        .arg(pgdata)
        .args(["-U", SUPERUSER, "--auth=trust", "-E", "UTF8", "--locale=C", "--no-sync"])
        .current_dir(pgdata.parent().unwrap_or(Path::new("/")))
        .stdin(Stdio::null())
        .stdout(log.try_clone().map_err(io_err("cannot reopen the PostgreSQL log"))?)
        .stderr(log);
    if let Some(RunAs { uid, gid }) = run_as {
        cmd.uid(uid).gid(gid);
    }
    cmd.env_remove("PGDATA").env("LC_ALL", "C").env("LANG", "C");
    let status = cmd.status().map_err(io_err("cannot run initdb"))?;
    if !status.success() {
        return Err(EmbeddedError::CommandFailed { command: "initdb", log: read_log_from(log_path, start) });
    }
    Ok(())
}

/// Finds a directory holding both `initdb` and `postgres`: on PATH, then `pg_config
/// --bindir`, then the newest `/usr/lib/postgresql/<version>/bin`.
pub fn find_binaries() -> Option<PathBuf> {
    let complete = |dir: &Path| dir.join("initdb").is_file() && dir.join("postgres").is_file();
    if let Some(path) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&path) {
            if complete(&dir) {
                // Follow symlinks (e.g. /usr/local/bin/initdb) to the real installation so
                // initdb finds its share directory.
                let real = fs::canonicalize(dir.join("initdb")).ok()?;
                let real_dir = real.parent()?.to_path_buf();
                return Some(if complete(&real_dir) { real_dir } else { dir });
            }
        }
    }
    if let Ok(out) = Command::new("pg_config").arg("--bindir").stderr(Stdio::null()).output() {
        let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        if out.status.success() && complete(&dir) {
            return Some(dir);
        }
    }
    let mut versions: Vec<(u32, PathBuf)> = fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(std::result::Result::ok)
        .filter_map(|e| Some((e.file_name().to_str()?.parse().ok()?, e.path().join("bin"))))
        .filter(|(_, dir)| complete(dir))
        .collect();
    versions.sort();
    versions.pop().map(|(_, dir)| dir)
}

fn unprivileged_account() -> Option<RunAs> {
    if !sys::is_root() {
        return None;
    }
    ["postgres", "nobody"].into_iter().find_map(|name| {
        let (uid, gid) = sys::account(&CString::new(name).ok()?)?;
        Some(RunAs { uid, gid })
    })
}

/// The process calls std offers no safe form of, in one place: signals by pid, the
/// effective uid, passwd lookups, and the parent-death signal of a child.
mod sys {
    #![expect(unsafe_code, reason = "kill, geteuid, getpwnam and prctl in a pre-exec hook have no safe std equivalent")]

    use std::{ffi::CStr, io, os::unix::process::CommandExt as _, process::Command};

    /// Sends `signal` to `pid`; false when there is no such process.
    pub fn signal(pid: libc::pid_t, signal: libc::c_int) -> bool {
        // SAFETY: kill(2) has no memory-safety preconditions.
        unsafe { libc::kill(pid, signal) == 0 }
    }

    /// Whether `pid` exists: `kill(pid, 0)` probes without sending anything.
    pub fn alive(pid: libc::pid_t) -> bool {
        signal(pid, 0)
    }

    /// Whether this process runs as root.
    pub fn is_root() -> bool {
        // SAFETY: geteuid(2) has no preconditions.
        unsafe { libc::geteuid() == 0 }
    }

    /// The uid and gid of the account `name`, if it exists.
    pub fn account(name: &CStr) -> Option<(libc::uid_t, libc::gid_t)> {
        // SAFETY: getpwnam returns null or a pointer to static storage that we read at once;
        // no other passwd lookup runs on this thread meanwhile.
        let pw = unsafe { libc::getpwnam(name.as_ptr()) };
        if pw.is_null() {
            return None;
        }
        // SAFETY: `pw` is non-null and points to a valid passwd record.
        Some(unsafe { ((*pw).pw_uid, (*pw).pw_gid) })
    }

    /// Makes the child get `signal` when the thread that spawned it dies.
    pub fn die_with_parent(cmd: &mut Command, signal: libc::c_int) {
        // SAFETY: the hook only calls async-signal-safe functions (prctl, getppid, kill).
        unsafe {
            cmd.pre_exec(move || {
                // Runs after the uid change, which would otherwise clear the death signal.
                if libc::prctl(libc::PR_SET_PDEATHSIG, signal) != 0 {
                    return Err(io::Error::last_os_error());
                }
                // The parent may have died before prctl took effect.
                if libc::getppid() == 1 {
                    libc::kill(libc::getpid(), signal);
                }
                Ok(())
            });
        }
    }
}

fn prepare_dir(pgdata: &Path, run_as: Option<RunAs>) -> Result<(), EmbeddedError> {
    if let Some(parent) = pgdata.parent() {
        fs::create_dir_all(parent).map_err(io_err(format!("cannot create {}", parent.display())))?;
    }
    if !pgdata.exists() {
        fs::create_dir(pgdata).map_err(io_err(format!("cannot create {}", pgdata.display())))?;
    }
    if let Some(RunAs { uid, gid }) = run_as {
        chown(pgdata, Some(uid), Some(gid)).map_err(io_err(format!("cannot chown {}", pgdata.display())))?;
    }
    fs::set_permissions(pgdata, fs::Permissions::from_mode(0o700))
        .map_err(io_err(format!("cannot restrict {}", pgdata.display())))?;
    Ok(())
}

/// The socket lives in the data directory unless that path is too long for a Unix socket,
/// in which case a private directory under the system temp dir is used.
fn socket_dir_for(pgdata: &Path, run_as: Option<RunAs>) -> Result<PathBuf, EmbeddedError> {
    let socket_len = |dir: &Path| dir.as_os_str().len() + format!("/.s.PGSQL.{PORT}").len();
    if socket_len(pgdata) <= MAX_SOCKET_PATH {
        return Ok(pgdata.to_path_buf());
    }
    use sha2::Digest as _;
    let digest = sha2::Sha256::digest(pgdata.as_os_str().as_encoded_bytes());
    let name: String = digest[..6].iter().map(|b| format!("{b:02x}")).collect();
    let dir = std::env::temp_dir().join(format!("fairway-pg-{name}"));
    prepare_dir(&dir, run_as)?;
    Ok(dir)
}

fn open_log(path: &Path, run_as: Option<RunAs>) -> Result<fs::File, EmbeddedError> {
    let file = fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(io_err(format!("cannot open {}", path.display())))?;
    if let Some(RunAs { uid, gid }) = run_as {
        chown(path, Some(uid), Some(gid)).map_err(io_err(format!("cannot chown {}", path.display())))?;
    }
    Ok(file)
}

/// The last lines the server wrote since `start`, for an error message.
fn read_log_from(path: &Path, start: u64) -> String {
    let mut text = String::new();
    if let Ok(mut f) = fs::File::open(path) {
        let _ = f.seek(io::SeekFrom::Start(start));
        let _ = f.read_to_string(&mut text);
    }
    let lines: Vec<&str> = text.lines().rev().take(5).collect();
    let tail: Vec<&str> = lines.into_iter().rev().collect();
    format!("{} (log: {})", tail.join(" | "), path.display())
}

fn absolute(path: &Path) -> Result<PathBuf, EmbeddedError> {
    std::path::absolute(path).map_err(io_err(format!("cannot resolve {}", path.display())))
}

fn assert_identifier(name: &str) {
    assert!(
        !name.is_empty() && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_'),
        "database names are generated by fairway and must be plain identifiers: {name:?}"
    );
}
