//! Load: workers that each submit new keys one after another.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::client::{BaseUrl, KEY_LIMIT, charge_body, http_client, submit};
use super::ledger::{Answer, Ledger};
use crate::{TestApi, new_key};

/// The clients of one scenario against one API: the ledger of what they were told,
/// one HTTP client (a bounded pool of idle connections) and the API's base URL.
pub struct Clients {
    pub ledger: Arc<Ledger>,
    pub http: reqwest::Client,
    pub base: BaseUrl,
}

impl Clients {
    pub fn new(api: &TestApi, idle: usize) -> Clients {
        Clients {
            ledger: Arc::new(Ledger::default()),
            http: http_client(idle),
            base: Arc::new(std::sync::RwLock::new(api.base_url.clone())),
        }
    }

    /// See [`Load`].
    pub fn load(&self, workers: usize, max_keys: usize, pace: Duration, twins: bool) -> Load {
        start_load(
            &self.http,
            &self.base,
            &self.ledger,
            workers,
            max_keys,
            pace,
            twins,
        )
    }

    /// `workers` clients with a new key every 20 ms each, until stopped.
    pub fn steady_load(&self, workers: usize) -> Load {
        self.load(workers, 5_000, Duration::from_millis(20), false)
    }

    /// See [`submit`].
    pub async fn submit(&self, key: &str, body: &str) -> Option<Answer> {
        submit(&self.http, &self.base, key, body, &self.ledger).await
    }
}

/// Workers that each submit new keys one after another (every key to its final
/// answer) until stopped, `max_keys` per worker, or [`KEY_LIMIT`] · 2. With `twins`
/// every eighth key is sent by two clients at once.
pub struct Load {
    stop: Arc<AtomicBool>,
    workers: Vec<tokio::task::JoinHandle<Vec<String>>>,
}

fn start_load(
    http: &reqwest::Client,
    base: &BaseUrl,
    ledger: &Arc<Ledger>,
    workers: usize,
    max_keys: usize,
    pace: Duration,
    twins: bool,
) -> Load {
    let stop = Arc::new(AtomicBool::new(false));
    let deadline = Instant::now() + KEY_LIMIT * 2;
    let workers = (0..workers)
        .map(|worker| {
            let (http, base, ledger, stop) =
                (http.clone(), base.clone(), ledger.clone(), stop.clone());
            tokio::spawn(async move {
                let mut keys = Vec::new();
                while !stop.load(Ordering::SeqCst)
                    && keys.len() < max_keys
                    && Instant::now() < deadline
                {
                    let key = new_key();
                    let body = charge_body(worker * 10_000 + keys.len());
                    if twins && keys.len() % 8 == 0 {
                        // Two clients with the same key and body at once: one executes,
                        // the other gets 409 or the replay.
                        futures::join!(
                            submit(&http, &base, &key, &body, &ledger),
                            submit(&http, &base, &key, &body, &ledger)
                        );
                    } else {
                        submit(&http, &base, &key, &body, &ledger).await;
                    }
                    keys.push(key);
                    if !pace.is_zero() {
                        tokio::time::sleep(pace).await;
                    }
                }
                keys
            })
        })
        .collect();
    Load { stop, workers }
}

impl Load {
    /// Waits until every worker has sent its `max_keys`; returns every key sent.
    pub async fn complete(self) -> Vec<String> {
        let mut keys = Vec::new();
        for worker in self.workers {
            keys.extend(worker.await.expect("load worker"));
        }
        keys
    }

    /// Stops the workers (each finishes its current key) and returns every key sent.
    pub async fn finish(self) -> Vec<String> {
        self.stop.store(true, Ordering::SeqCst);
        self.complete().await
    }
}
