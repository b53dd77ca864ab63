-- The inbox: one row per event id ever applied, inserted in the same transaction as
-- the event's effect, so "applied" and "remembered as applied" commit or roll back
-- together. Adopts the table where a consumer's own migrations created it first.
CREATE TABLE IF NOT EXISTS processed_events (
    event_id     uuid        PRIMARY KEY,
    event_type   text        NOT NULL,
    -- Where the copy that was applied came from; for debugging only.
    topic        text        NOT NULL,
    partition    integer     NOT NULL,
    "offset"     bigint      NOT NULL,
    processed_at timestamptz NOT NULL DEFAULT now()
);
