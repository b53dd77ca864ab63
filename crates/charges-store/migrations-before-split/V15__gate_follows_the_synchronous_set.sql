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
-- (deploy/sql/roles.sql): the standbys' positions are only shown to such roles.
-- EXECUTE only for the relay's role (deploy/sql/grants.sql). V12's
-- charges_standby_flush_positions() is left for relays of the previous version during a
-- rolling update.
CREATE FUNCTION outbox_standbys_flushed(
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

REVOKE ALL ON FUNCTION outbox_standbys_flushed(text[], boolean) FROM PUBLIC;
