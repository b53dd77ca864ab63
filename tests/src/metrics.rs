//! Reading a binary's `/metrics` (Prometheus text format).

use reqwest::StatusCode;

use crate::{DEADLINE, poll_within};

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
