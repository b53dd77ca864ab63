//! Shutdown on SIGTERM (Kubernetes, systemd) or SIGINT (Ctrl-C).

/// Installs both handlers now, so that a signal arriving before the returned future is
/// polled is not lost, and returns a future resolving to the first signal's name.
pub fn shutdown_signal() -> std::io::Result<impl Future<Output = &'static str>> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
        }
    })
}
