//! `charges-bench`: the pieces of `make bench` (scripts/bench.sh) that need the
//! project's own code.
//!
//! - `pgbench-script` prints what the API runs for a new charge, taken from the store
//!   crate (not retyped): the one call of `charges_create_idempotent`, or (`--variant
//!   statements` and the variants after it) the same work as five statements in a
//!   transaction, with pgbench variables in place of the bind parameters. pgbench
//!   running it is the floor the API's `POST /charges` is compared against.
//! - `produce` sends the outbox's payloads straight to Kafka with the relay's own
//!   producer settings: the broker floor for the relay's throughput.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use charges_domain::CreateCharge;
use clap::{Parser, Subcommand};
use futures::StreamExt;
use pg_outbox::relay::ProducerSettings;
use rdkafka::producer::FutureRecord;

#[derive(Debug, Parser)]
#[command(
    name = "charges-bench",
    version,
    about = "Benchmark helpers for make bench"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Print the pgbench script of one `POST /charges`.
    PgbenchScript {
        /// The transaction as shipped, or with one thing done differently (the cost
        /// table of make bench).
        #[arg(long, value_enum, default_value_t = Variant::AsShipped)]
        variant: Variant,
    },
    /// Print the pgbench script of the relay's database work for one batch: the
    /// claim and the mark, the relay's own statements, with no Kafka in between.
    PgbenchRelayScript {
        #[arg(long, default_value_t = 500)]
        batch_size: u32,
        /// The claim of `--ordering per-aggregate`.
        #[arg(long)]
        ordered: bool,
    },
    /// Publish every outbox payload of a database with the relay's producer settings,
    /// as fast as the producer allows, and print `events=<n> seconds=<s>`.
    Produce {
        #[arg(long, env = "DATABASE_URL")]
        database_url: String,
        #[arg(long, env = "KAFKA_BROKERS")]
        kafka_brokers: String,
        #[arg(long, default_value = "charges.bench")]
        topic: String,
        /// Messages in flight at once.
        #[arg(long, default_value_t = 10_000)]
        in_flight: usize,
    },
}

/// What `pgbench-script` leaves out or does the old way.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Variant {
    /// One call of `charges_create_idempotent`, as the API runs it.
    AsShipped,
    /// The same work as five statements in a transaction, as before V13; the variants
    /// below change one of these statements.
    Statements,
    /// The reservation without `pg_try_advisory_xact_lock`.
    NoAdvisoryLock,
    /// No trace context or request id on the event.
    NoTraceColumns,
    /// The payload as `jsonb` in `payload`, as before V8.
    PayloadJsonb,
    /// The key inserted `STARTED` by the reservation and updated to `COMPLETED` with the
    /// response, as before V11.
    StartedThenCompleted,
}

/// The reservation and completion before V11 (`git log -p migrations/V11*` and the store's
/// history): kept here only so the cost table can measure what writing the key once saves.
const RESERVE_BEFORE_V11: &str = "
WITH lock AS (
    SELECT pg_try_advisory_xact_lock(hashtextextended($2 || ' ' || $1, 0)) AS acquired,
           now() AS now
), reserved AS (
    INSERT INTO idempotency_keys AS k (key, endpoint, request_hash, status, created_at, expires_at)
    SELECT $1, $2, $3, 'STARTED', lock.now, lock.now + $4::bigint * interval '1 millisecond'
      FROM lock
     WHERE lock.acquired
    ON CONFLICT (key, endpoint) DO UPDATE
       SET request_hash = EXCLUDED.request_hash, status = 'STARTED', response_status = NULL,
           response_headers = '{}'::jsonb, response_body = NULL,
           created_at = EXCLUDED.created_at, expires_at = EXCLUDED.expires_at
     WHERE k.status = 'COMPLETED' AND k.expires_at <= now()
    RETURNING 1
)
SELECT lock.acquired, lock.now, EXISTS (SELECT 1 FROM reserved) AS reserved,
       existing.request_hash, existing.status, existing.response_status,
       existing.response_headers, existing.response_body, existing.expires_at
  FROM lock
  LEFT JOIN idempotency_keys existing ON existing.key = $1 AND existing.endpoint = $2";
const COMPLETE_BEFORE_V11: &str = "
UPDATE idempotency_keys
   SET status = 'COMPLETED', response_status = $3, response_headers = $4, response_body = $5
 WHERE key = $1 AND endpoint = $2 AND status = 'STARTED'";

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::PgbenchScript { variant } => {
            pgbench_script(variant).map(|script| print!("{script}"))
        }
        Command::PgbenchRelayScript {
            batch_size,
            ordered,
        } => {
            print!("{}", pgbench_relay_script(batch_size, ordered));
            Ok(())
        }
        Command::Produce {
            database_url,
            kafka_brokers,
            topic,
            in_flight,
        } => produce(&database_url, &kafka_brokers, &topic, in_flight).await,
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("charges-bench: {error}");
            ExitCode::FAILURE
        }
    }
}

/// A statement's text: the project's own ([`charges_store::Sql`]) or one of the bench's.
struct BenchSql(&'static str);

impl From<charges_store::Sql> for BenchSql {
    fn from(sql: charges_store::Sql) -> BenchSql {
        BenchSql(sql.text)
    }
}

impl From<&'static str> for BenchSql {
    fn from(text: &'static str) -> BenchSql {
        BenchSql(text)
    }
}

/// Replaces `$n` bind parameters by pgbench expressions (highest numbers first, so
/// `$1` never eats the front of `$10`).
fn bind(sql: impl Into<BenchSql>, params: &[&str]) -> String {
    let mut out = sql.into().0.to_owned();
    for (index, value) in params.iter().enumerate().rev() {
        out = out.replace(&format!("${}", index + 1), value);
    }
    // pgbench reads one statement per line unless it ends with `;` on the last line.
    let single_line = out.split_whitespace().collect::<Vec<_>>().join(" ");
    format!("{single_line};\n")
}

/// One new charge's values as pgbench expressions.
struct PgbenchValues {
    fingerprint: String,
    key: &'static str,
    charge_id: &'static str,
    event_id: &'static str,
    endpoint: &'static str,
    payload: &'static str,
    body: &'static str,
    location: &'static str,
    ttl_ms: &'static str,
    trace_parent: &'static str,
    request_id: &'static str,
}

impl PgbenchValues {
    fn new() -> Result<PgbenchValues, String> {
        let request = CreateCharge::new(4900, Some("EUR")).map_err(|e| e.to_string())?;
        Ok(PgbenchValues {
            fingerprint: format!("'{}'", request.fingerprint()),
            // Distinct per client and transaction, like the API's fresh keys (random
            // UUIDs, as clients choose them) and ids.
            key: "md5('key-' || :client_id || '-' || :r)::uuid::text",
            charge_id: "md5('charge-' || :client_id || '-' || :r)::uuid",
            event_id: "md5('event-' || :client_id || '-' || :r)::uuid",
            endpoint: "'/charges'",
            // Constant texts of the API's sizes: building them server-side would slow
            // the floor down and flatter the ratio.
            payload: "'{\"eventId\":\"01a2384a-d032-7351-a2c2-20c7a23be555\",\"chargeId\":\"01a2384a-d032-7351-a2c2-20c6b45c2233\",\"amountCents\":4900,\"currency\":\"EUR\",\"occurredAt\":\"2026-12-02T19:45:56.783080Z\"}'",
            body: "'{\"id\":\"01a2384a-d032-7351-a2c2-20c6b45c2233\",\"amountCents\":4900,\"currency\":\"EUR\",\"createdAt\":\"2026-12-02T19:45:56.783080Z\"}'",
            location: "'[[\"location\",\"/charges/01a2384a-d032-7351-a2c2-20c6b45c2233\"]]'",
            ttl_ms: "86400000",
            // The API stores the request's trace and request id with every event.
            trace_parent: "'00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01'",
            request_id: "'3f1c2d9e-8a41-4b6c-9d2e-5a7b8c9d0e1f'",
        })
    }
}

fn pgbench_script(variant: Variant) -> Result<String, String> {
    if variant == Variant::AsShipped {
        return pgbench_one_statement_script();
    }
    let PgbenchValues {
        fingerprint,
        key,
        charge_id,
        event_id,
        endpoint,
        payload,
        body,
        location,
        ttl_ms,
        trace_parent,
        request_id,
    } = PgbenchValues::new()?;
    let fingerprint = fingerprint.as_str();
    let mut script = String::from("\\set r random(1, 9000000000000000000)\nBEGIN;\n");
    let mut reserve = if variant == Variant::StartedThenCompleted {
        bind(RESERVE_BEFORE_V11, &[key, endpoint, fingerprint, ttl_ms])
    } else {
        bind(charges_store::idempotency_keys::RESERVE, &[key, endpoint])
    };
    if variant == Variant::NoAdvisoryLock {
        let lock = reserve
            .find("pg_try_advisory_xact_lock(")
            .ok_or("RESERVE takes no advisory lock")?;
        let end = reserve[lock..]
            .find(", 0))")
            .ok_or("RESERVE's lock call has changed")?;
        reserve.replace_range(lock..lock + end + ", 0))".len(), "true");
    }
    script += &reserve;
    script += &bind(
        charges_store::charges::INSERT,
        &[charge_id, "4900", "'EUR'", "now()", "NULL"],
    );
    let (trace_parent, request_id) = match variant {
        Variant::NoTraceColumns => ("NULL", "NULL"),
        _ => (trace_parent, request_id),
    };
    let mut insert = bind(
        charges_store::outbox::INSERT,
        &[
            event_id,
            "'charge'",
            charge_id,
            "'ChargeCreated'",
            "1",
            payload,
            "now()",
            trace_parent,
            "NULL",
            request_id,
        ],
    );
    if variant == Variant::PayloadJsonb {
        insert = insert.replacen(", data,", ", payload,", 1).replacen(
            payload,
            &format!("{payload}::jsonb"),
            1,
        );
    }
    script += &insert;
    script += &if variant == Variant::StartedThenCompleted {
        bind(COMPLETE_BEFORE_V11, &[key, endpoint, "201", location, body])
    } else {
        bind(
            charges_store::idempotency_keys::COMPLETE,
            &[key, endpoint, fingerprint, "201", location, body, ttl_ms],
        )
    };
    script += "COMMIT;\n";
    Ok(script)
}

/// The charge as the API creates it: one call of `charges_create_idempotent`, with the same
/// values as the statements' script (`pgbench_script`).
fn pgbench_one_statement_script() -> Result<String, String> {
    let values = PgbenchValues::new()?;
    let call = bind(
        charges_store::charges::CREATE_ONCE,
        &[
            values.key,
            values.endpoint,
            &values.fingerprint,
            values.ttl_ms,
            "201",
            values.location,
            values.body,
            values.charge_id,
            "4900",
            "'EUR'",
            "now()",
            "NULL",
            values.event_id,
            "'charge'",
            "'ChargeCreated'",
            "1",
            values.payload,
            values.trace_parent,
            "NULL",
            values.request_id,
        ],
    );
    Ok(format!("\\set r random(1, 9000000000000000000)\n{call}"))
}

fn pgbench_relay_script(batch_size: u32, ordered: bool) -> String {
    // pgbench passes one value from a statement to the next only through `\gset`, so
    // the claimed ids travel as one array, as the relay sends them.
    let claim = if ordered {
        charges_store::outbox::CLAIM_PENDING_ORDERED
    } else {
        charges_store::outbox::CLAIM_PENDING
    };
    // Always from the oldest row ($2 NULL): the floor is the plain statement, without
    // the relay's claim cursor.
    let claim = bind(claim, &[&batch_size.to_string(), "NULL"]);
    let claim = claim.trim_end().trim_end_matches(';');
    let mark = bind(
        charges_store::outbox::MARK_PUBLISHED_MANY,
        &["(:ids)::uuid[]"],
    );
    format!(
        "BEGIN;\nSELECT coalesce(array_agg(id), '{{}}') AS ids FROM ({claim}) claimed \\gset\n{mark}COMMIT;\n"
    )
}

async fn produce(
    database_url: &str,
    brokers: &str,
    topic: &str,
    in_flight: usize,
) -> Result<(), String> {
    let (client, connection) = tokio_postgres::connect(database_url, tokio_postgres::NoTls)
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(connection);
    let rows = client
        .query(
            "SELECT id::text, coalesce(data, payload::text) FROM outbox",
            &[],
        )
        .await
        .map_err(|e| e.to_string())?;
    let messages: Vec<(String, String)> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
    // The relay's own producer settings (client.id included), so that the floor is the
    // relay's producer without the relay.
    let producer = pg_outbox::relay::publish::producer(&ProducerSettings {
        brokers: brokers.to_owned(),
        client_id: "charges-relay".to_owned(),
        publish_timeout: Duration::from_secs(30),
        extra: Vec::new(),
    })
    .map_err(|e| e.to_string())?;
    let started = Instant::now();
    let mut sends = futures::stream::iter(messages.iter().map(|(id, payload)| {
        let producer = &producer;
        async move {
            producer
                .send(
                    FutureRecord::to(topic)
                        .key(id.as_str())
                        .payload(payload.as_str()),
                    Duration::from_secs(30),
                )
                .await
                .map(|_| ())
                .map_err(|(e, _)| e.to_string())
        }
    }))
    .buffer_unordered(in_flight);
    let mut acked = 0usize;
    while let Some(result) = sends.next().await {
        result?;
        acked += 1;
    }
    println!(
        "events={acked} seconds={:.3}",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}
