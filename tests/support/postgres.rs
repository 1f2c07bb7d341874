//! A throwaway PostgreSQL for the tests: one server per test binary, started on first use
//! (`initdb` into a temporary directory, `pg_ctl` on a private unix socket, no TCP), and a
//! fresh database per caller. A watcher process stops the server and removes its directory
//! once the test binary has exited, however it exits.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use subagents::SessionId;

/// The running server.
pub struct TestPostgres {
    socket_dir: PathBuf,
    port: u16,
    /// The data directory and the server's options, for a restart.
    data: PathBuf,
    options: String,
}

/// The variable that makes missing PostgreSQL binaries a failure instead of a skip (`.ci/run`
/// sets it).
const REQUIRE: &str = "SUBAGENTS_REQUIRE_POSTGRES";

/// What to install, for the line a skip prints and the failure a requirement raises.
const INSTALL: &str =
    "PostgreSQL's server binaries (initdb, pg_ctl: Debian's `postgresql` package)";

/// The PostgreSQL binaries: the directory `SUBAGENTS_POSTGRES_BIN` names when it is set (an
/// install elsewhere), else the one `pg_config --bindir` names, else the newest
/// `/usr/lib/postgresql/*/bin`; `None` when that has no `initdb`.
fn find_bin_dir() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("SUBAGENTS_POSTGRES_BIN") {
        let dir = PathBuf::from(dir);
        return dir.join("initdb").exists().then_some(dir);
    }
    if let Ok(output) = Command::new("pg_config").arg("--bindir").output() {
        let dir = PathBuf::from(String::from_utf8_lossy(&output.stdout).trim());
        if dir.join("initdb").exists() {
            return Some(dir);
        }
    }
    let mut found: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|entry| Some(entry.ok()?.path().join("bin")))
        .filter(|bin| bin.join("initdb").exists())
        .collect();
    found.sort();
    found.pop()
}

fn bin_dir() -> PathBuf {
    find_bin_dir().unwrap_or_else(|| panic!("{INSTALL} are not installed"))
}

/// The test binary's server, or `None` when PostgreSQL is not installed and `SUBAGENTS_REQUIRE_POSTGRES`
/// is unset: the caller skips its test (see [`postgres_or_skip`]), and the first skip prints one
/// line naming what to install.
pub fn available() -> Option<&'static TestPostgres> {
    static INSTALLED: OnceLock<bool> = OnceLock::new();
    let installed = *INSTALLED.get_or_init(|| {
        let installed = find_bin_dir().is_some();
        if !installed {
            assert!(
                std::env::var_os(REQUIRE).is_none(),
                "{REQUIRE} is set and {INSTALL} are not installed"
            );
            // Straight to the process's stderr: the test harness captures `eprintln!`.
            let _ = writeln!(
                std::io::stderr(),
                "SKIPPING every PostgreSQL test: {INSTALL} are not installed; install them to run \
                 these tests (set {REQUIRE}=1 to make their absence a failure)"
            );
        }
        installed
    });
    installed.then(server)
}

/// The test binary's server, or a return from the calling test (with `$skipped`, `()` unless
/// given) when PostgreSQL is not installed: see [`available`].
macro_rules! postgres_or_skip {
    () => {
        match $crate::support::postgres::available() {
            Some(server) => server,
            None => return,
        }
    };
    ($skipped:expr) => {
        match $crate::support::postgres::available() {
            Some(server) => server,
            None => return $skipped,
        }
    };
}
pub(crate) use postgres_or_skip;

/// Runs a PostgreSQL tool as the `postgres` user when this process is root (the server
/// refuses to run as root), else as ourselves.
fn pg_tool(bin: &Path, tool: &str) -> Command {
    if rustix::process::geteuid().is_root() {
        let mut command = Command::new("runuser");
        command.args(["-u", "postgres", "--"]).arg(bin.join(tool));
        command
    } else {
        Command::new(bin.join(tool))
    }
}

fn start() -> TestPostgres {
    let bin = bin_dir();
    let dir = tempfile::Builder::new()
        .prefix("subagents-pg-")
        .tempdir()
        .expect("a temporary directory")
        .keep();
    if rustix::process::geteuid().is_root() {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777))
            .expect("the directory opens to the postgres user");
    }
    let data = dir.join("data");
    // Armed before anything can fail: once this test binary is gone, however it ends, the
    // watcher stops the server (if it started) and removes the directory. It runs in a new
    // session and ignores hangups and terminations, so cancelling the tests does not take it.
    let quote = |path: &Path| format!("'{}'", path.display().to_string().replace('\'', "'\\''"));
    let pg_ctl = if rustix::process::geteuid().is_root() {
        format!("runuser -u postgres -- {}", quote(&bin.join("pg_ctl")))
    } else {
        quote(&bin.join("pg_ctl"))
    };
    let watch = format!(
        "trap '' HUP TERM INT; while kill -0 {pid} 2>/dev/null; do sleep 1; done; \
         if [ -d {data}/global ]; then {pg_ctl} -D {data} -m immediate stop; fi; rm -rf {dir}",
        pid = std::process::id(),
        data = quote(&data),
        dir = quote(&dir),
    );
    let spawned = Command::new("sh")
        .args([
            "-c",
            "setsid sh -c \"$0\" </dev/null >/dev/null 2>&1 &",
            &watch,
        ])
        .status()
        .expect("the watcher starts");
    assert!(spawned.success(), "the watcher could not start");
    let initdb = pg_tool(&bin, "initdb")
        .arg("-D")
        .arg(&data)
        .args(["-U", "postgres", "-A", "trust", "--no-sync", "-E", "UTF8"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .expect("initdb runs");
    assert!(
        initdb.status.success(),
        "initdb failed: {}",
        String::from_utf8_lossy(&initdb.stderr)
    );
    // A port number only names the socket file; any free one will do.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map(|address| address.port())
        .expect("a free port number");
    let options = format!(
        "-c listen_addresses='' -k {} -p {port} -c fsync=off -c synchronous_commit=off \
         -c full_page_writes=off -c max_connections=500",
        dir.display()
    );
    let started = pg_tool(&bin, "pg_ctl")
        .arg("-D")
        .arg(&data)
        .args(["-o", &options, "-l"])
        .arg(dir.join("log"))
        .args(["-w", "start"])
        .stdout(Stdio::null())
        .status()
        .expect("pg_ctl runs");
    assert!(started.success(), "pg_ctl could not start the server");
    TestPostgres {
        socket_dir: dir,
        port,
        data,
        options,
    }
}

/// The test binary's server, started on first use. A start that failed is not retried by
/// every later test: they all report the first failure.
fn server() -> &'static TestPostgres {
    static SERVER: OnceLock<Result<TestPostgres, String>> = OnceLock::new();
    let started = SERVER.get_or_init(|| {
        std::panic::catch_unwind(start).map_err(|panic| {
            panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|text| (*text).to_owned()))
                .unwrap_or_else(|| "the server did not start".to_owned())
        })
    });
    match started {
        Ok(server) => server,
        Err(why) => panic!("no test PostgreSQL: {why}"),
    }
}

impl TestPostgres {
    /// A server of the caller's own (one it may restart without disturbing other tests),
    /// stopped and removed like the shared one once the test binary exits.
    pub fn private() -> Option<Self> {
        available().map(|_| start())
    }

    /// Restarts the server (`pg_ctl restart -m fast`): every connection ends, and new ones are
    /// refused until it is back.
    pub fn restart(&self) {
        let restarted = pg_tool(&bin_dir(), "pg_ctl")
            .arg("-D")
            .arg(&self.data)
            .args(["-o", &self.options, "-l"])
            .arg(self.socket_dir.join("log"))
            .args(["-m", "fast", "-w", "restart"])
            .stdout(Stdio::null())
            .status()
            .expect("pg_ctl runs");
        assert!(restarted.success(), "pg_ctl could not restart the server");
    }

    /// Stops the server (`pg_ctl stop -m fast`), keeps it down for `down`, and starts it
    /// again: every connection ends, and none opens while it is down.
    pub fn down_for(&self, down: std::time::Duration) {
        let stopped = pg_tool(&bin_dir(), "pg_ctl")
            .arg("-D")
            .arg(&self.data)
            .args(["-m", "fast", "-w", "stop"])
            .stdout(Stdio::null())
            .status()
            .expect("pg_ctl runs");
        assert!(stopped.success(), "pg_ctl could not stop the server");
        std::thread::sleep(down);
        let started = pg_tool(&bin_dir(), "pg_ctl")
            .arg("-D")
            .arg(&self.data)
            .args(["-o", &self.options, "-l"])
            .arg(self.socket_dir.join("log"))
            .args(["-w", "start"])
            .stdout(Stdio::null())
            .status()
            .expect("pg_ctl runs");
        assert!(started.success(), "pg_ctl could not start the server again");
    }

    /// The connection string of `database`.
    pub fn url(&self, database: &str) -> String {
        format!(
            "host={} port={} user=postgres dbname={database}",
            self.socket_dir.display(),
            self.port
        )
    }

    /// A fresh, empty database's connection string.
    pub fn fresh_database(&self) -> String {
        let name = format!("t_{}", uuid::Uuid::new_v4().simple());
        let created = Command::new(bin_dir().join("psql"))
            .args(["-h"])
            .arg(&self.socket_dir)
            .args([
                "-p",
                &self.port.to_string(),
                "-U",
                "postgres",
                "-d",
                "postgres",
                "-q",
            ])
            .args(["-c", &format!("CREATE DATABASE {name}")])
            .stdout(Stdio::null())
            .status()
            .expect("psql runs");
        assert!(created.success(), "CREATE DATABASE {name} failed");
        self.url(&name)
    }
}

/// A connection of the test's own to `url` holding session `id`'s row `FOR UPDATE` in a
/// transaction it leaves open, as an append or a lease grant under way holds it, until the
/// test sends `ROLLBACK` (or drops it).
pub async fn holding_session_row(url: &str, id: SessionId) -> tokio_postgres::Client {
    holding(url, &format!("subagents_sessions WHERE id = '{id}'")).await
}

/// [`holding_session_row`] for session `id`'s lease row, as a grant, a renewal or a release
/// under way holds it.
pub async fn holding_lease_row(url: &str, id: SessionId) -> tokio_postgres::Client {
    holding(url, &format!("subagents_leases WHERE session = '{id}'")).await
}

/// A connection holding the rows of `rows` (a table and its condition) `FOR UPDATE` in a
/// transaction it leaves open.
async fn holding(url: &str, rows: &str) -> tokio_postgres::Client {
    let client = raw_client(url).await;
    client
        .batch_execute(&format!("BEGIN; SELECT 1 FROM {rows} FOR UPDATE"))
        .await
        .unwrap();
    client
}

/// A connection of the test's own to `url`, outside any store (to damage or lock rows, or to
/// read what a store wrote), driven by a task on the current runtime.
pub async fn raw_client(url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    client
}
