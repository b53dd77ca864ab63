//! Background upkeep of the charges database: every job that runs on a timer rather
//! than because a request or an event arrived. One file per job, one runner for all.
//! A job has one name: its file, its type, its `task` label and log field, and the
//! store statement it runs (`IdempotencyKeyPurgeExpired` for `purge_expired_keys`).
//! Its settings are a clap group in its file, gathered by [`MaintenanceArgs`]; the
//! flag and environment names are the relay's, which runs the jobs.
//!
//! This table is the one list of the jobs (docs/design.md links here):
//!
//! | job (`task`) | settings | what it does | single flight |
//! |---|---|---|---|
//! | [`purge_expired_keys`] | `--cleanup-interval` | deletes `COMPLETED` idempotency keys past `expires_at`, [`DELETE_BATCH`] per transaction (this is where keys expire); also `charges-relay purge`, once | yes |
//! | [`delete_published_outbox`] | `--cleanup-interval`, `--published-retention` | deletes outbox rows published longer ago than the retention, [`DELETE_BATCH`] per transaction | yes |
//! | [`reconcile`] | `--reconcile-interval`, `--stale-started-after` | counts broken invariants (charges without their event, committed `STARTED` keys) | its own: one replica counts per interval and records the result, every replica exports the latest |
//! | [`outbox_stats`] | `--stats-interval` | refreshes the backlog gauges (pending, oldest pending age, dead) | no: every replica exports its own |
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
//!   (`reconcile` shares one count between replicas itself, see [`reconcile`]).
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

pub mod delete_published_outbox;
pub mod metrics;
pub mod outbox_stats;
pub mod purge_expired_keys;
pub mod reconcile;
mod runner;
mod settings;

pub use delete_published_outbox::{DeletePublishedOutbox, DeletePublishedOutboxArgs};
pub use outbox_stats::{OutboxStats, OutboxStatsArgs};
pub use purge_expired_keys::PurgeExpiredKeys;
pub use reconcile::{Reconcile, ReconcileArgs};
pub use runner::{Job, JobFailed, JobRunner, RunOutcome, Step, run_once};
pub use settings::MaintenanceArgs;

/// Rows per DELETE statement (and per transaction) of the retention jobs: short locks,
/// small WAL bursts.
pub const DELETE_BATCH: i64 = 1000;
