# Stage scale: the same work on tables of BENCH_SCALE_BASE rows (10 000, "empty")
# and of 1 and 5 million rows per table (BENCH_SCALE_ROWS; BENCH_SCALE_20M=1 adds 20
# million), in alternating rounds:
#   - new charges (wrk, 8 clients, fresh random keys);
#   - replays of BENCH_REPLAY_KEYS completed keys spread over the whole table, with
#     the API's replay cache off so that each one reads its key's row;
#   - at the largest size, the relays (2, defaults) draining BENCH_RELAY_ROWS new rows
#     with the published rows behind them.
# Rows are what a running system holds: charges, published events and completed keys
# of the last 23 hours (fill.sql), settled; every run starts right after a checkpoint,
# when an insert's first change to a page writes the whole page to the WAL.

# The relay part drains with relay.sh's helpers, also when the relay stage is not run.
source scripts/bench/relay.sh

# scale_run URL KEYS_FILE → "new_rps new_p99 replay_rps replay_p99 errors"
scale_run() {
  local target=$1 keys=$2 new rep
  settle "$target"
  start_api "$target" --replay-cache-entries 0
  new=$(run_wrk 8 scripts/bench/new_charges.lua)
  rep=$(run_wrk 8 scripts/bench/replay_keys.lua BENCH_KEYS_FILE="$keys")
  stop_api
  awk -v n="$new" -v r="$rep" 'BEGIN { split(n, a, " "); split(r, b, " ");
    printf "%s %s %s %s %d\n", a[1], a[3], b[1], b[3], a[4] + b[4] }'
}

stage_scale() {
  local base="${BENCH_SCALE_BASE:-10000}" sizes="${BENCH_SCALE_ROWS:-1000000 5000000}"
  [ "${BENCH_SCALE_20M:-0}" = 1 ] && sizes="$sizes 20000000"
  local largest=${sizes##* } base_url big_url filled size round base_runs big_runs
  base_url=$(new_database charges_bench_base)
  big_url=$(new_database charges_bench_big)
  fill "$base_url" project 1 "$base"
  fill_keys "$out_dir/keys-base.txt" "$base"
  filled=0
  section "as the tables grow: vs $base rows (target ≥ 0.9 at the largest size)"
  for size in $sizes; do
    log "scale: filling to $size rows per table"
    fill "$big_url" project $(( filled + 1 )) "$size" "$largest"
    filled=$size
    fill_keys "$out_dir/keys-big.txt" "$size"
    base_runs=(); big_runs=()
    for round in $(seq 1 "$rounds"); do
      log "scale, $size rows, round $round/$rounds: $base rows"
      base_runs+=("$(scale_run "$base_url" "$out_dir/keys-base.txt")")
      log "scale, $size rows, round $round/$rounds: $size rows"
      big_runs+=("$(scale_run "$big_url" "$out_dir/keys-big.txt")")
    done
    scale_report "$size" "$base"
  done
  scale_relay "$base_url" "$big_url" "$largest" "$base"
  scale_sizes "$big_url" "$largest"
}

# scale_report SIZE BASE: medians of base_runs and big_runs, per measure.
scale_report() {
  local size=$1 base=$2 col name b g r p99 target
  for col in 1 3; do
    name=new_charges; [ "$col" = 3 ] && name=replays
    b=$(printf '%s\n' "${base_runs[@]}" | awk -v c="$col" '{print $c}' | median)
    g=$(printf '%s\n' "${big_runs[@]}" | awk -v c="$col" '{print $c}' | median)
    p99=$(printf '%s\n' "${big_runs[@]}" | awk -v c="$col" -v m="$g" '$c == m {print $(c + 1); exit}')
    r=$(ratio "$g" "$b")
    target=""; [ "$size" = "${sizes##* }" ] && target=" $(verdict "$r" 0.9)"
    row "  ${name//_/ }, $size rows|$g req/s p99 ${p99}ms|$base rows: $b req/s|$r$target"
    record scale measure="$name" rows="$size" base_rows="$base" clients=8 rounds="$rounds" req_per_s="$g" \
      p99_ms="$p99" base_req_per_s="$b" ratio="$r" \
      req_per_s_rounds="$(firsts $(printf '%s\n' "${big_runs[@]}" | awk -v c="$col" '{print $c}'))" \
      base_req_per_s_rounds="$(firsts $(printf '%s\n' "${base_runs[@]}" | awk -v c="$col" '{print $c}'))" \
      errors="$(printf '%s\n' "${base_runs[@]}" "${big_runs[@]}" | awk '{s += $5} END {print s + 0}')"
  done
}

# drain_new_rows URL → drain's "TOTAL FIRST": 2 relays drain relay_rows new pending rows,
# which are then deleted, so every drain starts in front of the same published rows.
# Their reconciliation is left to reconcile_once: its count reads whole tables (minutes
# at 20 million rows, once per --reconcile-interval for all relays), and a count that
# came due in a 2-second drain would be measured as the drain's.
drain_new_rows() {
  add_pending "$1"
  drain "$1" 2 --reconcile-interval 1h
  psql_on "$1" -c "DELETE FROM outbox WHERE request_id = 'bench-pending'" >/dev/null
}

# reconcile_once URL → seconds from a relay's launch to its recorded reconciliation
# (the count of charges without their outbox row and of stale keys, over whole tables).
reconcile_once() {
  local target=$1 started pid seconds=""
  psql_on "$target" -c "DELETE FROM reconciliation_result" >/dev/null
  started=$(psql_on "$target" -c "SELECT extract(epoch FROM clock_timestamp())")
  RUST_LOG=warn "$bin/charges-relay" --database-url "$target" --kafka-brokers "$brokers" \
    --metrics-listen 127.0.0.1:0 >>"$out_dir/relay.log" 2>&1 &
  pid=$!; pids+=("$pid")
  while [ -z "$seconds" ]; do
    kill -0 "$pid" 2>/dev/null || { echo "bench: the relay exited (log: $out_dir/relay.log)" >&2; exit 1; }
    sleep 0.2
    seconds=$(psql_on "$target" -c "SELECT round((extract(epoch FROM clock_timestamp()) - $started)::numeric, 1)
                                     FROM reconciliation_result")
  done
  stop_pids "$pid"
  echo "$seconds"
}

# scale_relay BASE_URL BIG_URL SIZE BASE: 2 relays draining new rows on each, alternating.
scale_relay() {
  local base_url=$1 big_url=$2 size=$3 base=$4 round b_runs=() g_runs=() secs b g r count_secs
  # A drain lasts about 1.5 s, so one scheduling hiccup moves a round by a third; more
  # rounds cost little next to the fill.
  local drain_rounds=${BENCH_SCALE_DRAIN_ROUNDS:-5}
  [ -n "${brokers:-}" ] || start_kafka
  log "scale, reconciliation count on $size rows"
  count_secs=$(reconcile_once "$big_url")
  row "  reconciliation count (1 relay per --reconcile-interval), $size rows|${count_secs} s||"
  record scale measure=reconciliation_count rows="$size" seconds="$count_secs"
  # One unmeasured drain on each first (start-up, caches).
  for target in "$base_url" "$big_url"; do
    log "scale, relay warm-up: $relay_rows new rows"
    drain_new_rows "$target" >/dev/null
  done
  for round in $(seq 1 "$drain_rounds"); do
    for target in "$base_url" "$big_url"; do
      log "scale, relay round $round/$drain_rounds: $relay_rows new rows on $([ "$target" = "$base_url" ] && echo "$base" || echo "$size") rows"
      read -r secs _ < <(drain_new_rows "$target")
      if [ "$target" = "$base_url" ]; then b_runs+=("$secs"); else g_runs+=("$secs"); fi
    done
  done
  b=$(awk -v n="$relay_rows" -v s="$(printf '%s\n' "${b_runs[@]}" | sort -rn | median)" 'BEGIN { printf "%.1f", n / s }')
  g=$(awk -v n="$relay_rows" -v s="$(printf '%s\n' "${g_runs[@]}" | sort -rn | median)" 'BEGIN { printf "%.1f", n / s }')
  r=$(ratio "$g" "$b")
  row "  relay (2), $size rows behind|$g events/s|$base rows: $b events/s|$r $(verdict "$r" 0.9)"
  record scale measure=relay rows="$size" base_rows="$base" workers=2 rounds="$drain_rounds" events_per_s="$g" \
    base_events_per_s="$b" ratio="$r" drain_seconds_rounds="[$(paste -sd, <<<"$(printf '%s\n' "${g_runs[@]}")")]" \
    base_drain_seconds_rounds="[$(paste -sd, <<<"$(printf '%s\n' "${b_runs[@]}")")]"
}

# scale_sizes URL SIZE: each table's and index's size at the largest size, against
# shared_buffers (what stays hot decides what a write costs).
scale_sizes() {
  local sizes_json
  sizes_json=$(psql_on "$1" -c "
    SELECT json_object_agg(relname, pg_relation_size(oid) / 1048576)
      FROM pg_class
     WHERE relnamespace = 'public'::regnamespace AND relkind IN ('r', 'i')
       AND relname ~ '^(charges|outbox|idempotency_keys)'")
  record relation_sizes_mib rows="$2" shared_buffers="$(psql_on "$1" -c 'SHOW shared_buffers')" sizes="$sizes_json"
}
