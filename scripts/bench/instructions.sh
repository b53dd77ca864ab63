# Stage instructions: what creating a charge costs the server, in instructions
# (valgrind's callgrind counts them; unlike seconds they do not drift with what else the
# machine runs), for the one call of each design on a server of the stage's own:
#   - fused:    charges_create_once as before the split (migrations-before-split, V1–V15),
#               the key's SQL, the charge and the outbox row inline in one function;
#   - claim:    charges_create_idempotent (charges V2), composing the mechanisms'
#               idempotency_key_claim and outbox_append: what the API runs;
#   - reserve:  charges_create_once (charges V1), composing idempotency_key_reserve,
#               idempotency_key_complete and outbox_append.
# Each is called with the same arguments and fresh keys, `SELECT * FROM f(…)`, prepared,
# in one psql session; a backend's total for INSTRUCTIONS_CALLS calls minus that for a
# fifth as many, over the difference, is one call without the session's start and the
# first calls' compilation. Target: claim ≤ 1.05× fused (the ≥ 0.95 throughput target of
# new charges, for the server's part). PG_BINDIR chooses the server binaries.

# Absolute: the server resolves paths from its data directory, callgrind from its cwd.
instructions_dir="$PWD/$out_dir/instructions"
instructions_calls="${INSTRUCTIONS_CALLS:-1000}"

# The stage's server, every backend under callgrind (one profile per process).
instructions_start_server() {
  command -v valgrind >/dev/null 2>&1 || { echo "bench: the instructions stage needs valgrind (make bench-deps)" >&2; exit 2; }
  [ -x "$server_bindir/initdb" ] ||
    { echo "bench: the instructions stage needs the Postgres server binaries (PG_BINDIR)" >&2; exit 2; }
  rm -rf "$instructions_dir"
  mkdir -p "$instructions_dir/profiles"
  [ "$(id -u)" = 0 ] && chown -R postgres "$instructions_dir"
  as_server "$server_bindir/initdb" --auth=trust --username=postgres -E UTF8 \
    -D "$instructions_dir/data" >/dev/null
  instructions_port=$(free_port 5480)
  as_server valgrind --tool=callgrind --trace-children=yes \
    --callgrind-out-file="$instructions_dir/profiles/%p" \
    "$server_bindir/postgres" -D "$instructions_dir/data" -p "$instructions_port" \
    -k "$instructions_dir" -c listen_addresses= -c fsync=off -c synchronous_commit=off \
    -c autovacuum=off >"$instructions_dir/server.log" 2>&1 &
  instructions_pid=$!
  pids+=("$instructions_pid")
  wait_until 300 "the callgrind server" pg_isready -q -h "$instructions_dir" -p "$instructions_port"
  instructions_url="postgres://postgres@/postgres?host=$instructions_dir&port=$instructions_port"
}

instructions_stop_server() {
  as_server "$server_bindir/pg_ctl" stop -D "$instructions_dir/data" -m fast >/dev/null || true
  stop_pids "$instructions_pid"
}

# instructions_databases: `fused` migrated with the pre-split files, `composed` by this
# build's charges-api (every set: idempotency, outbox, charges).
instructions_databases() {
  local base="postgres://postgres@/%s?host=$instructions_dir&port=$instructions_port" file
  psql_on "$instructions_url" -c "CREATE DATABASE fused" -c "CREATE DATABASE composed"
  for file in $(ls crates/charges-store/migrations-before-split/V*.sql | sort -t V -k 2 -n); do
    psql_on "$(printf "$base" fused)" -f "$file" >/dev/null
  done
  "$bin/charges-api" --database-url "$(printf "$base" composed)" migrate >/dev/null
}

# instructions_script FUNCTION CALLS: one psql session that prints its backend's pid,
# then prepares FUNCTION's call with the API's values (charges-bench's) and runs it CALLS
# times with fresh keys and ids.
instructions_script() {
  local call="EXECUTE create_charge(gen_random_uuid()::text, gen_random_uuid(), gen_random_uuid());"
  printf '%s\n' 'SELECT pg_backend_pid() AS pid \gset' '\echo :pid' '\o /dev/null'
  printf 'PREPARE create_charge(text, uuid, uuid) AS SELECT * FROM %s(' "$1"
  printf '%s' "\$1, '/charges', '$(printf %064d 0)', 86400000, 201, "
  printf '%s' "'[[\"location\",\"/charges/01a2384a-d032-7351-a2c2-20c6b45c2233\"]]', "
  printf '%s' "'{\"id\":\"01a2384a-d032-7351-a2c2-20c6b45c2233\",\"amountCents\":4900,\"currency\":\"EUR\",\"createdAt\":\"2026-12-02T19:45:56.783080Z\"}', "
  printf '%s' "\$2, 4900, 'EUR', now(), NULL, \$3, 'charge', 'ChargeCreated', 1, "
  printf '%s' "'{\"eventId\":\"01a2384a-d032-7351-a2c2-20c7a23be555\",\"chargeId\":\"01a2384a-d032-7351-a2c2-20c6b45c2233\",\"amountCents\":4900,\"currency\":\"EUR\",\"occurredAt\":\"2026-12-02T19:45:56.783080Z\"}', "
  printf '%s\n' "'00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01', NULL, '3f1c2d9e-8a41-4b6c-9d2e-5a7b8c9d0e1f');"
  awk -v n="$2" -v line="$call" 'BEGIN { for (i = 0; i < n; i++) print line }'
}

# instructions_backend DATABASE FUNCTION CALLS: the instructions of one session's backend
# for CALLS calls. Callgrind writes a backend's profile as it exits, totals last.
instructions_backend() {
  local database=$1 function=$2 calls=$3 pid
  instructions_script "$function" "$calls" >"$instructions_dir/$function.sql"
  pid=$(psql -qtAX -v ON_ERROR_STOP=1 -h "$instructions_dir" -p "$instructions_port" -U postgres \
    -d "$database" -f "$instructions_dir/$function.sql" | head -n 1)
  [ -n "$pid" ] || { echo "bench: the calls of $function on $database failed" >&2; exit 1; }
  wait_until 120 "the profile of $function's backend" grep -q '^totals:' "$instructions_dir/profiles/$pid"
  sed -n 's/^totals: *//p' "$instructions_dir/profiles/$pid"
}

# instructions_per_call DATABASE FUNCTION: one call's instructions.
instructions_per_call() {
  local few many
  few=$(instructions_backend "$1" "$2" $(( instructions_calls / 5 )))
  many=$(instructions_backend "$1" "$2" "$instructions_calls")
  echo $(( (many - few) / (instructions_calls - instructions_calls / 5) ))
}

stage_instructions() {
  instructions_start_server
  instructions_databases
  local fused claim reserve
  log "instructions: fused (before the split)"
  fused=$(instructions_per_call fused charges_create_once)
  log "instructions: claim (charges_create_idempotent)"
  claim=$(instructions_per_call composed charges_create_idempotent)
  log "instructions: reserve and complete (charges_create_once, charges V1)"
  reserve=$(instructions_per_call composed charges_create_once)
  instructions_stop_server
  section "server instructions per new charge (callgrind), fused function = 1 (target ≤ 1.05)"
  local r_claim r_reserve
  r_claim=$(ratio "$claim" "$fused")
  r_reserve=$(ratio "$reserve" "$fused")
  row "charges_create_idempotent (claim + append)|$claim|fused $fused|$r_claim $(awk -v r="$r_claim" 'BEGIN { print (r <= 1.05) ? "✔" : "✘" }')"
  row "charges_create_once, V1 (reserve + complete + append)|$reserve|fused $fused|$r_reserve"
  record instructions fused="$fused" claim="$claim" reserve_complete="$reserve" calls="$instructions_calls" \
    claim_to_fused="$r_claim" reserve_complete_to_fused="$r_reserve" target=1.05
}
