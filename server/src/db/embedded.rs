//! A private PostgreSQL server started from the machine's own PostgreSQL binaries.
//!
//! This is the embedded default: with no `DATABASE_URL`, `fairway serve` and the test harness
//! run their own cluster in a data directory, listening on a Unix socket only (no TCP port, so
//! nothing else on the machine can reach it over the network, and the socket is mode 0700).
//!
//! Lifecycle: `initdb` on first start, reused afterwards. The server process is watched by a
//! dedicated thread that lives exactly as long as the server does. A server that dies once it
//! was ready (killed, or crashed) is started again by that thread, with backoff, until
//! [`EmbeddedPostgres::stop`]: clients see a short outage and reconnect. The child asks the kernel
//! (through util-linux `setpriv --pdeathsig`) for `SIGINT`, PostgreSQL's fast shutdown, when
//! that thread dies, so even a `SIGKILL`ed `fairway` never leaves an orphaned server holding
//! the data directory. [`EmbeddedPostgres::stop`] shuts it down cleanly with `pg_ctl` on a
//! graceful exit. All of this is std and the machine's own tools: the crate forbids `unsafe`.
//!
//! `initdb` and `postgres` refuse to run as root. When we are root the cluster belongs to the
//! `postgres` system user if there is one (Debian's server package creates it), else `nobody`.

use std::{
    fs,
    io::{self, Read as _, Seek as _},
    os::unix::{
        fs::{chown, PermissionsExt as _},
        process::CommandExt as _,
    },
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::{
        atomic::{AtomicU32, AtomicU8, Ordering},
        Arc,
    },
    time::Duration,
};

use sqlx::{postgres::PgConnectOptions, ConnectOptions as _, Connection as _};
use tokio::sync::watch;

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
    #[error(
        "the data directory {data} is out of reach of the account PostgreSQL runs as (uid {uid}): \
         {blocked} (mode {mode:04o}) does not let it through. As root, fairway runs the embedded \
         PostgreSQL as `postgres` (or `nobody`), which must be able to enter every directory above \
         the data directory: allow it (`chmod o+x {blocked}`), choose a data directory it can reach \
         (FAIRWAY_DATA_DIR), or set DATABASE_URL"
    )]
    Unreachable { data: PathBuf, blocked: PathBuf, mode: u32, uid: u32 },
}

fn io_err(what: impl Into<String>) -> impl FnOnce(io::Error) -> EmbeddedError {
    let what = what.into();
    move |source| EmbeddedError::Io { what, source }
}

/// Tuning for one embedded cluster.
#[derive(Debug, Clone, Copy)]
pub struct Tuning {
    /// `false` turns off fsync and full-page writes: for throwaway test clusters only.
    pub fsync: bool,
    /// Loads `pg_stat_statements`, so a benchmark can say which statements took the
    /// database's time (each database that wants to read it creates the extension).
    pub statement_stats: bool,
}

impl Tuning {
    /// As `fairway serve` runs it: every commit durable.
    pub const DURABLE: Self = Self { fsync: true, statement_stats: false };
    /// For clusters thrown away after a test: nothing forced to disk.
    pub const THROWAWAY: Self = Self { fsync: false, statement_stats: false };
}

/// A running embedded PostgreSQL server.
pub struct EmbeddedPostgres {
    bin: PathBuf,
    pgdata: PathBuf,
    socket_dir: PathBuf,
    run_as: Option<RunAs>,
    /// The current server process (it changes when the supervisor restarts the server).
    pid: Arc<AtomicU32>,
    /// Starting, running or stopping: what the supervisor does when the server exits.
    phase: Arc<AtomicU8>,
    /// Turns true when the server process has exited for good (set by its supervisor thread).
    exited: watch::Receiver<bool>,
}

/// The server is starting: if it exits now, the start failed and is reported.
const STARTING: u8 = 0;
/// The server was ready: if it exits now, it died and is started again.
const RUNNING: u8 = 1;
/// We asked it to stop: its exit is the end.
const STOPPING: u8 = 2;

impl std::fmt::Debug for EmbeddedPostgres {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmbeddedPostgres")
            .field("pgdata", &self.pgdata)
            .field("socket_dir", &self.socket_dir)
            .field("pid", &self.pid.load(Ordering::Relaxed))
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
    pub async fn start(pgdata: &Path, tuning: Tuning) -> Result<Self, EmbeddedError> {
        let bin = find_binaries().ok_or(EmbeddedError::BinariesNotFound)?;
        let pgdata = absolute(pgdata)?;
        let run_as = unprivileged_account();
        prepare_dir(&pgdata, run_as)?;
        if let Some(account) = run_as {
            check_reachable(&pgdata, account)?;
        }
        let socket_dir = socket_dir_for(&pgdata, run_as)?;
        let log_path = pgdata.with_extension("log");

        if !pgdata.join("PG_VERSION").exists() {
            initdb(&bin, &pgdata, &log_path, run_as)?;
        }
        wait_for_previous_postmaster(&pgdata).await;

        let log = open_log(&log_path, run_as)?;
        let log_start = log.metadata().map_or(0, |m| m.len());
        let mut cmd = dies_with_this_thread(&bin.join("postgres"), "INT");
        cmd.arg("-D")
            .arg(&pgdata)
            .args(["-c", "listen_addresses="])
            .arg("-c")
            .arg(format!("unix_socket_directories={}", socket_dir.display()))
            .args(["-c", "unix_socket_permissions=0700", "-c", &format!("port={PORT}")])
            .args(["-c", "max_connections=200"]);
        if !tuning.fsync {
            cmd.args(["-c", "fsync=off", "-c", "full_page_writes=off", "-c", "synchronous_commit=off"]);
        }
        if tuning.statement_stats {
            cmd.args(["-c", "shared_preload_libraries=pg_stat_statements", "-c", "pg_stat_statements.max=1000"]);
        }
        cmd.current_dir(pgdata.parent().unwrap_or(Path::new("/")))
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(io_err("cannot reopen the PostgreSQL log"))?)
            .stderr(log);
        configure_child(&mut cmd, run_as);

        let phase = Arc::new(AtomicU8::new(STARTING));
        let (pid, exited) = supervise(cmd, pgdata.clone(), phase.clone())?;
        let server = Self { bin, pgdata, socket_dir, run_as, pid, phase, exited };
        server.wait_ready(&log_path, log_start).await?;
        server.phase.store(RUNNING, Ordering::Release);
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
    pub async fn stop(self) {
        self.phase.store(STOPPING, Ordering::Release);
        if self.has_exited() {
            return;
        }
        let mut exited = self.exited.clone();
        self.pg_ctl_stop("fast");
        if tokio::time::timeout(Duration::from_secs(30), exited.wait_for(|e| *e)).await.is_err() {
            tracing::warn!(
                pid = self.pid.load(Ordering::Relaxed),
                "embedded PostgreSQL ignored fast shutdown; stopping it immediately"
            );
            self.pg_ctl_stop("immediate");
            let _ = tokio::time::timeout(Duration::from_secs(10), exited.wait_for(|e| *e)).await;
        }
    }

    /// Asks the postmaster to stop in `mode` without waiting. `pg_ctl` signals the pid in
    /// `postmaster.pid`, which is our child; it refuses to run as root, hence the account.
    fn pg_ctl_stop(&self, mode: &str) {
        let mut cmd = Command::new(self.bin.join("pg_ctl"));
        cmd.args(["stop", "--no-wait", "-s", "-m", mode, "-D"]).arg(&self.pgdata);
        cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null());
        if let Some(RunAs { uid, gid }) = self.run_as {
            cmd.uid(uid).gid(gid);
        }
        match cmd.status() {
            Ok(status) if status.success() => {}
            outcome => {
                tracing::warn!(pid = self.pid.load(Ordering::Relaxed), mode, ?outcome, "pg_ctl stop did not succeed");
            }
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
        *self.exited.borrow()
    }
}

/// How long a start waits for the postmaster of a previous run to finish exiting.
const PREVIOUS_POSTMASTER_WAIT: Duration = Duration::from_secs(60);

/// Waits while the postmaster named in `postmaster.pid` still runs. After `fairway` is
/// killed, its server gets the parent-death signal and shuts down, which takes a moment; a
/// supervisor restarting `fairway` at once would otherwise meet its lock file and fail. A
/// stale file (its process gone) is PostgreSQL's to clear; a server that does not exit in
/// time is left alone (it may be another `fairway`'s) and the start fails on its lock.
async fn wait_for_previous_postmaster(pgdata: &Path) {
    let started = tokio::time::Instant::now();
    let mut logged = false;
    while let Some(pid) = previous_postmaster(pgdata) {
        if started.elapsed() > PREVIOUS_POSTMASTER_WAIT {
            return;
        }
        if !logged {
            tracing::info!(pid, "waiting for the previous embedded PostgreSQL to exit");
            logged = true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The pid in `postmaster.pid`, while that process is a PostgreSQL server or a process
/// that has exited but not been reaped (PostgreSQL's own check counts both as alive). A pid
/// since reused by some other program is not waited for.
fn previous_postmaster(pgdata: &Path) -> Option<u32> {
    let text = fs::read_to_string(pgdata.join("postmaster.pid")).ok()?;
    let pid: u32 = text.lines().next()?.trim().parse().ok()?;
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // `pid (comm) state ...`; comm may itself contain spaces or parentheses.
    let (comm, rest) = stat.split_once(" (").and_then(|(_, r)| r.rsplit_once(") "))?;
    let zombie = rest.starts_with('Z');
    (zombie || comm.starts_with("postgres") || comm.starts_with("postmaster")).then_some(pid)
}

/// The pause before the first attempt to start a server that died.
const FIRST_RESTART_BACKOFF: Duration = Duration::from_millis(100);
/// The longest pause between attempts to start a server that died.
const MAX_RESTART_BACKOFF: Duration = Duration::from_secs(5);

/// Spawns `cmd` from a thread that then waits for it. The thread must outlive the child:
/// the parent-death signal is tied to the thread that forked, not to the process.
///
/// When the server exits while `phase` is [`RUNNING`], the thread starts it again: first
/// after the dead postmaster's pid file names no live server, then with a backoff, since its
/// orphaned backends may hold the shared memory for a moment and make the new one give up.
fn supervise(
    mut cmd: Command,
    pgdata: PathBuf,
    phase: Arc<AtomicU8>,
) -> Result<(Arc<AtomicU32>, watch::Receiver<bool>), EmbeddedError> {
    let (pid_tx, pid_rx) = std::sync::mpsc::channel();
    let (exit_tx, exit_rx) = watch::channel(false);
    let current = Arc::new(AtomicU32::new(0));
    let pid = current.clone();
    std::thread::Builder::new()
        .name("embedded-postgres".into())
        .spawn(move || {
            let mut child = match cmd.spawn() {
                Ok(child) => child,
                Err(e) => {
                    let _ = pid_tx.send(Err(e));
                    return;
                }
            };
            current.store(child.id(), Ordering::Relaxed);
            let _ = pid_tx.send(Ok(()));
            let mut started = std::time::Instant::now();
            let mut backoff = FIRST_RESTART_BACKOFF;
            loop {
                let status = child.wait();
                if phase.load(Ordering::Acquire) != RUNNING {
                    break;
                }
                // A server that got past its start died of something new: retry quickly again.
                // One that keeps failing at once (its predecessor's backends still hold the
                // shared memory) is retried ever more slowly.
                if started.elapsed() > Duration::from_secs(2) {
                    backoff = FIRST_RESTART_BACKOFF;
                }
                tracing::warn!(pid = child.id(), ?status, "embedded PostgreSQL died; starting it again");
                loop {
                    std::thread::sleep(backoff);
                    backoff = (backoff * 2).min(MAX_RESTART_BACKOFF);
                    if phase.load(Ordering::Acquire) != RUNNING {
                        exit_tx.send_replace(true);
                        return;
                    }
                    if previous_postmaster(&pgdata).is_some() {
                        continue;
                    }
                    match cmd.spawn() {
                        Ok(next) => {
                            child = next;
                            started = std::time::Instant::now();
                            current.store(child.id(), Ordering::Relaxed);
                            break;
                        }
                        Err(e) => tracing::error!(error = %e, "cannot start the embedded PostgreSQL again"),
                    }
                }
            }
            exit_tx.send_replace(true);
        })
        .map_err(io_err("cannot start the PostgreSQL supervisor thread"))?;
    pid_rx
        .recv()
        .map_err(|_| EmbeddedError::Io {
            what: "PostgreSQL supervisor thread ended".into(),
            source: io::Error::other("no pid"),
        })?
        .map_err(io_err("cannot start postgres"))?;
    Ok((pid, exit_rx))
}

/// A command running `program` that gets `signal` when the thread spawning it dies.
///
/// util-linux `setpriv` sets the parent-death signal and then execs `program`, so the pid
/// stays the same process. It runs after std's uid change, which would otherwise clear the
/// signal. Left open: a parent that dies in the microseconds between fork and `setpriv`'s
/// prctl leaves the child running; `fairway` then finds the cluster locked and says so.
fn dies_with_this_thread(program: &Path, signal: &str) -> Command {
    let mut cmd = Command::new("setpriv");
    cmd.args(["--pdeathsig", signal, "--"]).arg(program);
    cmd
}

fn configure_child(cmd: &mut Command, run_as: Option<RunAs>) {
    if let Some(RunAs { uid, gid }) = run_as {
        cmd.uid(uid).gid(gid);
    }
    cmd.env_remove("PGDATA").env("LC_ALL", "C").env("LANG", "C");
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
    let complete = |dir: &Path| ["initdb", "postgres", "pg_ctl"].iter().all(|b| dir.join(b).is_file());
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
    if effective_uid() != Some(0) {
        return None;
    }
    let passwd = fs::read_to_string("/etc/passwd").ok()?;
    ["postgres", "nobody"].into_iter().find_map(|name| account(&passwd, name))
}

/// This process's effective uid, the second field of `Uid:` in `/proc/self/status`.
fn effective_uid() -> Option<u32> {
    let status = fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find_map(|l| l.strip_prefix("Uid:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// The uid and gid of `name` in a passwd file (`name:password:uid:gid:...`). System
/// accounts such as `postgres` and `nobody` are local, so NSS is not consulted.
fn account(passwd: &str, name: &str) -> Option<RunAs> {
    passwd.lines().find_map(|line| {
        let mut fields = line.split(':');
        if fields.next()? != name {
            return None;
        }
        let mut ids = fields.skip(1).map(str::parse::<u32>);
        Some(RunAs { uid: ids.next()?.ok()?, gid: ids.next()?.ok()? })
    })
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

/// Fails, naming the directory, when an ancestor of `pgdata` does not let `account` through
/// (no search permission for it as owner, primary group or other): `initdb` would otherwise
/// fail with a bare "Permission denied". Supplementary groups and ACLs are not read, so a
/// directory that admits the account only through them is reported too.
fn check_reachable(pgdata: &Path, account: RunAs) -> Result<(), EmbeddedError> {
    use std::os::unix::fs::MetadataExt as _;
    for dir in pgdata.ancestors().skip(1) {
        let Ok(meta) = fs::metadata(dir) else { continue };
        if !searchable(meta.uid(), meta.gid(), meta.mode(), account) {
            return Err(EmbeddedError::Unreachable {
                data: pgdata.to_path_buf(),
                blocked: dir.to_path_buf(),
                mode: meta.mode() & 0o7777,
                uid: account.uid,
            });
        }
    }
    Ok(())
}

/// Whether a directory owned by `uid`:`gid` with `mode` lets `account` search it.
fn searchable(uid: u32, gid: u32, mode: u32, account: RunAs) -> bool {
    let bit = if uid == account.uid {
        0o100
    } else if gid == account.gid {
        0o010
    } else {
        0o001
    };
    mode & bit != 0
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cluster_account_is_read_from_passwd_by_exact_name() {
        let passwd = "root:x:0:0:root:/root:/bin/bash\n\
                      postgres-old:x:7:7::/:/bin/false\n\
                      postgres:x:104:110:PostgreSQL administrator:/var/lib/postgresql:/bin/bash\n\
                      broken:x:notanumber:1::/:/bin/false\n";
        let pg = account(passwd, "postgres").expect("postgres is listed");
        assert_eq!((pg.uid, pg.gid), (104, 110));
        assert!(account(passwd, "nobody").is_none());
        assert!(account(passwd, "broken").is_none(), "a malformed uid is no account");
    }

    #[test]
    fn a_directory_lets_the_account_through_by_its_owner_group_or_other_bit() {
        let pg = RunAs { uid: 104, gid: 110 };
        assert!(searchable(104, 0, 0o700, pg), "its own");
        assert!(!searchable(0, 0, 0o700, pg), "root's private directory");
        assert!(searchable(0, 110, 0o750, pg), "through its group");
        assert!(searchable(0, 0, 0o711, pg), "through other");
        assert!(!searchable(0, 110, 0o705, pg), "the group bit decides for a member, not other's");
    }

    #[test]
    fn a_data_directory_under_a_private_one_is_refused_naming_the_private_one() {
        use std::os::unix::fs::MetadataExt as _;
        let private = std::env::temp_dir().join(format!("fairway-private-{}", std::process::id()));
        fs::create_dir_all(private.join("inner")).unwrap();
        fs::set_permissions(&private, fs::Permissions::from_mode(0o700)).unwrap();
        let owner = fs::metadata(&private).unwrap().uid();
        // An account that is neither the owner nor in its group.
        let stranger = RunAs { uid: owner.wrapping_add(1), gid: u32::MAX - 1 };
        let data = private.join("inner").join("data");
        let err = check_reachable(&data, stranger).unwrap_err();
        let message = err.to_string();
        assert!(
            matches!(&err, EmbeddedError::Unreachable { blocked, mode: 0o700, .. } if *blocked == private),
            "{err:?}"
        );
        assert!(message.contains(&format!("chmod o+x {}", private.display())), "{message}");
        fs::set_permissions(&private, fs::Permissions::from_mode(0o711)).unwrap();
        check_reachable(&data, stranger).expect("reachable once other may search it");
        fs::remove_dir_all(&private).unwrap();
    }

    #[test]
    fn the_effective_uid_matches_the_owner_of_a_file_this_process_creates() {
        use std::os::unix::fs::MetadataExt as _;
        let dir = std::env::temp_dir().join(format!("fairway-euid-{}", std::process::id()));
        fs::write(&dir, b"").unwrap();
        let owner = fs::metadata(&dir).unwrap().uid();
        fs::remove_file(&dir).unwrap();
        assert_eq!(effective_uid(), Some(owner));
    }
}
