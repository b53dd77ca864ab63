-- The relay's replication gate (--wait-for-standbys; docs/operations.md, "High
-- availability") publishes a batch only once the standbys have flushed the WAL that
-- holds its rows. How far each standby has flushed is in pg_stat_replication, whose
-- positions only superusers and members of pg_read_all_stats may read. This function,
-- owned by the migrating role (roles.sql makes it a member of pg_read_all_stats), shows
-- those two columns, and nothing else, to whoever may execute it: the relay
-- (grants.sql).
CREATE FUNCTION charges_standby_flush_positions()
RETURNS TABLE (standby text, flush_lsn pg_lsn)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog
AS $$
    SELECT application_name::text, flush_lsn
      FROM pg_stat_replication
     WHERE state = 'streaming' AND flush_lsn IS NOT NULL
$$;

REVOKE ALL ON FUNCTION charges_standby_flush_positions() FROM PUBLIC;
