#![doc = include_str!("../README.md")]

mod claim;
#[cfg(feature = "kafka")]
pub mod relay;
pub mod replication;
mod schema;
pub mod store;
mod wakeup;

pub use claim::ClaimTransaction;
pub use replication::{GateStandbys, ReplicationStore, StandbyFlush, WalPosition};
pub use schema::schema;
pub use store::{
    ClaimStatements, DeadEvent, NewEvent, Origin, OutboxStats, OutboxStore, PendingEvent,
    PublishFailure,
};
pub use wakeup::OutboxWakeupStore;
