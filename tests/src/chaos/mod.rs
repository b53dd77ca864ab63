//! The machinery of the fault-injection scenarios (tests/tests/chaos.rs and
//! hostile_input.rs): seeded randomness, clients that record every answer in a
//! [`Ledger`], a load generator, and one invariant checker ([`check_invariants`]) that
//! looks at what the clients were told, at the database and at the topic:
//!
//! - every 201 the clients received names a charge that exists, with exactly one
//!   outbox row; no charge without its outbox row; no committed `STARTED` key; one
//!   charge per `(key, endpoint)`, and each key names the same charge in every 201;
//! - every outbox row is published (or dead with a reason), and reading the topic back
//!   and deduplicating on header `id` finds each event once;
//! - no answer to client input was a 5xx, except 503 to a request sent while the
//!   database was made unavailable on purpose.

mod client;
pub mod hostile;
mod invariants;
mod ledger;
mod load;
mod rng;

use std::time::Duration;

pub use client::{BaseUrl, KEY_LIMIT, charge_body, http_client, post_charge, submit};
pub use invariants::{check_invariants, scalar};
pub use ledger::{Answer, Ledger};
pub use load::{Clients, Load};
pub use rng::seeded_rng;

/// Sleeps `total`: a step of a scenario's timeline (how long a fault lasts, or how long
/// the load runs between two faults), never a wait for an event.
pub async fn pause(total: Duration) {
    tokio::time::sleep(total).await;
}
