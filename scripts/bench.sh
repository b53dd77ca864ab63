#!/usr/bin/env bash
# make bench: every figure next to a floor measured in the same run on the same
# machine, reported as a ratio (absolute numbers drift on shared machines).
# Each load run lasts BENCH_SECONDS (10) for the project and for its floor alike.
#   1. new charges:  POST /charges (wrk, fresh keys)    vs pgbench running the same SQL
#   2. replays:      POST /charges with one key (wrk)   vs GET /healthz on the same server
#   3. relay:        100k pending rows, 1 and 2 relays  vs the raw producer, same payloads,
#                    and vs pgbench running the relay's claim + mark SQL alone; then
#                    --ordering per-aggregate (2 relays, 1 and 10 events per charge) next
#                    to unordered and to pgbench running the ordered claim + mark
#   4. commit→ack:   p50/p99 with LISTEN/NOTIFY         vs polling only (trigger disabled)
# Writes target/bench/latest.json and prints a table.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh

db="charges_bench"
url="$(database_url "$db")"
seconds="${BENCH_SECONDS:-10}"
relay_rows="${BENCH_RELAY_ROWS:-100000}"
backlog="${BENCH_BACKLOG:-100000}"
latency_events="${BENCH_LATENCY_EVENTS:-300}"
port="${BENCH_PORT:-18090}"
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
log() { printf '%s bench: %s\n' "$(date +%T)" "$*" >&2; }
field() { sed -n "s/.*$1=\([^ ]*\).*/\1/p" | head -n 1; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "n/a" }'; }

fresh_database() {
  recreate_database "$db"
  DATABASE_URL="$url" "$bin/charges-api" migrate >/dev/null 2>&1
}
# json NAME KEY=VALUE...: one result object; values that parse as JSON (numbers,
# arrays) stay JSON, anything else is a string.
json() {
  local args=(--arg name "$1") pair; shift
  for pair in "$@"; do
    if jq -e . >/dev/null 2>&1 <<<"${pair#*=}"; then
      args+=(--argjson "${pair%%=*}" "${pair#*=}")
    else
      args+=(--arg "${pair%%=*}" "${pair#*=}")
    fi
  done
  jq -nc "${args[@]}" '$ARGS.named'
}
# drained WITHIN: waits until no outbox row is pending, at most WITHIN seconds.
drained() { wait_until "$1" "the relay to publish every outbox row" sql_is "$url" 0 "SELECT count(*) FROM outbox WHERE published_at IS NULL"; }
# The tables as a running system has them: BENCH_BACKLOG rows already there, statistics
# current. Emptied tables are not neutral: with statistics that say "empty", Postgres
# may cache generic plans that scan sequentially (the outbox foreign-key check on
# charges, the key lookups), and every round then slows down as its own rows pile up.
steady_tables() {
  psql_db -c "
    TRUNCATE refunds, outbox, charges, idempotency_keys;
    INSERT INTO charges (id, amount_cents, currency, created_at)
      SELECT md5('steady-c' || g)::uuid, 4900, 'EUR', now() - interval '1 hour'
        FROM generate_series(1, $backlog) g;
    INSERT INTO outbox (id, aggregate_id, event_type, payload, created_at, published_at)
      SELECT md5('steady-o' || g)::uuid, md5('steady-c' || g)::uuid, 'ChargeCreated', '{}',
             now() - interval '1 hour', now() - interval '1 hour'
        FROM generate_series(1, $backlog) g;
    INSERT INTO idempotency_keys (key, endpoint, request_hash, status, response_status,
                                  response_headers, response_body, created_at, expires_at)
      SELECT md5('steady-k' || g)::uuid::text, '/charges', 'h', 'COMPLETED', 201, '[]', '{}',
             now() - interval '1 hour', now() + interval '23 hours'
        FROM generate_series(1, $backlog) g;" -c "VACUUM ANALYZE" >/dev/null
}
empty_tables() {
  psql_db -c "TRUNCATE refunds, outbox, charges, idempotency_keys" -c "VACUUM ANALYZE" >/dev/null
}

start_api() {
  RUST_LOG=warn DATABASE_URL="$url" "$bin/charges-api" serve --listen "127.0.0.1:$port" \
    --db-pool-size "${BENCH_POOL:-32}" >"$out_dir/api.log" 2>&1 &
  api_pid=$!
  pids+=("$api_pid")
  wait_until 30 "the API to answer /readyz (log: $out_dir/api.log)" http_ok "http://127.0.0.1:$port/readyz"
}

run_wrk() { # clients script [env...]
  local clients=$1 script=$2; shift 2
  env "$@" wrk -t 2 -c "$clients" -d "${seconds}s" -s "$script" \
    "http://127.0.0.1:$port${WRK_PATH:-/charges}" | grep '^BENCH'
}

run_pgbench() { # clients → "tps p50 p99"
  local clients=$1 logdir
  logdir=$(mktemp -d)
  (cd "$logdir" && pgbench "$url" -n -M prepared -c "$clients" -j 2 -T "$seconds" \
    -f "$OLDPWD/$out_dir/charge.pgbench" -l --log-prefix=tx >"$logdir/summary.txt" 2>&1)
  local tps
  tps=$(sed -n 's/^tps = \([0-9.]*\).*/\1/p' "$logdir/summary.txt")
  # Field 3 of pgbench's per-transaction log is the latency in microseconds.
  cat "$logdir"/tx.* | awk '{print $3}' | sort -n | awk -v tps="$tps" '
    { v[NR] = $1 } END { printf "%s %.3f %.3f\n", tps, v[int(NR * 0.50)] / 1000, v[int(NR * 0.99)] / 1000 }'
  rm -rf "$logdir"
}

log "building release binaries"
cargo build --release --bins -q
"$bin/charges-bench" pgbench-script >"$out_dir/charge.pgbench"
fresh_database
start_api
json_rows=()
table_rows=()

# 1. New charges. Disk flush times drift a lot on shared machines, so the project and
# its floor alternate for BENCH_ROUNDS rounds and each side reports its median round.
rounds="${BENCH_ROUNDS:-3}"
median() { sort -n | awk '{ v[NR] = $0 } END { print v[int((NR + 1) / 2)] }'; }
for clients in 8 32; do
  pg_runs=(); api_runs=(); errors=0
  for round in $(seq 1 "$rounds"); do
    steady_tables
    log "new charges, $clients clients, round $round: pgbench"
    pg_runs+=("$(run_pgbench "$clients")")
    steady_tables
    log "new charges, $clients clients, round $round: POST /charges"
    line=$(run_wrk "$clients" scripts/bench/new_charges.lua)
    rps=$(awk -v n="$(field requests <<<"$line")" -v s="$(field seconds <<<"$line")" 'BEGIN { printf "%.1f", n / s }')
    api_runs+=("$rps $(field p50_ms <<<"$line") $(field p99_ms <<<"$line")")
    errors=$(( errors + $(field errors <<<"$line") + $(field non2xx <<<"$line") ))
  done
  pg_tps=$(printf '%s\n' "${pg_runs[@]}" | awk '{print $1}' | median)
  read -r _ pg_p50 pg_p99 < <(printf '%s\n' "${pg_runs[@]}" | awk -v m="$pg_tps" '$1 == m' | head -n 1)
  api_rps=$(printf '%s\n' "${api_runs[@]}" | awk '{print $1}' | median)
  read -r _ api_p50 api_p99 < <(printf '%s\n' "${api_runs[@]}" | awk -v m="$api_rps" '$1 == m' | head -n 1)
  all_pg=$(printf '%s\n' "${pg_runs[@]}" | awk '{printf "%s%.0f", (NR > 1 ? "," : ""), $1}')
  all_api=$(printf '%s\n' "${api_runs[@]}" | awk '{printf "%s%.0f", (NR > 1 ? "," : ""), $1}')
  r=$(ratio "$api_rps" "$pg_tps")
  table_rows+=("new charges c=$clients|$api_rps req/s p50 ${api_p50}ms p99 ${api_p99}ms|pgbench $pg_tps tps p50 ${pg_p50}ms p99 ${pg_p99}ms|$r (target ≥ 0.8)")
  json_rows+=("$(json new_charges clients="$clients" rounds="$rounds" api_rps="$api_rps" api_rps_rounds="[$all_api]" \
    api_p50_ms="$api_p50" api_p99_ms="$api_p99" api_errors="$errors" pgbench_tps="$pg_tps" \
    pgbench_tps_rounds="[$all_pg]" pgbench_p50_ms="$pg_p50" pgbench_p99_ms="$pg_p99" ratio="$r")")
done

# 2. Replays vs the HTTP floor.
empty_tables
key=$(cat /proc/sys/kernel/random/uuid)
curl -s -o /dev/null -X POST "http://127.0.0.1:$port/charges" -H 'Content-Type: application/json' \
  -H "Idempotency-Key: $key" -d '{"amountCents":4900,"currency":"EUR"}'
for clients in 8 32; do
  log "replays, $clients clients"
  line=$(run_wrk "$clients" scripts/bench/fixed_request.lua BENCH_KEY="$key")
  rep_rps=$(awk -v n="$(field requests <<<"$line")" -v s="$(field seconds <<<"$line")" 'BEGIN { printf "%.1f", n / s }')
  rep_p99=$(field p99_ms <<<"$line")
  line=$(WRK_PATH=/healthz run_wrk "$clients" scripts/bench/fixed_request.lua BENCH_KEY=)
  floor_rps=$(awk -v n="$(field requests <<<"$line")" -v s="$(field seconds <<<"$line")" 'BEGIN { printf "%.1f", n / s }')
  r=$(ratio "$rep_rps" "$floor_rps")
  table_rows+=("replays c=$clients|$rep_rps req/s p99 ${rep_p99}ms|GET /healthz $floor_rps req/s|$r (target ≥ 0.5)")
  json_rows+=("$(json replays clients="$clients" replay_rps="$rep_rps" replay_p99_ms="$rep_p99" healthz_rps="$floor_rps" ratio="$r")")
done
kill -TERM "$api_pid"; wait "$api_pid" 2>/dev/null || true

# 3. Relay throughput into the mock cluster.
coproc KAFKA { exec "$bin/kafka-mock" --topic charges.events --partitions 6; }
pids+=("$KAFKA_PID")
read -r line <&"${KAFKA[0]}"
brokers="${line#bootstrap=}"
# fill_outbox [EVENTS_PER_CHARGE]: $relay_rows pending rows, EVENTS_PER_CHARGE (1) per
# charge with sequences 1..n; every charge's first event comes before any second one.
fill_outbox() {
  local per=${1:-1}
  empty_tables
  psql_db -c "
    INSERT INTO charges (id, amount_cents, currency, event_sequence)
      SELECT md5('c' || g)::uuid, 4900, 'EUR', $per FROM generate_series(1, $relay_rows / $per) g;
    INSERT INTO outbox (id, aggregate_id, event_type, sequence, payload, created_at)
      SELECT md5('o' || g || '-' || s)::uuid, md5('c' || g)::uuid,
             CASE s WHEN 1 THEN 'ChargeCreated' ELSE 'ChargeRefunded' END, s,
             json_build_object('eventId', md5('o' || g || '-' || s)::uuid, 'chargeId', md5('c' || g)::uuid,
                               'sequence', s, 'amountCents', 4900, 'currency', 'EUR', 'occurredAt', now())::jsonb,
             now() - interval '1 hour' + ((s - 1) * ($relay_rows / $per) + g) * interval '1 microsecond'
        FROM generate_series(1, $relay_rows / $per) g, generate_series(1, $per) s;
    ANALYZE outbox;" >/dev/null
}
drain_with() { # workers [relay flags...] → seconds
  local workers=$1 started relay_pids=(); shift
  # From launch (start-up included) to the last mark, both on the database's clock, so
  # the polling below does not add to the figure.
  started=$(psql_db -c "SELECT extract(epoch FROM clock_timestamp())")
  for _ in $(seq 1 "$workers"); do
    RUST_LOG=warn "$bin/charges-relay" --database-url "$url" --kafka-brokers "$brokers" \
      --batch-size "$batch" --concurrency "$concurrency" --metrics-listen 127.0.0.1:0 "$@" >>"$out_dir/relay.log" 2>&1 &
    relay_pids+=($!); pids+=($!)
  done
  # Bounded, so that a relay that fails to start stops the bench instead of hanging it.
  drained 600
  psql_db -c "SELECT round((extract(epoch FROM max(published_at)) - $started)::numeric, 3) FROM outbox"
  kill -TERM "${relay_pids[@]}"; wait "${relay_pids[@]}" 2>/dev/null || true
}
sql_floor() { # clients script → rows/s: the relay's claim + mark alone, no Kafka
  local clients=$1 script=$2 started
  started=$(date +%s.%N)
  pgbench "$url" -n -M prepared -c "$clients" -j "$clients" -t $(( (relay_rows / batch + clients) / clients )) \
    -f "$script" >/dev/null 2>&1
  awk -v n="$relay_rows" -v a="$started" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", n / (b - a) }'
}
fill_outbox
log "raw producer, $relay_rows messages"
line=$(DATABASE_URL="$url" "$bin/charges-bench" produce --kafka-brokers "$brokers" --topic charges.events)
raw_eps=$(awk -v n="$(field events <<<"$line")" -v s="$(field seconds <<<"$line")" 'BEGIN { printf "%.1f", n / s }')
batch="${BENCH_BATCH:-500}"               # the relay's default --batch-size
concurrency="${BENCH_CONCURRENCY:-2}"     # and its default --concurrency
"$bin/charges-bench" pgbench-relay-script --batch-size "$batch" >"$out_dir/relay.pgbench"
"$bin/charges-bench" pgbench-relay-script --batch-size "$batch" --ordered >"$out_dir/relay-ordered.pgbench"
# relay_round LABEL WORKERS EVENTS_PER_CHARGE SQL_SCRIPT [relay flags...]: drain time, and
# the same claim + mark SQL run by pgbench with as many clients as the relays have loops.
relay_round() {
  local label=$1 workers=$2 per=$3 script=$4; shift 4
  local sql_clients=$(( workers * concurrency ))
  fill_outbox "$per"
  log "$label: SQL floor (pgbench), $sql_clients client(s)"
  sql_eps=$(sql_floor "$sql_clients" "$script")
  fill_outbox "$per"
  log "$label: $workers relay(s), $relay_rows rows, $per event(s) per charge"
  secs=$(drain_with "$workers" "$@")
  eps=$(awk -v n="$relay_rows" -v s="$secs" 'BEGIN { printf "%.1f", n / s }')
  r=$(ratio "$eps" "$raw_eps")
  r_sql=$(ratio "$eps" "$sql_eps")
}
for workers in 1 2; do
  relay_round "relay unordered" "$workers" 1 "$out_dir/relay.pgbench"
  target=""; [ "$workers" = 2 ] && target=" (target ≥ 0.8)"
  table_rows+=("relay $workers worker(s)|$eps events/s|raw producer $raw_eps events/s|$r$target")
  table_rows+=("  same, vs its SQL|$eps events/s|pgbench claim+mark $sql_eps rows/s|$r_sql")
  json_rows+=("$(json relay_throughput ordering=unordered workers="$workers" rows="$relay_rows" batch_size="$batch" \
    concurrency="$concurrency" events_per_charge=1 events_per_s="$eps" raw_producer_events_per_s="$raw_eps" ratio="$r" \
    sql_floor_rows_per_s="$sql_eps" ratio_to_sql_floor="$r_sql")")
  if [ "$workers" = 2 ]; then unordered_eps=$eps; fi
done
for per in 1 10; do
  relay_round "relay ordered" 2 "$per" "$out_dir/relay-ordered.pgbench" --ordering per-aggregate
  r_unordered=$(ratio "$eps" "$unordered_eps")
  table_rows+=("ordered, $per ev/charge|$eps events/s|unordered (2 workers) $unordered_eps events/s|$r_unordered")
  table_rows+=("  same, vs its SQL|$eps events/s|pgbench ordered claim+mark $sql_eps rows/s|$r_sql")
  json_rows+=("$(json relay_throughput ordering=per-aggregate workers=2 rows="$relay_rows" batch_size="$batch" \
    concurrency="$concurrency" events_per_charge="$per" events_per_s="$eps" raw_producer_events_per_s="$raw_eps" ratio="$r" \
    sql_floor_rows_per_s="$sql_eps" ratio_to_sql_floor="$r_sql" ratio_to_unordered="$r_unordered")")
done

# 4. Commit-to-ack latency: published_at (set right after the ack) - created_at (the
# API transaction's start), with LISTEN/NOTIFY and with polling only.
latency_run() { # label
  empty_tables
  start_api
  local log="$out_dir/relay-latency-$1.log"
  RUST_LOG=warn,charges_relay=info "$bin/charges-relay" --database-url "$url" --kafka-brokers "$brokers" \
    --metrics-listen 127.0.0.1:0 >"$log" 2>&1 &
  local relay=$!; pids+=("$relay")
  wait_until 30 "the relay to start (log: $log)" grep -q "relay started" "$log"
  for _ in $(seq 1 "$latency_events"); do
    curl -s -o /dev/null -X POST "http://127.0.0.1:$port/charges" -H 'Content-Type: application/json' \
      -H "Idempotency-Key: $(cat /proc/sys/kernel/random/uuid)" -d '{"amountCents":4900}'
    sleep 0.02
  done
  drained 60
  kill -TERM "$relay" "$api_pid"; wait "$relay" "$api_pid" 2>/dev/null || true
  psql_db -c "SELECT round(percentile_cont(0.5) WITHIN GROUP (ORDER BY ms)::numeric, 1),
                     round(percentile_cont(0.99) WITHIN GROUP (ORDER BY ms)::numeric, 1)
                FROM (SELECT extract(epoch FROM published_at - created_at) * 1000 AS ms FROM outbox) t" | tr '|' ' '
}
log "commit-to-ack with LISTEN/NOTIFY"
read -r notify_p50 notify_p99 < <(latency_run notify)
psql_db -c "ALTER TABLE outbox DISABLE TRIGGER outbox_notify_pending" >/dev/null
log "commit-to-ack with polling only (1 s)"
read -r poll_p50 poll_p99 < <(latency_run polling)
psql_db -c "ALTER TABLE outbox ENABLE TRIGGER outbox_notify_pending" >/dev/null
table_rows+=("commit→ack NOTIFY|p50 ${notify_p50}ms p99 ${notify_p99}ms|polling p50 ${poll_p50}ms p99 ${poll_p99}ms|p99 target < 50ms")
json_rows+=("$(json commit_to_ack events="$latency_events" notify_p50_ms="$notify_p50" notify_p99_ms="$notify_p99" polling_p50_ms="$poll_p50" polling_p99_ms="$poll_p99")")

machine="$(nproc) cores, $(free -g | awk '/Mem:/ {print $2}') GiB, $(psql "$server_url" -qtAX -c 'SHOW server_version')"
printf '%s\n' "${json_rows[@]}" | jq -s --arg date "$(date -u +%FT%TZ)" --arg machine "$machine" \
  --argjson seconds "$seconds" '{date: $date, machine: $machine, seconds_per_run: $seconds, results: .}' \
  >"$out_dir/latest.json"
printf '\n%-20s | %-40s | %-44s | %s\n' "benchmark" "project" "floor (same run)" "ratio"
for row in "${table_rows[@]}"; do
  IFS='|' read -r a b c d <<<"$row"
  printf '%-20s | %-40s | %-44s | %s\n' "$a" "$b" "$c" "$d"
done
printf '\nmachine: %s; JSON: %s/latest.json\n' "$machine" "$out_dir"
