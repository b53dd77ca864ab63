//! The wake-up: a dedicated connection LISTENing on `outbox_pending`.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use pg_plumbing::{DatabaseTls, StoreError};
use postgres_openssl::MakeTlsConnector;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;
use tokio_postgres::{AsyncMessage, Connection};

use crate::relay::error::{EngineError, error_chain};
use crate::relay::metrics;
use crate::{OutboxStore, OutboxWakeupStore};

const RECONNECT_MIN: Duration = Duration::from_millis(200);
const RECONNECT_MAX: Duration = Duration::from_secs(30);

/// One live LISTEN session: the client must stay alive for the connection to stay open.
struct Session {
    _client: tokio_postgres::Client,
    connection: JoinHandle<Result<(), tokio_postgres::Error>>,
}

/// Connects and LISTENs; every notification calls `wake.notify_one()` (a permit is
/// stored if the relay is busy, so a notification is never lost while it works).
async fn listen(
    config: &tokio_postgres::Config,
    tls: Option<&MakeTlsConnector>,
    wake: &Arc<Notify>,
) -> Result<Session, EngineError> {
    let (client, connection) = match tls {
        Some(tls) => {
            let (client, connection) = config.connect(tls.clone()).await?;
            (client, forward_notifications(connection, wake.clone()))
        }
        None => {
            let (client, connection) = config.connect(tokio_postgres::NoTls).await?;
            (client, forward_notifications(connection, wake.clone()))
        }
    };
    OutboxStore::listen(&client).await?;
    // After a server crash the unlogged flag's row is gone; the loops write it again.
    OutboxWakeupStore::ensure(&client).await?;
    // Rows committed while nobody listened got no wake-up of their own.
    wake.notify_one();
    Ok(Session {
        _client: client,
        connection,
    })
}

/// Drives the connection; ends when it does.
fn forward_notifications<S, T>(
    mut connection: Connection<S, T>,
    wake: Arc<Notify>,
) -> JoinHandle<Result<(), tokio_postgres::Error>>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    tokio::spawn(async move {
        let mut messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
        while let Some(message) = messages.next().await {
            match message? {
                AsyncMessage::Notification(_) => wake.notify_one(),
                AsyncMessage::Notice(notice) => tracing::debug!(%notice, "listener notice"),
                _ => {}
            }
        }
        Ok(())
    })
}

/// LISTENs once (failing start-up if it cannot), then keeps the session alive in the
/// background: when the connection drops it reconnects with exponential backoff. The
/// relay keeps polling meanwhile, so a lost listener only costs latency.
/// `application_name` names the session in `pg_stat_activity`, apart from the pool's.
pub async fn start(
    database_url: &str,
    application_name: &str,
    tls: &DatabaseTls,
    wake: Arc<Notify>,
    mut shutdown: watch::Receiver<bool>,
) -> Result<JoinHandle<()>, EngineError> {
    let mut config: tokio_postgres::Config =
        database_url.parse().map_err(StoreError::DatabaseUrl)?;
    config.application_name(application_name);
    config.connect_timeout(Duration::from_secs(5));
    pg_plumbing::detect_dead_peers(&mut config);
    let tls = if DatabaseTls::required_by(&config) {
        Some(tls.connector()?)
    } else {
        None
    };
    let mut session = listen(&config, tls.as_ref(), &wake).await?;
    metrics::listener_connected(true);
    Ok(tokio::spawn(async move {
        loop {
            tokio::select! {
                ended = &mut session.connection => {
                    let reason = match ended {
                        Ok(Ok(())) => "closed by the server".to_owned(),
                        Ok(Err(e)) => error_chain(&e),
                        Err(e) => e.to_string(),
                    };
                    metrics::listener_connected(false);
                    tracing::warn!(reason, "listener connection lost; polling until it is back");
                }
                _ = shutdown.changed() => return,
            }
            let mut delay = RECONNECT_MIN;
            session = loop {
                tokio::select! {
                    () = tokio::time::sleep(delay) => {}
                    _ = shutdown.changed() => return,
                }
                match listen(&config, tls.as_ref(), &wake).await {
                    Ok(session) => {
                        metrics::listener_connected(true);
                        tracing::info!("listener reconnected");
                        break session;
                    }
                    Err(e) => {
                        tracing::warn!(error = %error_chain(&e), retry_in = ?delay, "listener reconnect failed");
                        delay = (delay * 2).min(RECONNECT_MAX);
                    }
                }
            };
        }
    }))
}

/// No LISTEN session (behind a transaction pooler, whose sessions last a transaction,
/// with no direct URL to listen on). Said once, loudly, and in the gauge: every commit
/// then waits for the next poll. `why` is the binary's explanation, in its own terms
/// (its flags), of why and what to do about it.
pub fn poll_only(poll_interval: Duration, why: &str) -> JoinHandle<()> {
    metrics::listener_connected(false);
    tracing::warn!(
        poll_interval = %humantime::format_duration(poll_interval),
        "no LISTEN session: {why}"
    );
    tokio::spawn(async {})
}
