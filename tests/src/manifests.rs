//! Reading `deploy/`: the YAML documents of a file, the files a kustomization names.

use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::Value;

/// The repository's root.
pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Every YAML document in `path`.
pub fn documents(path: &Path) -> Vec<Value> {
    let text =
        std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    serde_norway::Deserializer::from_str(&text)
        .map(|document| {
            Value::deserialize(document).unwrap_or_else(|e| panic!("parse {}: {e}", path.display()))
        })
        .filter(|document| !document.is_null())
        .collect()
}

/// The files `dir/kustomization.yaml` names: its resources and its generators' files.
pub fn kustomization_entries(dir: &Path) -> Vec<PathBuf> {
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

/// The Deployments of `deploy/k8s` whose first container runs `binary`.
pub fn deployments_running(binary: &str) -> Vec<Value> {
    kustomization_entries(&repo().join("deploy/k8s"))
        .iter()
        .filter(|path| path.extension().is_some_and(|e| e == "yaml"))
        .flat_map(|path| documents(path))
        .filter(|doc| {
            doc["kind"] == "Deployment"
                && doc["spec"]["template"]["spec"]["containers"][0]["command"][0] == binary
        })
        .collect()
}
