-- Rows as a running system has them, added to the project's tables:
--   psql -v from=F -v to=T -v total=N -v span=SECONDS -f v7.sql -f fill.sql
-- adds rows F..T (of N in all) to charges, outbox and idempotency_keys. Row g was made
-- SPAN/N*g seconds after (now - SPAN), so every row is within the key TTL and the
-- outbox retention, and growing the tables later (F..T after 1..F-1) appends newer
-- rows, as time does. Charge and event ids are UUIDv7 like the API's, keys random like clients';
-- texts have the API's sizes. Outbox rows are published.
CREATE TEMP TABLE fill AS
    SELECT g, now() - :span * interval '1 second' + g * (:span::float8 / :total) * interval '1 second' AS at
      FROM generate_series(:from, :to) g;

INSERT INTO charges (id, amount_cents, currency, created_at)
SELECT pg_temp.v7(at, 'c' || g), 4900, 'EUR', at FROM fill ORDER BY g;

INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, sequence, data, created_at,
                    published_at, next_attempt_at, trace_parent, request_id)
SELECT pg_temp.v7(at, 'o' || g), 'charge', pg_temp.v7(at, 'c' || g), 'ChargeCreated', 1,
       '{"eventId":"' || pg_temp.v7(at, 'o' || g) || '","chargeId":"' || pg_temp.v7(at, 'c' || g)
           || '","amountCents":4900,"currency":"EUR","occurredAt":"2026-12-02T19:45:56.783080Z"}',
       at, at + interval '5 milliseconds', at + interval '5 milliseconds',
       '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01', md5('r' || g)::uuid::text
  FROM fill ORDER BY g;

INSERT INTO idempotency_keys (key, endpoint, request_hash, status, response_status,
                              response_headers, response_body, created_at, expires_at)
SELECT md5('k' || g)::uuid::text, '/charges',
       '416a7c28d28db891579e6576f3d101f94347fe8f0002b4777d0760c157849951', 'COMPLETED', 201,
       ('[["location","/charges/' || pg_temp.v7(at, 'c' || g) || '"]]')::jsonb,
       '{"id":"' || pg_temp.v7(at, 'c' || g)
           || '","amountCents":4900,"currency":"EUR","createdAt":"2026-12-02T19:45:56.783080Z"}',
       at, at + interval '24 hours'
  FROM fill ORDER BY g;
