-- A replay is an acknowledgment: it must not be answered before the commit it replays
-- is on the synchronous standbys (docs/design.md, "A commit the standby does not have").
--
-- A commit whose wait for synchronous replication is cancelled is kept locally and
-- becomes visible. A retry that reads such a key's COMPLETED row and answers from it
-- acknowledges a charge that a failover to the standby loses. So a request that answers
-- from a key's row first waits until the standbys have it.
--
-- idempotency_standbys_have(position) says whether the standbys a commit waits for have
-- confirmed `position`, counted as the server counts them: synchronous_standby_names'
-- number (FIRST n, ANY n, or 1 for a plain list) of the standbys pg_stat_replication
-- marks `sync` or `quorum`, flushed (replayed, under synchronous_commit = remote_apply)
-- at or past it; NULL when it cannot tell (its owner may not read the positions).
-- SECURITY DEFINER so that the positions, which only members of pg_read_all_stats see,
-- are read with the migrating role's rights (roles.sql); it shows only a yes or no.
CREATE FUNCTION idempotency_standbys_have(p_position pg_lsn) RETURNS boolean
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog
AS $$
    -- pg_stat_get_wal_senders(), not the pg_stat_replication view: the view also reads
    -- every backend's status, which made this five times as slow.
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

-- idempotency_await_standbys() returns once the standbys have the row read before it.
-- It asks with the position the WAL was flushed to: a commit is flushed before it
-- becomes visible (RecordTransactionCommit flushes, then waits for the standbys, and
-- only then leaves the proc array), so that position is past the row's commit record
-- (for rows committed with synchronous_commit on, local or remote_*; one committed with
-- it off is visible before it is flushed, and lost by any crash: the API must not run
-- with it). Most replays find the standbys there already and return at once; a recent
-- one waits the replication's round trip, looking every millisecond and writing
-- nothing, so concurrent replays never wait for each other. The statement's timeout or
-- a cancel ends a wait for a standby that does not come (the API answers 503). Only
-- when the positions cannot be read does it fall back on the server's own wait: it
-- writes one transactional logical message (a transaction that only takes an xid
-- writes no commit record worth waiting for), so that its commit, after the row's in
-- the WAL, waits for the standbys as any commit does. Nothing at all happens without a
-- synchronous standby, or for a session that does not wait for one.
CREATE FUNCTION idempotency_await_standbys() RETURNS void
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

-- charges_create_once (V13), unchanged but for one line: an outcome `found` answered
-- from the key's row waits for the standbys (above) when its autocommit ends.
CREATE OR REPLACE FUNCTION charges_create_once(
    p_key              text,
    p_endpoint         text,
    p_request_hash     text,
    p_ttl_ms           bigint,
    p_response_status  integer,
    p_response_headers jsonb,
    p_response_body    text,
    p_charge_id        uuid,
    p_amount_cents     integer,
    p_currency         bpchar,
    p_created_at       timestamptz,
    p_client_id        text,
    p_event_id         uuid,
    p_aggregate_type   text,
    p_event_type       text,
    p_sequence         bigint,
    p_data             text,
    p_trace_parent     text,
    p_trace_state      text,
    p_request_id       text,
    OUT r_outcome          text,
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
DECLARE
    written bigint;
BEGIN
    r_now := now();
    r_acquired := pg_try_advisory_xact_lock(hashtextextended(p_endpoint || ' ' || p_key, 0));
    SELECT k.request_hash, k.status, k.response_status, k.response_headers,
           k.response_body, k.expires_at
      INTO r_request_hash, r_status, r_response_status, r_response_headers,
           r_response_body, r_expires_at
      FROM idempotency_keys k
     WHERE k.key = p_key AND k.endpoint = p_endpoint;
    IF NOT r_acquired OR NOT (r_status IS NULL
                              OR (r_status = 'COMPLETED' AND r_expires_at <= r_now)) THEN
        IF r_status IS NOT NULL THEN
            PERFORM idempotency_await_standbys();
        END IF;
        r_outcome := 'found';
        RETURN;
    END IF;

    INSERT INTO idempotency_keys AS k (key, endpoint, request_hash, status, response_status,
                                       response_headers, response_body, created_at, expires_at)
    VALUES (p_key, p_endpoint, p_request_hash, 'COMPLETED', p_response_status,
            p_response_headers, p_response_body, r_now,
            r_now + p_ttl_ms * interval '1 millisecond')
    ON CONFLICT (key, endpoint) DO UPDATE
       SET request_hash = EXCLUDED.request_hash,
           status = EXCLUDED.status,
           response_status = EXCLUDED.response_status,
           response_headers = EXCLUDED.response_headers,
           response_body = EXCLUDED.response_body,
           created_at = EXCLUDED.created_at,
           expires_at = EXCLUDED.expires_at
     WHERE k.status = 'COMPLETED' AND k.expires_at <= r_now;
    GET DIAGNOSTICS written = ROW_COUNT;
    IF written = 0 THEN
        r_outcome := 'taken';
        RETURN;
    END IF;

    INSERT INTO charges (id, amount_cents, currency, created_at, client_id)
    VALUES (p_charge_id, p_amount_cents, p_currency, p_created_at, p_client_id);
    INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, sequence, data,
                        created_at, trace_parent, trace_state, request_id)
    VALUES (p_event_id, p_aggregate_type, p_charge_id, p_event_type, p_sequence, p_data,
            r_now, p_trace_parent, p_trace_state, p_request_id);

    r_outcome := 'executed';
    r_request_hash := p_request_hash;
    r_status := 'COMPLETED';
    r_response_status := p_response_status;
    r_response_headers := p_response_headers;
    r_response_body := p_response_body;
    r_expires_at := r_now + p_ttl_ms * interval '1 millisecond';
END
$$;
