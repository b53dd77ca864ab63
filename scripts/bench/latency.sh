# Stage latency: commit → broker acknowledgement (published_at - created_at, both the
# database's clock), idle (one charge every 20 ms, so an idle relay is woken by
# NOTIFY) and under load (wrk at full speed, so the relay is busy and polls every
# --busy-poll-interval), next to polling only (the trigger disabled).

latency_idle() { # → "p50 p99"
  local target=$1 n
  for n in $(seq 1 "${BENCH_LATENCY_EVENTS:-300}"); do
    curl -s -o /dev/null -X POST "http://127.0.0.1:$port/charges" -H 'Content-Type: application/json' \
      -H "Idempotency-Key: $(cat /proc/sys/kernel/random/uuid)" -d '{"amountCents":4900}'
    sleep 0.02
  done
}

commit_to_ack() { # URL → "p50 p99" of the rows published since the last TRUNCATE
  psql_on "$1" -c "SELECT round(percentile_cont(0.5) WITHIN GROUP (ORDER BY ms)::numeric, 1),
                          round(percentile_cont(0.99) WITHIN GROUP (ORDER BY ms)::numeric, 1)
                     FROM (SELECT extract(epoch FROM published_at - created_at) * 1000 AS ms
                             FROM outbox WHERE published_at > now() - interval '1 hour') t" | tr '|' ' '
}

# latency_run LABEL load|idle [relay flags...] → "p50 p99"
latency_run() {
  local label=$1 mode=$2 target relay log; shift 2
  target=$(database_url charges_bench)
  psql_on "$target" -c "TRUNCATE refunds, outbox, charges, idempotency_keys" >/dev/null
  settle "$target"
  start_api "$target"
  log="$out_dir/relay-latency-$label.log"
  RUST_LOG=warn,charges_relay=info,pg_outbox=info "$bin/charges-relay" --database-url "$target" --kafka-brokers "$brokers" \
    --metrics-listen 127.0.0.1:0 "$@" >"$log" 2>&1 &
  relay=$!; pids+=("$relay")
  wait_until 30 "the relay to start (log: $log)" grep -q "relay started" "$log"
  if [ "$mode" = load ]; then run_wrk 8 scripts/bench/new_charges.lua >/dev/null; else latency_idle "$target"; fi
  drained "$target" 120 || { echo "bench: rows left pending (log: $log)" >&2; exit 1; }
  stop_pids "$relay" "$api_pid"
  commit_to_ack "$target"
}

stage_latency() {
  local target idle_p50 idle_p99 load_p50 load_p99 poll_p50 poll_p99
  target=$(new_database charges_bench)
  [ -n "${brokers:-}" ] || start_kafka
  section "commit → broker ack (target: p99 < 50 ms)"
  log "commit-to-ack, idle relay (NOTIFY)"
  read -r idle_p50 idle_p99 < <(latency_run idle idle)
  log "commit-to-ack, relay under load (busy polling)"
  read -r load_p50 load_p99 < <(latency_run load load)
  psql_on "$target" -c "ALTER TABLE outbox DISABLE TRIGGER outbox_notify_pending" >/dev/null
  log "commit-to-ack, polling only (trigger disabled, --poll-interval 1s)"
  read -r poll_p50 poll_p99 < <(latency_run polling idle)
  psql_on "$target" -c "ALTER TABLE outbox ENABLE TRIGGER outbox_notify_pending" >/dev/null
  row "commit→ack, idle relay|p50 ${idle_p50}ms p99 ${idle_p99}ms|polling only p50 ${poll_p50}ms p99 ${poll_p99}ms|$(awk -v p="$idle_p99" 'BEGIN { print (p < 50) ? "✔" : "✘" }')"
  row "commit→ack, under load|p50 ${load_p50}ms p99 ${load_p99}ms||$(awk -v p="$load_p99" 'BEGIN { print (p < 50) ? "✔" : "✘" }')"
  record commit_to_ack events="${BENCH_LATENCY_EVENTS:-300}" idle_p50_ms="$idle_p50" idle_p99_ms="$idle_p99" \
    load_p50_ms="$load_p50" load_p99_ms="$load_p99" polling_p50_ms="$poll_p50" polling_p99_ms="$poll_p99" target_p99_ms=50
}
