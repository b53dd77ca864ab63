# Stage pooler: POST /charges (wrk, fresh random keys) through PgBouncer in transaction
# pooling against the API talking to Postgres directly, in alternating rounds on one
# database whose sessions the server bounds itself (statement_timeout 5 s,
# idle_in_transaction_session_timeout 10 s, as `--db-pooler transaction` requires; the
# direct API asks for the same bounds on its connections), steady-state tables:
#   direct     --db-pooler none: statements prepared once per connection (the floor);
#   unnamed    --db-pooler transaction straight to Postgres: every statement sent
#              unnamed, parsed and planned per execution; unnamed / direct is what the
#              statement design costs without any pooler;
#   shipped    what deploy/ ships: --db-pooler transaction-prepared through the pinned
#              PgBouncer (deploy/podman/pgbouncer-source.env; `make deps` builds it for
#              the host) with the [pgbouncer] settings of deploy/k8s's pgbouncer.ini
#              (pool_mode = transaction, max_prepared_statements, …) but where it
#              listens, how it authenticates and TLS, and BENCH_PGBOUNCER_POOL server
#              connections (the shipped pool is sized for a fleet): statements prepared
#              through the pooler; target ≥ 0.85 of direct;
#   shipped-local  the same PgBouncer and settings reaching Postgres through the
#              server's Unix socket, as a pooler on the database host does (the others,
#              like a pooler Deployment, over TCP); only when the server is on this machine;
#   pgbouncer  --db-pooler transaction through Debian bookworm's PgBouncer 1.18, which
#              keeps no prepared statements (pool_mode = transaction, BENCH_PGBOUNCER_POOL
#              server connections, every other setting at its default): what a pooler
#              without them costs;
#   previous   only with BENCH_PREVIOUS_API=<charges-api binary of an earlier build>:
#              that API, direct, with the same pool and workers; direct / previous says
#              whether the direct path changed (target ≥ 0.95).
# BENCH_POOLER_VARIANTS runs only some of them (direct always runs: it is the floor),
# e.g. "direct previous" with more rounds to settle the direct path's figure alone.
# Each round runs every variant, starting one further along the list each round, so
# that no variant always runs first or last after the machine's other work.

pooler_db=charges_bench_pooler

stage_pooler() {
  local clients variant
  pooler_direct_url=$(new_database "$pooler_db")
  psql_on "$pooler_direct_url" \
    -c "ALTER DATABASE $pooler_db SET statement_timeout = '5s'" \
    -c "ALTER DATABASE $pooler_db SET idle_in_transaction_session_timeout = '10s'"
  pooler_variants=(direct)
  for variant in ${BENCH_POOLER_VARIANTS:-shipped shipped-local pgbouncer unnamed previous}; do
    case "$variant" in
      direct) ;;
      unnamed | pgbouncer | shipped | shipped-local) pooler_variants+=("${variant/-/_}") ;;
      previous) [ -z "${BENCH_PREVIOUS_API:-}" ] || pooler_variants+=(previous) ;;
      *) echo "bench: no pooler variant $variant (direct shipped shipped-local pgbouncer unnamed previous)" >&2; exit 2 ;;
    esac
  done
  if [[ " ${pooler_variants[*]} " == *" pgbouncer "* ]]; then
    command -v pgbouncer >/dev/null 2>&1 ||
      { echo "bench: the pgbouncer variant needs Debian's pgbouncer (apt-get install pgbouncer)" >&2; exit 2; }
    start_pgbouncer pgbouncer "" ""
    pooler_pooled_url=$pgbouncer_url
  fi
  local shipped_settings
  shipped_settings=$(shipped_pgbouncer_settings)
  if [[ " ${pooler_variants[*]} " == *" shipped "* ]]; then
    [ -x "$pgbouncer_shipped" ] ||
      { echo "bench: the shipped variants need $pgbouncer_shipped (make deps builds it)" >&2; exit 2; }
    start_pgbouncer "$pgbouncer_shipped" "$shipped_settings" ""
    pooler_shipped_url=$pgbouncer_url
  fi
  if [[ " ${pooler_variants[*]} " == *" shipped_local "* ]]; then
    local socket_dir
    [ -x "$pgbouncer_shipped" ] ||
      { echo "bench: the shipped variants need $pgbouncer_shipped (make deps builds it)" >&2; exit 2; }
    socket_dir=$(psql_on "$server_url" -tAc "SHOW unix_socket_directories" | cut -d, -f1)
    [ -S "$socket_dir/.s.PGSQL.$(psql_on "$server_url" -tAc "SHOW port")" ] ||
      { echo "bench: shipped-local needs the server's Unix socket on this machine ($socket_dir)" >&2; exit 2; }
    start_pgbouncer "$pgbouncer_shipped" "$shipped_settings" "$socket_dir"
    pooler_shipped_local_url=$pgbouncer_url
  fi
  section "new charges through PgBouncer vs direct (target ≥ 0.85)"
  for clients in 8 32; do
    pooler_clients "$clients"
  done
  stop_pids "${pgbouncer_pids[@]}"
  rm -rf "${pgbouncer_dirs[@]}"
}

# The PgBouncer deploy/ ships: the pinned release, which scripts/deps.sh builds for the
# host with the image's recipe.
source deploy/podman/pgbouncer-source.env
pgbouncer_shipped="${PGBOUNCER_PREPARED:-${XDG_CACHE_HOME:-$HOME/.cache}/charges-tools/pgbouncer-$PGBOUNCER_VERSION/pgbouncer}"
pgbouncer_pids=()
pgbouncer_dirs=()

# shipped_pgbouncer_settings: the [pgbouncer] settings of deploy/k8s's pgbouncer.ini (the
# ConfigMap's block), one `key = value` a line, but those start_pgbouncer sets for
# this machine: where PgBouncer listens, how clients authenticate, TLS.
shipped_pgbouncer_settings() {
  local settings
  settings=$(awk '
    /^  pgbouncer\.ini: \|/ { inside = 1; next }
    inside && !/^    / && !/^[ \t]*$/ { inside = 0 }
    !inside { next }
    { sub(/^    /, "") }
    /^\[/ { section = $0; next }
    section == "[pgbouncer]" && /^[a-z_]+[ \t]*=/ && !/^(listen_|unix_socket_dir|auth_|server_tls_|client_tls_)/
  ' deploy/k8s/pgbouncer-configmap.yaml)
  grep -q '^max_prepared_statements' <<<"$settings" ||
    { echo "bench: deploy/k8s/pgbouncer-configmap.yaml's pgbouncer.ini has no max_prepared_statements" >&2; exit 2; }
  echo "$settings"
}

# start_pgbouncer BINARY EXTRA_SETTING SOCKET_DIR: PgBouncer on a free port in front of
# the server (through its Unix socket in SOCKET_DIR, else over TCP), every setting at its
# default but the pool mode and size and EXTRA_SETTING (so it refuses the `options`
# startup parameter, as a deployment's would); sets pgbouncer_url, adds to
# pgbouncer_pids and pgbouncer_dirs.
start_pgbouncer() {
  local binary=$1 extra=$2 socket_dir=$3 host server_port user listen as_user=() pgbouncer_dir
  read -r host server_port user < <(psql_on "$server_url" -c '\echo :HOST :PORT :USER')
  [ -z "$socket_dir" ] || host=$socket_dir
  listen=$(free_port $(( port + 1 + ${#pgbouncer_pids[@]} * 7 )))
  pgbouncer_dir=$(mktemp -d)
  pgbouncer_dirs+=("$pgbouncer_dir")
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
$extra
INI
  printf '"%s" ""\n' "$user" >"$pgbouncer_dir/userlist.txt"
  # PgBouncer refuses to run as root; it then reads its files as the server's OS user.
  if [ "$(id -u)" = 0 ]; then
    as_user=(-u postgres)
    chmod 755 "$pgbouncer_dir"
    chmod 644 "$pgbouncer_dir"/*
  fi
  "$binary" "${as_user[@]}" "$pgbouncer_dir/pgbouncer.ini" >"$out_dir/pgbouncer-$listen.log" 2>&1 &
  pgbouncer_pids+=($!)
  pids+=($!)
  pgbouncer_url="postgres://$user@127.0.0.1:$listen/$pooler_db"
  wait_until 30 "PgBouncer to accept connections (log: $out_dir/pgbouncer-$listen.log)" \
    psql_on "$pgbouncer_url" -c "SELECT 1"
}

# pooler_clients CLIENTS: BENCH_ROUNDS rounds of every variant, then their medians as
# table rows and one record.
pooler_clients() {
  local clients=$1 round offset i n=${#pooler_variants[@]} variant errors=0
  local runs_direct=() runs_unnamed=() runs_pgbouncer=() runs_shipped=() runs_shipped_local=()
  local runs_previous=()
  for round in $(seq 1 "$rounds"); do
    offset=$(( (round - 1) % n ))
    for i in $(seq 0 $(( n - 1 ))); do
      variant=${pooler_variants[$(( (offset + i) % n ))]}
      log "pooler, $clients clients, round $round/$rounds: $variant"
      pooler_run "$variant" "$clients"
    done
  done
  local fields=() r rps_direct rps_unnamed rps_pgbouncer rps_shipped rps_shipped_local rps_previous
  local p50_direct p50_unnamed p50_pgbouncer p50_shipped p50_shipped_local p50_previous
  local p99_direct p99_unnamed p99_pgbouncer p99_shipped p99_shipped_local p99_previous
  for variant in "${pooler_variants[@]}"; do
    pooler_median "$variant"
  done
  if [ ${#runs_shipped[@]} -gt 0 ]; then
    r=$(ratio "$rps_shipped" "$rps_direct")
    row "shipped: PgBouncer $PGBOUNCER_VERSION, transaction-prepared c=$clients|$rps_shipped req/s p50 ${p50_shipped}ms p99 ${p99_shipped}ms|direct $rps_direct req/s p99 ${p99_direct}ms|$r $(verdict "$r" 0.85)"
    fields+=(shipped_ratio_to_direct="$r" target=0.85)
  fi
  if [ ${#runs_shipped_local[@]} -gt 0 ]; then
    r=$(ratio "$rps_shipped_local" "$rps_direct")
    row "  shipped, Unix socket to Postgres c=$clients|$rps_shipped_local req/s p50 ${p50_shipped_local}ms p99 ${p99_shipped_local}ms|direct $rps_direct req/s p99 ${p99_direct}ms|$r $(verdict "$r" 0.85)"
    fields+=(shipped_local_ratio_to_direct="$r")
  fi
  if [ ${#runs_pgbouncer[@]} -gt 0 ]; then
    r=$(ratio "$rps_pgbouncer" "$rps_direct")
    row "  PgBouncer 1.18 (Debian), unnamed c=$clients|$rps_pgbouncer req/s p50 ${p50_pgbouncer}ms p99 ${p99_pgbouncer}ms|direct $rps_direct req/s p99 ${p99_direct}ms|$r"
    fields+=(ratio_to_direct="$r")
  fi
  if [ ${#runs_unnamed[@]} -gt 0 ]; then
    r=$(ratio "$rps_unnamed" "$rps_direct")
    row "  direct, unnamed statements c=$clients|$rps_unnamed req/s p50 ${p50_unnamed}ms p99 ${p99_unnamed}ms|direct $rps_direct req/s|$r"
    fields+=(unnamed_ratio_to_direct="$r")
  fi
  if [ ${#runs_pgbouncer[@]} -gt 0 ] && [ ${#runs_unnamed[@]} -gt 0 ]; then
    r=$(ratio "$rps_pgbouncer" "$rps_unnamed")
    row "  PgBouncer 1.18 vs unnamed direct c=$clients|$rps_pgbouncer req/s|unnamed $rps_unnamed req/s|$r"
    fields+=(ratio_to_unnamed="$r")
  fi
  if [ ${#runs_previous[@]} -gt 0 ]; then
    r=$(ratio "$rps_direct" "$rps_previous")
    row "  direct vs previous build c=$clients|$rps_direct req/s p99 ${p99_direct}ms|previous $rps_previous req/s p99 ${p99_previous}ms|$r $(verdict "$r" 0.95)"
    fields+=(previous_api="$BENCH_PREVIOUS_API" direct_ratio_to_previous="$r" direct_target=0.95)
  fi
  record pooler clients="$clients" rounds="$rounds" backlog_rows="$backlog" \
    pgbouncer_pool="${BENCH_PGBOUNCER_POOL:-16}" errors="$errors" "${fields[@]}"
}

# pooler_median VARIANT: the median run of the caller's runs_VARIANT into its
# rps_VARIANT, p50_VARIANT and p99_VARIANT, and its record fields.
pooler_median() {
  local variant=$1
  local -n from="runs_$variant" rps="rps_$variant" p50="p50_$variant" p99="p99_$variant"
  read -r rps p50 p99 _ < <(pick "${from[@]}")
  fields+=("${variant}_rps=$rps" "${variant}_rps_rounds=$(firsts "${from[@]}")"
    "${variant}_p50_ms=$p50" "${variant}_p99_ms=$p99")
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
    shipped) start_api "$pooler_shipped_url" --db-pooler transaction-prepared ;;
    shipped_local) start_api "$pooler_shipped_local_url" --db-pooler transaction-prepared ;;
    previous) start_api_binary "$BENCH_PREVIOUS_API" "$pooler_direct_url" ;;
  esac
  into+=("$(run_wrk "$clients" scripts/bench/new_charges.lua)")
  stop_api
  errors=$(( errors + $(awk '{print $4}' <<<"${into[-1]}") ))
}
