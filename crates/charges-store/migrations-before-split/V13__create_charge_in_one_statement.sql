-- POST /charges in one statement (docs/design.md, "One statement per new charge").
--
-- The request's transaction used to be BEGIN, the key's reservation, the three writes
-- and COMMIT: five statements in four round trips, each planned once per connection
-- when prepared. Through a transaction pooler nothing can stay prepared, and parsing
-- and planning them on every request cost a third to a half of the throughput. As one
-- PL/pgSQL function, called in autocommit, the request is a single short statement
-- whose inner plans PL/pgSQL caches per server session, which a pooler's server
-- connections keep: the same work, prepared or not.
--
-- It does what IdempotencyKeyReserve and IdempotencyKeyComplete do (the same lock, the
-- same rules) and the two inserts of ChargeInsert and OutboxInsert:
-- - the key's transaction-scoped advisory lock, tried, never waited for;
-- - the key's row, read after the lock is granted (a volatile function's statements
--   each take a new snapshot, so a row the previous holder committed is seen);
-- - holding the lock, with no row or an expired COMPLETED one: the key's COMPLETED row
--   first, then the charge, then its ChargeCreated event; outcome `executed`. If the
--   key's row turns out to be taken after all (0 rows written), nothing is written and
--   the outcome is `taken`: the caller asks again.
-- - otherwise outcome `found`, with the lock's answer and the row as read: the caller
--   decides (replay, in flight, payload conflict) exactly as after a reservation.
--
-- The outbox row's created_at is the transaction's time, as the relay's claim order
-- expects; the charge's created_at is the API's (it is in the response the function
-- stores, built before the call).
--
-- SECURITY INVOKER (the default): the caller's own grants on the three tables apply.
CREATE FUNCTION charges_create_once(
    p_key              text,
    p_endpoint         text,
    p_request_hash     text,
    p_ttl_ms           bigint,
    p_response_status  integer,
    p_response_headers jsonb,
    p_response_body    text,
    p_charge_id        uuid,
    p_amount_cents     integer,
    p_currency         bpchar,
    p_created_at       timestamptz,
    p_client_id        text,
    p_event_id         uuid,
    p_aggregate_type   text,
    p_event_type       text,
    p_sequence         bigint,
    p_data             text,
    p_trace_parent     text,
    p_trace_state      text,
    p_request_id       text,
    OUT r_outcome          text,
    OUT r_acquired         boolean,
    OUT r_now              timestamptz,
    OUT r_request_hash     text,
    OUT r_status           text,
    OUT r_response_status  integer,
    OUT r_response_headers jsonb,
    OUT r_response_body    text,
    OUT r_expires_at       timestamptz)
LANGUAGE plpgsql
AS $$
DECLARE
    written bigint;
BEGIN
    r_now := now();
    r_acquired := pg_try_advisory_xact_lock(hashtextextended(p_endpoint || ' ' || p_key, 0));
    SELECT k.request_hash, k.status, k.response_status, k.response_headers,
           k.response_body, k.expires_at
      INTO r_request_hash, r_status, r_response_status, r_response_headers,
           r_response_body, r_expires_at
      FROM idempotency_keys k
     WHERE k.key = p_key AND k.endpoint = p_endpoint;
    IF NOT r_acquired OR NOT (r_status IS NULL
                              OR (r_status = 'COMPLETED' AND r_expires_at <= r_now)) THEN
        r_outcome := 'found';
        RETURN;
    END IF;

    INSERT INTO idempotency_keys AS k (key, endpoint, request_hash, status, response_status,
                                       response_headers, response_body, created_at, expires_at)
    VALUES (p_key, p_endpoint, p_request_hash, 'COMPLETED', p_response_status,
            p_response_headers, p_response_body, r_now,
            r_now + p_ttl_ms * interval '1 millisecond')
    ON CONFLICT (key, endpoint) DO UPDATE
       SET request_hash = EXCLUDED.request_hash,
           status = EXCLUDED.status,
           response_status = EXCLUDED.response_status,
           response_headers = EXCLUDED.response_headers,
           response_body = EXCLUDED.response_body,
           created_at = EXCLUDED.created_at,
           expires_at = EXCLUDED.expires_at
     WHERE k.status = 'COMPLETED' AND k.expires_at <= r_now;
    GET DIAGNOSTICS written = ROW_COUNT;
    IF written = 0 THEN
        r_outcome := 'taken';
        RETURN;
    END IF;

    INSERT INTO charges (id, amount_cents, currency, created_at, client_id)
    VALUES (p_charge_id, p_amount_cents, p_currency, p_created_at, p_client_id);
    INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, sequence, data,
                        created_at, trace_parent, trace_state, request_id)
    VALUES (p_event_id, p_aggregate_type, p_charge_id, p_event_type, p_sequence, p_data,
            r_now, p_trace_parent, p_trace_state, p_request_id);

    r_outcome := 'executed';
    r_request_hash := p_request_hash;
    r_status := 'COMPLETED';
    r_response_status := p_response_status;
    r_response_headers := p_response_headers;
    r_response_body := p_response_body;
    r_expires_at := r_now + p_ttl_ms * interval '1 millisecond';
END
$$;
