# Stage retention: does retention keep up? BENCH_RETENTION_BACKLOG expired keys and
# as many published events past the retention wait, the API takes new charges at full
# speed (wrk, 8 clients) and one relay at its defaults publishes them and runs the
# purge and the outbox cleanup (which start at once and loop while batches come back
# full). Deletes per second per table, sampled every second while the backlog lasts,
# against the rows the API inserts per second. Target: ≥ 3×, so that a backlog drains
# within an hour of restarting.

retention_backlog() { # URL ROWS
  psql_on "$1" -c "
    INSERT INTO idempotency_keys (key, endpoint, request_hash, status, response_status,
                                  response_headers, response_body, created_at, expires_at)
    SELECT md5('x' || g)::uuid::text, '/charges', repeat('a', 64), 'COMPLETED', 201,
           '[[\"location\",\"/charges/01a2384a-d032-7351-a2c2-20c6b45c2233\"]]',
           '{\"id\":\"01a2384a-d032-7351-a2c2-20c6b45c2233\",\"amountCents\":4900,\"currency\":\"EUR\",\"createdAt\":\"2026-12-02T19:45:56.783080Z\"}',
           now() - interval '2 days', now() - interval '1 day' + g * interval '1 millisecond'
      FROM generate_series(1, $2) g;
    INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, sequence, data, created_at, published_at, next_attempt_at)
    SELECT md5('xo' || g)::uuid, 'charge', md5('xc' || g)::uuid, 'ChargeCreated', 1, '{\"amountCents\":4900}',
           now() - interval '9 days', now() - interval '8 days' + g * interval '1 millisecond',
           now() - interval '8 days'
      FROM generate_series(1, $2) g;" >/dev/null
}

# retention_rate SAMPLES COLUMN → rows deleted per second while that backlog lasted.
retention_rate() {
  awk -v c="$2" '
    NR == 1 { t0 = $1; v0 = $c }
    { if ($c == 0 && !zt) zt = $1; tl = $1; vl = $c }
    END {
      if (zt) { if (zt > t0) printf "%.1f", v0 / (zt - t0); else print "n/a" }
      else if (tl > t0) printf "%.1f", (v0 - vl) / (tl - t0); else print "n/a"
    }' "$1"
}

stage_retention() {
  local target rows="${BENCH_RETENTION_BACKLOG:-1000000}" relay sampler samples api rps keys_rate events_rate
  target=$(new_database charges_bench)
  [ -n "${brokers:-}" ] || start_kafka
  steady "$target" project
  log "retention: $rows expired keys and $rows events past the retention"
  retention_backlog "$target" "$rows"
  settle "$target"
  start_api "$target"
  samples="$out_dir/retention-samples.txt"
  : >"$samples"
  (
    while :; do
      psql_on "$target" -c "SELECT extract(epoch FROM clock_timestamp()),
          (SELECT count(*) FROM idempotency_keys WHERE expires_at <= now() - interval '12 hours'),
          (SELECT count(*) FROM outbox WHERE published_at < now() - interval '7 days')" | tr '|' ' ' >>"$samples"
      sleep 1
    done
  ) &
  sampler=$!; pids+=("$sampler")
  RUST_LOG=warn "$bin/charges-relay" --database-url "$target" --kafka-brokers "$brokers" \
    --metrics-listen 127.0.0.1:0 >"$out_dir/relay-retention.log" 2>&1 &
  relay=$!; pids+=("$relay")
  log "retention: wrk for ${seconds}s while the relay purges"
  read -r rps _ <<<"$(run_wrk 8 scripts/bench/new_charges.lua)"
  stop_pids "$sampler" "$relay" "$api_pid"
  keys_rate=$(retention_rate "$samples" 2)
  events_rate=$(retention_rate "$samples" 3)
  section "retention while the API runs at full speed (target ≥ 3× the insert rate)"
  local r_keys r_events
  r_keys=$(ratio "$keys_rate" "$rps"); r_events=$(ratio "$events_rate" "$rps")
  row "expired keys purged|$keys_rate rows/s|API inserting $rps keys/s|$r_keys $(verdict "$r_keys" 3)"
  row "published events deleted|$events_rate rows/s|API inserting $rps events/s|$r_events $(verdict "$r_events" 3)"
  record retention backlog_rows="$rows" api_rps="$rps" keys_deleted_per_s="$keys_rate" \
    events_deleted_per_s="$events_rate" keys_ratio="$r_keys" events_ratio="$r_events" target=3 \
    hour_backlog_drains_in_minutes="$(awk -v d="$keys_rate" -v e="$events_rate" -v r="$rps" 'BEGIN {
      m = (d < e ? d : e); if (m > r) printf "%.1f", 60 * r / (m - r); else print "null" }')"
}
