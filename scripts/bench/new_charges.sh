# Stage new_charges: POST /charges (wrk, fresh random keys) against two floors, in
# alternating rounds on steady-state tables (BENCH_BACKLOG rows, settled):
#   - the reference article's transaction on its own schema (reference/): the least
#     work the contract needs, the target's floor;
#   - pgbench running the project's own statements (charges-bench pgbench-script):
#     what HTTP, JSON and the pool add on top of the SQL.

stage_new_charges() {
  local ref_url own_url clients round ref_runs own_runs api_runs errors
  ref_url=$(new_database charges_bench_ref reference)
  own_url=$(new_database charges_bench)
  "$bin/charges-bench" pgbench-script >"$out_dir/charge.pgbench"
  start_api "$own_url"
  section "new charges vs the reference transaction (target ≥ 0.8)"
  for clients in 8 32; do
    ref_runs=(); own_runs=(); api_runs=(); errors=0
    for round in $(seq 1 "$rounds"); do
      log "new charges, $clients clients, round $round/$rounds: reference transaction"
      steady "$ref_url" reference
      ref_runs+=("$(run_pgbench "$ref_url" scripts/bench/reference/charge.pgbench "$clients")")
      log "new charges, $clients clients, round $round/$rounds: our statements (pgbench)"
      steady "$own_url" project
      own_runs+=("$(run_pgbench "$own_url" "$out_dir/charge.pgbench" "$clients")")
      log "new charges, $clients clients, round $round/$rounds: POST /charges"
      steady "$own_url" project
      api_runs+=("$(run_wrk "$clients" scripts/bench/new_charges.lua)")
      errors=$(( errors + $(awk '{print $4}' <<<"${api_runs[-1]}") ))
    done
    local ref own api r_api r_own
    read -r ref ref_p50 ref_p99 < <(pick "${ref_runs[@]}")
    read -r own own_p50 own_p99 < <(pick "${own_runs[@]}")
    read -r api api_p50 api_p99 _ < <(pick "${api_runs[@]}")
    r_api=$(ratio "$api" "$ref"); r_own=$(ratio "$own" "$ref")
    row "new charges c=$clients|$api req/s p50 ${api_p50}ms p99 ${api_p99}ms|reference $ref tps p99 ${ref_p99}ms|$r_api $(verdict "$r_api" 0.8)"
    row "  our SQL (pgbench) c=$clients|$own tps p99 ${own_p99}ms|reference $ref tps|$r_own"
    row "  API vs our SQL c=$clients|$api req/s|our SQL $own tps|$(ratio "$api" "$own")"
    record new_charges clients="$clients" rounds="$rounds" backlog_rows="$backlog" \
      api_rps="$api" api_rps_rounds="$(firsts "${api_runs[@]}")" api_p50_ms="$api_p50" api_p99_ms="$api_p99" \
      api_errors="$errors" reference_tps="$ref" reference_tps_rounds="$(firsts "${ref_runs[@]}")" \
      reference_p99_ms="$ref_p99" own_sql_tps="$own" own_sql_tps_rounds="$(firsts "${own_runs[@]}")" \
      own_sql_p99_ms="$own_p99" ratio_to_reference="$r_api" own_sql_ratio_to_reference="$r_own" \
      ratio_to_own_sql="$(ratio "$api" "$own")" target=0.8
  done
  stop_api
}
