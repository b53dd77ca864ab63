#!/usr/bin/env bash
# make demo: the whole system on this machine, end to end: an idempotent API and a
# transactional outbox, with a relay killed between publish and mark.
#
# A fresh demo database (and a separate one for the consumer) on the local Postgres,
# kafka-mock (librdkafka's in-memory cluster) unless KAFKA_BROKERS is set, charges-api,
# two charges-relay workers and charges-consumer. Then: a charge, its "timeout" retry
# (replayed), a changed payload (422), a burst of 20 identical requests (one charge), a
# refund, and a relay killed between publish and mark: the event is on the topic twice,
# the consumer applies it once. Everything started here is stopped on exit and Ctrl-C.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh

demo_db="charges_demo"
ledger_db="charges_demo_ledger"
demo_url="$(database_url "$demo_db")"
ledger_url="$(database_url "$ledger_db")"
port="${DEMO_PORT:-18080}"
api="http://127.0.0.1:$port"
bin="${CARGO_TARGET_DIR:-target}/debug"
logs="$(mktemp -d /tmp/charges-demo.XXXXXX)"
declare -A pids=()

cleanup() {
  trap - EXIT INT TERM
  for name in "${!pids[@]}"; do kill -TERM "${pids[$name]}" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap cleanup EXIT
trap 'echo; echo "interrupted"; exit 130' INT TERM

say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
note() { printf '   %s\n' "$*"; }
fail() { printf '\033[31mdemo failed: %s\033[0m\n   logs: %s\n' "$*" "$logs" >&2; exit 1; }
sql() { psql "$demo_url" -qtAX -c "$1"; }
ledger_sql() { psql "$ledger_url" -qtAX -c "$1"; }
# wait_for DESCRIPTION SECONDS COMMAND...: polls until COMMAND succeeds, or fails the demo.
wait_for() {
  local what="$1" limit="$2"; shift 2
  ( wait_until "$limit" "$what" "$@" ) 2>/dev/null || fail "timed out waiting for $what"
}
start() { # start NAME COMMAND...: background process, logs in $logs/NAME.log
  local name="$1"; shift
  NO_COLOR=1 "$@" >"$logs/$name.log" 2>&1 &
  pids[$name]=$!
}
logged() { grep -q -- "$2" "$logs/$1.log"; }

for b in charges-api charges-relay kafka-mock charges-consumer; do
  [ -x "$bin/$b" ] || fail "$bin/$b is missing: \`make demo\` builds it"
done

say "fresh databases: $demo_db (API + outbox) and $ledger_db (the consumer's own)"
for db in "$demo_db" "$ledger_db"; do recreate_database "$db"; done
DATABASE_URL="$demo_url" $bin/charges-api migrate >"$logs/migrate.log" 2>&1 || fail "charges-api migrate"
note "migrated by \`charges-api migrate\`; the consumer migrates its own schema (--migrate)"

if [ -n "${KAFKA_BROKERS:-}" ]; then
  brokers="$KAFKA_BROKERS"
  # A topic of this run's own, so old messages do not mix in (needs auto-created topics).
  topic="charges.demo.$(date +%s)"
  say "Kafka at $brokers, topic $topic"
else
  topic="charges.events"
  start kafka-mock $bin/kafka-mock --topic "$topic" --partitions 3
  wait_for "kafka-mock" 10 grep -q '^bootstrap=' "$logs/kafka-mock.log"
  brokers="$(sed -n 's/^bootstrap=//p' "$logs/kafka-mock.log" | head -n 1)"
  say "kafka-mock (librdkafka's in-memory cluster) at $brokers, topic $topic, 3 partitions"
fi

say "starting charges-api, two charges-relay workers and charges-consumer"
start api $bin/charges-api serve --database-url "$demo_url" --listen "127.0.0.1:$port"
# Two relays on one machine need two metrics ports.
relay_flags=(--database-url "$demo_url" --kafka-brokers "$brokers" --topic "$topic"
  --poll-interval 200ms --publish-timeout 2s)
for n in 1 2; do
  start "relay-$n" $bin/charges-relay "${relay_flags[@]}" --metrics-listen "127.0.0.1:$((port + 10 + n))"
done
start consumer $bin/charges-consumer --database-url "$ledger_url" --kafka-brokers "$brokers" \
  --topic "$topic" --group-id charges-ledger-demo --migrate
wait_for "charges-api" 15 curl -s -o /dev/null "$api/charges"
for name in relay-1 relay-2; do wait_for "$name" 15 logged "$name" "relay started"; done
wait_for "charges-consumer" 15 logged consumer "consumer started"
say "running: charges-api on $api, relay-1 (pid ${pids[relay-1]}), relay-2 (pid ${pids[relay-2]}), charges-consumer"
note "logs in $logs"

uuid() { cat /proc/sys/kernel/random/uuid; }
# request METHOD PATH KEY BODY: prints the interesting headers and the body.
request() {
  curl -s -i -X "$1" "$api$2" -H 'Content-Type: application/json' -H "Idempotency-Key: $3" -d "$4" |
    tr -d '\r' | grep -iE '^(HTTP/|location|idempotent-replayed|retry-after)|^\{' | sed 's/^/   /'
}
json_id() { grep -o '"id":"[^"]*"' | head -n 1 | cut -d'"' -f4; }

key=$(uuid)
say "1. POST /charges, Idempotency-Key: $key"
first=$(request POST /charges "$key" '{"amountCents":4900,"currency":"EUR"}')
echo "$first"
charge=$(echo "$first" | json_id)
[ -n "$charge" ] || fail "no charge id in the first answer"

say "2. the client timed out and retries with the same key (white space and case differ)"
retry=$(request POST /charges "$key" '{ "currency": "eur", "amountCents": 4900 }')
echo "$retry"
[ "$(echo "$retry" | json_id)" = "$charge" ] || fail "the retry did not replay charge $charge"
echo "$retry" | grep -qi '^ *idempotent-replayed: true' || fail "no Idempotent-Replayed header"
note "same id $charge, replayed byte for byte: no second charge"

say "3. the same key with a different amount is refused"
request POST /charges "$key" '{"amountCents":5000,"currency":"EUR"}' | tee "$logs/reused.txt"
grep -q '^ *HTTP/[0-9.]* 422' "$logs/reused.txt" || fail "expected 422"

burst_key=$(uuid)
say "4. 20 identical requests at once with one new key"
before=$(sql "SELECT count(*) FROM charges")
for i in $(seq 1 20); do
  curl -s -o /dev/null -w '%{http_code}\n' -X POST "$api/charges" -H 'Content-Type: application/json' \
    -H "Idempotency-Key: $burst_key" -d '{"amountCents":1500,"currency":"EUR"}' >"$logs/burst-$i.txt" &
done

for i in $(seq 1 20); do
  wait_for "burst request $i" 15 test -s "$logs/burst-$i.txt"
done
cat "$logs"/burst-*.txt | sort | uniq -c | awk '{printf "   %s × HTTP %s\n", $1, $2}'
note "(201 = the winner or a replay of it; 409 = still in flight, Retry-After: 1)"
after=$(sql "SELECT count(*) FROM charges")
[ $((after - before)) -eq 1 ] || fail "the burst made $((after - before)) charges"
note "charges before: $before, after: $after — one charge for the burst"

say "5. refund 900 of charge $charge"
request POST "/charges/$charge/refunds" "$(uuid)" '{"amountCents":900}'

say "the relays publish, the consumer applies"
wait_for "every outbox row published" 20 sql_is "$demo_url" 0 "SELECT count(*) FROM outbox WHERE published_at IS NULL"
wait_for "the consumer to apply 3 events" 20 sql_is "$ledger_url" 3 "SELECT count(*) FROM processed_events"
note "3 events published and applied"

say "6. a relay dies between the broker's ack and its mark"
note "a trigger makes the relay's mark UPDATE on outbox sleep (the test's trick)"
psql "$demo_url" -qX >/dev/null <<'SQL'
CREATE FUNCTION demo_hang() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN PERFORM pg_sleep(3600); RETURN NEW; END $$;
CREATE TRIGGER demo_hang BEFORE UPDATE ON outbox FOR EACH ROW EXECUTE FUNCTION demo_hang();
SQL
victim_charge=$(request POST /charges "$(uuid)" '{"amountCents":2500,"currency":"EUR"}' | json_id)
event=$(sql "SELECT id FROM outbox WHERE aggregate_id = '$victim_charge'")
note "charge $victim_charge → outbox event $event"
wait_for "the consumer to see event $event" 20 \
  sql_is "$ledger_url" 1 "SELECT count(*) FROM processed_events WHERE event_id = '$event'"
note "the broker acknowledged it and the consumer applied it; the relay's mark hangs"
# Which relay holds it: the Postgres backend running the hanging UPDATE knows its client's port.
# Not this query's own session: its text matches the pattern too.
client_port=$(sql "SELECT client_port FROM pg_stat_activity
  WHERE datname = '$demo_db' AND state = 'active' AND query ILIKE '%UPDATE outbox%'
    AND pid <> pg_backend_pid() LIMIT 1")
[ -n "$client_port" ] || fail "no relay is hanging in its mark"
victim_pid=$(ss -Htnp "( sport = :$client_port )" | grep -o 'pid=[0-9]*' | head -n 1 | cut -d= -f2 || true)
victim=""
for name in relay-1 relay-2; do [ "${pids[$name]}" = "$victim_pid" ] && victim=$name; done
[ -n "$victim" ] || fail "cannot tell which relay holds the row (pid '$victim_pid')"
kill -KILL "$victim_pid"
wait "$victim_pid" 2>/dev/null || true
unset "pids[$victim]"
note "kill -9 $victim (pid $victim_pid): acknowledged, never marked"
note "its transaction ends at the relay's statement_timeout; then the row is free again"
psql "$demo_url" -qX -c "DROP TRIGGER demo_hang ON outbox" >/dev/null
wait_for "the surviving relay to mark the event" 30 \
  sql_is "$demo_url" t "SELECT published_at IS NOT NULL FROM outbox WHERE id = '$event'"
wait_for "the consumer to skip the second copy" 20 grep -q "duplicate event skipped id=$event" "$logs/consumer.log"
note "the surviving relay published it again and marked it; the consumer skipped the copy:"
grep "duplicate event skipped id=$event" "$logs/consumer.log" | sed 's/^/   consumer: /' | head -n 1

say "the topic, read from the beginning (charges-consumer tail)"
$bin/charges-consumer tail --kafka-brokers "$brokers" --topic "$topic" --from-beginning --until-idle 2s \
  >"$logs/topic.tsv" 2>"$logs/tail.log" || fail "charges-consumer tail"
messages=$(wc -l <"$logs/topic.tsv")
distinct=$(cut -f3 "$logs/topic.tsv" | sort -u | wc -l)
copies=$(cut -f3 "$logs/topic.tsv" | grep -c "^$event$" || true)
awk -F'\t' '{printf "   partition %s offset %-3s %s %s\n", $1, $2, $4, $3}' "$logs/topic.tsv"
note "$messages messages, $distinct distinct event ids; event $event is there $copies times"
[ "$copies" -ge 2 ] || fail "expected the killed relay's event twice on the topic"

say "what the databases hold"
psql "$demo_url" -qX -c "SELECT (SELECT count(*) FROM charges) AS charges,
         (SELECT count(*) FROM refunds) AS refunds,
         (SELECT count(*) FROM outbox) AS outbox_rows,
         (SELECT count(*) FROM outbox WHERE published_at IS NOT NULL) AS published,
         (SELECT count(*) FROM idempotency_keys) AS idempotency_keys"
psql "$ledger_url" -qX -c "SELECT count(*) AS processed_events FROM processed_events" \
  -c "SELECT currency, charged_cents, refunded_cents, events FROM ledger"
charges=$(sql "SELECT count(*) FROM charges")
ledger=$(ledger_sql "SELECT charged_cents || ' ' || refunded_cents || ' ' || events FROM ledger WHERE currency = 'EUR'")
[ "$charges" = 3 ] || fail "expected 3 charges, found $charges"
[ "$ledger" = "8900 900 4" ] || fail "expected ledger EUR 8900 900 4, found '$ledger'"
say "3 charges, 4 events, $messages messages on the topic, 4 applied: at least once on the wire, once in the ledger"
