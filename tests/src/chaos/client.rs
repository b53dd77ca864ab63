//! Clients as a careful one behaves: every answer recorded in the [`Ledger`].

use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use super::ledger::{Answer, Ledger};

/// How long any one key may take to reach a final answer, retries included.
pub const KEY_LIMIT: Duration = Duration::from_secs(60);
/// Attempts per key (connection errors, 409 and 503 are retried).
const MAX_TRIES: usize = 300;

/// The API's current base URL: a restarted API listens on a new port.
pub type BaseUrl = Arc<RwLock<String>>;

pub fn charge_body(n: usize) -> String {
    format!(
        r#"{{"amountCents":{},"currency":"EUR"}}"#,
        100 + n % 100_000
    )
}

/// A client with a bounded pool of idle connections; concurrency itself is bounded by
/// the callers (a semaphore or a fixed number of workers).
pub fn http_client(idle: usize) -> reqwest::Client {
    reqwest::Client::builder()
        .pool_max_idle_per_host(idle)
        .connect_timeout(Duration::from_secs(5))
        .timeout(Duration::from_secs(30))
        .build()
        .expect("http client")
}

pub async fn post_charge(
    http: &reqwest::Client,
    base: &str,
    key: &str,
    body: &str,
) -> Result<Answer, reqwest::Error> {
    let response = http
        .post(format!("{base}/charges"))
        .header("content-type", "application/json")
        .header("idempotency-key", key)
        .body(body.to_owned())
        .send()
        .await?;
    let headers = response.headers();
    let status = response.status().as_u16();
    let replayed = headers.get("idempotent-replayed").is_some();
    let retry_after = headers
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok());
    let content_type = headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let body = response.text().await?;
    Ok(Answer {
        status,
        replayed,
        retry_after,
        content_type,
        body,
    })
}

/// Sends `key` with `body` until a final answer, as a careful client does: after a
/// connection error it sends the same request again; after a 409 or a 503 it waits
/// `Retry-After` first. At most [`MAX_TRIES`] attempts and [`KEY_LIMIT`]. A final answer
/// other than 201 is a violation (every body sent here is valid).
pub async fn submit(
    http: &reqwest::Client,
    base: &BaseUrl,
    key: &str,
    body: &str,
    ledger: &Ledger,
) -> Option<Answer> {
    let deadline = Instant::now() + KEY_LIMIT;
    for _ in 0..MAX_TRIES {
        if Instant::now() > deadline {
            break;
        }
        let url = base.read().expect("base url").clone();
        let sent_during_outage = ledger.outage();
        match post_charge(http, &url, key, body).await {
            Err(_) => {
                ledger.connection_error();
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Ok(answer) => {
                ledger.record(Some(key), &answer, sent_during_outage);
                match answer.status {
                    409 | 503 => {
                        let wait = answer.retry_after.unwrap_or(1).min(2);
                        tokio::time::sleep(Duration::from_secs(wait)).await;
                    }
                    201 => return Some(answer),
                    other => {
                        ledger.violation(format!(
                            "key {key}: final answer {other} to a valid request: {}",
                            answer.body
                        ));
                        return Some(answer);
                    }
                }
            }
        }
    }
    ledger.violation(format!(
        "key {key}: no final answer within {MAX_TRIES} tries / {KEY_LIMIT:?}"
    ));
    None
}
