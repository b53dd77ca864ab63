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
