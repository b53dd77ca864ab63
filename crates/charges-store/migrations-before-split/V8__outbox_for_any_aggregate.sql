-- An outbox for more than charges, whose payloads reach the wire byte for byte, and
-- which carries the trace of the request that wrote each event (docs/design.md,
-- "The outbox row").
--
-- Rolling deploy: run this migration, then the relays, then the API (docs/operations.md,
-- "A release"). Relays built before V8 read `payload`, which the API built after V8 no
-- longer writes; relays built after V8 read both columns.

-- Which kind of aggregate the event belongs to; routes it to a topic
-- (charges-relay --topic-for). Every event so far was a charge's.
ALTER TABLE outbox ADD COLUMN aggregate_type TEXT NOT NULL DEFAULT 'charge';

-- The payload exactly as the application serialised it. jsonb would reorder keys and
-- drop white space, so a consumer verifying a hash or signature over the bytes could
-- not; `payload` (jsonb) stays readable for rows written before V8 and is no longer
-- written.
ALTER TABLE outbox ADD COLUMN data TEXT;
ALTER TABLE outbox ALTER COLUMN payload DROP NOT NULL;
ALTER TABLE outbox ADD CONSTRAINT outbox_has_payload CHECK (data IS NOT NULL OR payload IS NOT NULL);

-- W3C Trace Context and the request id of the request that wrote the event.
ALTER TABLE outbox
    ADD COLUMN trace_parent TEXT,
    ADD COLUMN trace_state  TEXT,
    ADD COLUMN request_id   TEXT;

-- No foreign key to one aggregate's table: any aggregate may write events. That every
-- charge has its ChargeCreated stays checked by reconciliation.
ALTER TABLE outbox DROP CONSTRAINT outbox_aggregate_id_fkey;

-- A sequence is per aggregate, and aggregates of two types may share an id.
CREATE UNIQUE INDEX outbox_aggregate_type_sequence_idx
    ON outbox (aggregate_type, aggregate_id, sequence);
DROP INDEX outbox_aggregate_sequence_idx;

-- Discarded rows keep what they had: the payload as text (or jsonb, before V8).
ALTER TABLE outbox_discarded
    ADD COLUMN aggregate_type TEXT NOT NULL DEFAULT 'charge',
    ADD COLUMN data TEXT,
    ALTER COLUMN payload DROP NOT NULL;
