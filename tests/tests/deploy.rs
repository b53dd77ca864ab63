//! deploy/ and asyncapi.yaml parse, and hang together: every file a kustomization
//! names exists, every manifest is a Kubernetes object, and the probes point at the
//! ports and paths the binaries serve. (No cluster here: this is what can be checked
//! without one.)

use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::Value;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Every YAML document in `path`.
fn documents(path: &Path) -> Vec<Value> {
    let text =
        std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    serde_norway::Deserializer::from_str(&text)
        .map(|document| {
            Value::deserialize(document).unwrap_or_else(|e| panic!("parse {}: {e}", path.display()))
        })
        .filter(|document| !document.is_null())
        .collect()
}

fn kustomization_entries(dir: &Path) -> Vec<PathBuf> {
    let kustomization = &documents(&dir.join("kustomization.yaml"))[0];
    let mut entries = Vec::new();
    for resource in kustomization["resources"].as_array().into_iter().flatten() {
        entries.push(dir.join(resource.as_str().expect("resource path")));
    }
    for generator in kustomization["configMapGenerator"]
        .as_array()
        .into_iter()
        .flatten()
    {
        for file in generator["files"].as_array().into_iter().flatten() {
            entries.push(dir.join(file.as_str().expect("file path")));
        }
    }
    entries
}

#[test]
fn every_manifest_parses_and_every_kustomization_entry_exists() {
    let deploy = repo().join("deploy");
    for dir in [deploy.clone(), deploy.join("k8s")] {
        for entry in kustomization_entries(&dir) {
            assert!(
                entry.exists(),
                "{} names a missing {}",
                dir.display(),
                entry.display()
            );
        }
    }
    let mut manifests = 0;
    for entry in std::fs::read_dir(deploy.join("k8s")).expect("deploy/k8s") {
        let path = entry.expect("dir entry").path();
        if path.extension().and_then(|e| e.to_str()) != Some("yaml") {
            continue;
        }
        for document in documents(&path) {
            assert!(
                document["apiVersion"].is_string(),
                "{}: no apiVersion",
                path.display()
            );
            assert!(document["kind"].is_string(), "{}: no kind", path.display());
            manifests += 1;
        }
    }
    assert!(manifests >= 8, "only {manifests} manifests");
    if deploy.join("prometheus/alerts.yaml").exists() {
        documents(&deploy.join("prometheus/alerts.yaml"));
    }
    let asyncapi = &documents(&repo().join("asyncapi.yaml"))[0];
    assert_eq!(asyncapi["asyncapi"].as_str(), Some("3.0.0"));
}

/// The probes and grace periods match what the binaries do.
#[test]
fn probes_and_grace_periods_match_the_binaries() {
    let k8s = repo().join("deploy/k8s");
    for (file, port, grace_at_least) in [
        // API: 5 s preStop + 20 s SHUTDOWN_TIMEOUT.
        ("api-deployment.yaml", "http", 25),
        // Relay: one batch (5 s publish timeout + margin) and a producer flush.
        ("relay-deployment.yaml", "metrics", 10),
    ] {
        let deployment = &documents(&k8s.join(file))[0];
        let pod = &deployment["spec"]["template"]["spec"];
        let grace = pod["terminationGracePeriodSeconds"]
            .as_i64()
            .expect("grace period");
        assert!(
            grace >= grace_at_least,
            "{file}: grace {grace}s < {grace_at_least}s"
        );
        let container = &pod["containers"][0];
        assert_eq!(
            container["readinessProbe"]["httpGet"]["path"], "/readyz",
            "{file}"
        );
        assert_eq!(
            container["livenessProbe"]["httpGet"]["path"], "/healthz",
            "{file}"
        );
        assert_eq!(
            container["readinessProbe"]["httpGet"]["port"], port,
            "{file}"
        );
        assert!(
            container["resources"]["requests"].is_object(),
            "{file}: no requests"
        );
    }
    let config = &documents(&k8s.join("configmap.yaml"))[0]["data"];
    assert_eq!(config["LISTEN_ADDR"], "0.0.0.0:8080");
    let relay = &documents(&k8s.join("relay-deployment.yaml"))[0];
    assert_eq!(relay["spec"]["replicas"], 2);
    assert_eq!(
        relay["spec"]["template"]["spec"]["containers"][0]["args"],
        serde_json::json!(["--metrics-listen", "0.0.0.0:9091"])
    );
}
