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

/// The ini of deploy/k8s's PgBouncer ConfigMap.
pub fn k8s_pgbouncer_ini() -> PgBouncerIni {
    kustomization_entries(&repo().join("deploy/k8s"))
        .iter()
        .flat_map(|path| documents(path))
        .filter(|doc| doc["kind"] == "ConfigMap")
        .find_map(|doc| {
            doc["data"]["pgbouncer.ini"]
                .as_str()
                .map(PgBouncerIni::parse)
        })
        .expect("a ConfigMap with pgbouncer.ini")
}

/// A PgBouncer ini file (`deploy/k8s/pgbouncer-configmap.yaml`, `deploy/compose/`): its
/// `[pgbouncer]` settings, and its `[databases]` entries with their connection strings
/// split into `key=value` pairs.
#[derive(Debug, Default)]
pub struct PgBouncerIni {
    pub settings: std::collections::BTreeMap<String, String>,
    pub databases: std::collections::BTreeMap<String, std::collections::BTreeMap<String, String>>,
}

impl PgBouncerIni {
    pub fn parse(text: &str) -> PgBouncerIni {
        let mut ini = PgBouncerIni::default();
        let mut section = String::new();
        for line in text.lines().map(str::trim) {
            if line.is_empty() || line.starts_with(';') || line.starts_with('#') {
                continue;
            }
            if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
                section = name.to_owned();
                continue;
            }
            let (key, value) = line
                .split_once('=')
                .unwrap_or_else(|| panic!("pgbouncer.ini: not `key = value`: {line}"));
            let (key, value) = (key.trim().to_owned(), value.trim().to_owned());
            match section.as_str() {
                "databases" => {
                    let pairs = value
                        .split_whitespace()
                        .map(|pair| {
                            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
                            (k.to_owned(), v.to_owned())
                        })
                        .collect();
                    ini.databases.insert(key, pairs);
                }
                "pgbouncer" => {
                    ini.settings.insert(key, value);
                }
                other => panic!("pgbouncer.ini: unexpected section [{other}]"),
            }
        }
        ini
    }

    /// A `[pgbouncer]` setting as a number.
    pub fn number(&self, key: &str) -> u64 {
        self.settings
            .get(key)
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("pgbouncer.ini: {key} is not a number"))
    }
}
