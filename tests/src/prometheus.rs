//! The tools of Debian's prometheus package, promtool and prometheus: found at `$PROMTOOL`
//! / `$PROMETHEUS`, else on PATH, else in the copy `make deps` unpacks into
//! `${XDG_CACHE_HOME:-~/.cache}/charges-tools/prometheus`.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::json;

use crate::manifests::repo;
use crate::scratch::Scratch;

/// A tool of Debian's prometheus package: `$env`, else PATH, else `make deps`' copy.
pub fn tool(name: &str, env: &str) -> PathBuf {
    if let Some(path) = std::env::var_os(env).filter(|p| !p.is_empty()) {
        return PathBuf::from(path);
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    if let Some(found) = std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
    {
        return found;
    }
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache")
        });
    let cached = cache.join("charges-tools/prometheus/usr/bin").join(name);
    assert!(
        cached.is_file(),
        "{name} not found (${env}, PATH, {}): run `make deps`",
        cached.display()
    );
    cached
}

pub fn promtool() -> PathBuf {
    tool("promtool", "PROMTOOL")
}

/// Runs `tool` with `args` in the repository; its success and its output.
pub fn run(tool: &Path, args: &[&str]) -> (bool, String) {
    let output = Command::new(tool)
        .args(args)
        .current_dir(repo())
        .output()
        .unwrap_or_else(|e| panic!("run {}: {e}", tool.display()));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.success(), text)
}

/// `promtool check rules` on a rule file of one recording rule per (name, expression):
/// whether every expression parses, and promtool's output (it names the failing rule).
pub fn check_expressions(expressions: &[(String, String)]) -> (bool, String) {
    let rules: Vec<_> = expressions
        .iter()
        .map(|(record, expr)| json!({"record": record, "expr": expr}))
        .collect();
    let file = json!({"groups": [{"name": "expressions", "rules": rules}]});
    let scratch = Scratch::new("charges-promql");
    // A JSON document is a YAML document.
    let path = scratch.path().join("rules.yaml");
    std::fs::write(&path, file.to_string()).expect("write the rule file");
    run(&promtool(), &["check", "rules", &path.to_string_lossy()])
}
