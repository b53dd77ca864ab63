# Sourced by demo.sh, bench.sh and soak.sh: the helpers they share.

# The server the scripts create their databases on.
server_url="${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/test}"

# database_url NAME: $server_url with its database replaced by NAME; the query string
# (sslmode=…, options) is kept.
database_url() {
  local name=$1 base=$server_url query=""
  case "$base" in *\?*) query="?${base#*\?}"; base="${base%%\?*}" ;; esac
  local scheme="${base%%://*}://" rest="${base#*://}"
  printf '%s%s/%s%s\n' "$scheme" "${rest%%/*}" "$name" "$query"
}

# on_local_server: the server is this machine's (a socket, localhost or a loopback
# address), so dropping a scratch database there cannot hurt anyone else's.
on_local_server() {
  local rest="${server_url#*://}" host
  if [[ "$server_url" =~ [?\&]host=([^\&]*) ]]; then
    host="${BASH_REMATCH[1]}"
  else
    rest="${rest%%/*}"; rest="${rest##*@}"; host="${rest%:*}"
  fi
  case "$host" in ""|localhost|127.*|"[::1]"|/*) return 0 ;; *) return 1 ;; esac
}

# recreate_database NAME: drops and creates NAME on the server. Refuses a server that
# is not local unless CHARGES_ALLOW_REMOTE_DROP=1: a scratch database name may exist
# on a shared server.
recreate_database() {
  local name=$1
  if ! on_local_server && [ "${CHARGES_ALLOW_REMOTE_DROP:-}" != 1 ]; then
    echo "refusing to drop and recreate database $name on a server that is not local ($server_url);" \
      "set CHARGES_ALLOW_REMOTE_DROP=1 if that is what you want" >&2
    exit 1
  fi
  PGOPTIONS="-c client_min_messages=warning" psql "$server_url" -qX \
    -c "DROP DATABASE IF EXISTS $name WITH (FORCE)" -c "CREATE DATABASE $name" >/dev/null
}

# wait_until SECONDS DESCRIPTION COMMAND...: polls COMMAND every 0.1 s until it
# succeeds; after SECONDS, prints what it waited for and exits 1.
wait_until() {
  local limit=$1 what=$2; shift 2
  local deadline=$((SECONDS + limit))
  until "$@" >/dev/null 2>&1; do
    if [ "$SECONDS" -ge "$deadline" ]; then
      echo "timed out after ${limit}s waiting for $what" >&2
      exit 1
    fi
    sleep 0.1
  done
}

# http_ok URL: the URL answers 2xx.
http_ok() { curl -sf -o /dev/null "$1"; }

# sql_is URL EXPECTED QUERY: the query's single value is EXPECTED.
sql_is() { [ "$(psql "$1" -qtAX -c "$3")" = "$2" ]; }
