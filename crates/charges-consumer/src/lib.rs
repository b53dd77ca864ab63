//! The reference consumer of `charges.events`: how to turn at-least-once delivery into
//! exactly-once *effects*.
//!
//! # The loop
//!
//! For each message, in **one** database transaction:
//!
//! 1. `INSERT INTO processed_events (event_id, …) … ON CONFLICT DO NOTHING` with the
//!    message's header `id` (the outbox id, also `ce_id` and the payload's `eventId`);
//! 2. only if that inserted a row, apply the effect (add to the per-currency `ledger`);
//! 3. `COMMIT`.
//!
//! Only then is the message's offset stored and committed to Kafka. A crash anywhere
//! before the offset commit means the message is delivered again (to this replica or
//! another one after a rebalance), and step 1 then inserts nothing, so step 2 is
//! skipped. A crash before the database commit rolls back both the inbox row and the
//! effect, so the redelivery applies it. Two replicas racing on the same event (during
//! a rebalance) serialize on the inbox row's primary key: the second insert waits for
//! the first transaction and then finds the conflict.
//!
//! The relay may publish an event more than once, and Kafka may deliver a message more
//! than once; both look the same here: the same `id` again.
//!
//! # Ordering
//!
//! Kafka orders messages within a partition only. With the relay's default (unordered)
//! a charge's `ChargeCreated` and `ChargeRefunded` may sit on different partitions and
//! arrive in either order; a redelivered duplicate can arrive after newer events. The
//! ledger only adds, so order does not matter to it. With the relay's `--ordering
//! per-aggregate`, each charge's events arrive in `sequence` order (first occurrences);
//! `--ordering per-aggregate` here checks that: each charge's highest applied sequence
//! is kept with the effect, and an event that arrives before its predecessor is counted
//! (`charges_consumer_out_of_order_total`) and logged.

mod apply;
pub mod config;
mod consume;
mod error;
pub mod event;
mod handle;
pub mod ledger;
pub mod metrics;
pub mod migrations;
pub mod parked;
pub mod positions;
mod replay;
mod tail;

pub use apply::{Applied, apply};
pub use consume::run;
pub use error::{ConsumerError, error_chain};
pub use event::{Event, Message, Rejection, decode};
pub use tail::tail;

use charges_runtime::secrets::ExposeSecret;

use crate::config::{Cli, Command};

/// Every secret on the command line, for the log redactor: the database password and
/// the values of secret `--kafka-config` settings (`sasl.password`, …).
pub fn secrets(cli: &Cli) -> Vec<String> {
    let mut secrets =
        charges_runtime::secrets::database_password(cli.database.database_url.expose_secret());
    let kafka = match &cli.command {
        Some(Command::Tail(tail)) => &tail.kafka,
        Some(Command::Parked(_)) | None => &cli.run.kafka,
    };
    secrets.extend(charges_runtime::secrets::kafka_config_secrets(
        &kafka.resolved,
    ));
    secrets
}

/// Runs what the command line asks for.
pub async fn main(cli: Cli) -> Result<(), ConsumerError> {
    match cli.command {
        None => run(&cli.database, cli.run).await,
        Some(Command::Tail(args)) => tail(args).await,
        Some(Command::Parked(args)) => replay::parked(&cli.database, args).await,
    }
}
