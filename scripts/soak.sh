#!/usr/bin/env bash
# make soak: SOAK_SECONDS (default 600) of mixed traffic (new, replay, conflict) with
# two relays draining into the mock cluster and the retention jobs on (short TTL (1 min) and
# retention so they really work). Samples table sizes and both binaries' RSS every
# 30 s, then asserts: no 5xx and no socket error, the outbox and key tables stay
# bounded in rows and on disk, memory stays flat, nothing is left pending.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh

db="charges_soak"
url="$(database_url "$db")"
seconds="${SOAK_SECONDS:-600}"
port="${SOAK_PORT:-18091}"
out_dir="target/bench"
bin="target/release"
mkdir -p "$out_dir"
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap cleanup EXIT INT TERM
psql_db() { psql "$url" -qtAX "$@"; }
rss_kb() { ps -o rss= -p "$1" | tr -d ' '; }

cargo build --release --bins -q
recreate_database "$db"
DATABASE_URL="$url" "$bin/charges-api" migrate >/dev/null 2>&1

coproc KAFKA { exec "$bin/kafka-mock" --topic charges.events --partitions 6; }
pids+=("$KAFKA_PID")
read -r line <&"${KAFKA[0]}"
brokers="${line#bootstrap=}"

RUST_LOG=warn DATABASE_URL="$url" "$bin/charges-api" serve --listen "127.0.0.1:$port" \
  --idempotency-ttl 1m >"$out_dir/soak-api.log" 2>&1 &
api=$!; pids+=("$api")
relays=()
for i in 1 2; do
  RUST_LOG=warn "$bin/charges-relay" --database-url "$url" --kafka-brokers "$brokers" \
    --published-retention 20s --cleanup-interval 5s --metrics-listen 127.0.0.1:0 \
    >"$out_dir/soak-relay-$i.log" 2>&1 &
  relays+=($!); pids+=($!)
done
wait_until 30 "the API to answer /readyz (log: $out_dir/soak-api.log)" http_ok "http://127.0.0.1:$port/readyz"

# outbox and idempotency_keys are queue tables: every row is inserted, updated and
# deleted within a minute here, and only vacuum makes their space reusable. Where the
# server runs without autovacuum (CI machines may), stand in for it, or the soak
# would measure bloat instead of the system.
if [ "$(psql_db -c "SHOW autovacuum")" = off ]; then
  echo "autovacuum is off on this server: VACUUM (ANALYZE) every 30 s stands in for it"
  ( while sleep 30; do
      psql_db -c "VACUUM (ANALYZE) outbox, idempotency_keys" -c "ANALYZE charges" >/dev/null 2>&1 || true
    done ) &
  pids+=($!)
fi

wrk -t 2 -c 16 -d "${seconds}s" -s scripts/bench/mixed.lua "http://127.0.0.1:$port/charges" \
  >"$out_dir/soak-wrk.txt" 2>&1 &
load=$!
samples="$out_dir/soak-samples.tsv"
printf 'second\toutbox\tkeys\tpending\tapi_rss_kb\trelay_rss_kb\tqueue_tables_kb\n' >"$samples"
elapsed=0
while kill -0 "$load" 2>/dev/null; do
  # queue_tables_kb: outbox and idempotency_keys on disk, indexes included (bloat).
  read -r outbox keys pending disk < <(psql_db -F ' ' -c "SELECT (SELECT count(*) FROM outbox), (SELECT count(*) FROM idempotency_keys), (SELECT count(*) FROM outbox WHERE published_at IS NULL), (pg_total_relation_size('outbox') + pg_total_relation_size('idempotency_keys')) / 1024")
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$elapsed" "$outbox" "$keys" "$pending" "$(rss_kb "$api")" "$(rss_kb "${relays[0]}")" "$disk" | tee -a "$samples"
  sleep 30; elapsed=$((elapsed + 30))
done
wait "$load" || true
result=$(grep '^BENCH' "$out_dir/soak-wrk.txt")
echo "$result"
# The verdict below reports whatever is still pending; waiting longer would only hide it.
( wait_until 30 "the relays to drain the outbox" sql_is "$url" 0 "SELECT count(*) FROM outbox WHERE published_at IS NULL" ) || true

fail=0
server_errors=$(sed -n 's/.*server_errors=\([0-9]*\).*/\1/p' <<<"$result")
socket_errors=$(sed -n 's/.*socket_errors=\([0-9]*\).*/\1/p' <<<"$result")
[ "$server_errors" = 0 ] || { echo "FAIL: $server_errors 5xx answers"; fail=1; }
[ "$socket_errors" = 0 ] || { echo "FAIL: $socket_errors socket errors"; fail=1; }
pending=$(psql_db -c "SELECT count(*) FROM outbox WHERE published_at IS NULL AND dead_at IS NULL")
[ "$pending" = 0 ] || { echo "FAIL: $pending rows still pending"; fail=1; }
dead=$(psql_db -c "SELECT count(*) FROM outbox WHERE dead_at IS NOT NULL")
[ "$dead" = 0 ] || { echo "FAIL: $dead dead rows"; fail=1; }
# Bounded: the second half's largest sample is no more than 1.5 × the first half's
# (after the first minute, when retention starts biting); flat: RSS and the queue
# tables' size on disk likewise.
awk -F'\t' -v fail="$fail" 'NR > 1 && $1 >= 60 { rows[++n] = $0 }
  END {
    if (n < 4) { print "too few samples for a verdict"; exit fail }
    split("", first); split("", second)
    for (i = 1; i <= n; i++) { split(rows[i], f, "\t"); half = (i <= n / 2) ? 1 : 2
      for (c = 2; c <= 7; c++) { if (c == 4) continue; if (half == 1 && f[c] > first[c]) first[c] = f[c]; if (half == 2 && f[c] > second[c]) second[c] = f[c] } }
    split("second outbox keys pending api_rss_kb relay_rss_kb queue_tables_kb", name, " ")
    for (c = 2; c <= 7; c++) { if (c == 4) continue
      verdict = (second[c] <= first[c] * 1.5) ? "bounded" : "GROWING"
      printf "%-14s first half max %10d, second half max %10d: %s\n", name[c], first[c], second[c], verdict
      if (verdict != "bounded") fail = 1 }
    exit fail }' "$samples" || fail=1
[ "$fail" = 0 ] && echo "soak: PASS ($seconds s)" || { echo "soak: FAIL"; exit 1; }
