-- Messages this consumer did not apply: an event type it handles in a payload version
-- it does not know, a message without a usable id or with a payload that does not
-- decode, or an event whose effect kept failing (--max-apply-attempts). Kept with the
-- headers it looked at and the payload, to be replayed (`charges-consumer parked
-- replay`) once the consumer or the data is fixed. One row per message read.
CREATE TABLE parked_events (
    topic         TEXT        NOT NULL,
    partition     INTEGER     NOT NULL,
    "offset"      BIGINT      NOT NULL,
    -- The header `id` as given: it may be missing or not a UUID.
    event_id      TEXT,
    event_type    TEXT,
    headers       JSONB       NOT NULL,
    payload       BYTEA       NOT NULL,
    reason        TEXT        NOT NULL,
    attempts      INTEGER     NOT NULL DEFAULT 1,
    parked_at     TIMESTAMPTZ NOT NULL DEFAULT now(),
    last_tried_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (topic, partition, "offset")
);
