-- The API client that created a charge, when charges-api runs with API keys
-- (--api-keys); NULL without authentication. With authentication on, GET
-- /charges/{id} and refunds only find the caller's own charges. Nullable and
-- without a default: additive, so binaries built before V4 keep working during a
-- rolling deploy (they insert NULL). Reads are by primary key, so no index.
--
-- Idempotency keys need no column: the client is part of their scope string
-- (idempotency_keys.endpoint = 'client:<id> <endpoint>', see README "Security"), so
-- UNIQUE (key, endpoint) already means one row per (client, endpoint, key).

ALTER TABLE charges ADD COLUMN client_id TEXT;
