//! A Patroni cluster of the test's own: one etcd (Debian's `etcd-server`) and two
//! Patroni nodes (`patroni`, installed with pip), each managing a PostgreSQL server,
//! everything on free loopback ports under a temporary folder, with `synchronous_mode:
//! true`. `make ha-deps` installs both.
//!
//! Patroni runs as the `postgres` user when the tests run as root (Postgres refuses
//! root), which is why it lives in a virtualenv outside `/root` ([`PATRONI`]). The
//! PostgreSQL binaries are [`crate::cluster`]'s.

use std::fs::File;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};
use uuid::Uuid;

use crate::cluster::{bindir, free_port, run, running_as_root};
use crate::{DEADLINE, TestDb, poll_within};

/// Where `make ha-deps` puts Patroni: a virtualenv the `postgres` user can read.
pub const PATRONI: &str = "/opt/charges-tools/patroni/bin/patroni";

/// Patroni's smallest leader key TTL. A crashed leader's key outlives it by up to this
/// long, so a crash failover takes about as long.
const TTL_SECONDS: u64 = 20;

/// One Patroni member: its PostgreSQL server and its REST API.
struct Node {
    name: String,
    pg_port: u16,
    api_port: u16,
    dir: PathBuf,
    patroni: Option<Child>,
}

impl Node {
    fn config(&self) -> PathBuf {
        self.dir.join("patroni.yml")
    }

    fn data(&self) -> PathBuf {
        self.dir.join("data")
    }

    fn log(&self) -> PathBuf {
        self.dir.join("patroni.log")
    }
}

/// etcd and two Patroni nodes, `node1` and `node2`; everything is killed on drop.
pub struct PatroniCluster {
    dir: PathBuf,
    etcd: Child,
    etcd_port: u16,
    nodes: Vec<Node>,
    /// `(uid, gid)` of `postgres` when running as root.
    server_user: Option<(u32, u32)>,
    http: reqwest::Client,
}

/// One line of Patroni's `GET /cluster`.
#[derive(Debug, Clone)]
pub struct Member {
    pub name: String,
    /// `leader`, `sync_standby` or `replica`.
    pub role: String,
    /// `running` (a leader), `streaming` (a standby), `starting`, …
    pub state: String,
}

fn id_of_postgres(flag: &str) -> u32 {
    let output = Command::new("id")
        .args([flag, "postgres"])
        .output()
        .expect("run id");
    String::from_utf8_lossy(&output.stdout)
        .trim()
        .parse()
        .expect("the postgres user exists (it comes with Debian's postgresql package)")
}

impl PatroniCluster {
    /// etcd, then `node1` (it bootstraps and leads), then `node2` (its synchronous
    /// standby); returns once both hold those roles.
    pub async fn start() -> PatroniCluster {
        assert!(
            Path::new(PATRONI).exists(),
            "{PATRONI} is missing: run `make ha-deps`"
        );
        let dir = std::env::temp_dir().join(format!("charges-patroni-{}", Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).expect("cluster folder");
        let server_user = running_as_root().then(|| (id_of_postgres("-u"), id_of_postgres("-g")));
        let (etcd, etcd_port) = start_etcd(&dir);
        let mut cluster = PatroniCluster {
            nodes: Vec::new(),
            etcd,
            etcd_port,
            server_user,
            http: reqwest::Client::new(),
            dir,
        };
        cluster
            .wait_for("etcd answers", async |c| {
                let url = format!("http://127.0.0.1:{}/health", c.etcd_port);
                let health: Value = c.http.get(url).send().await.ok()?.json().await.ok()?;
                (health["health"] == "true").then_some(())
            })
            .await;
        for name in ["node1", "node2"] {
            cluster.add_node(name);
            cluster.spawn_patroni(name);
            if name == "node1" {
                cluster.wait_for_role("node1", "leader").await;
            }
        }
        cluster.wait_for_role("node2", "sync_standby").await;
        cluster
    }

    fn add_node(&mut self, name: &str) {
        let node = Node {
            name: name.to_owned(),
            pg_port: free_port(),
            api_port: free_port(),
            dir: self.dir.join(name),
            patroni: None,
        };
        std::fs::create_dir_all(&node.dir).expect("node folder");
        let config = serde_norway::to_string(&self.config_of(&node)).expect("Patroni's config");
        std::fs::write(node.config(), config).expect("write Patroni's config");
        if self.server_user.is_some() {
            run(Command::new("chown")
                .args(["-R", "postgres:postgres"])
                .arg(&node.dir));
        }
        self.nodes.push(node);
    }

    /// Patroni's configuration of `node`. Timings as short as Patroni accepts, so that a
    /// crash failover takes seconds; trust on loopback, as the test servers of
    /// [`crate::cluster`] have.
    fn config_of(&self, node: &Node) -> Value {
        let api = format!("127.0.0.1:{}", node.api_port);
        let pg = format!("127.0.0.1:{}", node.pg_port);
        let postgres = json!({ "username": "postgres" });
        json!({
            "scope": "charges",
            "name": node.name,
            "restapi": { "listen": api, "connect_address": api },
            "etcd3": { "hosts": format!("127.0.0.1:{}", self.etcd_port) },
            "bootstrap": {
                "dcs": {
                    "ttl": TTL_SECONDS,
                    "loop_wait": 1,
                    "retry_timeout": 5,
                    "synchronous_mode": true,
                    // The crashed leader may have WAL the new one never got.
                    "postgresql": { "use_pg_rewind": true, "parameters": { "fsync": "off" } },
                },
                // C: the server's warnings in English, as the binaries read them.
                "initdb": [{ "encoding": "UTF8" }, { "locale": "C" }],
            },
            "postgresql": {
                "listen": pg,
                "connect_address": pg,
                "data_dir": node.data(),
                "bin_dir": bindir(),
                "pgpass": node.dir.join("pgpass"),
                "authentication": { "superuser": postgres, "replication": postgres, "rewind": postgres },
                "parameters": { "unix_socket_directories": node.dir },
                "pg_hba": [
                    "local all all trust",
                    "host all all 127.0.0.1/32 trust",
                    "host replication all 127.0.0.1/32 trust",
                ],
            },
        })
    }

    fn node(&self, name: &str) -> &Node {
        self.nodes
            .iter()
            .find(|n| n.name == name)
            .unwrap_or_else(|| panic!("no node {name}"))
    }

    fn node_mut(&mut self, name: &str) -> &mut Node {
        self.nodes
            .iter_mut()
            .find(|n| n.name == name)
            .unwrap_or_else(|| panic!("no node {name}"))
    }

    /// Starts `name`'s Patroni, its output appended to its log.
    fn spawn_patroni(&mut self, name: &str) {
        let server_user = self.server_user;
        let node = self.node_mut(name);
        let log = File::options()
            .create(true)
            .append(true)
            .open(node.log())
            .expect("Patroni's log");
        let mut command = Command::new(PATRONI);
        command
            .arg(node.config())
            .current_dir(&node.dir)
            .env("HOME", &node.dir)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("Patroni's log"))
            .stderr(log);
        if let Some((uid, gid)) = server_user {
            command.uid(uid).gid(gid);
        }
        node.patroni = Some(command.spawn().expect("start Patroni"));
    }

    /// The multi-host URL of `database` on both nodes, the writable one chosen.
    pub fn url(&self, database: &str) -> String {
        let hosts: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.pg_port))
            .collect();
        format!(
            "postgres://postgres@{}/{database}?target_session_attrs=read-write",
            hosts.join(",")
        )
    }

    /// The URL of `db` on the node `name` alone.
    pub fn url_on(&self, name: &str, db: &TestDb) -> String {
        format!(
            "postgres://postgres@127.0.0.1:{}/{}",
            self.node(name).pg_port,
            db.name
        )
    }

    /// The members as Patroni's REST API (of any node that answers) reports them.
    pub async fn members(&self) -> Option<Vec<Member>> {
        for node in &self.nodes {
            let url = format!("http://127.0.0.1:{}/cluster", node.api_port);
            let Ok(response) = self.http.get(url).send().await else {
                continue;
            };
            let Ok(cluster) = response.json::<Value>().await else {
                continue;
            };
            let field = |m: &Value, f: &str| m[f].as_str().unwrap_or_default().to_owned();
            let members = cluster["members"].as_array()?;
            return Some(
                members
                    .iter()
                    .map(|m| Member {
                        name: field(m, "name"),
                        role: field(m, "role"),
                        state: field(m, "state"),
                    })
                    .collect(),
            );
        }
        None
    }

    /// The running leader's name, once there is one other than `other_than`. After a
    /// crash, the old leader is listed as running until its key's TTL runs out.
    pub async fn leader(&self, other_than: Option<&str>) -> String {
        self.wait_for("a running leader", async |c| {
            c.members()
                .await?
                .into_iter()
                .find(|m| m.role == "leader" && m.state == "running")
                .map(|m| m.name)
                .filter(|name| Some(name.as_str()) != other_than)
        })
        .await
    }

    /// Waits until `name` is the running leader (`leader`) or the streaming
    /// synchronous standby (`sync_standby`).
    pub async fn wait_for_role(&self, name: &str, role: &str) {
        let state = if role == "leader" {
            "running"
        } else {
            "streaming"
        };
        self.wait_for(&format!("{name} is {role}, {state}"), async |c| {
            c.members()
                .await?
                .iter()
                .any(|m| m.name == name && m.role == role && m.state == state)
                .then_some(())
        })
        .await;
    }

    /// Polls `probe` until it answers; panics after the leader TTL plus [`DEADLINE`] with
    /// every node's log.
    async fn wait_for<T>(&self, what: &str, mut probe: impl AsyncFnMut(&Self) -> Option<T>) -> T {
        let limit = DEADLINE + Duration::from_secs(TTL_SECONDS);
        match poll_within(limit, async || probe(self).await).await {
            Some(value) => value,
            None => panic!("never within {limit:?}: {what}\n{}", self.logs()),
        }
    }

    /// The node `name` crashes: its Patroni, its postmaster and every backend die at
    /// once (`SIGKILL`), as when the machine fails.
    pub fn crash(&mut self, name: &str) {
        let node = self.node_mut(name);
        let mut patroni = node.patroni.take().expect("its Patroni runs");
        let postmaster = std::fs::read_to_string(node.data().join("postmaster.pid"))
            .ok()
            .and_then(|pid| pid.lines().next().map(str::to_owned))
            .expect("its postmaster runs");
        let children = Command::new("pgrep")
            .args(["-P", &postmaster])
            .output()
            .expect("run pgrep");
        let mut pids = vec![patroni.id().to_string(), postmaster];
        pids.extend(
            String::from_utf8_lossy(&children.stdout)
                .split_whitespace()
                .map(str::to_owned),
        );
        // Backends that exited meanwhile are fine: kill reports them, the rest die.
        let _ = Command::new("kill").arg("-KILL").args(&pids).status();
        let _ = patroni.wait();
    }

    /// Starts the crashed node's Patroni again: it rewinds its server if need be and
    /// rejoins as a standby.
    pub fn restart(&mut self, name: &str) {
        self.spawn_patroni(name);
    }

    /// Every node's Patroni log, for failure messages.
    pub fn logs(&self) -> String {
        self.nodes
            .iter()
            .map(|n| {
                let log = std::fs::read_to_string(n.log()).unwrap_or_default();
                format!("--- {} ---\n{log}", n.name)
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// etcd with its data under `dir`, on free ports; returns it and its client port.
fn start_etcd(dir: &Path) -> (Child, u16) {
    let client = format!("http://127.0.0.1:{}", free_port());
    let peer = format!("http://127.0.0.1:{}", free_port());
    let log = File::create(dir.join("etcd.log")).expect("etcd's log");
    let etcd = Command::new("etcd")
        .args(["--name", "etcd", "--data-dir"])
        .arg(dir.join("etcd"))
        .args(["--listen-client-urls", &client])
        .args(["--advertise-client-urls", &client])
        .args(["--listen-peer-urls", &peer])
        .args(["--initial-advertise-peer-urls", &peer])
        .args(["--initial-cluster", &format!("etcd={peer}")])
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("etcd's log"))
        .stderr(log)
        .spawn()
        .expect("start etcd (make ha-deps installs Debian's etcd-server)");
    let port = client
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .expect("a port");
    (etcd, port)
}

impl Drop for PatroniCluster {
    fn drop(&mut self) {
        // Patroni first, so that none starts its server again.
        for node in &mut self.nodes {
            if let Some(mut patroni) = node.patroni.take() {
                let _ = patroni.kill();
                let _ = patroni.wait();
            }
        }
        for node in &self.nodes {
            let mut pg_ctl = Command::new(bindir().join("pg_ctl"));
            pg_ctl
                .args(["stop", "-m", "immediate", "-D"])
                .arg(node.data())
                .stdout(Stdio::null())
                .stderr(Stdio::null());
            if let Some((uid, gid)) = self.server_user {
                pg_ctl.uid(uid).gid(gid);
            }
            let _ = pg_ctl.status();
        }
        let _ = self.etcd.kill();
        let _ = self.etcd.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
