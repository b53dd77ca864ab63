//! A TCP proxy a test can cut: in front of a broker, it makes "the broker refuses
//! connections" without stopping the broker (tansu's memory storage would forget its
//! topics on a restart).

use std::net::SocketAddr;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};

/// Forwards `addr` → `target` until [`FaultProxy::refuse`]: then every open connection
/// is reset and new ones are refused (the port is closed), until [`FaultProxy::pass`].
pub struct FaultProxy {
    pub addr: SocketAddr,
    open: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl FaultProxy {
    pub async fn start(target: SocketAddr) -> FaultProxy {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the proxy");
        let addr = listener.local_addr().expect("proxy address");
        let (open, state) = watch::channel(true);
        let task = tokio::spawn(supervise(listener, addr, target, state));
        FaultProxy { addr, open, task }
    }

    /// Resets every connection and refuses new ones.
    pub fn refuse(&self) {
        self.open.send_replace(false);
    }

    /// Accepts and forwards again.
    pub fn pass(&self) {
        self.open.send_replace(true);
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn supervise(
    first: TcpListener,
    addr: SocketAddr,
    target: SocketAddr,
    mut open: watch::Receiver<bool>,
) {
    let mut listener = Some(first);
    loop {
        let current = match listener.take() {
            Some(listener) => listener,
            None => rebind(addr).await,
        };
        let mut connections = JoinSet::new();
        loop {
            tokio::select! {
                accepted = current.accept() => {
                    if let Ok((client, _)) = accepted {
                        connections.spawn(forward(client, target));
                    }
                }
                changed = open.changed() => {
                    if changed.is_err() { return; }
                    if !*open.borrow() { break; }
                }
            }
        }
        // Dropping the listener closes the port; aborting drops both sockets of every
        // connection.
        drop(current);
        connections.shutdown().await;
        if open.wait_for(|open| *open).await.is_err() {
            return;
        }
    }
}

async fn rebind(addr: SocketAddr) -> TcpListener {
    loop {
        match TcpListener::bind(addr).await {
            Ok(listener) => return listener,
            Err(_) => tokio::time::sleep(std::time::Duration::from_millis(20)).await,
        }
    }
}

async fn forward(mut client: TcpStream, target: SocketAddr) {
    if let Ok(mut server) = TcpStream::connect(target).await {
        let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
    }
}

/// A loopback port nobody listens on right now.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}
