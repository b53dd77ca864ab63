-- Least privilege for the charges database: three roles, one per job.
--
--   charges_migrator  owns the schema and every table; runs `charges-api migrate`
--                     (the Kubernetes Job) and then grants.sql. Nothing else uses it.
--   charges_api       charges-api serve: exactly the statements the API runs.
--   charges_relay     charges-relay (the loop, `purge`, `dead list|requeue`).
--
-- Run this file once, as a superuser (or a role with CREATEROLE), connected to the
-- charges database: roles are cluster-wide, the schema statements act on the current
-- database. Then, after EVERY migration, run grants.sql as charges_migrator (`charges-api
-- migrate --grant-api-role charges_api --grant-relay-role charges_relay` does; GRANT is
-- idempotent; a migration that adds a table must add its grants there).
--
-- Passwords are not set here: set them from your secret store,
--   ALTER ROLE charges_api PASSWORD '…';
-- and put them in the binaries' DATABASE_URL (which they never log). The binaries do
-- not run with --migrate in production: only charges_migrator could.
--
-- tests/tests/security.rs runs this file and grants.sql verbatim (with the role names
-- suffixed per test) and runs both binaries as these roles, so the file and the code
-- cannot drift apart.

CREATE ROLE charges_migrator LOGIN;
CREATE ROLE charges_api LOGIN;
CREATE ROLE charges_relay LOGIN;

-- Behind a transaction pooler (deploy/k8s: PgBouncer) the binaries cannot send their
-- timeouts with the connection, so the roles carry them, and each binary refuses to
-- start if they are missing or looser than its own: the API's --db-statement-timeout
-- (5s) and twice that, the relay's --publish-timeout + 2s (7s) and twice that
-- (docs/operations.md, "Connection pooling"). Raise them here with those flags. A
-- direct connection sends its own, which take precedence.
ALTER ROLE charges_api SET statement_timeout = '5s';
ALTER ROLE charges_api SET idle_in_transaction_session_timeout = '10s';
ALTER ROLE charges_relay SET statement_timeout = '7s';
ALTER ROLE charges_relay SET idle_in_transaction_session_timeout = '14s';

-- The migrator owns the schema, hence every object the migrations create in it. No
-- one else may create anything there (PostgreSQL 15+ already revokes CREATE from
-- PUBLIC; older versions do not).
ALTER SCHEMA public OWNER TO charges_migrator;
REVOKE CREATE ON SCHEMA public FROM PUBLIC;
GRANT USAGE ON SCHEMA public TO charges_api, charges_relay;

-- The relay's replication gate and the API's replays read the standbys' positions
-- through SECURITY DEFINER functions the migrator owns (outbox_standbys_flushed,
-- idempotency_standbys_have): the migrator must see them itself.
GRANT pg_read_all_stats TO charges_migrator;

-- Optional hardening, per database (the name is yours):
--   REVOKE CONNECT ON DATABASE charges FROM PUBLIC;
--   GRANT CONNECT ON DATABASE charges TO charges_migrator, charges_api, charges_relay;
