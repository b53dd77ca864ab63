# Stage ha: the same work with a synchronous standby, on a primary and a standby of the
# stage's own (initdb with the installed server's defaults, as the main server has
# them; the standby by pg_basebackup -R with cluster_name=s1, and
# synchronous_standby_names = 's1' on the primary), both on this machine's disk:
#   - POST /charges against the reference transaction on that primary, in alternating
#     rounds, next to the same API on the main server (no standby): what synchronous
#     replication costs here;
#   - 2 relays draining BENCH_RELAY_ROWS pending rows with the replication gate
#     (--wait-for-standbys sync, BENCH_HA_GATE) against without it;
#   - commit → broker ack, idle and under load (latency.sh's method), with the gate
#     and without;
#   - replays of completed keys on that primary against the same on the main server
#     (no standby): every replay confirms that the standbys have its key's row first,
#     with the replay cache off (each replay reads its row) and on (the default).
# Each round runs both sides of a comparison, the one that went first last round
# second. PG_BINDIR chooses the server binaries (default: the newest installed).

source scripts/bench/relay.sh
source scripts/bench/latency.sh

ha_gate="${BENCH_HA_GATE:-sync}"

# ha_start_server NAME PORT [SETTINGS...]: the server in $ha_dir/NAME on PORT.
ha_start_server() {
  local name=$1 server_port=$2 options; shift 2
  options="-c listen_addresses=127.0.0.1 -c port=$server_port -c unix_socket_directories=$ha_dir $*"
  as_server "$server_bindir/pg_ctl" start -w -D "$ha_dir/$name" -l "$ha_dir/$name.log" -o "$options" >/dev/null
}

# start_ha_cluster: the primary and its synchronous standby; sets ha_dir, ha_server_url.
start_ha_cluster() {
  local primary_port standby_port
  [ -x "$server_bindir/initdb" ] ||
    { echo "bench: the ha stage needs the Postgres server binaries (PG_BINDIR)" >&2; exit 2; }
  ha_dir=$(mktemp -d)
  [ "$(id -u)" != 0 ] || chown postgres "$ha_dir"
  trap 'stop_ha_cluster; cleanup' EXIT INT TERM
  primary_port=$(free_port $(( port + 20 )))
  as_server "$server_bindir/initdb" --auth=trust --username=postgres -E UTF8 -D "$ha_dir/primary" >/dev/null
  # Nothing commits on the primary before the standby streams, so the name may come first.
  ha_start_server primary "$primary_port" "-c synchronous_standby_names=s1"
  ha_server_url="postgres://postgres@127.0.0.1:$primary_port/postgres"
  as_server "$server_bindir/pg_basebackup" -h 127.0.0.1 -p "$primary_port" -U postgres \
    -R -X stream --checkpoint=fast -D "$ha_dir/standby"
  standby_port=$(free_port $(( primary_port + 1 )))
  ha_start_server standby "$standby_port" "-c cluster_name=s1"
  wait_until 30 "the standby s1 to stream synchronously (log: $ha_dir/standby.log)" sql_is "$ha_server_url" sync \
    "SELECT sync_state FROM pg_stat_replication WHERE application_name = 's1'"
}
stop_ha_cluster() {
  [ -n "${ha_dir:-}" ] || return 0
  local name
  for name in primary standby; do
    [ ! -f "$ha_dir/$name/postmaster.pid" ] || as_server "$server_bindir/pg_ctl" stop -m immediate -w -D "$ha_dir/$name" >/dev/null 2>&1 || true
  done
  rm -rf "$ha_dir"
  ha_dir=""
}

# ha_alternate ROUND FIRST SECOND: FIRST SECOND on odd rounds, SECOND FIRST on even ones.
ha_alternate() { if [ $(( $1 % 2 )) = 1 ]; then printf '%s %s\n' "$2" "$3"; else printf '%s %s\n' "$3" "$2"; fi; }

# ha_api_run URL CLIENTS → run_wrk's line: POST /charges on steady tables, the API
# started for this run (the stage's API runs against two servers in turn).
ha_api_run() {
  steady "$1" project
  start_api "$1"
  run_wrk "$2" scripts/bench/new_charges.lua
  stop_api
}

# ha_new_charges REF_URL HA_URL LOCAL_URL CLIENTS
ha_new_charges() {
  local ref_url=$1 ha_url=$2 local_url=$3 clients=$4 round side ref_runs=() api_runs=() local_runs=()
  local ref ref_p50 ref_p99 api api_p50 api_p99 loc loc_p50 loc_p99 r_api r_sync
  for round in $(seq 1 "$rounds"); do
    for side in $(ha_alternate "$round" reference api) local; do
      log "ha: new charges, $clients clients, round $round/$rounds: $side"
      case "$side" in
        reference) steady "$ref_url" reference
                   ref_runs+=("$(run_pgbench "$ref_url" scripts/bench/reference/charge.pgbench "$clients")") ;;
        api) api_runs+=("$(ha_api_run "$ha_url" "$clients")") ;;
        local) local_runs+=("$(ha_api_run "$local_url" "$clients")") ;;
      esac
    done
  done
  read -r ref ref_p50 ref_p99 < <(pick "${ref_runs[@]}")
  read -r api api_p50 api_p99 _ < <(pick "${api_runs[@]}")
  read -r loc loc_p50 loc_p99 _ < <(pick "${local_runs[@]}")
  r_api=$(ratio "$api" "$ref"); r_sync=$(ratio "$api" "$loc")
  row "new charges c=$clients, sync standby|$api req/s p50 ${api_p50}ms p99 ${api_p99}ms|reference $ref tps p99 ${ref_p99}ms|$r_api"
  row "  same API, no standby (main server)|$api req/s|$loc req/s p99 ${loc_p99}ms|$r_sync"
  record ha_new_charges clients="$clients" rounds="$rounds" backlog_rows="$backlog" \
    api_rps="$api" api_rps_rounds="$(firsts "${api_runs[@]}")" api_p50_ms="$api_p50" api_p99_ms="$api_p99" \
    reference_tps="$ref" reference_tps_rounds="$(firsts "${ref_runs[@]}")" reference_p99_ms="$ref_p99" \
    no_standby_api_rps="$loc" no_standby_api_rps_rounds="$(firsts "${local_runs[@]}")" \
    no_standby_api_p99_ms="$loc_p99" ratio_to_reference="$r_api" ratio_to_no_standby="$r_sync"
}

# ha_relay URL: 2 relays draining the backlog, gated and not.
ha_relay() {
  local target=$1 round side secs gated=() open=() gated_eps open_eps
  for round in $(seq 1 "$rounds"); do
    for side in $(ha_alternate "$round" gated open); do
      pending_only "$target"
      log "ha: relay, round $round/$rounds: 2 relays, $relay_rows rows, $side"
      if [ "$side" = gated ]; then
        read -r secs _ < <(drain "$target" 2 --wait-for-standbys "$ha_gate")
        gated+=("$(awk -v n="$relay_rows" -v s="$secs" 'BEGIN { printf "%.1f", n / s }')")
      else
        read -r secs _ < <(drain "$target" 2)
        open+=("$(awk -v n="$relay_rows" -v s="$secs" 'BEGIN { printf "%.1f", n / s }')")
      fi
    done
  done
  gated_eps=$(printf '%s\n' "${gated[@]}" | median)
  open_eps=$(printf '%s\n' "${open[@]}" | median)
  row "relay, 2 workers, --wait-for-standbys $ha_gate|$gated_eps events/s|no gate $open_eps events/s|$(ratio "$gated_eps" "$open_eps") $(verdict "$(ratio "$gated_eps" "$open_eps")" 0.9)"
  record ha_relay_throughput workers=2 rows="$relay_rows" batch_size="$batch" concurrency="$concurrency" \
    rounds="$rounds" gated_events_per_s="$gated_eps" gated_events_per_s_rounds="[$(paste -sd, <<<"$(printf '%s\n' "${gated[@]}")")]" \
    ungated_events_per_s="$open_eps" ungated_events_per_s_rounds="[$(paste -sd, <<<"$(printf '%s\n' "${open[@]}")")]" \
    ratio_to_ungated="$(ratio "$gated_eps" "$open_eps")"
}

# ha_latency MODE: commit → ack (latency.sh's method; idle: one charge every 20 ms, so
# every batch is small and nothing else flushes the WAL) gated and not; the rounds' p99s
# and the run with their median.
ha_latency() {
  local mode=$1 round side p50 p99 gated=() open=() g50 g99 o50 o99
  for round in $(seq 1 "$rounds"); do
    for side in $(ha_alternate "$round" gated open); do
      log "ha: commit-to-ack, relay $mode, round $round/$rounds: $side"
      if [ "$side" = gated ]; then
        read -r p50 p99 < <(latency_run "ha-gated-$mode" "$mode" --wait-for-standbys "$ha_gate")
        gated+=("$p99 $p50")
      else
        read -r p50 p99 < <(latency_run "ha-open-$mode" "$mode")
        open+=("$p99 $p50")
      fi
    done
  done
  read -r g99 g50 < <(pick "${gated[@]}")
  read -r o99 o50 < <(pick "${open[@]}")
  row "commit→ack, relay $mode, --wait-for-standbys $ha_gate (target p99 < 50 ms)|p50 ${g50}ms p99 ${g99}ms|no gate p50 ${o50}ms p99 ${o99}ms|$(awk -v p="$g99" 'BEGIN { print (p + 0 < 50) ? "✔" : "✘" }')"
  record ha_commit_to_ack relay="$mode" rounds="$rounds" gated_p50_ms="$g50" gated_p99_ms="$g99" \
    gated_p99_ms_rounds="[$(printf '%s\n' "${gated[@]}" | awk '{print $1}' | paste -sd,)]" \
    ungated_p50_ms="$o50" ungated_p99_ms="$o99" \
    ungated_p99_ms_rounds="[$(printf '%s\n' "${open[@]}" | awk '{print $1}' | paste -sd,)]"
}

# ha_replays HA_URL LOCAL_URL CLIENTS CACHE_ENTRIES KEYS_FILE: replays of the fill's
# completed keys in KEYS_FILE, with a synchronous standby and without, alternating.
ha_replays() {
  local ha_url=$1 local_url=$2 clients=$3 cache=$4 keys=$5 round side ha_runs=() local_runs=()
  local ha ha_p99 loc loc_p99 r run
  for round in $(seq 1 "$rounds"); do
    for side in $(ha_alternate "$round" standby local); do
      log "ha: replays, $clients clients, cache $cache, round $round/$rounds: $side"
      if [ "$side" = standby ]; then start_api "$ha_url" --replay-cache-entries "$cache"
      else start_api "$local_url" --replay-cache-entries "$cache"; fi
      run=$(run_wrk "$clients" scripts/bench/replay_keys.lua BENCH_KEYS_FILE="$keys")
      stop_api
      if [ "$side" = standby ]; then ha_runs+=("$run"); else local_runs+=("$run"); fi
    done
  done
  read -r ha _ ha_p99 _ < <(pick "${ha_runs[@]}")
  read -r loc _ loc_p99 _ < <(pick "${local_runs[@]}")
  r=$(ratio "$ha" "$loc")
  row "replays c=$clients, replay cache $cache, sync standby|$ha req/s p99 ${ha_p99}ms|no standby $loc req/s p99 ${loc_p99}ms|$r $(verdict "$r" 0.67)"
  record ha_replays clients="$clients" cache_entries="$cache" rounds="$rounds" \
    standby_rps="$ha" standby_rps_rounds="$(firsts "${ha_runs[@]}")" standby_p99_ms="$ha_p99" \
    no_standby_rps="$loc" no_standby_rps_rounds="$(firsts "${local_runs[@]}")" no_standby_p99_ms="$loc_p99" \
    ratio_to_no_standby="$r" target=0.67
}

stage_ha() {
  local main_server=$server_url local_url ref_url ha_url clients
  local_url=$(new_database charges_bench)
  start_ha_cluster
  # Every database below is created on the stage's primary.
  server_url=$ha_server_url
  ref_url=$(new_database charges_bench_ref reference)
  ha_url=$(new_database charges_bench)
  [ -n "${brokers:-}" ] || start_kafka
  section "with a synchronous standby (s1, same machine)"
  for clients in 8 32; do
    if [ -n "${BENCH_HA_SKIP_NEW_CHARGES:-}" ]; then
      steady "$ha_url" project; steady "$local_url" project; break
    fi
    ha_new_charges "$ref_url" "$ha_url" "$local_url" "$clients"
  done
  # Both databases hold the steady fill the new-charges runs left (steady, in ha_api_run).
  # BENCH_HA_PARTS chooses among the parts below (all by default).
  local parts=" ${BENCH_HA_PARTS:-replays relay latency} "
  if [[ $parts == *" replays "* ]]; then
    fill_keys "$out_dir/keys-ha.txt" "$backlog"
    for clients in 8 32; do
      ha_replays "$ha_url" "$local_url" "$clients" 0 "$out_dir/keys-ha.txt"
    done
    ha_replays "$ha_url" "$local_url" 32 10000 "$out_dir/keys-ha.txt"
  fi
  [[ $parts != *" relay "* ]] || ha_relay "$ha_url"
  if [[ $parts == *" latency "* ]]; then
    ha_latency idle
    ha_latency load
  fi
  server_url=$main_server
  stop_ha_cluster
  trap cleanup EXIT INT TERM
}
