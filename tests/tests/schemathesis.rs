//! schemathesis (property-based API testing, installed with pip by `make deps`) runs
//! against the real `charges-api` with openapi.yaml: schema-valid and schema-invalid
//! requests for every operation (examples, coverage, fuzzing, and stateful sequences
//! that follow `Location` to the created charge), and every check it has: no 5xx,
//! every status, content type, header and body as the file documents, valid data
//! accepted, invalid data refused. Any failure fails the test, with schemathesis'
//! report (each failure with a `curl` line to reproduce it).
//!
//! What the checks cannot know is in tests/schemathesis/: schemathesis.toml (422 is a
//! documented answer to valid data that conflicts with the server's state) and
//! hooks.py (`4900.0` is refused on purpose, though JSON Schema calls it an integer).
//!
//! Bounded and repeatable: a fixed seed, 50 examples per operation, no example database
//! or cache carried between runs, a hard time limit; everything it writes (reports,
//! Hypothesis' directory) goes to a temporary directory, removed when the run passes.
//! Only the API on the loopback interface is contacted.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use charges_tests::{DEADLINE, TestApi, TestDb};
use tokio::process::Command;
use uuid::Uuid;

/// The version `scripts/deps.sh` pins; the flags, check names and configuration keys
/// below are this version's.
const SCHEMATHESIS_VERSION: &str = "4.32.5";

/// Past this the run is killed and the test fails with what it printed so far: a
/// hang guard ([`DEADLINE`]), not an expectation of speed.
const TIME_LIMIT: Duration = DEADLINE;

const MISSING: &str = "schemathesis is missing or not the pinned version: run `make deps` \
                       (scripts/deps.sh pip-installs it); this test never passes without it";

fn repo() -> PathBuf {
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    repo.canonicalize().unwrap_or(repo)
}

/// `python3` running schemathesis' command line: the interpreter `make deps` installed
/// it into, whether or not pip put its `schemathesis` script on PATH. (The package has
/// no `__main__`; this is what that script does.)
fn schemathesis(work_dir: &Path) -> Command {
    let mut command = Command::new("python3");
    command
        .args([
            "-c",
            "import sys; from schemathesis.cli import schemathesis; \
             sys.exit(schemathesis(prog_name='schemathesis'))",
        ])
        .current_dir(work_dir)
        // Hypothesis' directory and anything else relative goes under the run's own
        // directory, never into the repository (and no __pycache__ next to hooks.py).
        .env("HYPOTHESIS_STORAGE_DIRECTORY", work_dir.join(".hypothesis"))
        .env("PYTHONDONTWRITEBYTECODE", "1")
        // Loopback only: no proxy, whatever the environment says.
        .env("NO_PROXY", "*")
        .env("no_proxy", "*")
        .env_remove("SCHEMATHESIS_HOOKS")
        .stdin(Stdio::null())
        .kill_on_drop(true);
    for proxy in ["HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"] {
        command
            .env_remove(proxy)
            .env_remove(proxy.to_ascii_lowercase());
    }
    command
}

#[tokio::test]
async fn schemathesis_finds_no_failure_against_openapi_yaml() {
    let version = schemathesis(&std::env::temp_dir())
        .arg("--version")
        .output()
        .await
        .unwrap_or_else(|e| panic!("cannot run python3 ({e}): {MISSING}"));
    let version = format!(
        "{}{}",
        String::from_utf8_lossy(&version.stdout),
        String::from_utf8_lossy(&version.stderr)
    );
    assert!(
        version.contains(&format!("version {SCHEMATHESIS_VERSION}")),
        "{MISSING}\n{version}"
    );

    let work_dir = std::env::temp_dir().join(format!("charges-schemathesis-{}", Uuid::new_v4()));
    std::fs::create_dir_all(&work_dir).expect("create the run's directory");
    let db = TestDb::new().await;
    let api = TestApi::start(&db, &[]).await;

    let config = repo().join("tests/schemathesis");
    let log_path = work_dir.join("schemathesis.log");
    let log = std::fs::File::create(&log_path).expect("create the log");
    let mut command = schemathesis(&work_dir);
    command
        .env("SCHEMATHESIS_HOOKS", config.join("hooks.py"))
        .arg("--config-file")
        .arg(config.join("schemathesis.toml"))
        .arg("run")
        .arg(repo().join("openapi.yaml"))
        .args(["--url", &api.base_url])
        .args(["--checks", "all"])
        .args(["--phases", "examples,coverage,fuzzing,stateful"])
        .args(["--max-examples", "50"])
        .args(["--seed", "20261203"])
        .args(["--workers", "1"])
        .args(["--generation-database", "none"])
        .args(["--request-timeout", "10"])
        .args(["--report", "junit,har"])
        .arg("--report-dir")
        .arg(work_dir.join("report"))
        // Idempotency-Keys are test data, and a failure's `curl` line must replay it.
        .args(["--output-sanitize", "false"])
        .arg("--no-color")
        .stdout(log.try_clone().expect("clone the log"))
        .stderr(log);
    let command_line = format!("{:?}", command.as_std());
    let started = Instant::now();
    let mut child = command
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run python3 ({e}): {MISSING}"));
    let status = tokio::time::timeout(TIME_LIMIT, child.wait()).await;
    let elapsed = started.elapsed();
    if status.is_err() {
        child.kill().await.expect("kill schemathesis");
    }
    let output = std::fs::read_to_string(&log_path).unwrap_or_default();
    let api_log = api.process.output_text();
    let api_tail: Vec<&str> = api_log.lines().rev().take(60).collect();
    let context = format!(
        "{command_line}\n\n{output}\n\nthe run's files: {}\nthe API's last log lines:\n{}",
        work_dir.display(),
        api_tail.into_iter().rev().collect::<Vec<_>>().join("\n")
    );
    let status = match status {
        Ok(status) => status.expect("wait for schemathesis"),
        Err(_) => panic!("schemathesis ran longer than {TIME_LIMIT:?} and was killed:\n{context}"),
    };
    assert!(!output.contains("No module named"), "{MISSING}\n{output}");
    assert!(
        status.success(),
        "schemathesis reported failures or errors ({status}, {elapsed:.1?}):\n{context}"
    );
    // A run that tested nothing would exit 0 too: its summary must say that every
    // operation in the file was selected and tested.
    let summary = |label: &str| {
        output
            .lines()
            .find_map(|line| line.trim().strip_prefix(label))
            .map(str::trim)
            .unwrap_or_default()
            .to_owned()
    };
    let (selected, total) = summary("Selected:")
        .split_once('/')
        .map(|(s, t)| (s.to_owned(), t.to_owned()))
        .unwrap_or_default();
    assert!(
        !selected.is_empty() && selected == total && summary("Tested:") == selected,
        "schemathesis did not test every operation:\n{context}"
    );
    eprintln!("schemathesis passed in {elapsed:.1?}");
    let _ = std::fs::remove_dir_all(&work_dir);
}
