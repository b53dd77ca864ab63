-- The orders service's own tables; the key, the outbox and the inbox are the
-- mechanisms' (their sets are applied first).
CREATE TABLE orders (
    id         uuid        PRIMARY KEY,
    item       text        NOT NULL CHECK (length(item) BETWEEN 1 AND 100),
    quantity   integer     NOT NULL CHECK (quantity BETWEEN 1 AND 1000),
    created_at timestamptz NOT NULL
);

-- The consumer's effect: units ordered per item, as seen through the events.
CREATE TABLE item_totals (
    item     text   PRIMARY KEY,
    quantity bigint NOT NULL
);
