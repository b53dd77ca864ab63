//! Reading a binary's `/metrics` (Prometheus text format), and the names every binary
//! exports.

use std::collections::BTreeSet;

use reqwest::StatusCode;

use crate::kafka::TestKafka;
use crate::{
    DEADLINE, TestApi, TestDb, log_field, new_key, poll_within, start_consumer, start_relay,
};

/// The value of the sample `name{labels…}` (labels in any order, all required); 0
/// when the series does not exist yet, as Prometheus' `absent` would treat it.
pub fn sample(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            let (metric, rest) = match series.split_once('{') {
                Some((metric, rest)) => (metric, rest),
                None => (series, ""),
            };
            (metric == name
                && labels
                    .iter()
                    .all(|(k, v)| rest.contains(&format!("{k}=\"{v}\""))))
            .then(|| value.parse::<f64>().ok())
            .flatten()
        })
        .sum()
}

/// `GET url`: 200 with a `text/plain` page; returns the page.
pub async fn scrape(http: &reqwest::Client, url: &str) -> String {
    let response = http.get(url).send().await.expect("GET /metrics");
    assert_eq!(response.status(), StatusCode::OK);
    assert!(
        response.headers()["content-type"]
            .to_str()
            .expect("a text content type")
            .starts_with("text/plain")
    );
    response.text().await.expect("the metrics page")
}

/// Scrapes `url` until `check` holds for the page; returns that page.
pub async fn scrape_until(
    http: &reqwest::Client,
    url: &str,
    what: &str,
    check: impl Fn(&str) -> bool,
) -> String {
    let mut last = String::new();
    let found = poll_within(DEADLINE, async || {
        last = scrape(http, url).await;
        check(&last).then(|| last.clone())
    })
    .await;
    found.unwrap_or_else(|| panic!("never within {DEADLINE:?}: {what}; last scrape:\n{last}"))
}

/// Whether `text` shows a successful run of the maintenance job `task`.
pub fn job_succeeded(text: &str, task: &str) -> bool {
    sample(
        text,
        "charges_maintenance_last_success_timestamp_seconds",
        &[("task", task)],
    ) > 0.0
}

/// Scrapes `url` until the maintenance job `task` has succeeded once; returns that page.
pub async fn scrape_until_job_succeeded(http: &reqwest::Client, url: &str, task: &str) -> String {
    scrape_until(
        http,
        url,
        &format!("maintenance job {task} succeeded"),
        |page| job_succeeded(page, task),
    )
    .await
}

/// What every binary's `/metrics` carries besides its own series: its build info, the
/// process metrics and the database pool (charges-runtime's `metrics::render`).
pub fn assert_exports_build_process_and_pool(text: &str, binary: &str) {
    assert_eq!(
        sample(text, "charges_build_info", &[("binary", binary)]),
        1.0,
        "{binary}: charges_build_info\n{text}"
    );
    for name in [
        "process_cpu_seconds_total",
        "process_resident_memory_bytes",
        "process_open_fds",
        "charges_db_pool_connections",
        "charges_db_pool_idle_connections",
        "charges_db_pool_waiting",
        "charges_db_pool_timeouts_total",
    ] {
        assert!(
            text.lines().any(|l| l.starts_with(name)),
            "{binary}: no {name} in /metrics\n{text}"
        );
    }
    assert!(
        sample(text, "charges_db_pool_max_connections", &[]) > 0.0,
        "{binary}: charges_db_pool_max_connections\n{text}"
    );
}

/// Every series name a `/metrics` page exposes, and the series of each histogram and
/// summary it declares: `_bucket` (histograms; a summary's quantiles carry the family's
/// own name), `_sum` and `_count`.
pub fn exported_names(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut words = rest.split_whitespace();
            let (name, kind) = (words.next().unwrap_or_default(), words.next());
            let suffixes: &[&str] = match kind {
                Some("histogram") => &["_bucket", "_sum", "_count"],
                Some("summary") => &["", "_sum", "_count"],
                _ => &[],
            };
            names.extend(suffixes.iter().map(|suffix| format!("{name}{suffix}")));
        } else if !line.starts_with('#') && !line.trim().is_empty() {
            let end = line.find(['{', ' ']).unwrap_or(line.len());
            names.insert(line[..end].to_owned());
        }
    }
    names
}

/// The series Prometheus itself adds for every scrape target.
const SCRAPE_SERIES: &[&str] = &[
    "up",
    "scrape_duration_seconds",
    "scrape_samples_scraped",
    "scrape_samples_post_metric_relabeling",
    "scrape_series_added",
];

/// Every series name a Prometheus scraping the API, a relay and a consumer would hold:
/// the three binaries run with enough traffic that every family is registered (a
/// charge replayed, conflicting and with an invalid key; published; consumed; every
/// maintenance job run), then their `/metrics` are read; plus Prometheus' own
/// per-target series (`up`, …).
pub async fn names_a_prometheus_would_scrape() -> BTreeSet<String> {
    const BODY: &str = r#"{"amountCents":4900,"currency":"EUR"}"#;
    let db = TestDb::new().await;
    let kafka = TestKafka::new(1).await;
    let api = TestApi::start(&db, &[]).await;
    let key = new_key();
    for body in [BODY, BODY, r#"{"amountCents":1}"#] {
        api.post_charge(Some(&key), body).await;
    }
    api.post_charge(Some("not-a-uuid"), BODY).await;
    let often = [
        "--reconcile-interval",
        "200ms",
        "--cleanup-interval",
        "200ms",
    ];
    let (_relay, relay_url) = start_relay(&db, &kafka, &often).await;
    let consumer = start_consumer(&db, &kafka, &format!("names-{}", new_key()), &[]).await;
    let started = consumer.output_text();
    let line = started
        .lines()
        .find(|l| l.contains("consumer started"))
        .expect("the consumer's start line");
    let consumer_url = format!(
        "http://{}/metrics",
        log_field(line, "metrics_addr").expect("metrics_addr")
    );

    let http = reqwest::Client::new();
    let topic = kafka.topic.as_str();
    let tasks = [
        "outbox_stats",
        "reconcile",
        "purge_expired_keys",
        "delete_published_outbox",
    ];
    let relay_text = scrape_until(
        &http,
        &relay_url,
        "the charge published, every job run",
        |text| {
            sample(text, "charges_relay_published_total", &[("topic", topic)]) == 1.0
                && tasks.iter().all(|task| job_succeeded(text, task))
        },
    )
    .await;
    // Lag comes from librdkafka's statistics, every 5 s.
    let consumer_text = scrape_until(
        &http,
        &consumer_url,
        "the event applied, lag reported",
        |text| {
            sample(
                text,
                "charges_consumer_events_total",
                &[("outcome", "applied")],
            ) == 1.0
                && text.contains("charges_consumer_lag_messages{")
        },
    )
    .await;
    let api_text = scrape(&api.http, &api.url("/metrics")).await;
    [api_text, relay_text, consumer_text]
        .iter()
        .flat_map(|text| exported_names(text))
        .chain(SCRAPE_SERIES.iter().map(|name| (*name).to_owned()))
        .collect()
}

/// Panics unless every `(place, metric)` of `referenced` names a series of
/// [`names_a_prometheus_would_scrape`]; `what` names the places' file in the message.
pub async fn assert_only_scraped_names(what: &str, referenced: &[(String, String)]) {
    let scraped = names_a_prometheus_would_scrape().await;
    let missing: Vec<String> = referenced
        .iter()
        .filter(|(_, metric)| !scraped.contains(metric))
        .map(|(place, metric)| format!("{place}: {metric}"))
        .collect();
    assert!(
        missing.is_empty(),
        "{what} names metrics no binary exports: {missing:?}\nexported: {scraped:?}"
    );
}
