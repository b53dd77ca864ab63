-- Reconciliation that cannot false-alarm, and dead events an operator gave up on.

-- How far retention has deleted: the newest `published_at` among the outbox rows it
-- ever deleted. A charge created after it cannot have lost its event to retention
-- (an event is published after its charge is created), whatever --published-retention
-- any relay ran with, so reconciliation checks only those. One row.
CREATE TABLE outbox_retention_horizon (
    singleton                 BOOLEAN     PRIMARY KEY DEFAULT true CHECK (singleton),
    deleted_published_through TIMESTAMPTZ NOT NULL
);

-- Dead outbox rows discarded by `charges-relay dead discard`: the row as it was, who
-- discarded it and when. Reconciliation counts a charge whose ChargeCreated is here as
-- accounted for.
CREATE TABLE outbox_discarded (
    id            UUID        PRIMARY KEY,
    aggregate_id  UUID        NOT NULL,
    event_type    TEXT        NOT NULL,
    sequence      BIGINT,
    payload       JSONB       NOT NULL,
    attempts      INTEGER     NOT NULL,
    rejections    INTEGER     NOT NULL,
    last_error    TEXT,
    created_at    TIMESTAMPTZ NOT NULL,
    dead_at       TIMESTAMPTZ NOT NULL,
    discarded_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    -- The person (`--by`, else the operating-system user) and the database role.
    discarded_by  TEXT        NOT NULL,
    database_role TEXT        NOT NULL DEFAULT current_user
);

CREATE INDEX outbox_discarded_aggregate_idx ON outbox_discarded (aggregate_id);
