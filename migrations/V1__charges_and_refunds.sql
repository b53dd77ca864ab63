-- The charges service's own schema: charges, refunds, the reconciliation's result and
-- the one statement that creates a charge. The Idempotency-Key table and the outbox
-- are the mechanisms' (pg-idempotency's and pg-outbox's migrations, applied first);
-- this set only calls their functions.
--
-- A database created before the schema was split (its history in
-- refinery_schema_history, crates/charges-store/migrations-before-split) already has
-- these tables: they are adopted as they are (IF NOT EXISTS, CREATE OR REPLACE).

CREATE TABLE IF NOT EXISTS charges (
    id             uuid        NOT NULL PRIMARY KEY,
    amount_cents   integer     NOT NULL CONSTRAINT charges_amount_cents_check CHECK (amount_cents > 0),
    currency       char(3)     NOT NULL CONSTRAINT charges_currency_check CHECK (currency ~ '^[A-Z]{3}$'),
    created_at     timestamptz NOT NULL DEFAULT now(),
    refunded_cents integer     NOT NULL DEFAULT 0,
    -- Who created it, when the API authenticates its clients.
    client_id      text,
    -- The sequence of the charge's latest event (its outbox rows'), advanced under the
    -- charge's row lock.
    event_sequence bigint      NOT NULL DEFAULT 1,
    CONSTRAINT charges_refunded_within_amount
        CHECK (refunded_cents >= 0 AND refunded_cents <= amount_cents)
);

CREATE TABLE IF NOT EXISTS refunds (
    id           uuid        NOT NULL PRIMARY KEY,
    charge_id    uuid        NOT NULL REFERENCES charges (id),
    amount_cents integer     NOT NULL CONSTRAINT refunds_amount_cents_check CHECK (amount_cents > 0),
    created_at   timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS refunds_charge_idx ON refunds (charge_id, created_at);

-- The last reconciliation's counts, shared by every relay replica (one runs it).
CREATE TABLE IF NOT EXISTS reconciliation_result (
    singleton              boolean     NOT NULL DEFAULT true PRIMARY KEY
        CONSTRAINT reconciliation_result_singleton_check CHECK (singleton),
    checked_at             timestamptz NOT NULL,
    charges_without_outbox bigint      NOT NULL
        CONSTRAINT reconciliation_result_charges_without_outbox_check CHECK (charges_without_outbox >= 0),
    stale_started_keys     bigint      NOT NULL
        CONSTRAINT reconciliation_result_stale_started_keys_check CHECK (stale_started_keys >= 0)
);

-- POST /charges in one statement: the key's reservation and completion
-- (idempotency_key_reserve, idempotency_key_complete), the charge, and its
-- ChargeCreated (outbox_append), one round trip and no plan per request. The outcome:
-- `executed` (everything written), `taken` (the key's row was committed by someone else
-- after it was read; nothing written) or `found` (nothing written; the row as read, on
-- the synchronous standbys already, decides).
CREATE OR REPLACE FUNCTION charges_create_once(
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
    free boolean;
BEGIN
    SELECT k.r_free, k.r_acquired, k.r_now, k.r_request_hash, k.r_status,
           k.r_response_status, k.r_response_headers, k.r_response_body, k.r_expires_at
      INTO free, r_acquired, r_now, r_request_hash, r_status,
           r_response_status, r_response_headers, r_response_body, r_expires_at
      FROM idempotency_key_reserve(p_key, p_endpoint) k;
    IF NOT free THEN
        r_outcome := 'found';
        RETURN;
    END IF;
    IF NOT idempotency_key_complete(p_key, p_endpoint, p_request_hash, p_ttl_ms,
                                    p_response_status, p_response_headers,
                                    p_response_body) THEN
        r_outcome := 'taken';
        RETURN;
    END IF;

    INSERT INTO charges (id, amount_cents, currency, created_at, client_id)
    VALUES (p_charge_id, p_amount_cents, p_currency, p_created_at, p_client_id);
    PERFORM outbox_append(p_event_id, p_aggregate_type, p_charge_id, p_event_type,
                          p_sequence, p_data, r_now, p_trace_parent, p_trace_state,
                          p_request_id);

    r_outcome := 'executed';
    r_request_hash := p_request_hash;
    r_status := 'COMPLETED';
    r_response_status := p_response_status;
    r_response_headers := p_response_headers;
    r_response_body := p_response_body;
    r_expires_at := r_now + p_ttl_ms * interval '1 millisecond';
END
$$;

-- Relays older than the gate's outbox_standbys_flushed (before-split V15) asked this
-- one; no relay of the previous release does.
DROP FUNCTION IF EXISTS charges_standby_flush_positions();
