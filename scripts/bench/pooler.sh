# Stage pooler: POST /charges (wrk, fresh random keys) through PgBouncer in transaction
# pooling against the API talking to Postgres directly, in alternating rounds on one
# database whose sessions the server bounds itself (statement_timeout 5 s,
# idle_in_transaction_session_timeout 10 s, as `--db-pooler transaction` requires; the
# direct API asks for the same bounds on its connections), steady-state tables:
#   direct     --db-pooler none: statements prepared once per connection (the floor);
#   unnamed    --db-pooler transaction straight to Postgres: every statement sent
#              unnamed, parsed and planned per execution; unnamed / direct is what the
#              statement design costs without any pooler;
#   pgbouncer  --db-pooler transaction through a PgBouncer the stage starts
#              (pool_mode = transaction, BENCH_PGBOUNCER_POOL server connections);
#              target ≥ 0.85 of direct;
#   previous   only with BENCH_PREVIOUS_API=<charges-api binary of an earlier build>:
#              that API, direct, its own flags' defaults; direct / previous says
#              whether the direct path changed (target ≥ 0.95).
# Each round runs every variant, starting one further along the list each round, so
# that no variant always runs first or last after the machine's other work.

pooler_db=charges_bench_pooler

stage_pooler() {
  local clients
  command -v pgbouncer >/dev/null 2>&1 ||
    { echo "bench: the pooler stage needs pgbouncer (apt-get install pgbouncer)" >&2; exit 2; }
  pooler_direct_url=$(new_database "$pooler_db")
  psql_on "$pooler_direct_url" \
    -c "ALTER DATABASE $pooler_db SET statement_timeout = '5s'" \
    -c "ALTER DATABASE $pooler_db SET idle_in_transaction_session_timeout = '10s'"
  start_pgbouncer
  pooler_variants=(direct unnamed pgbouncer)
  [ -z "${BENCH_PREVIOUS_API:-}" ] || pooler_variants+=(previous)
  section "new charges through PgBouncer vs direct (target ≥ 0.85)"
  for clients in 8 32; do
    pooler_clients "$clients"
  done
  stop_pids "$pgbouncer_pid"
  rm -rf "$pgbouncer_dir"
}

# start_pgbouncer: PgBouncer on a free port in front of the server, every setting at
# its default but the pool mode and size (so it refuses the `options` startup
# parameter, as a deployment's would); sets pooler_pooled_url and pgbouncer_pid.
start_pgbouncer() {
  local host server_port user listen as_user=()
  read -r host server_port user < <(psql_on "$server_url" -c '\echo :HOST :PORT :USER')
  listen=$(free_port $(( port + 1 )))
  pgbouncer_dir=$(mktemp -d)
  cat >"$pgbouncer_dir/pgbouncer.ini" <<INI
[databases]
* = host=$host port=$server_port

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $listen
unix_socket_dir =
auth_type = trust
auth_file = $pgbouncer_dir/userlist.txt
pool_mode = transaction
default_pool_size = ${BENCH_PGBOUNCER_POOL:-16}
INI
  printf '"%s" ""\n' "$user" >"$pgbouncer_dir/userlist.txt"
  # PgBouncer refuses to run as root; it then reads its files as the server's OS user.
  if [ "$(id -u)" = 0 ]; then
    as_user=(-u postgres)
    chmod 755 "$pgbouncer_dir"
    chmod 644 "$pgbouncer_dir"/*
  fi
  pgbouncer "${as_user[@]}" "$pgbouncer_dir/pgbouncer.ini" >"$out_dir/pgbouncer.log" 2>&1 &
  pgbouncer_pid=$!
  pids+=("$pgbouncer_pid")
  pooler_pooled_url="postgres://$user@127.0.0.1:$listen/$pooler_db"
  wait_until 30 "PgBouncer to accept connections (log: $out_dir/pgbouncer.log)" \
    psql_on "$pooler_pooled_url" -c "SELECT 1"
}

# free_port FROM: the first port from FROM up that nothing on this machine listens on.
free_port() {
  local candidate=$1
  while (exec 3<>"/dev/tcp/127.0.0.1/$candidate") 2>/dev/null; do
    candidate=$(( candidate + 1 ))
  done
  printf '%s\n' "$candidate"
}

# pooler_clients CLIENTS: BENCH_ROUNDS rounds of every variant, then their medians as
# table rows and one record.
pooler_clients() {
  local clients=$1 round offset i n=${#pooler_variants[@]} variant errors=0
  local runs_direct=() runs_unnamed=() runs_pgbouncer=() runs_previous=()
  for round in $(seq 1 "$rounds"); do
    offset=$(( (round - 1) % n ))
    for i in $(seq 0 $(( n - 1 ))); do
      variant=${pooler_variants[$(( (offset + i) % n ))]}
      log "pooler, $clients clients, round $round/$rounds: $variant"
      pooler_run "$variant" "$clients"
    done
  done
  local direct direct_p50 direct_p99 unnamed unnamed_p50 unnamed_p99 pooled pooled_p50 pooled_p99
  read -r direct direct_p50 direct_p99 _ < <(pick "${runs_direct[@]}")
  read -r unnamed unnamed_p50 unnamed_p99 _ < <(pick "${runs_unnamed[@]}")
  read -r pooled pooled_p50 pooled_p99 _ < <(pick "${runs_pgbouncer[@]}")
  local r_pooled r_unnamed r_bouncer
  r_pooled=$(ratio "$pooled" "$direct"); r_unnamed=$(ratio "$unnamed" "$direct")
  r_bouncer=$(ratio "$pooled" "$unnamed")
  row "PgBouncer c=$clients|$pooled req/s p50 ${pooled_p50}ms p99 ${pooled_p99}ms|direct $direct req/s p99 ${direct_p99}ms|$r_pooled $(verdict "$r_pooled" 0.85)"
  row "  direct, unnamed statements c=$clients|$unnamed req/s p50 ${unnamed_p50}ms p99 ${unnamed_p99}ms|direct $direct req/s|$r_unnamed"
  row "  PgBouncer vs unnamed direct c=$clients|$pooled req/s|unnamed $unnamed req/s|$r_bouncer"
  local previous_fields=()
  [ ${#runs_previous[@]} -eq 0 ] || pooler_previous "$clients" "$direct" "${runs_previous[@]}"
  record pooler clients="$clients" rounds="$rounds" backlog_rows="$backlog" \
    pgbouncer_pool="${BENCH_PGBOUNCER_POOL:-16}" errors="$errors" \
    direct_rps="$direct" direct_rps_rounds="$(firsts "${runs_direct[@]}")" \
    direct_p50_ms="$direct_p50" direct_p99_ms="$direct_p99" \
    unnamed_rps="$unnamed" unnamed_rps_rounds="$(firsts "${runs_unnamed[@]}")" \
    unnamed_p50_ms="$unnamed_p50" unnamed_p99_ms="$unnamed_p99" \
    pgbouncer_rps="$pooled" pgbouncer_rps_rounds="$(firsts "${runs_pgbouncer[@]}")" \
    pgbouncer_p50_ms="$pooled_p50" pgbouncer_p99_ms="$pooled_p99" \
    ratio_to_direct="$r_pooled" unnamed_ratio_to_direct="$r_unnamed" \
    ratio_to_unnamed="$r_bouncer" target=0.85 "${previous_fields[@]}"
}

# pooler_previous CLIENTS DIRECT_RPS RUNS...: the direct path against the earlier
# build's; sets the caller's previous_fields for its record.
pooler_previous() {
  local clients=$1 direct=$2 previous previous_p99 r; shift 2
  read -r previous _ previous_p99 _ < <(pick "$@")
  r=$(ratio "$direct" "$previous")
  row "  direct vs previous build c=$clients|$direct req/s|previous $previous req/s p99 ${previous_p99}ms|$r $(verdict "$r" 0.95)"
  previous_fields=(previous_api="$BENCH_PREVIOUS_API" previous_rps="$previous"
    previous_rps_rounds="$(firsts "$@")" previous_p99_ms="$previous_p99"
    direct_ratio_to_previous="$r" direct_target=0.95)
}

# pooler_run VARIANT CLIENTS: one wrk run on tables brought back to the steady state,
# its "rps p50_ms p99_ms errors" added to the caller's runs_VARIANT, its errors to the
# caller's errors. The API starts afresh for each run, so that the idle pools of the
# other variants hold no server connections meanwhile.
pooler_run() {
  local variant=$1 clients=$2
  local -n into="runs_$variant"
  # The fill and VACUUM may outlast the database's 5 s bound on a busy machine.
  PGOPTIONS="-c statement_timeout=0" steady "$pooler_direct_url" project
  case "$variant" in
    direct) start_api "$pooler_direct_url" --db-pooler none ;;
    unnamed) start_api "$pooler_direct_url" --db-pooler transaction ;;
    pgbouncer) start_api "$pooler_pooled_url" --db-pooler transaction ;;
    previous) start_api_binary "$BENCH_PREVIOUS_API" "$pooler_direct_url" ;;
  esac
  into+=("$(run_wrk "$clients" scripts/bench/new_charges.lua)")
  stop_api
  errors=$(( errors + $(awk '{print $4}' <<<"${into[-1]}") ))
}
