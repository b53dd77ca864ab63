-- What charges_api and charges_relay may do, derived statement by statement from the
-- SQL they run: the named consts and SQL functions of crates/pg-idempotency,
-- crates/pg-outbox (its store and relay engine) and crates/charges-store. Run as
-- charges_migrator (the owner) after every migration: `charges-api migrate
-- --grant-api-role charges_api --grant-relay-role charges_relay` does both (this file is
-- embedded in the binary); see roles.sql.
--
-- PostgreSQL rules that shape these grants:
--   * SELECT … FOR UPDATE needs UPDATE on at least one column of the table;
--   * INSERT … ON CONFLICT DO UPDATE needs INSERT, UPDATE on the SET columns and
--     SELECT on the columns it reads;
--   * UPDATE/DELETE … WHERE needs SELECT on the columns the WHERE reads;
--   * foreign-key checks need nothing more (they run as the table owner), and
--     pg_notify is executable by PUBLIC; but the outbox NOTIFY trigger runs as the
--     role that inserts, so that role reads outbox_wakeup.

-- ---------------------------------------------------------------------------------
-- charges_api
-- ---------------------------------------------------------------------------------

-- IdempotencyKeyReserve (reads the row) and IdempotencyKeyComplete (INSERT … ON
-- CONFLICT DO UPDATE of an expired row). Every column but the key and its scope may
-- change: the API can never move a stored response to another key, endpoint or client.
GRANT SELECT, INSERT ON idempotency_keys TO charges_api;
GRANT UPDATE (request_hash, status, response_status, response_headers, response_body,
              created_at, expires_at)
   ON idempotency_keys TO charges_api;

-- ChargeInsert, ChargeGet, ChargeLockForRefund (FOR UPDATE), ChargeAddRefunded: the
-- refunded total and the event sequence are the only things the API ever changes on a
-- charge; it never deletes one.
GRANT SELECT, INSERT ON charges TO charges_api;
GRANT UPDATE (refunded_cents, event_sequence) ON charges TO charges_api;

-- RefundInsert, RefundListForCharge.
GRANT SELECT, INSERT ON refunds TO charges_api;

-- OutboxInsert: the API writes events and never reads, changes or deletes them. Its
-- trigger reads whether a relay waits for a notification.
GRANT INSERT ON outbox TO charges_api;
GRANT SELECT ON outbox_wakeup TO charges_api;

-- ChargeCreateOnce: charges_create_idempotent (migrations/V2) and the mechanisms'
-- functions it composes (idempotency_key_claim, outbox_append) run with their caller's
-- rights (SECURITY INVOKER), so the grants above on idempotency_keys, charges and outbox
-- are all they may use. charges_create_once (V1, composing idempotency_key_reserve and
-- idempotency_key_complete) is what the previous release calls during a rolling deploy.
-- EXECUTE is PUBLIC's by default; granted here too so that it survives a REVOKE.
GRANT EXECUTE ON FUNCTION charges_create_idempotent(text, text, text, bigint, integer, jsonb,
    text, uuid, integer, bpchar, timestamptz, text, uuid, text, text, bigint, text, text,
    text, text) TO charges_api;
GRANT EXECUTE ON FUNCTION idempotency_key_claim(text, text, text, bigint, integer, jsonb, text)
   TO charges_api;
GRANT EXECUTE ON FUNCTION charges_create_once(text, text, text, bigint, integer, jsonb, text,
    uuid, integer, bpchar, timestamptz, text, uuid, text, text, bigint, text, text, text,
    text) TO charges_api;

-- IdempotencyKeyAwaitStandbys and idempotency_key_reserve: a replay waits until the
-- synchronous standbys have the key's row. idempotency_standbys_have runs with
-- its owner's rights (a member of pg_read_all_stats, roles.sql) and answers only yes or
-- no. EXECUTE is PUBLIC's by default; granted here so that it survives a REVOKE.
GRANT EXECUTE ON FUNCTION idempotency_key_reserve(text, text) TO charges_api;
GRANT EXECUTE ON FUNCTION idempotency_key_complete(text, text, text, bigint, integer, jsonb, text)
   TO charges_api;
GRANT EXECUTE ON FUNCTION outbox_append(uuid, text, uuid, text, bigint, text, timestamptz, text,
    text, text) TO charges_api;
GRANT EXECUTE ON FUNCTION idempotency_await_standbys() TO charges_api;
GRANT EXECUTE ON FUNCTION idempotency_standbys_have(pg_lsn) TO charges_api;

-- /readyz compares the applied schema version with the binary's.
GRANT SELECT ON idempotency_schema_history, outbox_schema_history, charges_schema_history
   TO charges_api;

-- ---------------------------------------------------------------------------------
-- charges_relay
-- ---------------------------------------------------------------------------------

-- OutboxClaimPending (FOR UPDATE SKIP LOCKED), OutboxMarkPublishedMany,
-- OutboxRecordFailureMany, OutboxRequeueDeadMany, OutboxListDead, OutboxStats, and
-- OutboxDeletePublished (retention). Only the delivery bookkeeping may change: the
-- relay can never rewrite an event's id, aggregate, type or payload.
GRANT SELECT, DELETE ON outbox TO charges_relay;
GRANT UPDATE (published_at, next_attempt_at, attempts, rejections, last_error, dead_at)
   ON outbox TO charges_relay;

-- IdempotencyKeyPurgeExpired (`purge` and the periodic retention) and
-- IdempotencyKeyCountStartedOlderThan (reconciliation). The purge's sub-select locks
-- rows FOR UPDATE SKIP LOCKED, which needs UPDATE on one column: expires_at, which
-- gives no power DELETE does not already give.
GRANT SELECT, DELETE ON idempotency_keys TO charges_relay;
GRANT UPDATE (expires_at) ON idempotency_keys TO charges_relay;

-- ChargeCountWithoutOutbox (reconciliation) reads charges; the relay never writes them.
GRANT SELECT ON charges TO charges_relay;

-- OutboxDeletePublished records how far it deleted; reconciliation reads it.
GRANT SELECT, INSERT, UPDATE ON outbox_retention_horizon TO charges_relay;

-- ReconciliationResultClaim, ReconciliationResultRecord: one relay checks, every relay
-- exports the latest result.
GRANT SELECT, INSERT, UPDATE ON reconciliation_result TO charges_relay;

-- OutboxDiscardDeadMany (`dead discard`) keeps what it deleted; reconciliation reads it.
GRANT SELECT, INSERT ON outbox_discarded TO charges_relay;

-- OutboxWakeupEnsure, OutboxWakeupSet, OutboxWakeupGet: an idle relay asks for
-- notifications, a busy one withdraws.
GRANT SELECT, INSERT, UPDATE ON outbox_wakeup TO charges_relay;

-- /readyz on --metrics-listen.
GRANT SELECT ON idempotency_schema_history, outbox_schema_history, charges_schema_history
   TO charges_relay;

-- ReplicationStandbysFlushed: the replication gate reads how far its standbys flushed
-- through this function (pg-outbox's schema), not pg_stat_replication itself.
GRANT EXECUTE ON FUNCTION outbox_standbys_flushed(text[], boolean) TO charges_relay;
