//! Background upkeep of the charges database: every job that runs on a timer rather
//! than because a request or an event arrived. One file per job, one runner for all.
//!
//! | job | file | what it does |
//! |---|---|---|
//! | `purge_expired_keys` | [`key_purger`] | deletes `COMPLETED` idempotency keys past `expires_at` (this is where keys expire) |
//! | `delete_published_outbox` | [`outbox_cleaner`] | deletes outbox rows published longer ago than the retention |
//! | `reconcile` | [`reconciler`] | counts broken invariants (charges without their event, committed `STARTED` keys), once per interval for all replicas |
//! | `outbox_stats` | [`outbox_stats`] | refreshes the backlog gauges (pending, oldest pending age, dead) |
//!
//! # The runner
//!
//! [`JobRunner`] runs each [`Job`] now and then every interval, on its own task:
//!
//! - **Steps in transactions.** A run is one or more [`Job::step`]s, each in its own
//!   short transaction; a step that reports [`Step::More`] is followed by the next one
//!   at once (batched deletes keep their locks and WAL bursts small).
//! - **Single flight.** A job with a [`Job::lock_key`] takes
//!   `pg_try_advisory_xact_lock(key)` in each step's transaction; when another process
//!   holds it, the run is skipped, so N replicas never do the same deletes side by
//!   side. Read-only jobs have no key: every replica exports its own gauges
//!   (`reconcile` shares one count between replicas itself, see [`reconciler`]).
//! - **Metrics**, by `task` (the job name): runs by outcome (`ok`, `skipped`, `failed`), rows affected,
//!   duration, and the time of the last successful run (the alert for a stalled job).
//! - **Failure policy.** A failed run is logged and counted, and the job runs again at
//!   its next interval: upkeep can wait. A job that fails three times in a row for a
//!   reason other than an unreachable database (a missing grant, a broken schema) makes
//!   the process's `/readyz` answer 503 naming it, until it runs again. A job whose
//!   task ends — a panic, a bug — ends [`JobRunner::failed`], and the process exits
//!   non-zero: never a half-alive process whose gauges quietly stop moving.
//!
//! `charges-relay` runs these jobs next to the outbox relay: it is already deployed
//! as N replicas with a database role that may delete from both queue tables, and the
//! advisory locks make one replica do each delete. A separate Deployment would add a
//! process to operate and nothing to the guarantees.

mod key_purger;
pub mod metrics;
mod outbox_cleaner;
mod outbox_stats;
mod reconciler;
mod runner;

pub use key_purger::{ExpiredKeyPurger, PURGE_EXPIRED_KEYS};
pub use outbox_cleaner::{DELETE_PUBLISHED_OUTBOX, PublishedOutboxCleaner};
pub use outbox_stats::{OUTBOX_STATS, OutboxStatsRefresher};
pub use reconciler::{RECONCILE, ReconcileSettings, Reconciler};
pub use runner::{Job, JobFailed, JobRunner, RunOutcome, Step, run_once};

/// Rows per DELETE statement (and per transaction) of the retention jobs: short locks,
/// small WAL bursts.
pub const DELETE_BATCH: i64 = 1000;
