#!/usr/bin/env bash
# make compose-demo: deploy/docker-compose.yml for real. Brings the whole system up in
# containers (Postgres, broker, topic, migrate, PgBouncer, API, relay, consumer), posts a
# charge, shows that the API reached Postgres only through PgBouncer and that the event
# was applied once by the consumer, and tears everything down, also on failure or Ctrl-C. Run through `scripts/containers.sh with-socket` (make does), which
# provides the engine (DOCKER_HOST for podman). Images: deploy/images.env.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh

containers() { bash scripts/containers.sh "$@"; }
kind="$(containers kind)"
export POSTGRES_IMAGE BROKER_IMAGE PGBOUNCER_IMAGE CHARGES_IMAGE
POSTGRES_IMAGE="$(containers name POSTGRES)"
BROKER_IMAGE="$(containers name BROKER)"
PGBOUNCER_IMAGE="$(containers name PGBOUNCER)"
CHARGES_IMAGE="$(containers name CHARGES)"
files=(-f deploy/docker-compose.yml)
[ "$kind" = docker ] || files+=(-f deploy/podman/compose.local.yml)

# Ports of the run's own on loopback, so that nothing else on 8080/9091 is in the way.
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
export API_PORT RELAY_METRICS_PORT
API_PORT="$(free_port)"
RELAY_METRICS_PORT="$(free_port)"
project="charges-demo-$$"

compose() {
  if [ "$kind" = docker ] && docker compose version >/dev/null 2>&1; then
    docker compose -p "$project" "${files[@]}" "$@"
  else
    docker-compose -p "$project" "${files[@]}" "$@"
  fi
}
engine() { if [ "$kind" = podman ]; then podman "$@"; else docker "$@"; fi; }

health_driver=""
cleanup() {
  local status=$?
  trap - EXIT INT TERM
  [ -z "$health_driver" ] || kill "$health_driver" 2>/dev/null || true
  if [ "$status" -ne 0 ]; then
    echo "compose-demo failed; the services' last log lines:"
    compose logs --no-color --tail 15 2>&1 | sed 's/^/  /' || true
  fi
  echo "== tearing down"
  local down_started=$SECONDS
  compose down --volumes --remove-orphans --timeout 10 >/dev/null 2>&1 || true
  # Whatever `down` left (a container restarting at that moment), by the project's label.
  engine ps -aq --filter "label=com.docker.compose.project=$project" | xargs -r "$kind" rm -f >/dev/null 2>&1 || true
  engine network ls -q --filter "label=com.docker.compose.project=$project" | xargs -r "$kind" network rm >/dev/null 2>&1 || true
  echo "compose-demo: down in $((SECONDS - down_started)) s, $SECONDS s in all"
  exit "$status"
}
trap cleanup EXIT
trap 'echo; echo "interrupted"; exit 130' INT TERM

if [ "$kind" = podman ]; then
  # podman runs health checks from systemd timers, and these machines have no systemd:
  # run the checks of the containers still starting, once a second, for compose's
  # `condition: service_healthy` to see them.
  ( while sleep 1; do
      for id in $(podman ps -q --filter health=starting 2>/dev/null); do
        podman healthcheck run "$id" >/dev/null 2>&1 || true
      done
    done ) &
  health_driver=$!
fi

echo "== compose up ($kind: $POSTGRES_IMAGE, $BROKER_IMAGE, $PGBOUNCER_IMAGE, $CHARGES_IMAGE)"
compose up --detach --no-build
api="http://127.0.0.1:$API_PORT"
wait_until 60 "the API's /readyz" http_ok "$api/readyz"
wait_until 60 "the relay's /readyz" http_ok "http://127.0.0.1:$RELAY_METRICS_PORT/readyz"
compose ps
echo "compose-demo: up and ready after $SECONDS s"

psql_in() {
  engine exec "$(compose ps -q postgres)" psql -U charges -d charges -qtAX -c "$1"
}

echo "== POST /charges"
key="$(python3 -c 'import uuid; print(uuid.uuid4())')"
response="$(curl -sf "$api/charges" -H 'content-type: application/json' \
  -H "idempotency-key: $key" -d '{"amountCents":4900,"currency":"EUR"}')"
echo "  $response"
charge="$(python3 -c 'import json, sys; print(json.loads(sys.argv[1])["id"])' "$response")"
event="$(psql_in "SELECT id FROM outbox WHERE aggregate_id = '$charge'")"
echo "  charge $charge, event $event"

# The pooler is in the path: Postgres has sessions from PgBouncer and none from the API.
address() { engine inspect --format '{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}' "$(compose ps -q "$1")"; }
sessions_from() { psql_in "SELECT count(*) FROM pg_stat_activity WHERE client_addr = '$(address "$1")'"; }
echo "== sessions on Postgres: $(sessions_from pgbouncer) from PgBouncer, $(sessions_from api) from the API"
[ "$(sessions_from pgbouncer)" -gt 0 ] && [ "$(sessions_from api)" = 0 ] \
  || { echo "the API does not reach Postgres through PgBouncer" >&2; exit 1; }

sql_in_is() { [ "$(psql_in "$2")" = "$1" ]; }
applied() { compose logs --no-color consumer 2>&1 | grep "event applied" | grep -c "id=$event"; }
wait_until 60 "the consumer to apply event $event" sql_in_is 1 \
  "SELECT count(*) FROM processed_events WHERE event_id = '$event'"
echo "== the consumer applied it once"
compose logs --no-color consumer 2>&1 | grep "event applied" | grep "id=$event" | sed 's/^/  /'
echo "  inbox rows for the event: $(psql_in "SELECT count(*) FROM processed_events WHERE event_id = '$event'")"
echo "  ledger: $(psql_in "SELECT currency || ' charged ' || charged_cents || ', events ' || events FROM ledger")"
[ "$(applied)" = 1 ] || { echo "event $event applied $(applied) times" >&2; exit 1; }
[ "$(psql_in "SELECT events FROM ledger WHERE currency = 'EUR'")" = 1 ] \
  || { echo "the ledger counts another number of events than 1" >&2; exit 1; }
[ "$(psql_in "SELECT count(*) FROM outbox WHERE published_at IS NOT NULL")" = 1 ] \
  || { echo "the outbox row is not marked published" >&2; exit 1; }
echo "compose-demo: ok"
