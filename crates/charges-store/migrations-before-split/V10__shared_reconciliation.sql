-- Reconciliation's latest result, shared by every relay. Its checks read whole tables
-- (every charge within the outbox retention, every idempotency key), so one relay
-- checks per --reconcile-interval, under an advisory lock, and every relay exports
-- what that check found. A relay that starts does not check again while a recent
-- result exists: a rolling restart of N relays costs no check at all. One row.
CREATE TABLE reconciliation_result (
    singleton              BOOLEAN     PRIMARY KEY DEFAULT true CHECK (singleton),
    checked_at             TIMESTAMPTZ NOT NULL,
    charges_without_outbox BIGINT      NOT NULL CHECK (charges_without_outbox >= 0),
    stale_started_keys     BIGINT      NOT NULL CHECK (stale_started_keys >= 0)
);
