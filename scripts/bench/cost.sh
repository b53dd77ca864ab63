# Stage cost: what each part of a new charge's transaction costs. pgbench runs the
# project's statements on the schema as shipped, and on copies with one thing
# removed or done the old way, in alternating rounds (BENCH_COST_CLIENTS clients);
# each variant is reported as its throughput over the shipped one's. The reference
# transaction runs in the same rounds, for scale. BENCH_COST_VARIANTS names a subset.
# The variants that change a statement (their label starts "statements,") change the
# five-statement transaction of before V13: read them against the `statements` row.

# name|what differs|SQL run on the variant's database|pgbench-script --variant
cost_variants=(
  "as-shipped|the schema and statements as shipped (one call of charges_create_idempotent)||as-shipped"
  "statements|the same work as five statements in a transaction (before V13)||statements"
  "notify-always|NOTIFY on every insert (the trigger before V9)|CREATE OR REPLACE FUNCTION outbox_notify_pending() RETURNS trigger LANGUAGE plpgsql AS \$\$ BEGIN PERFORM pg_notify('outbox_pending', ''); RETURN NULL; END; \$\$|as-shipped"
  "no-notify-trigger|no NOTIFY trigger at all|ALTER TABLE outbox DISABLE TRIGGER outbox_notify_pending|as-shipped"
  "no-advisory-lock|statements, RESERVE without pg_try_advisory_xact_lock||no-advisory-lock"
  "no-sequence-index|no outbox_aggregate_type_sequence_idx|DROP INDEX outbox_aggregate_type_sequence_idx|as-shipped"
  "no-expires-index|no idempotency_keys_expires_idx|DROP INDEX idempotency_keys_expires_idx|as-shipped"
  "expires-index-partial|idempotency_keys_expires_idx partial on status = 'COMPLETED' (before V9)|DROP INDEX idempotency_keys_expires_idx; CREATE INDEX idempotency_keys_expires_idx ON idempotency_keys (expires_at) WHERE status = 'COMPLETED'|as-shipped"
  "started-then-completed|statements, the key inserted STARTED, then updated to COMPLETED, at fillfactor 80 (before V11)|ALTER TABLE idempotency_keys SET (fillfactor = 80)|started-then-completed"
  "no-checks|no CHECK constraints on charges and outbox|ALTER TABLE charges DROP CONSTRAINT charges_currency_check, DROP CONSTRAINT charges_amount_cents_check, DROP CONSTRAINT charges_refunded_within_amount; ALTER TABLE outbox DROP CONSTRAINT outbox_published_or_dead, DROP CONSTRAINT outbox_has_payload|as-shipped"
  "headers-text|response_headers as text, not jsonb|ALTER TABLE idempotency_keys ALTER COLUMN response_headers DROP DEFAULT, ALTER COLUMN response_headers TYPE text USING response_headers::text, ALTER COLUMN response_headers SET DEFAULT '{}'|as-shipped"
  "no-trace-columns|statements, no trace context or request id on the event||no-trace-columns"
  "payload-jsonb|statements, the payload as jsonb (before V8)||payload-jsonb"
  "deferred-fk|a deferred foreign key outbox → charges (before V8)|ALTER TABLE outbox ADD CONSTRAINT outbox_aggregate_id_fkey FOREIGN KEY (aggregate_id) REFERENCES charges (id) DEFERRABLE INITIALLY DEFERRED|as-shipped"
  "reference|the reference article's transaction and schema||reference"
)

stage_cost() {
  local clients="${BENCH_COST_CLIENTS:-8}" spec name label sql variant target script
  # BENCH_COST_VARIANTS (names, space-separated) runs only those, as-shipped always.
  if [ -n "${BENCH_COST_VARIANTS:-}" ]; then
    local chosen=()
    for spec in "${cost_variants[@]}"; do
      name=${spec%%|*}
      [[ " as-shipped $BENCH_COST_VARIANTS " == *" $name "* ]] && chosen+=("$spec")
    done
    cost_variants=("${chosen[@]}")
  fi
  declare -A urls scripts runs
  for spec in "${cost_variants[@]}"; do
    IFS='|' read -r name label sql variant <<<"$spec"
    if [ "$variant" = reference ]; then
      target=$(new_database "charges_cost_${name//-/_}" reference)
      scripts[$name]=scripts/bench/reference/charge.pgbench
    else
      target=$(new_database "charges_cost_${name//-/_}")
      [ -z "$sql" ] || psql_on "$target" -c "$sql" >/dev/null
      scripts[$name]="$out_dir/cost-$name.pgbench"
      "$bin/charges-bench" pgbench-script --variant "$variant" >"${scripts[$name]}"
    fi
    urls[$name]=$target
    runs[$name]=""
  done
  for round in $(seq 1 "$rounds"); do
    for spec in "${cost_variants[@]}"; do
      IFS='|' read -r name _ <<<"$spec"
      log "cost, round $round/$rounds: $name"
      if [ "$name" = reference ]; then steady "${urls[$name]}" reference; else steady "${urls[$name]}" project; fi
      runs[$name]+="$(run_pgbench "${urls[$name]}" "${scripts[$name]}" "$clients" | awk '{print $1}') "
    done
  done
  section "where a charge's time goes: pgbench, $clients clients, vs as shipped"
  local base tps r
  base=$(tr ' ' '\n' <<<"${runs[as-shipped]}" | grep . | median)
  for spec in "${cost_variants[@]}"; do
    IFS='|' read -r name label _ <<<"$spec"
    tps=$(tr ' ' '\n' <<<"${runs[$name]}" | grep . | median)
    r=$(ratio "$tps" "$base")
    row "  $name|$tps tps|as shipped $base tps|$r"
    record cost variant="$name" what="$label" clients="$clients" rounds="$rounds" tps="$tps" \
      tps_rounds="[$(tr ' ' '\n' <<<"${runs[$name]}" | grep . | paste -sd,)]" as_shipped_tps="$base" ratio="$r"
  done
  for name in "${!urls[@]}"; do
    psql "$server_url" -qX -c "DROP DATABASE IF EXISTS charges_cost_${name//-/_} WITH (FORCE)" >/dev/null 2>&1 || true
  done
}
