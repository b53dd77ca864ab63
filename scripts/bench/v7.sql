-- pg_temp.v7(at, seed): a UUIDv7 for time `at` (its random bits from md5(seed)), as
-- the API makes ids; for the session's bench fills (PostgreSQL 15 has no uuidv7()).
CREATE FUNCTION pg_temp.v7(at timestamptz, seed text) RETURNS uuid
    LANGUAGE sql IMMUTABLE AS $$
    SELECT (lpad(to_hex((extract(epoch FROM at) * 1000)::bigint), 12, '0') || '7'
            || substr(md5(seed), 1, 3) || '8' || substr(md5(seed), 4, 15))::uuid
$$;
