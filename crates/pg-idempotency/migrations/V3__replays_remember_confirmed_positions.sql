-- A replay's wait (V1) asked the standbys on every call, through a SECURITY DEFINER
-- function, even when nothing had been written since the last answer: with replays
-- read from the database (no in-process cache) that check was a third to a half of a
-- replay's cost. The server session now remembers the last position its synchronous
-- standbys confirmed, and for which synchronous_standby_names: a replay whose bound
-- (the flush position, past the commit of every row this session can see) is at or
-- below it has nothing to wait for. Standbys' flush positions only grow, so the answer
-- is the one the check would give; a changed synchronous_standby_names, or a new
-- session (another server after a failover, a pooler's reset), asks again.
--
-- The settings are the session's, not the transaction's (set_config(…, false)): a
-- transaction pooler hands them to the next client of the same server session, which is
-- what they describe.
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
    -- NULL before the first confirmation, '' after a RESET: either asks.
    IF current_setting('idempotency.confirmed_for', true)
           = current_setting('synchronous_standby_names')
       AND target <= nullif(current_setting('idempotency.confirmed_position', true), '')::pg_lsn
    THEN
        RETURN;
    END IF;
    LOOP
        have := idempotency_standbys_have(target);
        IF have THEN
            PERFORM set_config('idempotency.confirmed_position', target::text, false),
                    set_config('idempotency.confirmed_for',
                               current_setting('synchronous_standby_names'), false);
            RETURN;
        ELSIF have IS NULL THEN
            PERFORM pg_logical_emit_message(true, 'idempotency.await_standbys', '');
            RETURN;
        END IF;
        PERFORM pg_sleep(0.001);
    END LOOP;
END
$$;
