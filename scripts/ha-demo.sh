#!/usr/bin/env bash
# make ha-demo: the binaries under a real failover manager. etcd and two Patroni nodes
# (synchronous_mode: true) on local ports, the API and two relays (--wait-for-standbys
# sync) given one multi-host URL, kafka-mock, and clients charging with retries on 503.
# The leader crashes (its Patroni, postmaster and backends killed at once); Patroni
# promotes the synchronous standby; the crashed node's Patroni, started again, rewinds
# it and rejoins as the new standby. Then the checks of tests/tests/patroni.rs: every
# charge answered 201 is on the new leader, the topic holds exactly the new leader's
# events. Everything started here is stopped on exit and Ctrl-C; logs stay in
# /tmp/charges-ha-demo.*.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh

patroni=/opt/charges-tools/patroni/bin/patroni
patronictl=/opt/charges-tools/patroni/bin/patronictl
bin="${CARGO_TARGET_DIR:-target}/debug"
base="${HA_DEMO_PORT:-18100}"   # API base, relays +1 +2, Postgres +11 +12, Patroni +21 +22, etcd +31 +32
api="http://127.0.0.1:$base"
clients=6 charges_per_client=40
logs="$(mktemp -d /tmp/charges-ha-demo.XXXXXX)"
work="$(mktemp -d /tmp/charges-ha-demo-data.XXXXXX)"
declare -A pids=()

say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
note() { printf '   %s\n' "$*"; }
fail() { printf '\033[31mha-demo failed: %s\033[0m\n   logs: %s\n' "$*" "$logs" >&2; exit 1; }
wait_for() { # wait_for DESCRIPTION SECONDS COMMAND...
  local what="$1" limit="$2"; shift 2
  ( wait_until "$limit" "$what" "$@" ) 2>/dev/null || fail "timed out waiting for $what"
}
start() { # start NAME COMMAND...: background process, logs in $logs/NAME.log
  local name="$1"; shift
  NO_COLOR=1 "$@" >>"$logs/$name.log" 2>&1 &
  pids[$name]=$!
}
# Patroni runs as postgres when this runs as root (Postgres refuses root). setpriv execs
# (runuser would fork), so a background job's $! is Patroni's own pid, the one to kill.
as_server_user=()
[ "$(id -u)" -eq 0 ] && as_server_user=(setpriv --reuid=postgres --regid=postgres --init-groups)

cleanup() {
  trap - EXIT INT TERM
  for name in "${!pids[@]}"; do kill -KILL "${pids[$name]}" 2>/dev/null || true; done
  wait 2>/dev/null || true
  for n in 1 2; do
    [ -d "$work/node$n/data" ] && "${as_server_user[@]}" "$pg_bindir/pg_ctl" stop -m immediate -D "$work/node$n/data" >/dev/null 2>&1 || true
  done
  rm -rf "$work"
}
trap cleanup EXIT
trap 'echo; echo "interrupted"; exit 130' INT TERM

for b in charges-api charges-relay kafka-mock charges-consumer; do
  [ -x "$bin/$b" ] || fail "$bin/$b is missing: \`make ha-demo\` builds it"
done
[ -x "$patroni" ] && command -v etcd >/dev/null || fail "Patroni or etcd is missing: \`make ha-deps\` installs them"
pg_bindir="${PG_BINDIR:-$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1)}"

say "etcd on 127.0.0.1:$((base + 31)), the store Patroni keeps its leader lock in"
start etcd etcd --name etcd --data-dir "$work/etcd" \
  --listen-client-urls "http://127.0.0.1:$((base + 31))" --advertise-client-urls "http://127.0.0.1:$((base + 31))" \
  --listen-peer-urls "http://127.0.0.1:$((base + 32))" --initial-advertise-peer-urls "http://127.0.0.1:$((base + 32))" \
  --initial-cluster "etcd=http://127.0.0.1:$((base + 32))"
wait_for "etcd" 20 http_ok "http://127.0.0.1:$((base + 31))/health"

# node_config N: Patroni's configuration of node N (its keys: tests/src/patroni.rs).
node_config() {
  local n=$1 dir="$work/node$1" pg="127.0.0.1:$((base + 10 + $1))" rest="127.0.0.1:$((base + 20 + $1))"
  cat <<YAML
scope: charges-ha-demo
name: node$n
restapi: {listen: "$rest", connect_address: "$rest"}
etcd3: {hosts: "127.0.0.1:$((base + 31))"}
bootstrap:
  dcs:
    ttl: 20
    loop_wait: 1
    retry_timeout: 5
    synchronous_mode: true
    postgresql: {use_pg_rewind: true}
  initdb: [{encoding: UTF8}, {locale: C}]
postgresql:
  listen: "$pg"
  connect_address: "$pg"
  data_dir: $dir/data
  bin_dir: $pg_bindir
  pgpass: $dir/pgpass
  authentication: {superuser: {username: postgres}, replication: {username: postgres}, rewind: {username: postgres}}
  parameters: {unix_socket_directories: "$dir"}
  pg_hba: ["local all all trust", "host all all 127.0.0.1/32 trust", "host replication all 127.0.0.1/32 trust"]
YAML
}
start_node() { # start_node N: node N's Patroni, its log appended to $logs/nodeN.log
  local n=$1
  "${as_server_user[@]}" env HOME="$work/node$n" "$patroni" "$work/node$n/patroni.yml" >>"$logs/node$n.log" 2>&1 &
  pids[node$n]=$!
}
members() { curl -sf "http://127.0.0.1:$((base + 21))/cluster" || curl -sf "http://127.0.0.1:$((base + 22))/cluster"; }
# has_role NODE ROLE STATE: Patroni's REST API lists NODE with that role and state.
has_role() { members | grep -q "\"name\": \"$1\", \"role\": \"$2\", \"state\": \"$3\""; }
listing() { "$patronictl" -c "$work/node1/patroni.yml" list 2>/dev/null | sed 's/^/   /'; }

say "two Patroni nodes, synchronous_mode: true (Postgres on ports $((base + 11)) and $((base + 12)))"
for n in 1 2; do
  mkdir -p "$work/node$n"
  node_config "$n" >"$work/node$n/patroni.yml"
done
[ "$(id -u)" -eq 0 ] && chown -R postgres:postgres "$work"
start_node 1
wait_for "node1 to bootstrap and lead" 60 has_role node1 leader running
start_node 2
wait_for "node2 to stream as the synchronous standby" 60 has_role node2 sync_standby streaming
listing

url="postgres://postgres@127.0.0.1:$((base + 11)),127.0.0.1:$((base + 12))/charges?target_session_attrs=read-write"
say "the binaries get one URL for both nodes; only the writable one is used"
note "$url"
psql "${url/\/charges\?//postgres?}" -qX -c "CREATE DATABASE charges" >/dev/null
DATABASE_URL="$url" $bin/charges-api migrate >"$logs/migrate.log" 2>&1 || fail "charges-api migrate"
start kafka-mock $bin/kafka-mock --topic charges.events --partitions 3
wait_for "kafka-mock" 10 grep -q '^bootstrap=' "$logs/kafka-mock.log"
brokers="$(sed -n 's/^bootstrap=//p' "$logs/kafka-mock.log" | head -n 1)"
start api $bin/charges-api serve --database-url "$url" --listen "127.0.0.1:$base"
for n in 1 2; do
  start "relay-$n" $bin/charges-relay --database-url "$url" --kafka-brokers "$brokers" --topic charges.events \
    --poll-interval 200ms --publish-timeout 2s --wait-for-standbys sync --metrics-listen "127.0.0.1:$((base + n))"
done
wait_for "charges-api" 15 curl -s -o /dev/null "$api/charges"
for n in 1 2; do wait_for "relay-$n" 15 grep -q "relay started" "$logs/relay-$n.log"; done
note "charges-api on $api, two relays with --wait-for-standbys sync, kafka-mock at $brokers"

# client N: charges_per_client charges, each retried with its key while the answer is 503;
# the keys answered 201 go to $logs/acknowledged-N, every status to $logs/statuses-N.
client() {
  local n=$1 key status
  for _ in $(seq 1 "$charges_per_client"); do
    key=$(cat /proc/sys/kernel/random/uuid)
    for _ in $(seq 1 600); do
      status=$(curl -s -o /dev/null -w '%{http_code}' -X POST "$api/charges" -H 'Content-Type: application/json' \
        -H "Idempotency-Key: $key" -d '{"amountCents":4900,"currency":"EUR"}')
      echo "$status" >>"$logs/statuses-$n"
      [ "$status" = 503 ] || break
      sleep 0.1
    done
    [ "$status" = 201 ] && echo "$key" >>"$logs/acknowledged-$n"
  done
}
say "$clients clients charge, $charges_per_client charges each, retrying 503 with the same key"
declare -a client_pids=()
for n in $(seq 1 "$clients"); do client "$n" & client_pids+=($!); done
wait_for "the load to be under way" 30 sql_is "$url" t "SELECT count(*) >= 40 FROM charges"

say "the leader crashes: node1's Patroni, postmaster and backends, kill -9 at once"
before=$(psql "$url" -qtAX -c 'SELECT count(*) FROM charges')
postmaster=$(head -n 1 "$work/node1/data/postmaster.pid")
kill -KILL "${pids[node1]}" "$postmaster" $(pgrep -P "$postmaster") 2>/dev/null || true
crashed=$SECONDS
{ wait "${pids[node1]}"; } 2>/dev/null || true
unset "pids[node1]"
note "about $before charges committed so far; the clients now get 503 and retry"
wait_for "Patroni to promote node2" 60 has_role node2 leader running
note "node2 is the leader $((SECONDS - crashed)) s after the crash (the leader lock's TTL is 20 s)"
listing

say "node1's Patroni starts again: pg_rewind, then it follows node2"
start_node 1
wait_for "node1 to stream as node2's synchronous standby" 90 has_role node1 sync_standby streaming
note "rejoined $((SECONDS - crashed)) s after the crash"
grep -h "pg_rewind exit code\|servers diverged" "$logs/node1.log" | sed 's/^/   node1: /' || true
listing

for pid in "${client_pids[@]}"; do wait "$pid" || fail "a client failed"; done
cat "$logs"/statuses-* | sort | uniq -c | awk '{printf "   %s × HTTP %s\n", $1, $2}'
grep -vqx '201\|503' "$logs"/statuses-* && fail "an answer other than 201 or 503"

say "the checks: what was acknowledged is on the new leader, the topic matches its outbox"
new_leader="postgres://postgres@127.0.0.1:$((base + 12))/charges"
acknowledged=$(cat "$logs"/acknowledged-* | wc -l)
cat "$logs"/acknowledged-* | psql "$new_leader" -qX -c "CREATE TABLE demo_acknowledged (key text)" \
  -c "\\copy demo_acknowledged FROM STDIN" >/dev/null
lost=$(psql "$new_leader" -qtAX -c "SELECT count(*) FROM demo_acknowledged a
  WHERE NOT EXISTS (SELECT 1 FROM idempotency_keys k JOIN outbox o ON o.aggregate_id = (k.response_body::jsonb ->> 'id')::uuid
                     WHERE k.key = a.key)")
note "$acknowledged charges answered 201; missing on the new leader: $lost"
[ "$lost" = 0 ] || fail "$lost acknowledged charges lost"
wait_for "every outbox row of the new leader published" 60 sql_is "$new_leader" 0 "SELECT count(*) FROM outbox WHERE published_at IS NULL"
for n in 1 2; do kill -TERM "${pids[relay-$n]}"; wait "${pids[relay-$n]}" 2>/dev/null || true; unset "pids[relay-$n]"; done
$bin/charges-consumer tail --kafka-brokers "$brokers" --topic charges.events --from-beginning --until-idle 2s \
  >"$logs/topic.tsv" 2>"$logs/tail.log" || fail "charges-consumer tail"
cut -f3 "$logs/topic.tsv" | sort -u >"$logs/published.txt"
psql "$new_leader" -qtAX -c "SELECT id FROM outbox" | sort >"$logs/outbox.txt"
ghosts=$(comm -23 "$logs/published.txt" "$logs/outbox.txt" | wc -l)
unpublished=$(comm -13 "$logs/published.txt" "$logs/outbox.txt" | wc -l)
note "$(wc -l <"$logs/topic.tsv") messages, $(wc -l <"$logs/published.txt") distinct events; outbox rows on the new leader: $(wc -l <"$logs/outbox.txt")"
note "events without their commit on the new leader (ghosts): $ghosts; outbox rows never published: $unpublished"
[ "$ghosts" = 0 ] && [ "$unpublished" = 0 ] || fail "the topic does not match the new leader's outbox"
say "a crash failover under Patroni: nothing acknowledged lost, no ghost event, the binaries never restarted"
