//! The wake-up: a dedicated connection LISTENing on `outbox_pending`.

use std::sync::Arc;
use std::time::Duration;

use charges_store::{DatabaseTls, OutboxStore, OutboxWakeupStore};
use futures::StreamExt;
use postgres_openssl::MakeTlsConnector;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;
use tokio_postgres::{AsyncMessage, Connection};

use crate::RelayError;
use crate::metrics::LISTENER_CONNECTED;

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
) -> Result<Session, RelayError> {
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
pub async fn start(
    database_url: &str,
    tls: &DatabaseTls,
    wake: Arc<Notify>,
    mut shutdown: watch::Receiver<bool>,
) -> Result<JoinHandle<()>, RelayError> {
    let mut config: tokio_postgres::Config = database_url
        .parse()
        .map_err(charges_store::StoreError::DatabaseUrl)?;
    config.application_name("charges-relay-listener");
    config.connect_timeout(Duration::from_secs(5));
    charges_store::detect_dead_peers(&mut config);
    let tls = if DatabaseTls::required_by(&config) {
        Some(tls.connector()?)
    } else {
        None
    };
    let mut session = listen(&config, tls.as_ref(), &wake).await?;
    metrics::gauge!(LISTENER_CONNECTED).set(1.0);
    Ok(tokio::spawn(async move {
        loop {
            tokio::select! {
                ended = &mut session.connection => {
                    let reason = match ended {
                        Ok(Ok(())) => "closed by the server".to_owned(),
                        Ok(Err(e)) => crate::error_chain(&e),
                        Err(e) => e.to_string(),
                    };
                    metrics::gauge!(LISTENER_CONNECTED).set(0.0);
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
                        metrics::gauge!(LISTENER_CONNECTED).set(1.0);
                        tracing::info!("listener reconnected");
                        break session;
                    }
                    Err(e) => {
                        tracing::warn!(error = %crate::error_chain(&e), retry_in = ?delay, "listener reconnect failed");
                        delay = (delay * 2).min(RECONNECT_MAX);
                    }
                }
            };
        }
    }))
}

/// No LISTEN session: behind a transaction pooler without `--listen-database-url`.
/// Said once, loudly, and in the gauge: every commit then waits for the next poll.
pub fn poll_only(poll_interval: Duration) -> JoinHandle<()> {
    metrics::gauge!(LISTENER_CONNECTED).set(0.0);
    tracing::warn!(
        poll_interval = %humantime::format_duration(poll_interval),
        "no LISTEN session: --db-pooler transaction without --listen-database-url; \
         new rows are found by polling only. Give --listen-database-url Postgres's own \
         URL to publish within milliseconds of each commit"
    );
    tokio::spawn(async {})
}
