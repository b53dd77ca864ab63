-- The outbox mechanism's schema: events committed with the change that caused them,
-- published by relays that claim them with FOR UPDATE SKIP LOCKED.
--
-- Written so that it also adopts a database where these objects were created by an
-- earlier layout that ended with exactly this shape but for the aggregate_type
-- defaults dropped below (a service whose own migrations held them first): IF NOT EXISTS, CREATE
-- OR REPLACE, and changes that leave an adopted table as a new one would be.

CREATE TABLE IF NOT EXISTS outbox (
    id              uuid        NOT NULL PRIMARY KEY,
    aggregate_id    uuid        NOT NULL,
    event_type      text        NOT NULL,
    -- The payload of rows written before `data` existed; new rows leave it NULL.
    payload         jsonb,
    created_at      timestamptz NOT NULL DEFAULT now(),
    published_at    timestamptz,
    attempts        integer     NOT NULL DEFAULT 0,
    last_error      text,
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    dead_at         timestamptz,
    -- The event's place among its aggregate's events (1, 2, …), assigned by the writer
    -- under the aggregate's row lock.
    sequence        bigint,
    rejections      integer     NOT NULL DEFAULT 0,
    aggregate_type  text        NOT NULL,
    -- The payload exactly as it goes on the wire.
    data            text,
    trace_parent    text,
    trace_state     text,
    request_id      text,
    CONSTRAINT outbox_has_payload CHECK (data IS NOT NULL OR payload IS NOT NULL),
    CONSTRAINT outbox_published_or_dead CHECK (published_at IS NULL OR dead_at IS NULL)
)
WITH (autovacuum_vacuum_scale_factor = 0.02,
      autovacuum_vacuum_insert_scale_factor = 0.02,
      autovacuum_analyze_scale_factor = 0.02);

-- An aggregate's type is the writer's to name, always: no default that names one.
ALTER TABLE outbox ALTER COLUMN aggregate_type DROP DEFAULT;

CREATE UNIQUE INDEX IF NOT EXISTS outbox_aggregate_type_sequence_idx
    ON outbox (aggregate_type, aggregate_id, sequence);
-- The relay's claim: oldest pending first, without reading published or dead rows.
CREATE INDEX IF NOT EXISTS outbox_pending_idx ON outbox (created_at) INCLUDE (next_attempt_at)
    WHERE published_at IS NULL AND dead_at IS NULL;
CREATE INDEX IF NOT EXISTS outbox_dead_idx ON outbox (dead_at) WHERE dead_at IS NOT NULL;
-- Retention deletes published rows oldest first.
CREATE INDEX IF NOT EXISTS outbox_published_idx ON outbox (published_at)
    WHERE published_at IS NOT NULL;

-- Dead rows an operator discarded, kept with who discarded them and why they died.
CREATE TABLE IF NOT EXISTS outbox_discarded (
    id             uuid        NOT NULL PRIMARY KEY,
    aggregate_id   uuid        NOT NULL,
    event_type     text        NOT NULL,
    sequence       bigint,
    payload        jsonb,
    attempts       integer     NOT NULL,
    rejections     integer     NOT NULL,
    last_error     text,
    created_at     timestamptz NOT NULL,
    dead_at        timestamptz NOT NULL,
    discarded_at   timestamptz NOT NULL DEFAULT now(),
    discarded_by   text        NOT NULL,
    database_role  text        NOT NULL DEFAULT CURRENT_USER,
    aggregate_type text        NOT NULL,
    data           text
);
ALTER TABLE outbox_discarded ALTER COLUMN aggregate_type DROP DEFAULT;
CREATE INDEX IF NOT EXISTS outbox_discarded_aggregate_idx ON outbox_discarded (aggregate_id);

-- How far retention has deleted published rows: consumers that replay from the outbox
-- learn where its history now begins.
CREATE TABLE IF NOT EXISTS outbox_retention_horizon (
    singleton                  boolean     NOT NULL DEFAULT true PRIMARY KEY
        CONSTRAINT outbox_retention_horizon_singleton_check CHECK (singleton),
    deleted_published_through timestamptz NOT NULL
);

-- Whether a relay waits for a notification. Unlogged: after a crash it is empty, the
-- relays write it again, and no insert pays WAL for it.
CREATE UNLOGGED TABLE IF NOT EXISTS outbox_wakeup (
    singleton boolean NOT NULL DEFAULT true PRIMARY KEY
        CONSTRAINT outbox_wakeup_singleton_check CHECK (singleton),
    requested boolean NOT NULL DEFAULT false
);
INSERT INTO outbox_wakeup DEFAULT VALUES ON CONFLICT (singleton) DO NOTHING;

-- Notifies only while a relay asked to be woken: a busy relay claims on its own, and
-- a NOTIFY per insert statement would serialize every writer's commit on the
-- notification queue's lock.
CREATE OR REPLACE FUNCTION outbox_notify_pending() RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM outbox_wakeup WHERE requested) THEN
        PERFORM pg_notify('outbox_pending', '');
    END IF;
    RETURN NULL;
END;
$$;

CREATE OR REPLACE TRIGGER outbox_notify_pending AFTER INSERT ON outbox
    FOR EACH STATEMENT EXECUTE FUNCTION outbox_notify_pending();

-- Appends an event on the caller's transaction: what a service's own one-statement
-- function calls (the Rust side's OutboxStore::insert runs the same INSERT).
CREATE OR REPLACE FUNCTION outbox_append(
    p_id             uuid,
    p_aggregate_type text,
    p_aggregate_id   uuid,
    p_event_type     text,
    p_sequence       bigint,
    p_data           text,
    p_created_at     timestamptz,
    p_trace_parent   text,
    p_trace_state    text,
    p_request_id     text) RETURNS void
LANGUAGE plpgsql
AS $$
BEGIN
    INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, sequence, data,
                        created_at, trace_parent, trace_state, request_id)
    VALUES (p_id, p_aggregate_type, p_aggregate_id, p_event_type, p_sequence, p_data,
            p_created_at, p_trace_parent, p_trace_state, p_request_id);
END
$$;

-- The relay's replication gate (--wait-for-standbys; docs/design.md, "A commit the
-- standby does not have") asks one question of the standbys, from one watcher per relay
-- process that every waiting batch shares: how far have the standbys it waits for
-- flushed the WAL? A batch is published once that is at or past its claim's position.
--
--   p_sync      `sync`: the standbys synchronous_standby_names names right now,
--               counted as the server counts them (FIRST n or ANY n of those
--               pg_stat_replication marks `sync` or `quorum`; 1 for a plain list): the
--               n-th furthest flush among them. While it names none, `everything` is
--               true: a failover manager that promotes only the synchronous set
--               (Patroni's synchronous_mode) has no standby a ghost could come from.
--   p_names     otherwise: these standbys (application_name), all of them streaming,
--               the one furthest behind; empty: any one standby, the one furthest
--               ahead.
--
-- `flushed` is NULL while the standbys asked for are not (all) streaming; `wal_end`,
-- the WAL insert position as the question was answered, gives the lag.
--
-- SECURITY DEFINER, owned by the migrating role, a member of pg_read_all_stats
-- (the service's role setup): the standbys' positions are only shown to such roles.
CREATE OR REPLACE FUNCTION outbox_standbys_flushed(
    p_names text[],
    p_sync boolean,
    OUT flushed pg_lsn,
    OUT everything boolean,
    OUT wal_end pg_lsn)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog
AS $$
DECLARE
    sync_names text := current_setting('synchronous_standby_names');
    needed integer;
BEGIN
    wal_end := pg_current_wal_insert_lsn();
    everything := false;
    -- pg_stat_get_wal_senders(), not the pg_stat_replication view, which also reads
    -- every backend's status: five times as slow, asked every millisecond. Only names
    -- need a backend's status, the walsender's own.
    IF p_sync THEN
        IF sync_names = '' THEN
            everything := true;
            RETURN;
        END IF;
        needed := coalesce((regexp_match(sync_names,
                                         '^\s*(?:first\s+|any\s+)?(\d+)\s*\(', 'i'))[1]::integer,
                           1);
        SELECT (array_agg(w.flush_lsn ORDER BY w.flush_lsn DESC))[needed]
          INTO flushed
          FROM pg_stat_get_wal_senders() w
         WHERE w.sync_state IN ('sync', 'quorum') AND w.flush_lsn IS NOT NULL;
    ELSIF cardinality(p_names) = 0 THEN
        SELECT max(w.flush_lsn)
          INTO flushed
          FROM pg_stat_get_wal_senders() w
         WHERE w.state = 'streaming';
    ELSE
        SELECT CASE WHEN count(DISTINCT a.application_name) = cardinality(p_names)
                    THEN min(w.flush_lsn) END
          INTO flushed
          FROM pg_stat_get_wal_senders() w
         CROSS JOIN LATERAL pg_stat_get_activity(w.pid) a
         WHERE w.state = 'streaming' AND w.flush_lsn IS NOT NULL
           AND a.application_name = ANY (p_names);
    END IF;
END
$$;
