-- What the relay (crates/charges-relay) needs on top of V1's outbox: retry
-- bookkeeping, a dead-letter state, an index matching its claim query, and a
-- wake-up notification on insert.

ALTER TABLE outbox
    ADD COLUMN attempts        INTEGER NOT NULL DEFAULT 0,
    ADD COLUMN last_error      TEXT,
    ADD COLUMN next_attempt_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    ADD COLUMN dead_at         TIMESTAMPTZ;

-- A row is either pending, published or dead, never two of these.
ALTER TABLE outbox
    ADD CONSTRAINT outbox_published_or_dead CHECK (published_at IS NULL OR dead_at IS NULL);

-- The claim (OutboxClaimPending) filters on exactly this predicate and orders by
-- created_at; next_attempt_at is checked on the index entries, not the heap.
DROP INDEX outbox_pending_idx;
CREATE INDEX outbox_pending_idx
    ON outbox (created_at) INCLUDE (next_attempt_at)
    WHERE published_at IS NULL AND dead_at IS NULL;

-- Retention (OutboxDeletePublished) deletes the oldest published rows first.
CREATE INDEX outbox_published_idx
    ON outbox (published_at)
    WHERE published_at IS NOT NULL;

-- `charges-relay dead list` / `dead requeue --all`.
CREATE INDEX outbox_dead_idx
    ON outbox (dead_at)
    WHERE dead_at IS NOT NULL;

-- Wakes listening relays. NOTIFY is delivered on commit (never for a rolled-back
-- insert), identical notifications in one transaction are folded into one, and a
-- statement-level trigger notifies once per INSERT statement, however many rows.
CREATE FUNCTION outbox_notify_pending() RETURNS trigger
    LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('outbox_pending', '');
    RETURN NULL;
END;
$$;

CREATE TRIGGER outbox_notify_pending
    AFTER INSERT ON outbox
    FOR EACH STATEMENT
    EXECUTE FUNCTION outbox_notify_pending();
