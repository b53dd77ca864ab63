# Sourced by scripts/bench.sh after scripts/lib.sh: the settings and helpers every
# stage (scripts/bench/<stage>.sh) shares. A stage records its results with `record`
# (target/bench/results.jsonl) and its table lines with `row`.

seconds="${BENCH_SECONDS:-10}"
rounds="${BENCH_ROUNDS:-3}"
backlog="${BENCH_BACKLOG:-100000}"
port="${BENCH_PORT:-18090}"
out_dir="target/bench"
bin="target/release"
results="$out_dir/results.jsonl"
table="$out_dir/table.txt"
# Rows of the steady-state fill span the last 23 hours: inside the key TTL (24 h) and
# the outbox retention (7 d), so retention deletes none of them.
span=82800
pids=()

log() { printf '%s bench: %s\n' "$(date +%T)" "$*" >&2; }
field() { sed -n "s/.*$1=\([^ ]*\).*/\1/p" | head -n 1; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "n/a" }'; }
median() { sort -n | awk '{ v[NR] = $0 } END { print v[int((NR + 1) / 2)] }'; }
# verdict RATIO TARGET: "✔" when RATIO ≥ TARGET, else "✘".
verdict() { awk -v r="$1" -v t="$2" 'BEGIN { print (r != "n/a" && r + 0 >= t + 0) ? "✔" : "✘" }'; }
psql_on() { local target=$1; shift; psql "$target" -qtAX -v ON_ERROR_STOP=1 "$@"; }

# json NAME KEY=VALUE...: one result object; values that parse as JSON (numbers,
# arrays) stay JSON, anything else is a string.
json() {
  local args=(--arg name "$1") pair; shift
  for pair in "$@"; do
    if jq -e . >/dev/null 2>&1 <<<"${pair#*=}"; then
      args+=(--argjson "${pair%%=*}" "${pair#*=}")
    else
      args+=(--arg "${pair%%=*}" "${pair#*=}")
    fi
  done
  jq -nc "${args[@]}" '$ARGS.named'
}
record() { json "$@" >>"$results"; }
# row "BENCHMARK|PROJECT|FLOOR|RATIO": one line of the printed table.
row() { printf '%s\n' "$1" >>"$table"; }
section() { row "## $1|||"; }

# The Postgres server binaries the stages that start servers of their own use (ha,
# instructions): PG_BINDIR, else the newest installed.
server_bindir="${PG_BINDIR:-$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)}"

# as_server COMMAND...: as the postgres user when run as root (Postgres refuses root).
as_server() {
  if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

# free_port FROM: the first port from FROM up that nothing on this machine listens on.
free_port() {
  local candidate=$1
  while (exec 3<>"/dev/tcp/127.0.0.1/$candidate") 2>/dev/null; do
    candidate=$(( candidate + 1 ))
  done
  printf '%s\n' "$candidate"
}

stop_pids() {
  local pid
  for pid in "$@"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "$@"; do wait "$pid" 2>/dev/null || true; done
}

# new_database NAME [reference]: a fresh database with the project's schema (or the
# reference article's); prints its URL.
new_database() {
  local name=$1 target
  target=$(database_url "$name")
  recreate_database "$name"
  if [ "${2:-}" = reference ]; then
    psql_on "$target" -f scripts/bench/reference/schema.sql >/dev/null
  else
    DATABASE_URL="$target" "$bin/charges-api" migrate >/dev/null 2>&1
  fi
  printf '%s\n' "$target"
}

# settle URL: statistics current, every row's visibility settled, dirty pages written,
# so that a run neither pays for the fill nor starts mid-checkpoint.
settle() { psql_on "$1" -c "VACUUM (ANALYZE)" -c "CHECKPOINT" >/dev/null; }

# fill_keys FILE ROWS: BENCH_REPLAY_KEYS completed keys of the fill, evenly spread over
# 1..ROWS, one per line (for scripts/bench/replay_keys.lua).
fill_keys() {
  local file=$1 rows=$2 n=${BENCH_REPLAY_KEYS:-10000}
  psql_on "$server_url" -c "SELECT md5('k' || (1 + (i - 1) * ($rows / $n)))::uuid FROM generate_series(1, $n) i" >"$file"
}

# fill URL KIND FROM TO [TOTAL]: adds rows FROM..TO (of TOTAL, default TO) to each
# table (KIND project or reference).
fill() {
  local target=$1 kind=$2 from=$3 to=$4 total=${5:-$4} files=(-f scripts/bench/v7.sql -f scripts/bench/fill.sql)
  [ "$kind" = reference ] && files=(-f scripts/bench/reference/fill.sql)
  [ "$to" -ge "$from" ] || return 0
  psql_on "$target" -v from="$from" -v to="$to" -v total="$total" -v span="$span" "${files[@]}" >/dev/null
}

# steady URL KIND [ROWS]: emptied, then ROWS (BENCH_BACKLOG) rows per table, settled.
# Emptied tables are not neutral: with statistics that say "empty", Postgres may cache
# generic plans that scan sequentially, and every round then slows down as its own
# rows pile up.
steady() {
  local target=$1 kind=$2 rows=${3:-$backlog}
  if [ "$kind" = reference ]; then
    psql_on "$target" -c "TRUNCATE outbox, charges, idempotency_keys" >/dev/null
  else
    psql_on "$target" -c "TRUNCATE refunds, outbox, charges, idempotency_keys" >/dev/null
  fi
  fill "$target" "$kind" 1 "$rows"
  settle "$target"
}

# start_api URL [FLAGS...]: the release API on BENCH_PORT with BENCH_API_WORKERS HTTP
# workers (1: on two cores shared with Postgres, a second worker took CPU from Postgres
# and added cross-thread wake-ups: about 7 % fewer charges); sets api_pid.
start_api() { start_api_binary "$bin/charges-api" "$@"; }
# start_api_binary BINARY URL [FLAGS...]: the same with another build's API.
start_api_binary() {
  local binary=$1 target=$2; shift 2
  RUST_LOG=warn DATABASE_URL="$target" "$binary" serve --listen "127.0.0.1:$port" \
    --db-pool-size "${BENCH_POOL:-32}" --workers "${BENCH_API_WORKERS:-1}" "$@" >"$out_dir/api.log" 2>&1 &
  api_pid=$!
  pids+=("$api_pid")
  wait_until 30 "the API to answer /readyz (log: $out_dir/api.log)" http_ok "http://127.0.0.1:$port/readyz"
}
stop_api() { stop_pids "$api_pid"; }

# run_wrk CLIENTS SCRIPT [ENV=VALUE...] → "rps p50_ms p99_ms errors" (errors: socket
# errors and non-2xx answers).
run_wrk() {
  local clients=$1 script=$2 line; shift 2
  line=$(env "$@" wrk -t 2 -c "$clients" -d "${seconds}s" -s "$script" \
    "http://127.0.0.1:$port${WRK_PATH:-/charges}" | grep '^BENCH')
  awk -v n="$(field requests <<<"$line")" -v s="$(field seconds <<<"$line")" \
    -v p50="$(field p50_ms <<<"$line")" -v p99="$(field p99_ms <<<"$line")" \
    -v e="$(( $(field errors <<<"$line") + $(field non2xx <<<"$line") ))" \
    'BEGIN { printf "%.1f %s %s %d\n", n / s, p50, p99, e }'
}

# run_pgbench URL SCRIPT CLIENTS → "tps p50_ms p99_ms" (pgbench -T BENCH_SECONDS).
run_pgbench() {
  local target=$1 script=$2 clients=$3 logdir tps
  logdir=$(mktemp -d)
  (cd "$logdir" && pgbench "$target" -n -M prepared -c "$clients" -j 2 -T "$seconds" \
    -f "$OLDPWD/$script" -l --log-prefix=tx >"$logdir/summary.txt" 2>&1) ||
    { cat "$logdir/summary.txt" >&2; return 1; }
  tps=$(sed -n 's/^tps = \([0-9.]*\).*/\1/p' "$logdir/summary.txt")
  # Field 3 of pgbench's per-transaction log is the latency in microseconds.
  cat "$logdir"/tx.* | awk '{print $3}' | sort -n | awk -v tps="$tps" '
    { v[NR] = $1 } END { printf "%.1f %.3f %.3f\n", tps, v[int(NR * 0.50)] / 1000, v[int(NR * 0.99)] / 1000 }'
  rm -rf "$logdir"
}

# pick RUNS...: of "value rest..." lines, the line of the median value.
pick() {
  local m
  m=$(printf '%s\n' "$@" | awk '{print $1}' | median)
  printf '%s\n' "$@" | awk -v m="$m" '$1 == m' | head -n 1
}
# firsts RUNS...: the first value of each line, as a JSON array.
firsts() { printf '%s\n' "$@" | awk '{printf "%s%.0f", (NR > 1 ? "," : "["), $1} END {print "]"}'; }

# split_cores: Postgres (when it runs on this machine and may be pinned) confined to
# the first half of the cores, and what `launch` starts, and the mock broker, to the
# other half; sets postgres_cores and client_cores. Fails, changing nothing, when
# Postgres cannot be pinned. restore_cores undoes it (bench.sh's exit trap too).
split_cores() {
  local n postmaster
  n=$(nproc)
  postmaster=$(pgrep -xo postgres) && [ "$n" -ge 2 ] || return 1
  postgres_cores="0-$(( n / 2 - 1 ))"
  client_cores="$(( n / 2 ))-$(( n - 1 ))"
  # New backends inherit the postmaster's affinity; the running processes are moved
  # one by one (one may exit meanwhile).
  taskset -a -p -c "$postgres_cores" "$postmaster" >/dev/null 2>&1 || return 1
  cores_split=1
  pin_cores "$postgres_cores" $(pgrep -x postgres)
  [ -z "${KAFKA_PID:-}" ] || pin_cores "$client_cores" "$KAFKA_PID"
  launch=(taskset -c "$client_cores")
}
restore_cores() {
  [ -n "${cores_split:-}" ] || return 0
  local all="0-$(( $(nproc) - 1 ))"
  pin_cores "$all" $(pgrep -x postgres)
  [ -z "${KAFKA_PID:-}" ] || pin_cores "$all" "$KAFKA_PID"
  launch=() cores_split=""
}
# pin_cores CORES PID...: every thread of each PID that is still there.
pin_cores() {
  local cores=$1 pid; shift
  for pid in "$@"; do taskset -a -p -c "$cores" "$pid" >/dev/null 2>&1 || true; done
}
launch=()

# start_kafka: the mock cluster (6 partitions, topic charges.events); sets brokers.
start_kafka() {
  coproc KAFKA { exec "$bin/kafka-mock" --topic charges.events --partitions 6; }
  pids+=("$KAFKA_PID")
  local line
  read -r line <&"${KAFKA[0]}"
  brokers="${line#bootstrap=}"
}

# drained URL SECONDS: waits until no row is pending, from inside the server (one
# session, a cheap probe of the pending index every 50 ms): polling from here with a
# new psql each time, and a count that the planner runs as a parallel scan, took a
# tenth of the CPU the relays compete for. Fails after SECONDS.
drained() {
  PGOPTIONS="-c statement_timeout=${2}s" psql_on "$1" -c "
    DO \$\$ BEGIN
      WHILE EXISTS (SELECT 1 FROM outbox WHERE published_at IS NULL AND dead_at IS NULL) LOOP
        PERFORM pg_sleep(0.05);
      END LOOP;
    END \$\$" >/dev/null 2>&1
}
