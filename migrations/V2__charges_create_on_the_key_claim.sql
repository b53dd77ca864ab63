-- POST /charges in one statement, composed from one call of each mechanism:
-- idempotency_key_claim (the key's lock, read and completed row) and outbox_append
-- (ChargeCreated). Its row is the key's outcome (idempotency_key_outcome, declared by
-- pg-idempotency's V2): `executed` once the charge and its event are written too.
--
-- A new name rather than a new body for charges_create_once (V1): its result columns
-- differ, and the previous release's API calls charges_create_once until every replica
-- is replaced, so both exist during a rolling deploy.
CREATE OR REPLACE FUNCTION charges_create_idempotent(
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
    p_request_id       text) RETURNS idempotency_key_outcome
LANGUAGE plpgsql
AS $$
DECLARE
    k idempotency_key_outcome;
BEGIN
    -- An assignment, not SELECT … FROM: a function call PL/pgSQL evaluates as a simple
    -- expression, without an executor of its own.
    k := idempotency_key_claim(p_key, p_endpoint, p_request_hash, p_ttl_ms,
                               p_response_status, p_response_headers, p_response_body);
    IF k.outcome <> 'executed' THEN
        RETURN k;
    END IF;

    INSERT INTO charges (id, amount_cents, currency, created_at, client_id)
    VALUES (p_charge_id, p_amount_cents, p_currency, p_created_at, p_client_id);
    PERFORM outbox_append(p_event_id, p_aggregate_type, p_charge_id, p_event_type,
                          p_sequence, p_data, k.now, p_trace_parent, p_trace_state,
                          p_request_id);
    RETURN k;
END
$$;
