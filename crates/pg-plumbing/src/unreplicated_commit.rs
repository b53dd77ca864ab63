//! A commit that did not wait for its synchronous standby must not look successful.
//!
//! When a commit's wait for synchronous replication is cancelled (an operator's
//! `pg_cancel_backend`, a pooler's `query_timeout`, a statement watchdog), PostgreSQL
//! keeps the commit locally and tells the client only with a `WARNING` ("canceling wait
//! for synchronous replication … The transaction has already committed locally, but
//! might not have been replicated to the standby"), then answers `COMMIT` as usual. A
//! failover to that standby then loses the transaction although the client was told
//! it committed.
//!
//! So every pooled connection is driven by [`drive`], which reads the server's notices
//! itself: on that warning it drops the connection before the `COMMIT`'s answer, which
//! the server sends after the notice, reaches the caller. The caller's commit then
//! fails as "connection closed", an unavailable database ([`crate::StoreError`]): the
//! API answers `503` with `Retry-After`, and the client's retry with the same key
//! replays the operation if it survived or runs it once if a failover dropped it. The
//! relay's batch fails the same way and its rows are published again (at least once).

use deadpool_postgres::Connect;
use futures::StreamExt;
use futures::future::BoxFuture;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::task::JoinHandle;
use tokio_postgres::error::DbError;
use tokio_postgres::tls::{MakeTlsConnect, TlsConnect};
use tokio_postgres::{AsyncMessage, Socket};

/// deadpool's connector, with [`drive`] as the connection task.
#[derive(Debug, Clone)]
pub(crate) struct GuardedConnect<T> {
    pub(crate) tls: T,
}

impl<T> Connect for GuardedConnect<T>
where
    T: MakeTlsConnect<Socket> + Clone + Sync + Send + 'static,
    T::Stream: Sync + Send,
    T::TlsConnect: Sync + Send,
    <T::TlsConnect as TlsConnect<Socket>>::Future: Send,
{
    fn connect(
        &self,
        config: &tokio_postgres::Config,
    ) -> BoxFuture<'_, Result<(tokio_postgres::Client, JoinHandle<()>), tokio_postgres::Error>>
    {
        let tls = self.tls.clone();
        let config = config.clone();
        Box::pin(async move {
            let (client, connection) = config.connect(tls).await?;
            Ok((client, tokio::spawn(drive(connection))))
        })
    }
}

/// Drives the connection until it ends, or until a commit turns out unreplicated.
async fn drive<S, T>(mut connection: tokio_postgres::Connection<S, T>)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let mut messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
    while let Some(message) = messages.next().await {
        match message {
            Ok(AsyncMessage::Notice(notice)) if is_unreplicated_commit(&notice) => {
                metrics::counter!(crate::metric_names().unreplicated_commits).increment(1);
                tracing::warn!(
                    notice = %notice.message(),
                    "a commit was not replicated to the synchronous standby: its connection \
                     is closed so that the commit is reported as failed, not as done"
                );
                // Dropping the stream drops the connection: the `COMMIT` still waiting
                // for its answer fails as "connection closed".
                return;
            }
            Ok(AsyncMessage::Notice(notice)) => {
                tracing::debug!(severity = notice.severity(), notice = %notice.message(), "server notice");
            }
            Ok(_) => {}
            Err(error) => {
                tracing::warn!(error = %error, "database connection ended");
                return;
            }
        }
    }
}

/// The warning PostgreSQL (`syncrep.c`) sends when a commit stops waiting for its
/// synchronous standby: "canceling wait for synchronous replication due to user
/// request", or "canceling the wait for synchronous replication and terminating
/// connection due to administrator command". The server's messages must be in English
/// (`lc_messages`), as they are by default.
fn is_unreplicated_commit(notice: &DbError) -> bool {
    let message = notice.message();
    message.starts_with("canceling wait for synchronous replication")
        || message.starts_with("canceling the wait for synchronous replication")
}
