//! A real Kafka-protocol broker for one test: tansu (`cargo install tansu`, which
//! `make deps` does), with in-memory storage, on a port of its own, behind a
//! [`FaultProxy`]. Clients only ever see the proxy's address (tansu advertises it), so
//! the test can make the broker refuse connections (the proxy closes) or hang
//! (`SIGSTOP`) and come back, without a restart that would forget the topics.

use std::net::SocketAddr;
use std::process::Stdio;
use std::time::Duration;

use tokio::process::{Child, Command};

use crate::proxy::{FaultProxy, free_port};

pub struct TestTansu {
    child: Child,
    pub proxy: FaultProxy,
}

impl TestTansu {
    pub async fn start() -> TestTansu {
        let port = free_port();
        let target: SocketAddr = ([127, 0, 0, 1], port).into();
        let proxy = FaultProxy::start(target).await;
        let child = Command::new(binary())
            .args([
                "broker",
                "--storage-engine",
                "memory://tansu/",
                "--listener-url",
                &format!("tcp://127.0.0.1:{port}"),
                "--advertised-listener-url",
                &format!("tcp://{}", proxy.addr),
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("start tansu ({}): {e}; run `make deps`", binary()));
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while tokio::net::TcpStream::connect(target).await.is_err() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "tansu never listened on {target}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        TestTansu { child, proxy }
    }

    /// Where clients connect: the proxy.
    pub fn bootstrap(&self) -> String {
        self.proxy.addr.to_string()
    }

    /// `SIGSTOP`: the broker keeps its connections but answers nothing.
    pub fn hang(&self) {
        self.signal("STOP");
    }

    /// `SIGCONT`.
    pub fn resume(&self) {
        self.signal("CONT");
    }

    fn signal(&self, name: &str) {
        let pid = self.child.id().expect("tansu is running");
        let status = std::process::Command::new("kill")
            .args([format!("-{name}"), pid.to_string()])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -{name} tansu");
    }
}

impl Drop for TestTansu {
    fn drop(&mut self) {
        // A stopped process would ignore the SIGKILL of kill_on_drop until continued.
        if let Some(pid) = self.child.id() {
            let _ = std::process::Command::new("kill")
                .args(["-CONT", &pid.to_string()])
                .status();
        }
    }
}

/// `tansu` from cargo's bin directory, or from `PATH`.
fn binary() -> String {
    let cargo_bin = std::env::var("CARGO_HOME")
        .map(std::path::PathBuf::from)
        .or_else(|_| std::env::var("HOME").map(|h| std::path::Path::new(&h).join(".cargo")))
        .map(|home| home.join("bin").join("tansu"));
    match cargo_bin {
        Ok(path) if path.exists() => path.display().to_string(),
        _ => "tansu".to_owned(),
    }
}
