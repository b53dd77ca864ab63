-- The Idempotency-Key mechanism's schema: one row per (key, endpoint), written once
-- with the response to replay, in the same transaction as the operation's writes.
--
-- Written so that it also adopts a database where this table and these functions
-- were created by an earlier layout that ended with exactly this shape (a service
-- whose own migrations held them before this crate did): IF NOT EXISTS, CREATE OR REPLACE, nothing else.

CREATE TABLE IF NOT EXISTS idempotency_keys (
    key              text        NOT NULL,
    endpoint         text        NOT NULL,
    request_hash     text        NOT NULL,
    status           text        NOT NULL,
    response_status  integer,
    response_headers jsonb       NOT NULL DEFAULT '{}'::jsonb,
    response_body    text,
    created_at       timestamptz NOT NULL DEFAULT now(),
    expires_at       timestamptz NOT NULL,
    CONSTRAINT idempotency_keys_check
        CHECK (status = 'STARTED' OR (response_status IS NOT NULL AND response_body IS NOT NULL)),
    CONSTRAINT idempotency_keys_status_check CHECK (status IN ('STARTED', 'COMPLETED')),
    CONSTRAINT idempotency_keys_key_endpoint_key UNIQUE (key, endpoint)
)
-- A row is written once and never updated in place (a completed key is taken over
-- only after it expired): no room to leave on a page. Expired keys are purged in
-- batches, so vacuum must follow quickly where autovacuum runs at all.
WITH (autovacuum_vacuum_scale_factor = 0.02,
      autovacuum_vacuum_insert_scale_factor = 0.02,
      autovacuum_analyze_scale_factor = 0.02,
      fillfactor = 100);

CREATE INDEX IF NOT EXISTS idempotency_keys_expires_idx ON idempotency_keys (expires_at);

-- Whether the synchronous standbys, counted as the server counts them (FIRST n / ANY n
-- of synchronous_standby_names), have flushed (applied, with remote_apply) p_position.
-- NULL when the positions cannot be read: the caller then falls back to a commit of
-- its own. SECURITY DEFINER because reading walsender positions needs pg_monitor.
-- pg_stat_get_wal_senders(), not the pg_stat_replication view: the view also reads
-- every backend's status, which made this five times as slow.
CREATE OR REPLACE FUNCTION idempotency_standbys_have(p_position pg_lsn) RETURNS boolean
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog
AS $$
    SELECT CASE WHEN bool_or(w.sync_state IS NULL) THEN NULL
                ELSE count(*) FILTER (
                         WHERE w.sync_state IN ('sync', 'quorum')
                           AND CASE current_setting('synchronous_commit')
                                 WHEN 'remote_apply' THEN w.replay_lsn
                                 ELSE w.flush_lsn
                               END >= p_position)
                     >= coalesce((regexp_match(current_setting('synchronous_standby_names'),
                                               '^\s*(?:first\s+|any\s+)?(\d+)\s*\(', 'i'))[1]::integer,
                                 1)
           END
      FROM pg_stat_get_wal_senders() w
$$;

-- A replay is an acknowledgment: PostgreSQL shows a commit to other sessions before
-- its synchronous wait ends, so a key's row read here may exist on this server only.
-- Returns once the synchronous standbys have flushed past it (the flush position is
-- past the commit of every row this session can see); a statement timeout or a
-- cancel ends the wait, and the caller answers "unavailable", never the response.
CREATE OR REPLACE FUNCTION idempotency_await_standbys() RETURNS void
LANGUAGE plpgsql
AS $$
DECLARE
    target pg_lsn;
    have boolean;
BEGIN
    IF current_setting('synchronous_standby_names') = ''
       OR current_setting('synchronous_commit') IN ('off', 'local') THEN
        RETURN;
    END IF;
    target := pg_current_wal_flush_lsn();
    LOOP
        have := idempotency_standbys_have(target);
        IF have THEN
            RETURN;
        ELSIF have IS NULL THEN
            PERFORM pg_logical_emit_message(true, 'idempotency.await_standbys', '');
            RETURN;
        END IF;
        PERFORM pg_sleep(0.001);
    END LOOP;
END
$$;

-- The first half of a one-statement operation (a service's own function that reserves
-- the key, writes, and completes the key in one call): takes the key's transaction
-- advisory lock without waiting, reads its row, and says whether the caller may run
-- the operation (r_free). When it may not, the row as read decides the answer (a
-- replay, an in-flight or a payload conflict), and a row that exists is on the
-- synchronous standbys before this returns.
CREATE OR REPLACE FUNCTION idempotency_key_reserve(
    p_key text,
    p_endpoint text,
    OUT r_free             boolean,
    OUT r_acquired         boolean,
    OUT r_now              timestamptz,
    OUT r_request_hash     text,
    OUT r_status           text,
    OUT r_response_status  integer,
    OUT r_response_headers jsonb,
    OUT r_response_body    text,
    OUT r_expires_at       timestamptz)
LANGUAGE plpgsql
AS $$
BEGIN
    r_now := now();
    r_acquired := pg_try_advisory_xact_lock(hashtextextended(p_endpoint || ' ' || p_key, 0));
    SELECT k.request_hash, k.status, k.response_status, k.response_headers,
           k.response_body, k.expires_at
      INTO r_request_hash, r_status, r_response_status, r_response_headers,
           r_response_body, r_expires_at
      FROM idempotency_keys k
     WHERE k.key = p_key AND k.endpoint = p_endpoint;
    r_free := r_acquired AND (r_status IS NULL
                              OR (r_status = 'COMPLETED' AND r_expires_at <= r_now));
    IF NOT r_free AND r_status IS NOT NULL THEN
        PERFORM idempotency_await_standbys();
    END IF;
END
$$;

-- The second half: writes the key's completed row with the response to replay, or
-- takes over an expired one. false: a row committed by someone else after the read
-- (the lock was granted after their commit), and the caller must write nothing.
CREATE OR REPLACE FUNCTION idempotency_key_complete(
    p_key              text,
    p_endpoint         text,
    p_request_hash     text,
    p_ttl_ms           bigint,
    p_response_status  integer,
    p_response_headers jsonb,
    p_response_body    text) RETURNS boolean
LANGUAGE plpgsql
AS $$
DECLARE
    written bigint;
BEGIN
    INSERT INTO idempotency_keys AS k (key, endpoint, request_hash, status, response_status,
                                       response_headers, response_body, created_at, expires_at)
    VALUES (p_key, p_endpoint, p_request_hash, 'COMPLETED', p_response_status,
            p_response_headers, p_response_body, now(),
            now() + p_ttl_ms * interval '1 millisecond')
    ON CONFLICT (key, endpoint) DO UPDATE
       SET request_hash = EXCLUDED.request_hash,
           status = EXCLUDED.status,
           response_status = EXCLUDED.response_status,
           response_headers = EXCLUDED.response_headers,
           response_body = EXCLUDED.response_body,
           created_at = EXCLUDED.created_at,
           expires_at = EXCLUDED.expires_at
     WHERE k.status = 'COMPLETED' AND k.expires_at <= now();
    GET DIAGNOSTICS written = ROW_COUNT;
    RETURN written > 0;
END
$$;
