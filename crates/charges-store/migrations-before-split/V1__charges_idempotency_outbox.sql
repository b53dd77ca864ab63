-- The reference article's three tables, plus what the HTTP contract needs:
-- a currency on the charge and the replayed response's headers on the key.

CREATE TABLE charges (
    id            UUID PRIMARY KEY,
    amount_cents  INTEGER NOT NULL CHECK (amount_cents > 0),
    currency      CHAR(3) NOT NULL CHECK (currency ~ '^[A-Z]{3}$'),
    created_at    TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- One row per (key, endpoint). Only COMPLETED rows are ever committed by the
-- one-transaction design; a committed STARTED row means a bug or a future
-- multi-phase endpoint and is never deleted by retention (see README).
CREATE TABLE idempotency_keys (
    key               TEXT NOT NULL,
    endpoint          TEXT NOT NULL,
    request_hash      TEXT NOT NULL,
    status            TEXT NOT NULL CHECK (status IN ('STARTED', 'COMPLETED')),
    response_status   INTEGER,
    response_headers  JSONB NOT NULL DEFAULT '{}'::jsonb,
    response_body     TEXT,
    created_at        TIMESTAMPTZ NOT NULL DEFAULT now(),
    expires_at        TIMESTAMPTZ NOT NULL,
    UNIQUE (key, endpoint),
    CHECK (status = 'STARTED' OR (response_status IS NOT NULL AND response_body IS NOT NULL))
);

-- Retention deletes expired COMPLETED keys in small batches ordered by expiry.
CREATE INDEX idempotency_keys_expires_idx
    ON idempotency_keys (expires_at)
    WHERE status = 'COMPLETED';

CREATE TABLE outbox (
    id            UUID PRIMARY KEY,
    aggregate_id  UUID NOT NULL REFERENCES charges (id),
    event_type    TEXT NOT NULL,
    payload       JSONB NOT NULL,
    created_at    TIMESTAMPTZ NOT NULL DEFAULT now(),
    published_at  TIMESTAMPTZ
);

CREATE INDEX outbox_pending_idx
    ON outbox (created_at)
    WHERE published_at IS NULL;

-- Reconciliation ("charges without an outbox row") joins on it.
CREATE INDEX outbox_aggregate_idx ON outbox (aggregate_id);
