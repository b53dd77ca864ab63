//! The crate graph is the architecture: Postgres plumbing at the bottom, each mechanism
//! on it knowing nothing of the other or of charges, the charges domain on both, the
//! binaries on top. Read off `cargo metadata`, so a dependency added anywhere (normal,
//! dev or build) that points the wrong way fails here.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use charges_tests::manifests::repo;
use serde_json::Value;

const PLUMBING: &str = "pg-plumbing";
/// The building blocks another service adopts.
const MECHANISMS: &[&str] = &["pg-idempotency", "pg-outbox", "pg-inbox"];

fn cargo() -> String {
    std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned())
}

/// `cargo metadata` of the workspace's own packages.
fn workspace_metadata() -> Value {
    let output = std::process::Command::new(cargo())
        .args([
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--offline",
        ])
        .current_dir(repo())
        .output()
        .expect("run cargo metadata");
    assert!(
        output.status.success(),
        "cargo metadata: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("metadata JSON")
}

/// Every workspace package of `metadata` and the workspace packages it depends on, of
/// any kind.
fn workspace_graph(metadata: &Value) -> BTreeMap<String, (PathBuf, BTreeSet<String>)> {
    let packages = metadata["packages"].as_array().expect("packages");
    let members: BTreeSet<&str> = packages.iter().filter_map(|p| p["name"].as_str()).collect();
    packages
        .iter()
        .map(|package| {
            let name = package["name"].as_str().expect("name").to_owned();
            let manifest = PathBuf::from(package["manifest_path"].as_str().expect("manifest"));
            let dir = manifest.parent().expect("package dir").to_owned();
            let depends_on = package["dependencies"]
                .as_array()
                .expect("dependencies")
                .iter()
                .filter_map(|d| d["name"].as_str())
                .filter(|d| members.contains(d))
                .map(str::to_owned)
                .collect();
            (name, (dir, depends_on))
        })
        .collect()
}

#[test]
fn dependencies_point_from_the_domain_down_to_the_mechanisms_and_the_plumbing() {
    let graph = workspace_graph(&workspace_metadata());
    let plumbing = &graph.get(PLUMBING).expect("the plumbing crate").1;
    assert!(plumbing.is_empty(), "{PLUMBING} depends on {plumbing:?}");
    for mechanism in MECHANISMS {
        let (_, depends_on) = graph
            .get(*mechanism)
            .unwrap_or_else(|| panic!("no crate {mechanism}"));
        let allowed = BTreeSet::from([PLUMBING.to_owned()]);
        assert!(
            depends_on.is_subset(&allowed),
            "{mechanism} may build on {PLUMBING} only, not on {:?}",
            depends_on.difference(&allowed).collect::<Vec<_>>()
        );
    }
    // Nothing outside the charges service builds on it: the mechanisms, the plumbing
    // and any other service in the workspace stay usable without charges.
    for (name, (_, depends_on)) in &graph {
        if name.starts_with("charges-") {
            continue;
        }
        let on_charges: Vec<_> = depends_on
            .iter()
            .filter(|d| d.starts_with("charges-"))
            .collect();
        assert!(on_charges.is_empty(), "{name} depends on {on_charges:?}");
    }
    // And the charges service is built on them: its store on the key and the outbox,
    // its consumer on the inbox.
    for (user, mechanism) in [
        ("charges-store", "pg-idempotency"),
        ("charges-store", "pg-outbox"),
        ("charges-consumer", "pg-inbox"),
    ] {
        let depends_on = &graph.get(user).expect("charges crate").1;
        assert!(depends_on.contains(mechanism), "{user} lacks {mechanism}");
    }
}

/// Every file of `dir` but build output, recursively.
fn files_of(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).expect("read dir").flatten() {
        let path = entry.path();
        if path.is_dir() {
            if path.file_name().is_some_and(|n| n != "target") {
                found.extend(files_of(&path));
            }
        } else {
            found.push(path);
        }
    }
    found
}

#[test]
fn the_mechanisms_and_the_plumbing_never_name_charges_or_refunds() {
    let graph = workspace_graph(&workspace_metadata());
    let mut named = Vec::new();
    for name in MECHANISMS.iter().chain([&PLUMBING]) {
        let (dir, _) = &graph[*name];
        for file in files_of(dir) {
            let Ok(text) = std::fs::read_to_string(&file) else {
                continue;
            };
            for (number, line) in text.lines().enumerate() {
                let lower = line.to_lowercase();
                if lower.contains("charge") || lower.contains("refund") {
                    named.push(format!("{}:{}: {line}", file.display(), number + 1));
                }
            }
        }
    }
    assert!(
        named.is_empty(),
        "domain words in the building blocks:\n{}",
        named.join("\n")
    );
}

/// Publishing is a version bump away: each building block's manifest says what it is,
/// and `cargo package` would ship its README, its sources and its migrations.
#[test]
fn every_building_block_packages_its_readme_sources_and_migrations() {
    let metadata = workspace_metadata();
    let graph = workspace_graph(&metadata);
    for name in MECHANISMS.iter().chain([&PLUMBING]) {
        let package = metadata["packages"]
            .as_array()
            .expect("packages")
            .iter()
            .find(|p| p["name"] == *name)
            .unwrap_or_else(|| panic!("no package {name}"));
        for field in ["description", "license", "readme", "documentation"] {
            assert!(
                package[field].as_str().is_some_and(|v| !v.is_empty()),
                "{name} has no {field}"
            );
        }
        for field in ["keywords", "categories"] {
            assert!(
                package[field].as_array().is_some_and(|v| !v.is_empty()),
                "{name} has no {field}"
            );
        }
        assert!(package["publish"].is_null(), "{name} may not be published");

        let listed = std::process::Command::new(cargo())
            .args([
                "package",
                "--list",
                "--allow-dirty",
                "--offline",
                "-p",
                name,
            ])
            .current_dir(repo())
            .output()
            .expect("run cargo package --list");
        assert!(
            listed.status.success(),
            "cargo package --list -p {name}: {}",
            String::from_utf8_lossy(&listed.stderr)
        );
        let files: BTreeSet<String> = String::from_utf8_lossy(&listed.stdout)
            .lines()
            .map(str::to_owned)
            .collect();
        assert!(files.contains("README.md"), "{name}: {files:?}");
        assert!(files.contains("src/lib.rs"), "{name}: {files:?}");
        let (dir, _) = &graph[*name];
        let migrations = dir.join("migrations");
        if migrations.exists() {
            for file in files_of(&migrations) {
                let relative = file.strip_prefix(dir).expect("inside the crate");
                let relative = relative.to_string_lossy().into_owned();
                assert!(
                    files.contains(&relative),
                    "{name} would not ship {relative}"
                );
            }
        }
    }
}
