# Stage replays: POST /charges with one completed key (wrk) vs GET /healthz on the
# same server: what a replay costs over the cheapest request the server answers.

stage_replays() {
  local target key clients rep floor r
  target=$(new_database charges_bench)
  steady "$target" project
  start_api "$target"
  key=$(cat /proc/sys/kernel/random/uuid)
  curl -sf -o /dev/null -X POST "http://127.0.0.1:$port/charges" -H 'Content-Type: application/json' \
    -H "Idempotency-Key: $key" -d '{"amountCents":4900,"currency":"EUR"}'
  section "replays vs GET /healthz (target ≥ 0.5)"
  for clients in 8 32; do
    log "replays, $clients clients"
    read -r rep _ rep_p99 _ < <(run_wrk "$clients" scripts/bench/fixed_request.lua BENCH_KEY="$key")
    read -r floor _ < <(WRK_PATH=/healthz run_wrk "$clients" scripts/bench/fixed_request.lua BENCH_KEY=)
    r=$(ratio "$rep" "$floor")
    row "replays c=$clients|$rep req/s p99 ${rep_p99}ms|GET /healthz $floor req/s|$r $(verdict "$r" 0.5)"
    record replays clients="$clients" replay_rps="$rep" replay_p99_ms="$rep_p99" healthz_rps="$floor" ratio="$r" target=0.5
  done
  stop_api
}
