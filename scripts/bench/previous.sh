# Stage previous: this build against an earlier one (BENCH_PREVIOUS_REF, default
# 0d1f2e4, the last commit before the idempotency layer and the outbox became crates of
# their own), in the same run, in alternating rounds (the build that runs first swapped
# each round), target ≥ 0.95 of the earlier build:
#   - POST /charges (wrk, fresh random keys, 8 and 32 clients) on steady-state tables,
#     direct (--db-pooler none) and through the shipped PgBouncer (--db-pooler
#     transaction-prepared, the pooler stage's `shipped` setup), both APIs with the same
#     flags;
#   - 2 relays at their defaults draining BENCH_RELAY_ROWS pending rows into the mock
#     cluster, unordered, then --ordering per-aggregate with 10 events per charge.
# The earlier build is checked out with `git worktree add --detach` in
# target/bench/previous-src and built (release, 10+ minutes on 2 cores, once per
# commit) in target/bench/previous-target. Each build has a database of its own,
# migrated by its own charges-api: its binaries expect its own schema (the earlier
# readiness reads refinery_schema_history, this one a history per mechanism), and
# running one's functions on the other's tables would not be the earlier build.

source scripts/bench/relay.sh
source scripts/bench/pooler.sh

previous_ref="${BENCH_PREVIOUS_REF:-0d1f2e4}"
previous_src="$out_dir/previous-src"
previous_target="$out_dir/previous-target"
declare -A previous_urls previous_bins

stage_previous() {
  local commit clients path
  commit=$(git rev-parse --verify "$previous_ref^{commit}")
  # Others may commit while the bench runs: the records say which tree this build was.
  current_tree=$(git describe --always --dirty)
  previous_checkout "$commit"
  previous_build "$commit"
  previous_bins=([current]="$bin" [previous]="$previous_target/release")
  previous_databases
  local name=$previous_ref
  [[ "$commit" == "$previous_ref"* ]] || name+=" (${commit:0:7})"
  section "this build vs $name, same run (target ≥ 0.95)"
  for path in direct shipped; do
    for clients in 8 32; do
      previous_new_charges "$commit" "$path" "$clients"
    done
  done
  [ -n "${brokers:-}" ] || start_kafka
  previous_relay "$commit" unordered 1
  previous_relay "$commit" per-aggregate 10
  stop_pids "${pgbouncer_pids[@]}"
  rm -rf "${pgbouncer_dirs[@]}"
}

# previous_checkout COMMIT: the worktree at COMMIT, reused when it already is there. A
# directory without its .git file is no worktree: git would answer for the main one.
previous_checkout() {
  local commit=$1
  if [ -f "$previous_src/.git" ] && [ "$(git -C "$previous_src" rev-parse HEAD)" = "$commit" ]; then
    return 0
  fi
  log "previous: checking out $previous_ref ($commit) in $previous_src"
  git worktree remove --force "$previous_src" 2>/dev/null || rm -rf "$previous_src"
  git worktree prune
  git worktree add -q --detach "$previous_src" "$commit"
}

# previous_build COMMIT: its release binaries, unless the stamp says they are COMMIT's.
# Its own target directory, so that neither build's artefacts evict the other's.
previous_build() {
  local commit=$1 stamp="$previous_target/built-commit" name
  if [ "$(cat "$stamp" 2>/dev/null)" = "$commit" ]; then
    log "previous: $previous_ref's release binaries are built ($previous_target/release)"
    return 0
  fi
  log "previous: building $previous_ref's release binaries in $previous_target (10+ minutes on 2 cores)"
  rm -f "$stamp"
  (cd "$previous_src" && CARGO_TARGET_DIR="$OLDPWD/$previous_target" nice cargo build --release --bins -q)
  for name in charges-api charges-relay; do
    [ -x "$previous_target/release/$name" ] || { echo "bench: the build of $previous_ref made no $name" >&2; exit 1; }
  done
  printf '%s\n' "$commit" >"$stamp"
}

# previous_databases: a database per build, migrated by that build's charges-api, whose
# sessions the server bounds as --db-pooler transaction-prepared requires (statement 5 s,
# idle in transaction 10 s; the direct APIs ask for the same on their connections); one
# shipped PgBouncer in front of both, a pool per database. Sets previous_urls[SIDE.PATH].
previous_databases() {
  local side name
  [ -x "$pgbouncer_shipped" ] ||
    { echo "bench: the previous stage needs $pgbouncer_shipped (make deps builds it)" >&2; exit 2; }
  for side in current previous; do
    name="charges_bench_$side"
    # lib.sh's and relay.sh's helpers run "$bin/<binary>": bin= picks the build.
    previous_urls[$side.direct]=$(bin=${previous_bins[$side]} new_database "$name")
    psql_on "${previous_urls[$side.direct]}" \
      -c "ALTER DATABASE $name SET statement_timeout = '5s'" \
      -c "ALTER DATABASE $name SET idle_in_transaction_session_timeout = '10s'"
  done
  # start_pgbouncer waits for a login to the pooler stage's database; ours exist now.
  pooler_db=charges_bench_current start_pgbouncer "$pgbouncer_shipped" "$(shipped_pgbouncer_settings)" ""
  for side in current previous; do
    previous_urls[$side.shipped]="${pgbouncer_url%/*}/charges_bench_$side"
  done
}

# previous_order ROUND: the two builds in the order they run in ROUND.
previous_order() {
  if [ $(( $1 % 2 )) = 1 ]; then echo previous current; else echo current previous; fi
}

# previous_new_charges COMMIT PATH CLIENTS: BENCH_ROUNDS rounds of both APIs, then the
# medians as one row and one record.
previous_new_charges() {
  local commit=$1 path=$2 clients=$3 round side errors=0 runs_current=() runs_previous=()
  for round in $(seq 1 "$rounds"); do
    for side in $(previous_order "$round"); do
      log "previous, new charges $path, $clients clients, round $round/$rounds: $side"
      previous_charges_run "$side" "$path" "$clients"
    done
  done
  local cur cur_p50 cur_p99 prev prev_p50 prev_p99 r label="direct"
  read -r cur cur_p50 cur_p99 _ < <(pick "${runs_current[@]}")
  read -r prev prev_p50 prev_p99 _ < <(pick "${runs_previous[@]}")
  r=$(ratio "$cur" "$prev")
  [ "$path" = shipped ] && label="PgBouncer $PGBOUNCER_VERSION"
  row "new charges, $label c=$clients|$cur req/s p50 ${cur_p50}ms p99 ${cur_p99}ms|$previous_ref $prev req/s p99 ${prev_p99}ms|$r $(verdict "$r" 0.95)"
  record previous measure=new_charges path="$path" clients="$clients" previous_ref="$previous_ref" \
    previous_commit="$commit" current_tree="$current_tree" rounds="$rounds" backlog_rows="$backlog" errors="$errors" \
    current_rps="$cur" current_rps_rounds="$(firsts "${runs_current[@]}")" current_p50_ms="$cur_p50" \
    current_p99_ms="$cur_p99" previous_rps="$prev" previous_rps_rounds="$(firsts "${runs_previous[@]}")" \
    previous_p50_ms="$prev_p50" previous_p99_ms="$prev_p99" ratio_to_previous="$r" target=0.95
}

# previous_charges_run SIDE PATH CLIENTS: one wrk run against SIDE's API on its tables
# brought back to the steady state, added to the caller's runs_SIDE and errors. The API
# starts afresh for each run, as in the pooler stage, so that the idle pool of the other
# build's API holds no server connections meanwhile.
previous_charges_run() {
  local side=$1 path=$2 clients=$3 pooler=none
  local -n runs="runs_$side"
  [ "$path" = shipped ] && pooler=transaction-prepared
  # The fill and VACUUM may outlast the database's 5 s bound on a busy machine.
  PGOPTIONS="-c statement_timeout=0" steady "${previous_urls[$side.direct]}" project
  start_api_binary "${previous_bins[$side]}/charges-api" "${previous_urls[$side.$path]}" --db-pooler "$pooler"
  runs+=("$(run_wrk "$clients" scripts/bench/new_charges.lua)")
  stop_api
  errors=$(( errors + $(awk '{print $4}' <<<"${runs[-1]}") ))
}

# previous_relay COMMIT ORDERING EVENTS_PER_CHARGE: BENCH_ROUNDS rounds in which each
# build's 2 relays (relay.sh's drain, with that build's binaries) drain relay_rows
# pending rows of its own database; the medians as one row and one record.
previous_relay() {
  local commit=$1 ordering=$2 per=$3 round side secs_current=() secs_previous=()
  for round in $(seq 1 "$rounds"); do
    for side in $(previous_order "$round"); do
      log "previous, relay $ordering, $per event(s) per charge, round $round/$rounds: $side"
      previous_drain "$side" "$ordering" "$per"
    done
  done
  local cur prev r
  cur=$(previous_eps "${secs_current[@]}")
  prev=$(previous_eps "${secs_previous[@]}")
  r=$(ratio "$cur" "$prev")
  row "relay, 2 workers, $ordering, $per ev/charge|$cur events/s|$previous_ref $prev events/s|$r $(verdict "$r" 0.95)"
  record previous measure=relay ordering="$ordering" events_per_charge="$per" workers=2 \
    previous_ref="$previous_ref" previous_commit="$commit" current_tree="$current_tree" rounds="$rounds" rows="$relay_rows" \
    batch_size="$batch" concurrency="$concurrency" current_events_per_s="$cur" \
    current_seconds_rounds="[$(paste -sd, <<<"$(printf '%s\n' "${secs_current[@]}")")]" \
    previous_events_per_s="$prev" \
    previous_seconds_rounds="[$(paste -sd, <<<"$(printf '%s\n' "${secs_previous[@]}")")]" \
    ratio_to_previous="$r" target=0.95
}

# previous_drain SIDE ORDERING EVENTS_PER_CHARGE: SIDE's relays drain a fresh backlog;
# the seconds from their launch to the last mark added to the caller's secs_SIDE.
previous_drain() {
  local side=$1 ordering=$2 per=$3 secs
  local -n drains="secs_$side"
  # Filling, VACUUM and CHECKPOINT may outlast the database's 5 s bound.
  PGOPTIONS="-c statement_timeout=0" pending_only "${previous_urls[$side.direct]}" "$per"
  read -r secs _ < <(bin=${previous_bins[$side]} drain "${previous_urls[$side.direct]}" 2 --ordering "$ordering")
  drains+=("$secs")
}

# previous_eps SECONDS...: relay_rows over the median drain time, in events/s.
previous_eps() {
  awk -v n="$relay_rows" -v s="$(printf '%s\n' "$@" | median)" 'BEGIN { printf "%.1f", n / s }'
}
