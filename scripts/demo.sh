#!/usr/bin/env bash
# make demo: migrate a fresh demo database, start charges-api, post the same charge
# twice (the second is the "timeout" retry) and a changed payload, then show that the
# database holds one charge and one outbox event.
set -euo pipefail
cd "$(dirname "$0")/.."

server_url="${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/test}"
root="${server_url%/*}"
demo_db="charges_demo"
demo_url="$root/$demo_db"
port="${DEMO_PORT:-18080}"
api="http://127.0.0.1:$port"
pids=()

cleanup() {
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap cleanup EXIT INT TERM

say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

say "fresh database $demo_db, migrated by \`charges-api migrate\`"
psql "$server_url" -qX -c "DROP DATABASE IF EXISTS $demo_db WITH (FORCE)" -c "CREATE DATABASE $demo_db"
DATABASE_URL="$demo_url" target/debug/charges-api migrate

say "starting charges-api on $api"
DATABASE_URL="$demo_url" target/debug/charges-api serve --listen "127.0.0.1:$port" >/tmp/charges-demo-api.log 2>&1 &
pids+=($!)
for _ in $(seq 1 50); do curl -s -o /dev/null "$api/charges" && break; sleep 0.1; done

key=$(cat /proc/sys/kernel/random/uuid)
post() {
  curl -s -i -X POST "$api/charges" -H 'Content-Type: application/json' -H "Idempotency-Key: $1" -d "$2" |
    tr -d '\r' | grep -iE '^(HTTP/|location|idempotent-replayed|retry-after)|^\{'
}

say "POST /charges with Idempotency-Key: $key"
post "$key" '{"amountCents":4900,"currency":"EUR"}'
say "the client timed out and retries with the same key: the stored response is replayed"
post "$key" '{ "currency": "eur", "amountCents": 4900 }'
say "the same key with a different amount is refused"
post "$key" '{"amountCents":5000,"currency":"EUR"}'

say "what the database holds"
psql "$demo_url" -qX -c "SELECT id, amount_cents, currency FROM charges" \
  -c "SELECT id, event_type, aggregate_id, published_at FROM outbox" \
  -c "SELECT key, endpoint, status, response_status FROM idempotency_keys"
charges=$(psql "$demo_url" -qtAX -c "SELECT count(*) FROM charges")
[ "$charges" = "1" ] || { echo "expected exactly one charge, found $charges" >&2; exit 1; }
say "one charge, one outbox event, one key: done"
