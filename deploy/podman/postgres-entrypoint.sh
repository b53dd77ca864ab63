#!/bin/sh
# The upstream postgres image's variables, honoured on the first start as it does:
# POSTGRES_USER (a superuser), POSTGRES_DB (single-user mode: one statement a line). The cluster itself was initialised when the
# image was built, with trust authentication, so POSTGRES_PASSWORD is accepted and
# not needed.
set -eu
if [ ! -f "$PGDATA/charges-initialised" ]; then
  user="${POSTGRES_USER:-postgres}"
  db="${POSTGRES_DB:-$user}"
  {
    [ "$user" = postgres ] || echo "CREATE ROLE \"$user\" SUPERUSER LOGIN;"
    [ "$db" = postgres ] || echo "CREATE DATABASE \"$db\" OWNER \"$user\";"
  } | postgres --single -D "$PGDATA" postgres >/dev/null
  touch "$PGDATA/charges-initialised"
fi
exec postgres -D "$PGDATA" "$@"
