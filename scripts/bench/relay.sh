# Stage relay: BENCH_RELAY_ROWS pending rows drained into the mock cluster by 1 and 2
# relays at their defaults, against the raw producer (same payloads, no database) and
# against pgbench running the relay's own claim + mark with as many clients as the
# relays have batch loops (the target's floor), in BENCH_ROUNDS alternating rounds
# (medians); then 2 relays again with Postgres and everything else on cores of their
# own (split_cores), and --ordering per-aggregate.

relay_rows="${BENCH_RELAY_ROWS:-100000}"
batch="${BENCH_BATCH:-500}"             # the relay's default --batch-size
concurrency="${BENCH_CONCURRENCY:-2}"   # and its default --concurrency

# add_pending URL [EVENTS_PER_CHARGE]: relay_rows pending rows (on top of what the
# tables hold; request_id 'bench-pending'), EVENTS_PER_CHARGE (1) per charge with
# sequences 1..n; every charge's first event comes before any second one. Ids are
# UUIDv7 of their created_at, like the API's. The relay never reads charges, so there
# are none.
add_pending() {
  local target=$1 per=${2:-1}
  psql_on "$target" -f scripts/bench/v7.sql -c "
    INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, sequence, data, created_at, request_id)
      SELECT pg_temp.v7(at, 'po' || g || '-' || s), 'charge', pg_temp.v7(at, 'pc' || g),
             CASE s WHEN 1 THEN 'ChargeCreated' ELSE 'ChargeRefunded' END, s,
             json_build_object('eventId', pg_temp.v7(at, 'po' || g || '-' || s), 'chargeId', pg_temp.v7(at, 'pc' || g),
                               'sequence', s, 'amountCents', 4900, 'currency', 'EUR', 'occurredAt', at)::text,
             at, 'bench-pending'
        FROM generate_series(1, $relay_rows / $per) g, generate_series(1, $per) s,
             LATERAL (SELECT now() - interval '1 minute'
                             + ((s - 1) * ($relay_rows / $per) + g) * interval '1 microsecond' AS at) t;" >/dev/null
  settle "$target"
}
# pending_only URL [EVENTS_PER_CHARGE]: empty tables, then the pending rows.
pending_only() {
  psql_on "$1" -c "TRUNCATE refunds, outbox, charges, idempotency_keys" >/dev/null
  add_pending "$@"
}

# drain URL WORKERS [relay flags...] → "TOTAL FIRST": seconds from launch (start-up
# included) to the last mark, and from launch to the first mark (the start-up), both on
# the database's clock, so the polling here does not add to them.
drain() {
  local target=$1 workers=$2 started relay_pids=(); shift 2
  started=$(psql_on "$target" -c "SELECT extract(epoch FROM clock_timestamp())")
  for _ in $(seq 1 "$workers"); do
    RUST_LOG=warn "${launch[@]}" "$bin/charges-relay" --database-url "$target" --kafka-brokers "$brokers" \
      --batch-size "$batch" --concurrency "$concurrency" --metrics-listen 127.0.0.1:0 "$@" \
      >>"$out_dir/relay.log" 2>&1 &
    relay_pids+=($!); pids+=($!)
  done
  drained "$target" 600 || { echo "bench: rows left pending (log: $out_dir/relay.log)" >&2; exit 1; }
  psql_on "$target" -c "SELECT round((extract(epoch FROM max(published_at)) - $started)::numeric, 3) || ' '
                              || round((extract(epoch FROM min(published_at)) - $started)::numeric, 3)
                         FROM outbox WHERE request_id = 'bench-pending'"
  stop_pids "${relay_pids[@]}"
}

# sql_floor URL CLIENTS SCRIPT → rows/s: the relay's claim + mark alone, no Kafka.
sql_floor() {
  local target=$1 clients=$2 script=$3 started
  started=$(date +%s.%N)
  "${launch[@]}" pgbench "$target" -n -M prepared -c "$clients" -j "$clients" -t $(( (relay_rows / batch + clients) / clients )) \
    -f "$script" >/dev/null 2>&1
  awk -v n="$relay_rows" -v a="$started" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", n / (b - a) }'
}

# relay_round URL WORKERS EVENTS_PER_CHARGE SQL_SCRIPT [relay flags...]: BENCH_ROUNDS
# alternating rounds of the floor and the relays, each on a fresh backlog; sets the
# medians eps (the relays' events/s from launch), startup (seconds from launch to the
# first mark), steady_eps (events/s after it) and sql_eps (pgbench's rows/s with one
# client per batch loop), and the rounds' figures in eps_rounds and sql_rounds.
relay_round() {
  local target=$1 workers=$2 per=$3 script=$4 round secs first all=() firsts=() sqls=(); shift 4
  for round in $(seq 1 "$rounds"); do
    pending_only "$target" "$per"
    log "relay, round $round/$rounds: SQL floor (pgbench), $(( workers * concurrency )) client(s), $per event(s) per charge"
    sqls+=("$(sql_floor "$target" $(( workers * concurrency )) "$script")")
    pending_only "$target" "$per"
    log "relay, round $round/$rounds: $workers relay(s), $relay_rows rows, $per event(s) per charge $*"
    read -r secs first < <(drain "$target" "$workers" "$@")
    all+=("$secs"); firsts+=("$first")
  done
  secs=$(printf '%s\n' "${all[@]}" | median)
  startup=$(printf '%s\n' "${firsts[@]}" | median)
  sql_eps=$(printf '%s\n' "${sqls[@]}" | median)
  eps=$(awk -v n="$relay_rows" -v s="$secs" 'BEGIN { printf "%.1f", n / s }')
  steady_eps=$(awk -v n="$relay_rows" -v s="$secs" -v f="$startup" 'BEGIN { printf "%.1f", n / (s - f) }')
  eps_rounds="[$(printf '%s\n' "${all[@]}" | awk -v n="$relay_rows" '{ printf "%s%.1f", (NR > 1 ? "," : ""), n / $1 }')]"
  sql_rounds="[$(paste -sd, <<<"$(printf '%s\n' "${sqls[@]}")")]"
}

# record_relay_round KEY=VALUE...: the figures relay_round set, as one relay_throughput
# result, with what tells the rounds apart.
record_relay_round() {
  record relay_throughput "$@" rows="$relay_rows" batch_size="$batch" concurrency="$concurrency" \
    events_per_s="$eps" sql_floor_rows_per_s="$sql_eps" ratio_to_sql_floor="$(ratio "$eps" "$sql_eps")" \
    rounds="$rounds" events_per_s_rounds="$eps_rounds" sql_floor_rows_per_s_rounds="$sql_rounds"
}

# relay_split_cores URL: the 2-relay rounds with Postgres on half of the cores and the
# relays, the broker and pgbench on the other half. On two shared cores the relays'
# CPU is CPU Postgres lacks, and the floor (pgbench) takes far less of it; with the
# cores split, Postgres has the same under both, as in a deployment where the relays
# and the broker run on nodes of their own. Not the target's figure: what stands in
# its way.
relay_split_cores() {
  local target=$1 r_sql
  if ! split_cores; then
    log "relay: Postgres is not on this machine or cannot be pinned: no split-cores rounds"
    return 0
  fi
  relay_round "$target" 2 1 "$out_dir/relay.pgbench"
  restore_cores
  r_sql=$(ratio "$eps" "$sql_eps")
  row "  same, Postgres on cores $postgres_cores, the rest on $client_cores|$eps events/s|pgbench claim+mark $sql_eps rows/s|$r_sql"
  record_relay_round ordering=unordered workers=2 events_per_charge=1 cores=split \
    postgres_cores="$postgres_cores" client_cores="$client_cores" startup_seconds="$startup" \
    events_per_s_after_startup="$steady_eps"
}

stage_relay() {
  local target raw_eps workers per r r_sql unordered_eps=""
  target=$(new_database charges_bench)
  [ -n "${brokers:-}" ] || start_kafka
  "$bin/charges-bench" pgbench-relay-script --batch-size "$batch" >"$out_dir/relay.pgbench"
  "$bin/charges-bench" pgbench-relay-script --batch-size "$batch" --ordered >"$out_dir/relay-ordered.pgbench"
  pending_only "$target"
  log "relay: raw producer, $relay_rows messages"
  read -r raw_eps < <(DATABASE_URL="$target" "$bin/charges-bench" produce --kafka-brokers "$brokers" \
    --topic charges.events | awk '{ split($1, e, "="); split($2, s, "="); printf "%.1f\n", e[2] / s[2] }')
  section "relay vs its own SQL (pgbench claim + mark; target ≥ 0.8 with 2 relays)"
  for workers in 1 2; do
    relay_round "$target" "$workers" 1 "$out_dir/relay.pgbench"
    r=$(ratio "$eps" "$raw_eps"); r_sql=$(ratio "$eps" "$sql_eps")
    local mark=""; [ "$workers" = 2 ] && mark=" $(verdict "$r_sql" 0.8)"
    row "relay, $workers worker(s)|$eps events/s|pgbench claim+mark $sql_eps rows/s|$r_sql$mark"
    row "  same, vs the raw producer|$eps events/s|raw producer $raw_eps events/s|$r"
    row "  same, after start-up ($startup s)|$steady_eps events/s|pgbench claim+mark $sql_eps rows/s|$(ratio "$steady_eps" "$sql_eps")"
    record_relay_round ordering=unordered workers="$workers" events_per_charge=1 \
      raw_producer_events_per_s="$raw_eps" ratio_to_raw_producer="$r" startup_seconds="$startup" \
      events_per_s_after_startup="$steady_eps" target="$([ "$workers" = 2 ] && echo 0.8 || echo null)"
    [ "$workers" = 2 ] && unordered_eps=$eps
  done
  relay_split_cores "$target"
  for per in 1 10; do
    relay_round "$target" 2 "$per" "$out_dir/relay-ordered.pgbench" --ordering per-aggregate
    r=$(ratio "$eps" "$unordered_eps"); r_sql=$(ratio "$eps" "$sql_eps")
    row "ordered, $per ev/charge, 2 workers|$eps events/s|unordered $unordered_eps events/s|$r"
    row "  same, vs its SQL|$eps events/s|pgbench ordered claim+mark $sql_eps rows/s|$r_sql"
    record_relay_round ordering=per-aggregate workers=2 events_per_charge="$per" \
      raw_producer_events_per_s="$raw_eps" ratio_to_unordered="$r"
  done
}
