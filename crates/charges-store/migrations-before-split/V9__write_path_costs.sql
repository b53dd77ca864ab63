-- What a new charge's transaction pays for, cut to what earns its keep (measured in
-- docs/benchmarks.md, "Where a charge's time goes").
--
-- Rolling deploy: run this migration, then the relays, then the API. Relays built
-- before V9 never ask for a wake-up, so until they are replaced no insert notifies
-- and they find new rows by polling (--poll-interval) only.

-- The wake-up gate. A NOTIFY takes a database-wide lock from its transaction's
-- pre-commit until after the commit record is flushed, so transactions that notify
-- commit one at a time: with the old trigger, which notified on every insert, a new
-- charge ran at about half the speed it does without it. Now an insert notifies only
-- while a relay asked for it (an idle relay); a busy relay withdraws its request and
-- polls after --busy-poll-interval instead, and finds its rows without anyone's
-- commit waiting for it. Unlogged: the flag is a hint, never a fact (a crash empties
-- the table, relays fill it in again when they reconnect, and polling covers the
-- gap), and flipping it writes no WAL.
CREATE UNLOGGED TABLE outbox_wakeup (
    singleton  BOOLEAN PRIMARY KEY DEFAULT true CHECK (singleton),
    requested  BOOLEAN NOT NULL DEFAULT false
);
INSERT INTO outbox_wakeup DEFAULT VALUES;

CREATE OR REPLACE FUNCTION outbox_notify_pending() RETURNS trigger
    LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM outbox_wakeup WHERE requested) THEN
        PERFORM pg_notify('outbox_pending', '');
    END IF;
    RETURN NULL;
END;
$$;

-- The key's COMPLETE update may stay on the key's page as a heap-only tuple (HOT),
-- adding no index entry, only if no index covers a column it changes and the page has
-- room for the completed row. The expiry index was partial on status = 'COMPLETED',
-- which the update changes, so every COMPLETE added an entry to both indexes; the
-- purge's status filter reads the heap now, which for expired keys it had to visit
-- anyway. The free fifth of each page is where the completed row goes.
DROP INDEX idempotency_keys_expires_idx;
CREATE INDEX idempotency_keys_expires_idx ON idempotency_keys (expires_at);
ALTER TABLE idempotency_keys SET (fillfactor = 80);

-- Vacuum by a small share of the table, not the default fifth. Every row of these two
-- tables is inserted, updated once (a key's completion, an event's mark) and deleted
-- by retention, so dead rows pile up at twice the insert rate; with the defaults a
-- 20-million-row table gathers 4 million of them before autovacuum starts, and the
-- claim, the purge and the cleanup walk over them in the indexes meanwhile. Analyze
-- as often, so plans follow the tables as they grow (docs/operations.md, "Large
-- tables").
ALTER TABLE outbox SET (autovacuum_vacuum_scale_factor = 0.02,
                        autovacuum_vacuum_insert_scale_factor = 0.02,
                        autovacuum_analyze_scale_factor = 0.02);
ALTER TABLE idempotency_keys SET (autovacuum_vacuum_scale_factor = 0.02,
                                  autovacuum_vacuum_insert_scale_factor = 0.02,
                                  autovacuum_analyze_scale_factor = 0.02);
