//! A Postgres server of the test's own: `initdb` into a temporary folder, started on a
//! free loopback port. For faults the shared server must not take (a restart, a crash)
//! and for settings it does not have (TLS with a certificate the test issued).
//!
//! Uses the server binaries of the installed Postgres (`PG_BINDIR`, else the newest
//! `/usr/lib/postgresql/*/bin`) and the `openssl` command line for certificates. As root
//! (CI here), the server runs as the `postgres` user, since Postgres refuses root.

use std::path::{Path, PathBuf};
use std::process::Command;

use uuid::Uuid;

pub struct TestCluster {
    dir: PathBuf,
    data: PathBuf,
    bindir: PathBuf,
    port: u16,
    run_as: Option<&'static str>,
    tls: Option<TlsFiles>,
    /// Settings of its own, `-c name=value` at every start (a standby's name).
    settings: Vec<String>,
    /// `postgres://postgres@127.0.0.1:<port>/postgres`
    pub url: String,
}

/// What the test's certificate authority issued.
pub struct TlsFiles {
    /// The CA that signed the server's certificate (for `--database-ca-file`).
    pub ca_file: PathBuf,
    /// A CA that signed nothing here: verification against it must fail.
    pub other_ca_file: PathBuf,
}

pub(crate) fn bindir() -> PathBuf {
    if let Some(dir) = std::env::var_os("PG_BINDIR") {
        return PathBuf::from(dir);
    }
    let mut found: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .expect("no /usr/lib/postgresql: set PG_BINDIR to the folder holding initdb and pg_ctl")
        .filter_map(|entry| entry.ok().map(|e| e.path().join("bin")))
        .filter(|bin| bin.join("initdb").exists())
        .collect();
    found.sort_by_key(|bin| {
        bin.parent()
            .and_then(|v| v.file_name())
            .and_then(|v| v.to_str())
            .and_then(|v| v.parse::<u32>().ok())
            .unwrap_or(0)
    });
    found
        .pop()
        .expect("no initdb under /usr/lib/postgresql/*/bin")
}

/// As root (CI here) the servers run as `postgres`: Postgres refuses root.
pub(crate) fn running_as_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

pub(crate) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free loopback port")
        .port()
}

/// The `postgres` database of a test's server on `port`.
fn postgres_url(port: u16) -> String {
    format!("postgres://postgres@127.0.0.1:{port}/postgres")
}

pub(crate) fn run(command: &mut Command) {
    let output = command
        .output()
        .unwrap_or_else(|e| panic!("{command:?}: {e}"));
    assert!(
        output.status.success(),
        "{command:?} failed: {}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

impl TestCluster {
    /// A plain-text server.
    pub async fn start() -> TestCluster {
        Self::create(false).await
    }

    /// A server that also accepts TLS, with a certificate for `127.0.0.1` and `localhost`
    /// issued by a CA of this test's own.
    pub async fn start_with_tls() -> TestCluster {
        Self::create(true).await
    }

    async fn create(tls: bool) -> TestCluster {
        let dir = std::env::temp_dir().join(format!("charges-pg-{}", Uuid::new_v4().simple()));
        let data = dir.join("data");
        std::fs::create_dir_all(&dir).expect("cluster folder");
        let run_as = running_as_root().then_some("postgres");
        let mut cluster = TestCluster {
            url: String::new(),
            bindir: bindir(),
            port: free_port(),
            data,
            run_as,
            tls: None,
            settings: Vec::new(),
            dir,
        };
        if tls {
            cluster.tls = Some(cluster.issue_certificates());
        }
        if let Some(user) = run_as {
            run(Command::new("chown").args(["-R", user]).arg(&cluster.dir));
        }
        let initdb = cluster.bindir.join("initdb");
        run(cluster
            .as_server_user(&initdb)
            .args([
                "--auth=trust",
                "--username=postgres",
                "--no-sync",
                "-E",
                "UTF8",
                "-D",
            ])
            .arg(&cluster.data));
        cluster.url = postgres_url(cluster.port);
        cluster.start_on_a_free_port();
        cluster
    }

    /// The CA's files, when started with TLS.
    pub fn tls(&self) -> &TlsFiles {
        self.tls.as_ref().expect("started without TLS")
    }

    fn as_server_user(&self, program: &Path) -> Command {
        match self.run_as {
            Some(user) => {
                let mut command = Command::new("runuser");
                command.args(["-u", user, "--"]).arg(program);
                command
            }
            None => Command::new(program),
        }
    }

    fn issue_certificates(&self) -> TlsFiles {
        let path = |name: &str| self.dir.join(name);
        let ca = |name: &str| {
            run(Command::new("openssl")
                .args(["req", "-x509", "-nodes", "-days", "2", "-newkey", "ec"])
                .args(["-pkeyopt", "ec_paramgen_curve:prime256v1"])
                .args(["-subj", &format!("/CN=charges-tests {name}")])
                .arg("-keyout")
                .arg(path(&format!("{name}.key")))
                .arg("-out")
                .arg(path(&format!("{name}.crt"))));
        };
        ca("ca");
        ca("other-ca");
        run(Command::new("openssl")
            .args(["req", "-nodes", "-newkey", "ec"])
            .args(["-pkeyopt", "ec_paramgen_curve:prime256v1"])
            .args(["-subj", "/CN=localhost"])
            .arg("-keyout")
            .arg(path("server.key"))
            .arg("-out")
            .arg(path("server.csr")));
        std::fs::write(
            path("server.ext"),
            "subjectAltName=IP:127.0.0.1,DNS:localhost\n",
        )
        .expect("extensions file");
        run(Command::new("openssl")
            .args(["x509", "-req", "-days", "2", "-CAcreateserial"])
            .arg("-in")
            .arg(path("server.csr"))
            .arg("-CA")
            .arg(path("ca.crt"))
            .arg("-CAkey")
            .arg(path("ca.key"))
            .arg("-extfile")
            .arg(path("server.ext"))
            .arg("-out")
            .arg(path("server.crt")));
        // Postgres refuses a key others can read.
        run(Command::new("chmod").arg("600").arg(path("server.key")));
        TlsFiles {
            ca_file: path("ca.crt"),
            other_ca_file: path("other-ca.crt"),
        }
    }

    /// Starts the server (again) and waits until it accepts connections.
    pub async fn start_server(&self) {
        if let Err(failure) = self.try_start_server() {
            panic!("{failure}");
        }
    }

    /// The first start, on a port `free_port` chose: another test may bind it between
    /// the choice and the server's bind, so a port found taken is chosen again.
    fn start_on_a_free_port(&mut self) {
        for _ in 0..5 {
            match self.try_start_server() {
                Ok(()) => return,
                Err(failure) if failure.contains("Address already in use") => {
                    let _ = std::fs::remove_file(self.dir.join("server.log"));
                    self.port = free_port();
                    self.url = postgres_url(self.port);
                }
                Err(failure) => panic!("{failure}"),
            }
        }
        panic!("no free port for the test's server after 5 tries");
    }

    /// `pg_ctl start -w`; on failure, what it and the server's log said.
    fn try_start_server(&self) -> Result<(), String> {
        let mut options = format!(
            "-c listen_addresses=127.0.0.1 -c port={} -c unix_socket_directories={} \
             -c fsync=off -c max_connections=100",
            self.port,
            self.dir.display()
        );
        for setting in &self.settings {
            options.push_str(&format!(" -c {setting}"));
        }
        if self.tls.is_some() {
            options.push_str(&format!(
                " -c ssl=on -c ssl_cert_file={} -c ssl_key_file={}",
                self.dir.join("server.crt").display(),
                self.dir.join("server.key").display()
            ));
        }
        let mut command = self.as_server_user(&self.bindir.join("pg_ctl"));
        command
            .arg("start")
            .arg("-w")
            .arg("-D")
            .arg(&self.data)
            .arg("-l")
            .arg(self.dir.join("server.log"))
            .arg("-o")
            .arg(options);
        let output = command.output().map_err(|e| format!("{command:?}: {e}"))?;
        if output.status.success() {
            return Ok(());
        }
        Err(format!(
            "{command:?} failed: {}\n{}\nserver log:\n{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr),
            self.log()
        ))
    }

    /// Stops the server the way a crash would (`pg_ctl stop -m immediate`: every backend
    /// is killed, no checkpoint, recovery at the next start).
    pub fn crash(&self) {
        run(self
            .as_server_user(&self.bindir.join("pg_ctl"))
            .args(["stop", "-m", "immediate", "-w", "-D"])
            .arg(&self.data));
    }

    /// A streaming replica of this server (`pg_basebackup -R`), started and accepting
    /// read-only connections. `name` is its `cluster_name`, which its WAL receiver
    /// reports as `application_name`: what `synchronous_standby_names` and the relay's
    /// `--wait-for-standbys` name.
    pub async fn start_standby(&self, name: &str) -> TestCluster {
        let dir = std::env::temp_dir().join(format!("charges-pg-{}", Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).expect("standby folder");
        if let Some(user) = self.run_as {
            run(Command::new("chown").args(["-R", user]).arg(&dir));
        }
        let port = free_port();
        let mut standby = TestCluster {
            url: postgres_url(port),
            bindir: self.bindir.clone(),
            port,
            data: dir.join("data"),
            run_as: self.run_as,
            tls: None,
            settings: vec![format!("cluster_name={name}")],
            dir,
        };
        run(standby
            .as_server_user(&standby.bindir.join("pg_basebackup"))
            .args([
                "-h",
                "127.0.0.1",
                "-p",
                &self.port.to_string(),
                "-U",
                "postgres",
            ])
            .args(["-R", "-X", "stream", "--no-sync", "--checkpoint=fast", "-D"])
            .arg(&standby.data));
        standby.start_on_a_free_port();
        standby
    }

    /// Ends recovery: this standby becomes a primary, writable.
    pub fn promote(&self) {
        run(self
            .as_server_user(&self.bindir.join("pg_ctl"))
            .args(["promote", "-w", "-D"])
            .arg(&self.data));
    }

    /// A clean shutdown (`pg_ctl stop -m fast`).
    pub fn stop(&self) {
        run(self
            .as_server_user(&self.bindir.join("pg_ctl"))
            .args(["stop", "-m", "fast", "-w", "-D"])
            .arg(&self.data));
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// `db`'s URL on this server (a standby's, after a failover).
    pub fn url_of(&self, db: &crate::TestDb) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{}", self.port, db.name)
    }

    /// Commits wait for `names` (`synchronous_standby_names`; empty: for none).
    pub async fn synchronous_standbys(&self, names: &str) {
        let client = crate::connect(&self.url).await;
        client
            .batch_execute(&format!(
                "ALTER SYSTEM SET synchronous_standby_names = '{names}'"
            ))
            .await
            .expect("set synchronous_standby_names");
        client
            .batch_execute("SELECT pg_reload_conf()")
            .await
            .expect("reload the configuration");
    }

    /// Waits until the standby `name` streams from this server, in `sync_state` `state`
    /// (`sync` or `async`).
    pub async fn wait_for_standby(&self, name: &str, state: &str) {
        let client = crate::connect(&self.url).await;
        crate::poll_until(&format!("standby {name} streams ({state})"), async || {
            client
                .query_opt(
                    "SELECT 1 FROM pg_stat_replication
                      WHERE application_name = $1 AND state = 'streaming' AND sync_state = $2",
                    &[&name, &state],
                )
                .await
                .ok()
                .flatten()
                .map(|_| ())
        })
        .await;
    }

    /// The server's own log, for failure messages.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("server.log")).unwrap_or_default()
    }
}

impl Drop for TestCluster {
    fn drop(&mut self) {
        let _ = self
            .as_server_user(&self.bindir.join("pg_ctl"))
            .args(["stop", "-m", "immediate", "-D"])
            .arg(&self.data)
            .output();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
