-- The reference schema's tables with rows F..T, as fill.sql does for the project's
-- (random UUIDs, as the article's code makes them):
--   psql -v from=F -v to=T -v total=N -v span=SECONDS -f reference/fill.sql
CREATE TEMP TABLE fill AS
    SELECT g, now() - :span * interval '1 second' + g * (:span::float8 / :total) * interval '1 second' AS at
      FROM generate_series(:from, :to) g;

INSERT INTO charges (id, amount_cents, created_at)
SELECT md5('c' || g)::uuid, 4900, at FROM fill;

INSERT INTO outbox (id, aggregate_id, event_type, payload, created_at, published_at)
SELECT md5('o' || g)::uuid, md5('c' || g)::uuid, 'ChargeCreated',
       '{"chargeId":"' || md5('c' || g)::uuid || '","amountCents":4900}', at, at + interval '5 milliseconds'
  FROM fill;

INSERT INTO idempotency_keys (key, endpoint, request_hash, status, response_status,
                              response_body, created_at, expires_at)
SELECT md5('k' || g)::uuid::text, '/charges',
       '5e1a4a3c0fb0e4f0e1c5b1a05b1de4f3c6d4b8e1a6c2d7f9e0b3a4c5d6e7f8a9', 'COMPLETED', 201,
       '{"id":"' || md5('c' || g)::uuid || '"}', at, at + interval '24 hours'
  FROM fill;
