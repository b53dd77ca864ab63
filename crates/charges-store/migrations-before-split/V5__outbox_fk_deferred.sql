-- The API sends a charge's INSERT and its outbox row's INSERT together, pipelined on
-- one connection, to save a round trip per request. Checking the outbox -> charges
-- reference at commit instead of per statement makes that independent of the order
-- in which the two statements happen to reach the server; the guarantee at commit is
-- unchanged.
ALTER TABLE outbox
    DROP CONSTRAINT outbox_aggregate_id_fkey,
    ADD CONSTRAINT outbox_aggregate_id_fkey
        FOREIGN KEY (aggregate_id) REFERENCES charges (id) DEFERRABLE INITIALLY DEFERRED;
