#!/usr/bin/env bash
# make bench: every figure next to a floor measured in the same run on the same
# machine, reported as a ratio (absolute numbers drift on shared machines). Stages
# (scripts/bench/<stage>.sh, each says what it measures), all by default, or those
# BENCH_STAGES names:
#   new_charges  POST /charges vs the reference article's transaction and our own SQL
#   pooler       POST /charges through PgBouncer (transaction pooling) vs direct
#   cost         what each part of our transaction costs (pgbench, one thing removed)
#   replays      replays vs GET /healthz
#   scale        new charges, replays and the relay at 1 and 5 million rows per table
#   retention    purge and cleanup rates while the API runs at full speed
#   relay        relay throughput vs its own SQL and the raw producer; ordered runs
#   latency      commit → broker acknowledgement, idle and under load
#   ha           with a synchronous standby: new charges, the relay with and without its
#                replication gate, commit → ack
#   previous     new charges (direct and through PgBouncer) and the relay vs an earlier
#                build (BENCH_PREVIOUS_REF, built in target/bench/previous-target)
#   instructions the server's instructions per new charge (callgrind): the composed
#                function vs the fused one from before the split
# Writes target/bench/latest.json and target/bench/scale.svg, and prints a table.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh
source scripts/bench/lib.sh
stages="${BENCH_STAGES:-new_charges pooler cost replays scale retention relay latency ha previous instructions}"

cleanup() { restore_cores; stop_pids "${pids[@]}"; }
trap cleanup EXIT INT TERM

log "building release binaries"
cargo build --release --bins -q
mkdir -p "$out_dir"
: >"$results"
: >"$table"
started=$(date +%s)
for stage in $stages; do
  [ -f "scripts/bench/$stage.sh" ] || { echo "bench: no stage $stage (scripts/bench/)" >&2; exit 2; }
  source "scripts/bench/$stage.sh"
done
for stage in $stages; do
  log "stage $stage"
  "stage_$stage"
done
source scripts/bench/report.sh
report "$(( $(date +%s) - started ))"
