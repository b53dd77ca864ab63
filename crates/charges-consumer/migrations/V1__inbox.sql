-- The consumer's own schema. It has its own refinery history table
-- (consumer_schema_history), so it can live in the API's database or in any other.

-- The inbox: one row per event id ever applied. Inserted in the same transaction as the
-- event's effect, so "applied" and "remembered as applied" commit or roll back together.
CREATE TABLE processed_events (
    event_id     UUID        PRIMARY KEY,
    event_type   TEXT        NOT NULL,
    -- Where the copy that was applied came from; for debugging only.
    topic        TEXT        NOT NULL,
    partition    INTEGER     NOT NULL,
    "offset"     BIGINT      NOT NULL,
    processed_at TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- The effect: money per currency, as seen through the events.
CREATE TABLE ledger (
    currency       TEXT   PRIMARY KEY CHECK (currency ~ '^[A-Z]{3}$'),
    charged_cents  BIGINT NOT NULL DEFAULT 0,
    refunded_cents BIGINT NOT NULL DEFAULT 0,
    events         BIGINT NOT NULL DEFAULT 0
);
