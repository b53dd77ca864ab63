//! Every end-to-end test, one module per area (docs/development.md, "Tests"). One test
//! binary rather than one per file: a change to `tests/src` relinks one binary, not
//! thirty. nextest still runs each test in a process of its own, so process-wide state
//! (the statement mode, the metrics recorder) never leaks from one test to another.

mod alerts;
mod api;
mod architecture;
mod chaos;
mod cli;
mod configuration;
mod consumer;
mod containers;
mod deploy;
mod event_schemas;
mod events_on_the_wire;
mod failover;
mod grafana;
mod hostile_input;
mod idempotency_store;
mod maintenance;
mod network_faults;
mod openapi;
mod operations;
mod orders;
mod patroni;
mod pooler;
mod refunds;
mod relay;
mod relay_ordering;
mod relay_outage;
mod retention;
mod schema_upgrade;
mod schemathesis;
mod security;
mod store_errors;
mod tracing;
