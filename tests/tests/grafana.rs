//! deploy/grafana/charges.json, the Grafana dashboard: importable as it is (a Prometheus
//! datasource variable that every panel and the `job` variable use, unique panel ids,
//! every panel placed and with a query), every query parses (promtool, with Grafana's
//! variables given values) and names only metrics the binaries export.

use std::collections::BTreeSet;

use charges_tests::manifests::repo;
use charges_tests::metrics::assert_only_scraped_names;
use charges_tests::{prometheus, promql};
use serde_json::{Value, json};

const DASHBOARD: &str = "deploy/grafana/charges.json";

/// What Grafana puts in place of the variables the queries use; any value of the right
/// kind does for promtool. Longer names first: `$__range` would match `$__range_s`.
const VARIABLES: &[(&str, &str)] = &[
    ("$__rate_interval", "1m"),
    ("$__interval", "15s"),
    ("$__range", "6h"),
    ("$job", "charges-api|charges-relay"),
];

/// How every panel names its datasource: the dashboard's `datasource` variable.
fn datasource() -> Value {
    json!({"type": "prometheus", "uid": "${datasource}"})
}

fn dashboard() -> Value {
    let path = repo().join(DASHBOARD);
    let text =
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{DASHBOARD} is not JSON: {e}"))
}

/// Every panel, those inside collapsed rows too.
fn panels(dashboard: &Value) -> Vec<&Value> {
    let top = dashboard["panels"].as_array().expect("panels");
    top.iter()
        .flat_map(|panel| {
            let nested = panel["panels"].as_array().into_iter().flatten();
            std::iter::once(panel).chain(nested)
        })
        .collect()
}

/// Every query of every panel: (where, for messages; its expression as Grafana would
/// send it, variables replaced).
fn queries(dashboard: &Value) -> Vec<(String, String)> {
    let mut queries = Vec::new();
    for panel in panels(dashboard) {
        for target in panel["targets"].as_array().into_iter().flatten() {
            let place = format!(
                "panel {} \"{}\" query {}",
                panel["id"],
                panel["title"].as_str().unwrap_or_default(),
                target["refId"].as_str().unwrap_or_default()
            );
            let mut expr = target["expr"].as_str().unwrap_or_default().to_owned();
            for (variable, value) in VARIABLES {
                expr = expr.replace(variable, value);
            }
            assert!(
                !expr.contains('$'),
                "{place}: an unknown variable in {expr}"
            );
            queries.push((place, expr));
        }
    }
    queries
}

/// The dashboard's template variable `name`.
fn variable<'a>(dashboard: &'a Value, name: &str) -> &'a Value {
    dashboard["templating"]["list"]
        .as_array()
        .expect("templating.list")
        .iter()
        .find(|variable| variable["name"] == name)
        .unwrap_or_else(|| panic!("no template variable {name}"))
}

/// The metric of the `job` variable's `label_values(<metric>, job)`.
fn job_variable_metric(dashboard: &Value) -> String {
    let query = variable(dashboard, "job")["query"]
        .as_str()
        .expect("the job variable's query");
    let inner = query
        .strip_prefix("label_values(")
        .and_then(|rest| rest.strip_suffix(", job)"))
        .unwrap_or_else(|| panic!("the job variable: {query}"));
    inner.to_owned()
}

/// Importable as it is, through the UI or by provisioning: a standard dashboard whose
/// panels all read the Prometheus the `datasource` variable picks, with unique ids, a
/// place on the grid and at least one query each (rows: none).
#[test]
fn the_dashboard_is_importable_and_every_panel_has_a_query() {
    let dashboard = dashboard();
    assert!(dashboard["title"].is_string() && dashboard["uid"].is_string());
    let schema = dashboard["schemaVersion"].as_u64().expect("schemaVersion");
    assert!(schema >= 36, "schemaVersion {schema}: older than Grafana 9");
    let source = variable(&dashboard, "datasource");
    assert_eq!(
        (&source["type"], &source["query"]),
        (&json!("datasource"), &json!("prometheus"))
    );
    assert_eq!(variable(&dashboard, "job")["datasource"], datasource());

    let mut ids = BTreeSet::new();
    let mut with_queries = 0;
    for panel in panels(&dashboard) {
        let id = panel["id"].as_u64().expect("every panel has an id");
        let title = panel["title"].as_str().unwrap_or_default();
        assert!(ids.insert(id), "panel id {id} ({title}) twice");
        assert!(!title.is_empty(), "panel {id} has no title");
        let grid = &panel["gridPos"];
        for field in ["x", "y", "w", "h"] {
            assert!(grid[field].is_u64(), "{title}: gridPos.{field}");
        }
        let right = grid["x"].as_u64().unwrap_or_default() + grid["w"].as_u64().unwrap_or_default();
        assert!(right <= 24, "{title}: wider than the grid");
        let targets = panel["targets"].as_array().map_or(&[][..], Vec::as_slice);
        if panel["type"] == "row" {
            assert!(targets.is_empty(), "row {title} has queries");
            continue;
        }
        assert_eq!(panel["datasource"], datasource(), "{title}: datasource");
        assert!(!targets.is_empty(), "{title}: no query");
        let mut ref_ids = BTreeSet::new();
        for target in targets {
            let ref_id = target["refId"].as_str().expect("every query has a refId");
            assert!(ref_ids.insert(ref_id), "{title}: refId {ref_id} twice");
            let expr = target["expr"].as_str().unwrap_or_default();
            assert!(!expr.trim().is_empty(), "{title} {ref_id}: an empty query");
            assert!(
                target["datasource"].is_null() || target["datasource"] == datasource(),
                "{title} {ref_id}: datasource"
            );
        }
        with_queries += 1;
    }
    assert!(
        with_queries >= 20,
        "only {with_queries} panels with queries"
    );
}

/// Every query parses: written as recording rules (variables replaced) into a rule file
/// that `promtool check rules` reads.
#[test]
fn promtool_parses_every_dashboard_query() {
    let queries = queries(&dashboard());
    let rules: Vec<(String, String)> = queries
        .iter()
        .enumerate()
        .map(|(i, (_, expr))| (format!("dashboard:query_{i}"), expr.clone()))
        .collect();
    let (ok, output) = prometheus::check_expressions(&rules);
    let legend: Vec<String> = queries
        .iter()
        .enumerate()
        .map(|(i, (place, _))| format!("dashboard:query_{i} = {place}"))
        .collect();
    assert!(
        ok,
        "promtool check rules on the dashboard's queries:\n{output}\n{}",
        legend.join("\n")
    );
}

/// Every metric a query (or the `job` variable) names is one the binaries export, or
/// one Prometheus makes: the binaries run with traffic and their `/metrics` are read.
#[tokio::test]
async fn every_metric_the_dashboard_queries_is_exported() {
    let dashboard = dashboard();
    let mut referenced = vec![(
        "the job variable".to_owned(),
        job_variable_metric(&dashboard),
    )];
    for (place, expr) in queries(&dashboard) {
        let names = promql::metric_names(&expr);
        assert!(!names.is_empty(), "{place}: no metric in {expr}");
        referenced.extend(names.into_iter().map(|name| (place.clone(), name)));
    }
    assert_only_scraped_names(DASHBOARD, &referenced).await;
}
