# The end of make bench: target/bench/latest.json (the machine, the settings, every
# result), the table, and target/bench/scale.svg (throughput ratios against table size).

machine_json() {
  local pg_settings
  pg_settings=$(psql_on "$server_url" -c "
    SELECT json_object_agg(name, current_setting(name))
      FROM pg_settings
     WHERE name IN ('server_version', 'shared_buffers', 'synchronous_commit', 'wal_compression',
                    'max_wal_size', 'checkpoint_timeout', 'autovacuum', 'full_page_writes', 'work_mem')")
  jq -n --arg cpu "$(nproc) cores, $(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -n 1)" \
    --arg memory "$(free -g | awk '/Mem:/ {print $2}') GiB" --arg kernel "$(uname -r)" \
    --argjson postgres "$pg_settings" '{cpu: $cpu, memory: $memory, kernel: $kernel, postgres: $postgres}'
}

# The plot shows ratios, each size's figure over the small tables' figure of the same
# rounds: absolute throughput drifts between the sizes' rounds on these machines, and a
# line of absolute numbers would draw that drift as a cost of size.
plot_scale() {
  local data="$out_dir/scale.dat" measure
  jq -r 'select(.name == "scale") | [.measure, .base_rows, .rows, .ratio] | @tsv' "$results" >"$data"
  [ -s "$data" ] || return 0
  if ! command -v gnuplot >/dev/null 2>&1; then
    log "gnuplot missing (make bench-deps installs it): no plot"
    return 0
  fi
  for measure in new_charges replays relay; do
    awk -F'\t' -v m="$measure" '$1 == m { if (!b) print $2, 1; b = 1; print $3, $4 }' "$data" \
      >"$out_dir/scale-$measure.dat"
  done
  gnuplot <<PLOT
set terminal svg size 720,420 font "sans,12" background rgb "white"
set output "$out_dir/scale.svg"
set title "As the tables grow: throughput over the same run's small tables ($(date -u +%F))"
set logscale x
set format x "%.0s%c"
set xlabel "rows in each of charges, outbox, idempotency_keys"
set ylabel "ratio to the small tables"
set yrange [0:1.3]
set key bottom left
set grid
set arrow from graph 0, first 0.9 to graph 1, first 0.9 nohead dt 2 lw 1.5 lc rgb "red"
set label "target 0.9" at graph 0.02, first 0.93 tc rgb "red"
plot "$out_dir/scale-new_charges.dat" using 1:2 with linespoints lw 2 pt 7 title "new charges (8 clients)", \
     "$out_dir/scale-replays.dat" using 1:2 with linespoints lw 2 pt 5 title "replays, cache off (8 clients)", \
     "$out_dir/scale-relay.dat" using 1:2 with linespoints lw 2 pt 9 title "2 relays draining 100 000 rows"
PLOT
}

report() { # ELAPSED_SECONDS
  jq -s --arg date "$(date -u +%FT%TZ)" --argjson machine "$(machine_json)" \
    --argjson settings "$(jq -n --argjson seconds "$seconds" --argjson rounds "$rounds" \
      --argjson backlog "$backlog" --argjson pool "${BENCH_POOL:-32}" --argjson workers "${BENCH_API_WORKERS:-1}" --arg stages "$stages" \
      '{seconds_per_run: $seconds, rounds: $rounds, backlog_rows: $backlog, api_pool: $pool, api_workers: $workers, stages: $stages}')" \
    --argjson elapsed "$1" \
    '{date: $date, machine: $machine, settings: $settings, elapsed_seconds: $elapsed, results: .}' \
    "$results" >"$out_dir/latest.json"
  plot_scale
  printf '\n%-40s | %-42s | %-42s | %s\n' "benchmark" "project" "floor (same run)" "ratio"
  local a b c d
  while IFS='|' read -r a b c d; do
    if [[ "$a" == "## "* ]]; then printf '\n%s\n' "${a#\#\# }"; continue; fi
    printf '%-40s | %-42s | %-42s | %s\n' "$a" "$b" "$c" "$d"
  done <"$table"
  printf '\n%s; JSON: %s/latest.json; plot: %s/scale.svg\n' \
    "$(jq -r '"\(.machine.cpu), \(.machine.memory), PostgreSQL \(.machine.postgres.server_version)"' "$out_dir/latest.json")" \
    "$out_dir" "$out_dir"
}
