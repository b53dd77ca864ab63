//! deploy/prometheus, tested with the real tools: promtool runs the rules' unit tests
//! (alerts.test.yaml) and every alert must have a case that fires and one that stays
//! quiet; the scrape configuration shipped next to the rules (podmonitor.yaml,
//! scrape-config.yaml) gives the pods of deploy/k8s the `job` the rules match on, which
//! a real Prometheus confirms by relabelling those pods; every maintenance `task` a rule
//! names is one a real relay runs.
//!
//! promtool and prometheus: `charges_tests::prometheus`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::Command;

use charges_tests::kafka::TestKafka;
use charges_tests::manifests::repo;
use charges_tests::metrics::scrape_until;
use charges_tests::prometheus::{self, run};
use charges_tests::promql::matched_values;
use charges_tests::scratch::Scratch;
use charges_tests::{DEADLINE, TestDb, poll_within, start_relay};
use serde::Deserialize;
use serde_json::{Value, json};

/// The one YAML document in `relative` (to the repository).
fn yaml(relative: &str) -> Value {
    let path = repo().join(relative);
    let text =
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    serde_norway::from_str(&text).unwrap_or_else(|e| panic!("parse {relative}: {e}"))
}

/// Every rule of alerts.yaml: (alert name, expression).
fn alert_rules() -> Vec<(String, String)> {
    let rules = yaml("deploy/prometheus/alerts.yaml");
    let groups = rules["groups"].as_array().expect("alerts.yaml: groups");
    groups
        .iter()
        .flat_map(|group| group["rules"].as_array().expect("a group's rules"))
        .map(|rule| {
            let name = rule["alert"].as_str().expect("every rule is an alert");
            let expr = rule["expr"].as_str().expect("every rule has an expr");
            (name.to_owned(), expr.to_owned())
        })
        .collect()
}

/// `promtool test rules deploy/prometheus/alerts.test.yaml` passes.
#[test]
fn promtool_unit_tests_of_the_alert_rules_pass() {
    let promtool = prometheus::promtool();
    let (ok, output) = run(
        &promtool,
        &["test", "rules", "deploy/prometheus/alerts.test.yaml"],
    );
    assert!(
        ok && output.contains("SUCCESS"),
        "promtool test rules failed:\n{output}"
    );
}

/// Every alert of alerts.yaml has a promtool case where it fires (non-empty
/// `exp_alerts`) and one where it must not (empty), and every case names a real alert
/// (an empty expectation for a misspelt name would pass without testing anything).
#[test]
fn every_alert_has_a_firing_and_a_quiet_promtool_case() {
    let tests = yaml("deploy/prometheus/alerts.test.yaml");
    assert_eq!(tests["rule_files"], json!(["alerts.yaml"]));
    let alerts: BTreeSet<String> = alert_rules().into_iter().map(|(name, _)| name).collect();
    let mut fires = BTreeSet::new();
    let mut quiet = BTreeSet::new();
    for test in tests["tests"].as_array().expect("tests") {
        for case in test["alert_rule_test"].as_array().into_iter().flatten() {
            let name = case["alertname"].as_str().expect("alertname").to_owned();
            assert!(
                alerts.contains(&name),
                "alerts.test.yaml tests {name}, which alerts.yaml does not define"
            );
            let expected = case["exp_alerts"].as_array().map_or(0, Vec::len);
            if expected > 0 {
                fires.insert(name);
            } else {
                quiet.insert(name);
            }
        }
    }
    let never_fires: Vec<_> = alerts.difference(&fires).collect();
    let never_quiet: Vec<_> = alerts.difference(&quiet).collect();
    assert!(
        never_fires.is_empty(),
        "alerts without a promtool case where they fire (deploy/prometheus/alerts.test.yaml): {never_fires:?}"
    );
    assert!(
        never_quiet.is_empty(),
        "alerts without a promtool case where they stay quiet: {never_quiet:?}"
    );
}

/// A pod as Kubernetes would run it from a template in deploy/k8s.
struct Pod {
    /// The workload's name, the pod's name prefix.
    owner: String,
    labels: BTreeMap<String, String>,
    annotations: BTreeMap<String, String>,
    /// (name, number) of each container port.
    ports: Vec<(String, u16)>,
}

impl Pod {
    fn name_label(&self) -> &str {
        &self.labels["app.kubernetes.io/name"]
    }

    fn asks_to_be_scraped(&self) -> bool {
        self.annotations
            .get("prometheus.io/scrape")
            .map(String::as_str)
            == Some("true")
    }
}

fn string_map(value: &Value) -> BTreeMap<String, String> {
    value
        .as_object()
        .into_iter()
        .flatten()
        .map(|(key, value)| (key.clone(), value.as_str().expect("a string").to_owned()))
        .collect()
}

/// The pods of every workload (an object with `spec.template`) in deploy/k8s.
fn pods() -> Vec<Pod> {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(repo().join("deploy/k8s"))
        .expect("deploy/k8s")
        .map(|entry| entry.expect("dir entry").path())
        .filter(|path| path.extension().and_then(|e| e.to_str()) == Some("yaml"))
        .collect();
    paths.sort();
    let mut pods = Vec::new();
    for path in paths {
        let text = std::fs::read_to_string(&path).expect("read a manifest");
        for document in serde_norway::Deserializer::from_str(&text) {
            let object = Value::deserialize(document).expect("a YAML document");
            let template = &object["spec"]["template"];
            if template.is_null() {
                continue;
            }
            let containers = template["spec"]["containers"].as_array();
            pods.push(Pod {
                owner: object["metadata"]["name"]
                    .as_str()
                    .expect("a name")
                    .to_owned(),
                labels: string_map(&template["metadata"]["labels"]),
                annotations: string_map(&template["metadata"]["annotations"]),
                ports: containers
                    .into_iter()
                    .flatten()
                    .flat_map(|c| c["ports"].as_array().cloned().unwrap_or_default())
                    .map(|port| {
                        let name = port["name"].as_str().unwrap_or_default().to_owned();
                        let number = port["containerPort"].as_u64().expect("containerPort");
                        (name, u16::try_from(number).expect("a port number"))
                    })
                    .collect(),
            });
        }
    }
    let scraped = pods.iter().filter(|pod| pod.asks_to_be_scraped()).count();
    assert!(scraped >= 2, "deploy/k8s: only {scraped} scraped workloads");
    pods
}

/// The `job` values the rules match on: at least the API's and the relay's.
fn alert_jobs() -> BTreeSet<String> {
    let jobs: BTreeSet<String> = alert_rules()
        .iter()
        .flat_map(|(_, expr)| matched_values(expr, "job"))
        .collect();
    assert!(jobs.len() >= 2, "alerts.yaml matches only jobs {jobs:?}");
    jobs
}

/// Whether `names` (a list) holds the namespace deploy/k8s puts the application in.
fn lists_app_namespace(names: &Value) -> bool {
    let namespace = &yaml("deploy/k8s/kustomization.yaml")["namespace"];
    assert!(namespace.is_string(), "deploy/k8s sets no namespace");
    names
        .as_array()
        .is_some_and(|names| names.contains(namespace))
}

/// Whether a Kubernetes label selector (`matchLabels`, `matchExpressions`) selects `labels`.
fn selects(selector: &Value, labels: &BTreeMap<String, String>) -> bool {
    let match_labels = string_map(&selector["matchLabels"]);
    let expressions = selector["matchExpressions"]
        .as_array()
        .into_iter()
        .flatten();
    match_labels.iter().all(|(k, v)| labels.get(k) == Some(v))
        && expressions.into_iter().all(|expression| {
            let value = labels.get(expression["key"].as_str().expect("key"));
            let values: Vec<&str> = expression["values"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|v| v.as_str().expect("a value"))
                .collect();
            let listed = value.is_some_and(|v| values.contains(&v.as_str()));
            match expression["operator"].as_str().expect("operator") {
                "In" => listed,
                "NotIn" => !listed,
                "Exists" => value.is_some(),
                "DoesNotExist" => value.is_none(),
                other => panic!("unknown selector operator {other}"),
            }
        })
}

/// podmonitor.yaml (Prometheus Operator) selects every pod that asks to be scraped,
/// at the port its annotations name, and its `jobLabel` makes `job` the pod's
/// app.kubernetes.io/name: the jobs the rules match on.
#[test]
fn the_podmonitor_gives_the_scraped_pods_the_jobs_the_alerts_match() {
    let monitor = yaml("deploy/prometheus/podmonitor.yaml");
    assert_eq!(monitor["apiVersion"], "monitoring.coreos.com/v1");
    assert_eq!(monitor["kind"], "PodMonitor");
    let spec = &monitor["spec"];
    assert_eq!(spec["jobLabel"], "app.kubernetes.io/name");
    let namespaces = &spec["namespaceSelector"];
    assert!(
        namespaces.is_null()
            || namespaces["any"] == true
            || lists_app_namespace(&namespaces["matchNames"]),
        "the PodMonitor does not look in the application's namespace"
    );
    let endpoints = spec["podMetricsEndpoints"].as_array().expect("endpoints");
    for endpoint in endpoints {
        for relabeling in endpoint["relabelings"].as_array().into_iter().flatten() {
            assert_ne!(
                relabeling["targetLabel"], "job",
                "a relabeling overrides the job jobLabel sets"
            );
        }
    }
    let mut jobs = BTreeSet::new();
    for pod in pods() {
        let selected = selects(&spec["selector"], &pod.labels);
        assert_eq!(
            selected,
            pod.asks_to_be_scraped(),
            "{}: the PodMonitor should select exactly the pods annotated prometheus.io/scrape",
            pod.owner
        );
        if !selected {
            continue;
        }
        // The endpoints whose named port this pod has: one, at the annotated port and path.
        let scraped: Vec<(u16, &str)> = endpoints
            .iter()
            .filter_map(|endpoint| {
                let port = endpoint["port"]
                    .as_str()
                    .expect("endpoints name their port");
                let (_, number) = pod.ports.iter().find(|(name, _)| name == port)?;
                Some((*number, endpoint["path"].as_str().unwrap_or("/metrics")))
            })
            .collect();
        let annotated = (
            pod.annotations["prometheus.io/port"]
                .parse::<u16>()
                .expect("a port annotation"),
            pod.annotations["prometheus.io/path"].as_str(),
        );
        assert_eq!(scraped, [annotated], "{}: scraped at", pod.owner);
        jobs.insert(pod.name_label().to_owned());
    }
    let unmatched: Vec<_> = alert_jobs().difference(&jobs).cloned().collect();
    assert!(
        unmatched.is_empty(),
        "alerts.yaml matches jobs {unmatched:?} the PodMonitor gives no pod (it gives {jobs:?})"
    );
}

/// scrape-config.yaml (plain Prometheus): discovers pods, keeps the annotated ones,
/// and its relabelling copies the pod label app.kubernetes.io/name into `job`, with no
/// later rule touching `job`; the Deployments' label values are the jobs the rules
/// match on.
#[test]
fn the_scrape_config_maps_the_pods_name_label_to_the_jobs_the_alerts_match() {
    let config = yaml("deploy/prometheus/scrape-config.yaml");
    let jobs = config["scrape_configs"].as_array().expect("scrape_configs");
    assert_eq!(jobs.len(), 1, "one scrape job");
    let job = &jobs[0];
    let discovery = &job["kubernetes_sd_configs"][0];
    assert_eq!(discovery["role"], "pod");
    let namespaces = &discovery["namespaces"]["names"];
    assert!(
        namespaces.is_null() || lists_app_namespace(namespaces),
        "the scrape job does not look in the application's namespace"
    );
    let rules = job["relabel_configs"].as_array().expect("relabel_configs");
    let keeps_annotated = rules.iter().any(|rule| {
        rule["action"] == "keep"
            && rule["source_labels"]
                == json!(["__meta_kubernetes_pod_annotation_prometheus_io_scrape"])
            && rule["regex"] == "true"
    });
    assert!(keeps_annotated, "no keep on prometheus.io/scrape: \"true\"");
    let sets_job: Vec<usize> = (0..rules.len())
        .filter(|&i| rules[i]["target_label"] == "job")
        .collect();
    assert_eq!(sets_job.len(), 1, "one rule sets job: {rules:?}");
    let rule = &rules[sets_job[0]];
    assert_eq!(
        rule["source_labels"],
        json!(["__meta_kubernetes_pod_label_app_kubernetes_io_name"])
    );
    // Prometheus' defaults copy the value as it is: action replace, regex (.*), $1.
    for (field, default) in [
        ("action", "replace"),
        ("regex", "(.*)"),
        ("replacement", "$1"),
    ] {
        assert!(
            rule[field].is_null() || rule[field] == default,
            "the job rule's {field} is {}, not {default}",
            rule[field]
        );
    }
    assert!(
        rules.iter().all(|rule| rule["action"] != "labelmap"),
        "a labelmap could overwrite job"
    );
    let produced: BTreeSet<String> = pods()
        .iter()
        .filter(|pod| pod.asks_to_be_scraped())
        .map(|pod| pod.name_label().to_owned())
        .collect();
    let unmatched: Vec<_> = alert_jobs().difference(&produced).cloned().collect();
    assert!(
        unmatched.is_empty(),
        "alerts.yaml matches jobs {unmatched:?} no scraped Deployment's app.kubernetes.io/name gives ({produced:?})"
    );
}

/// The label Kubernetes service discovery derives from a pod label or annotation name.
fn meta_label(prefix: &str, name: &str) -> String {
    let sanitized: String = name
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    format!("__meta_kubernetes_pod_{prefix}_{sanitized}")
}

/// One target per container port, labelled as `kubernetes_sd_configs` role pod labels
/// it (the documented `__meta_kubernetes_pod_*` labels); `ip` is the pod's IP.
fn discovered_targets(pod: &Pod, pod_name: &str, ip: &str) -> Vec<Value> {
    let mut labels = serde_json::Map::new();
    let namespace = &yaml("deploy/k8s/kustomization.yaml")["namespace"];
    labels.insert("__meta_kubernetes_namespace".into(), namespace.clone());
    labels.insert("__meta_kubernetes_pod_name".into(), json!(pod_name));
    labels.insert("__meta_kubernetes_pod_ip".into(), json!(ip));
    for (key, value) in &pod.labels {
        labels.insert(meta_label("label", key), json!(value));
    }
    for (key, value) in &pod.annotations {
        labels.insert(meta_label("annotation", key), json!(value));
    }
    if pod.ports.is_empty() {
        // A pod without declared ports: one target, its IP alone.
        return vec![json!({"targets": [ip], "labels": labels})];
    }
    pod.ports
        .iter()
        .map(|(name, number)| {
            let mut labels = labels.clone();
            labels.insert(
                "__meta_kubernetes_pod_container_port_name".into(),
                json!(name),
            );
            labels.insert(
                "__meta_kubernetes_pod_container_port_number".into(),
                json!(number.to_string()),
            );
            json!({"targets": [format!("{}:{number}", host(ip))], "labels": labels})
        })
        .collect()
}

/// `[ip]` for an IPv6 address, as in a URL; `ip` otherwise.
fn host(ip: &str) -> String {
    if ip.contains(':') {
        format!("[{ip}]")
    } else {
        ip.to_owned()
    }
}

/// Two pods of `pod`'s workload (the `i`th in the list): one with an IPv4 address, one
/// with an IPv6 address (documentation ranges, never scraped successfully).
fn pod_addresses(pod: &Pod, i: usize) -> [(String, String); 2] {
    [
        (format!("{}-v4", pod.owner), format!("192.0.2.{}", i + 1)),
        (format!("{}-v6", pod.owner), format!("2001:db8::{}", i + 1)),
    ]
}

/// A child process killed when dropped.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A real Prometheus runs scrape-config.yaml (with alerts.yaml as its rules) against the
/// pods of deploy/k8s, each once with an IPv4 and once with an IPv6 address, plus a pod
/// of another application: the API and relay pods become targets at their annotated
/// port and path with `job` = their app.kubernetes.io/name, every other pod is dropped.
/// (Debian's Prometheus is built without Kubernetes discovery, so file discovery hands
/// it the labels Kubernetes discovery would; `promtool check config` checks the
/// configuration as shipped wherever promtool knows `kubernetes_sd_configs`.)
#[tokio::test]
async fn prometheus_relabels_the_deployments_pods_to_the_jobs_the_alerts_match() {
    let promtool = prometheus::promtool();
    let prometheus = prometheus::tool("prometheus", "PROMETHEUS");
    let scratch = Scratch::new("charges-alerts");
    let dir = scratch.path();

    let shipped = repo().join("deploy/prometheus/scrape-config.yaml");
    let (ok, output) = run(&promtool, &["check", "config", &shipped.to_string_lossy()]);
    let without_kubernetes_sd = output.contains("field kubernetes_sd_configs not found");
    assert!(
        ok || without_kubernetes_sd,
        "promtool check config scrape-config.yaml:\n{output}"
    );

    // Expected: each pod of deploy/k8s that asks to be scraped, at its annotated port
    // and path, with job = its app.kubernetes.io/name; nothing else.
    let mut pods = pods();
    let mut expected = BTreeMap::new();
    for (i, pod) in pods.iter().enumerate() {
        for (pod_name, ip) in pod_addresses(pod, i) {
            if pod.asks_to_be_scraped() {
                let url = format!(
                    "http://{}:{}{}",
                    host(&ip),
                    pod.annotations["prometheus.io/port"],
                    pod.annotations["prometheus.io/path"]
                );
                expected.insert(pod_name, (pod.name_label().to_owned(), url));
            }
        }
    }
    pods.push(Pod {
        owner: "another-app".into(),
        labels: BTreeMap::from([("app.kubernetes.io/name".into(), "another-app".into())]),
        annotations: BTreeMap::from([
            ("prometheus.io/scrape".into(), "true".into()),
            ("prometheus.io/port".into(), "8080".into()),
        ]),
        ports: vec![("http".into(), 8080)],
    });
    let groups: Vec<Value> = pods
        .iter()
        .enumerate()
        .flat_map(|(i, pod)| {
            pod_addresses(pod, i)
                .into_iter()
                .flat_map(move |(pod_name, ip)| discovered_targets(pod, &pod_name, &ip))
        })
        .collect();
    let discovered = groups.len();
    let targets_file = dir.join("pods.json");
    std::fs::write(&targets_file, Value::Array(groups).to_string()).expect("write pods.json");

    // The shipped job, its discovery swapped for the file (YAML reads JSON).
    let mut config = yaml("deploy/prometheus/scrape-config.yaml");
    let job = &mut config["scrape_configs"][0];
    let discovery = job
        .as_object_mut()
        .expect("a scrape job")
        .remove("kubernetes_sd_configs");
    assert!(discovery.is_some(), "the scrape job discovers pods");
    job["file_sd_configs"] = json!([{"files": [targets_file]}]);
    config["rule_files"] = json!([repo().join("deploy/prometheus/alerts.yaml")]);
    let config_file = dir.join("prometheus.yml");
    std::fs::write(&config_file, config.to_string()).expect("write prometheus.yml");
    let (ok, output) = run(
        &promtool,
        &["check", "config", &config_file.to_string_lossy()],
    );
    assert!(ok, "promtool check config:\n{output}");

    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("a free port")
        .port();
    let log = std::fs::File::create(dir.join("prometheus.log")).expect("a log file");
    let server = KillOnDrop(
        Command::new(&prometheus)
            .arg(format!("--config.file={}", config_file.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}", prometheus.display())),
    );
    let http = reqwest::Client::new();
    let url = format!("http://127.0.0.1:{port}/api/v1/targets?state=any");
    let log_text = || std::fs::read_to_string(dir.join("prometheus.log")).unwrap_or_default();
    // Discovery reaches the scrape manager a few seconds after start.
    let targets = poll_within(DEADLINE, async || {
        let body: Value = http.get(&url).send().await.ok()?.json().await.ok()?;
        let data = &body["data"];
        let seen =
            data["activeTargets"].as_array()?.len() + data["droppedTargets"].as_array()?.len();
        (seen == discovered).then(|| data.clone())
    })
    .await
    .unwrap_or_else(|| {
        panic!(
            "Prometheus never listed {discovered} targets; its log:\n{}",
            log_text()
        )
    });

    let mut active = BTreeMap::new();
    for target in targets["activeTargets"].as_array().expect("active targets") {
        let pod = target["discoveredLabels"]["__meta_kubernetes_pod_name"]
            .as_str()
            .expect("a pod name")
            .to_owned();
        let job = target["labels"]["job"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let url = target["scrapeUrl"]
            .as_str()
            .expect("a scrape URL")
            .to_owned();
        assert!(
            active.insert(pod.clone(), (job, url)).is_none(),
            "{pod} scraped twice"
        );
    }
    assert_eq!(active, expected, "targets after relabelling");
    let jobs: BTreeSet<String> = active.values().map(|(job, _)| job.clone()).collect();
    let unmatched: Vec<_> = alert_jobs().difference(&jobs).cloned().collect();
    assert!(
        unmatched.is_empty(),
        "alerts.yaml matches jobs {unmatched:?} that Prometheus gives no pod ({jobs:?})"
    );
    drop(server);
}

/// Every `task` a rule names is the label of a maintenance job a real relay runs (all of
/// them run at start-up): a misspelt one would keep MaintenanceJobNeverSucceeded firing.
#[tokio::test]
async fn every_task_the_alerts_name_is_a_job_the_relay_runs() {
    let tasks: BTreeSet<String> = alert_rules()
        .iter()
        .flat_map(|(_, expr)| matched_values(expr, "task"))
        .collect();
    assert!(tasks.len() >= 4, "alerts.yaml names only tasks {tasks:?}");
    let db = TestDb::new().await;
    let kafka = TestKafka::new(1).await;
    let (relay, url) = start_relay(&db, &kafka, &[]).await;
    let what = format!("a success of every maintenance job {tasks:?}");
    scrape_until(&reqwest::Client::new(), &url, &what, |text| {
        tasks.iter().all(|task| {
            text.lines().any(|line| {
                line.starts_with("charges_maintenance_last_success_timestamp_seconds{")
                    && line.contains(&format!("task=\"{task}\""))
            })
        })
    })
    .await;
    drop(relay);
}
