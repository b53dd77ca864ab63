//! A real PgBouncer (Debian's package, 1.18: no protocol-level prepared statements) in
//! transaction pooling in front of the test server, started per test on a free port,
//! with every setting at its default but the pool size. Stopped when dropped. Or the
//! PgBouncer the images ship, which `make deps` also builds for the host from the
//! source `deploy/podman/pgbouncer-source.env` pins, and which keeps prepared
//! statements with `max_prepared_statements` (`--db-pooler transaction-prepared`).
//! Also what any PgBouncer's admin console says about it ([`show_version`],
//! [`assert_statements_stay_prepared`]).

use std::path::PathBuf;
use std::time::Duration;

use tokio::process::{Child, Command};

use crate::proxy::free_port;
use crate::{TestDb, poll_until, server_url};

pub struct TestPgBouncer {
    pub port: u16,
    dir: PathBuf,
    child: Child,
}

/// The settings a test may change; the rest stay at PgBouncer's defaults
/// (`ignore_startup_parameters` included: the `options` parameter is refused).
#[derive(Debug, Clone, Copy)]
pub struct PgBouncerSettings {
    pub pool_mode: &'static str,
    /// Server connections per database and user.
    pub default_pool_size: u32,
    /// The pinned PgBouncer with `max_prepared_statements = 200` instead of Debian's 1.18.
    pub keeps_prepared_statements: bool,
}

impl Default for PgBouncerSettings {
    fn default() -> Self {
        PgBouncerSettings {
            pool_mode: "transaction",
            default_pool_size: 8,
            keeps_prepared_statements: false,
        }
    }
}

/// The version of PgBouncer `deploy/podman/pgbouncer-source.env` pins: the images'.
pub fn pinned_version() -> String {
    let path = crate::manifests::repo().join("deploy/podman/pgbouncer-source.env");
    let text =
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    text.lines()
        .find_map(|line| line.strip_prefix("PGBOUNCER_VERSION="))
        .unwrap_or_else(|| panic!("{} has no PGBOUNCER_VERSION=", path.display()))
        .to_owned()
}

/// The PgBouncer that keeps prepared statements: `$PGBOUNCER_PREPARED`, else where
/// `make deps` (scripts/deps.sh) builds the pinned version.
pub fn prepared_statements_pgbouncer() -> PathBuf {
    if let Some(path) = std::env::var_os("PGBOUNCER_PREPARED") {
        return PathBuf::from(path);
    }
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache")
        });
    cache
        .join(format!("charges-tools/pgbouncer-{}", pinned_version()))
        .join("pgbouncer")
}

impl TestPgBouncer {
    pub async fn start() -> TestPgBouncer {
        Self::start_with(PgBouncerSettings::default()).await
    }

    /// Every database of the test server behind one PgBouncer, trusted as the server is.
    pub async fn start_with(settings: PgBouncerSettings) -> TestPgBouncer {
        let server: tokio_postgres::Config = server_url().parse().expect("DATABASE_URL parses");
        let host = match server.get_hosts().first() {
            Some(tokio_postgres::config::Host::Tcp(host)) => host.clone(),
            _ => "127.0.0.1".to_owned(),
        };
        let server_port = server.get_ports().first().copied().unwrap_or(5432);
        let user = server.get_user().unwrap_or("postgres").to_owned();
        let port = free_port();
        let dir = std::env::temp_dir().join(format!("charges-pgbouncer-{port}"));
        std::fs::create_dir_all(&dir).expect("pgbouncer directory");
        let ini = format!(
            "[databases]\n* = host={host} port={server_port}\n\n[pgbouncer]\n\
             listen_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n\
             auth_type = trust\nauth_file = {auth}\npool_mode = {mode}\n\
             default_pool_size = {size}\nmax_client_conn = 500\n\
             admin_users = {user}\nlogfile = {log}\n{prepared}",
            log = dir.join("pgbouncer.log").display(),
            auth = dir.join("userlist.txt").display(),
            mode = settings.pool_mode,
            size = settings.default_pool_size,
            prepared = if settings.keeps_prepared_statements {
                "max_prepared_statements = 200\n"
            } else {
                ""
            },
        );
        std::fs::write(dir.join("pgbouncer.ini"), ini).expect("pgbouncer.ini");
        std::fs::write(dir.join("userlist.txt"), format!("\"{user}\" \"\"\n"))
            .expect("userlist.txt");
        make_readable(&dir);
        let mut command = if settings.keeps_prepared_statements {
            Command::new(prepared_statements_pgbouncer())
        } else {
            Command::new("pgbouncer")
        };
        // PgBouncer refuses to run as root: it switches to the server's OS user.
        if is_root() {
            command.args(["-u", "postgres"]);
        }
        let child = command
            .arg(dir.join("pgbouncer.ini"))
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("start pgbouncer (apt-get install pgbouncer; make deps does)");
        let bouncer = TestPgBouncer { port, dir, child };
        poll_until("PgBouncer accepts connections", async || {
            tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .ok()
                .map(|_| ())
        })
        .await;
        bouncer
    }

    /// `db`'s URL through this PgBouncer.
    pub fn url(&self, db: &TestDb) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{}", self.port, db.name)
    }

    /// Samples, until stopped, how many server sessions Postgres has on `db` besides
    /// the test's own and the relays' direct LISTEN sessions: with only pooled clients,
    /// PgBouncer's server connections.
    pub fn watch_server_sessions(&self, db: &TestDb) -> SessionWatcher {
        let (stop, mut stopped) = tokio::sync::oneshot::channel();
        let url = db.url.clone();
        let name = db.name.clone();
        let task = tokio::spawn(async move {
            let client = crate::connect(&url).await;
            let mut most = 0;
            loop {
                let now: i64 = client
                    .query_one(
                        "SELECT count(*) FROM pg_stat_activity
                          WHERE datname = $1 AND backend_type = 'client backend'
                            AND pid <> pg_backend_pid()
                            AND coalesce(application_name, '') NOT IN
                                ('charges-tests', 'charges-relay-listener')",
                        &[&name],
                    )
                    .await
                    .map(|row| row.get(0))
                    .unwrap_or(0);
                most = most.max(now);
                tokio::select! {
                    _ = &mut stopped => return most,
                    () = tokio::time::sleep(Duration::from_millis(20)) => {}
                }
            }
        });
        SessionWatcher { stop, task }
    }

    /// This PgBouncer's admin console.
    pub fn console_url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/pgbouncer", self.port)
    }

    /// PgBouncer's own log, for a failing test's message.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("pgbouncer.log")).unwrap_or_default()
    }
}

/// `SHOW VERSION` on a PgBouncer's admin console (`console`: a URL of database
/// `pgbouncer` as one of its `admin_users` or `stats_users`), e.g. `PgBouncer 1.24.1`.
pub async fn show_version(console: &str) -> String {
    let client = crate::connect(console).await;
    let messages = client
        .simple_query("SHOW VERSION")
        .await
        .expect("SHOW VERSION");
    messages
        .iter()
        .find_map(|message| match message {
            tokio_postgres::SimpleQueryMessage::Row(row) => row.get(0).map(str::to_owned),
            _ => None,
        })
        .expect("a SHOW VERSION row")
}

/// PgBouncer keeps its clients' prepared statements: while `charge` makes `charges`
/// new charges (its argument counts them), the clients of `database` bind a prepared
/// statement at least once per charge and parse one at most a quarter as often. PgBouncer
/// counts only the named statements it keeps (none without `max_prepared_statements`,
/// and no unnamed ones), and a client that keeps its statements parses each once per
/// connection: call this once the clients' connections are warm. `console` as for
/// [`show_version`].
pub async fn assert_statements_stay_prepared(
    console: &str,
    database: &str,
    charges: usize,
    mut charge: impl AsyncFnMut(usize),
) {
    let (parses_before, binds_before) = parses_and_binds(console, database).await;
    for n in 0..charges {
        charge(n).await;
    }
    let (parses_after, binds_after) = parses_and_binds(console, database).await;
    let (parses, binds) = (parses_after - parses_before, binds_after - binds_before);
    assert!(
        binds >= charges as i64 && parses * 4 < binds,
        "{charges} charges through PgBouncer: {parses} parses and {binds} binds of \
         prepared statements, where each charge binds one and each connection parses \
         its statements once"
    );
}

/// How many prepared statements clients asked PgBouncer to parse for `database`, and
/// how many executions of them they bound, since it started (`SHOW STATS`, PgBouncer
/// 1.21 and later).
async fn parses_and_binds(console: &str, database: &str) -> (i64, i64) {
    let client = crate::connect(console).await;
    let messages = client.simple_query("SHOW STATS").await.expect("SHOW STATS");
    let row = messages
        .iter()
        .find_map(|message| match message {
            tokio_postgres::SimpleQueryMessage::Row(row)
                if row.get("database") == Some(database) =>
            {
                Some(row)
            }
            _ => None,
        })
        .unwrap_or_else(|| panic!("no SHOW STATS row for {database}"));
    let number = |column: &str| -> i64 {
        row.get(column)
            .and_then(|value| value.parse().ok())
            .unwrap_or_else(|| panic!("SHOW STATS has no number in {column}"))
    };
    (
        number("total_client_parse_count"),
        number("total_bind_count"),
    )
}

/// The most server sessions [`TestPgBouncer::watch_server_sessions`] saw.
pub struct SessionWatcher {
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<i64>,
}

impl SessionWatcher {
    pub async fn stop(self) -> i64 {
        let _ = self.stop.send(());
        self.task.await.expect("the session watcher")
    }
}

/// Bounds every statement and idle transaction of `db` on the server side, as a
/// deployment does for the roles behind a transaction pooler (deploy/sql/roles.sql):
/// new sessions start with them, so PgBouncer's server connections do.
pub async fn bound_server_sessions(db: &TestDb, statement: Duration, idle: Duration) {
    db.client()
        .batch_execute(&format!(
            "ALTER DATABASE {name} SET statement_timeout = '{s}ms';
             ALTER DATABASE {name} SET idle_in_transaction_session_timeout = '{i}ms';",
            name = db.name,
            s = statement.as_millis(),
            i = idle.as_millis(),
        ))
        .await
        .expect("bound the database's sessions");
}

fn is_root() -> bool {
    std::process::Command::new("id")
        .arg("-u")
        .output()
        .map(|out| String::from_utf8_lossy(&out.stdout).trim() == "0")
        .unwrap_or(false)
}

/// The directory and files are read by the `postgres` user PgBouncer switches to.
fn make_readable(dir: &std::path::Path) {
    use std::os::unix::fs::PermissionsExt;
    let _ = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o777));
    for file in ["pgbouncer.ini", "userlist.txt"] {
        let _ = std::fs::set_permissions(dir.join(file), std::fs::Permissions::from_mode(0o644));
    }
}

impl Drop for TestPgBouncer {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
