//! deploy/ and asyncapi.yaml parse, and hang together: every file a kustomization
//! names exists, every manifest is a Kubernetes object, and the probes point at the
//! ports and paths the binaries serve; the manifests validate against the Kubernetes
//! schemas (kubernetes-validate); every flag and environment variable that the
//! manifests and deploy/docker-compose.yml name is in the binary's `--help` (the
//! documents' configuration tables: configuration.rs). (What can be checked without running them; containers.rs and
//! `make compose-demo` run them.)

use std::collections::BTreeSet;

use charges_tests::manifests::{
    PgBouncerIni, documents, k8s_pgbouncer_ini, kustomization_entries, repo,
};
use charges_tests::pgbouncer::pinned_version;
use serde_json::Value;

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

/// Every Kubernetes manifest in deploy/k8s validates against the Kubernetes API
/// schemas (`kubernetes-validate --strict`, which `make deps` installs with pip, with
/// its schemas, so this works offline). Unknown fields, wrong types and unknown kinds
/// fail; kustomization.yaml is kustomize's, not a Kubernetes object, and is skipped.
#[test]
fn k8s_manifests_validate_against_the_kubernetes_schemas() {
    let mut files: Vec<std::path::PathBuf> = std::fs::read_dir(repo().join("deploy/k8s"))
        .expect("deploy/k8s")
        .map(|entry| entry.expect("dir entry").path())
        .filter(|path| path.extension().and_then(|e| e.to_str()) == Some("yaml"))
        .filter(|path| path.file_name().and_then(|n| n.to_str()) != Some("kustomization.yaml"))
        .collect();
    files.sort();
    assert!(files.len() >= 8, "only {files:?}");
    // `python3 -m`: found wherever pip put the package, whether or not its console
    // script is on PATH.
    let missing = "kubernetes-validate is missing: run `make deps` (scripts/deps.sh \
                   pip-installs it); this test never passes without it";
    let output = std::process::Command::new("python3")
        .args(["-m", "kubernetes_validate", "--strict"])
        .args(&files)
        .output()
        .unwrap_or_else(|e| panic!("cannot run python3 ({e}): {missing}"));
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(!report.contains("No module named"), "{missing}\n{report}");
    assert!(
        output.status.success(),
        "kubernetes-validate failed:\n{report}"
    );
    // A warning is a manifest it could not check (an unknown kind or apiVersion).
    for line in report.lines().filter(|l| !l.trim().is_empty()) {
        assert!(
            line.starts_with("INFO ") && line.contains(" passed "),
            "{line}\n{report}"
        );
    }
    for file in &files {
        assert!(
            report.contains(&*file.to_string_lossy()),
            "{} was not reported:\n{report}",
            file.display()
        );
    }
}

/// The flags and environment variables a binary's `--help` documents.
struct Help {
    text: String,
    flags: BTreeSet<String>,
    envs: BTreeSet<String>,
}

impl Help {
    /// `--help` of `binary` (its subcommand `args`, if any).
    fn of(binary: &str, args: &[&str]) -> Help {
        let output = std::process::Command::new(charges_tests::binary(binary))
            .args(args)
            .arg("--help")
            .output()
            .unwrap_or_else(|e| panic!("run {binary} {args:?} --help: {e}"));
        assert!(output.status.success(), "{binary} {args:?} --help failed");
        let text = String::from_utf8_lossy(&output.stdout).into_owned();
        let mut flags = BTreeSet::new();
        let mut envs = BTreeSet::new();
        for line in text.lines() {
            let trimmed = line.trim_start();
            if trimmed.starts_with('-') {
                for word in trimmed.split([' ', ',', '=']) {
                    if word.starts_with("--") {
                        flags.insert(word.to_owned());
                    }
                }
            }
            let mut rest = line;
            while let Some(at) = rest.find("[env: ") {
                rest = &rest[at + "[env: ".len()..];
                let end = rest.find([']', '=']).unwrap_or(rest.len());
                envs.insert(rest[..end].to_owned());
            }
        }
        Help { text, flags, envs }
    }

    /// Whether the binary reads `name` from its environment: a clap `env` of a flag,
    /// or RUST_LOG, which the tracing filter reads and the help mentions.
    fn reads_env(&self, name: &str) -> bool {
        self.envs.contains(name) || (name == "RUST_LOG" && self.text.contains("RUST_LOG"))
    }
}

/// The help a container's command gets: `charges-api serve|migrate` or `charges-relay`.
fn help_for_command(command: &[String]) -> Help {
    let args: Vec<&str> = command[1..]
        .iter()
        .map(String::as_str)
        .take_while(|a| !a.starts_with('-'))
        .collect();
    match command[0].as_str() {
        "charges-api" => {
            let sub = if args.is_empty() { vec!["serve"] } else { args };
            Help::of("charges-api", &sub)
        }
        "charges-relay" | "charges-consumer" => Help::of(&command[0], &args),
        other => panic!("unknown binary {other}"),
    }
}

fn strings(value: &Value) -> Vec<String> {
    value
        .as_array()
        .into_iter()
        .flatten()
        .map(|v| v.as_str().expect("a string").to_owned())
        .collect()
}

/// Every `--flag` in `args`.
fn flags_in(args: &[String]) -> Vec<String> {
    args.iter()
        .filter(|a| a.starts_with("--"))
        .map(|a| a.split('=').next().unwrap_or(a).to_owned())
        .collect()
}

/// Every environment variable and flag the Kubernetes manifests hand a binary is one
/// that binary documents in `--help` (a typo there is silently ignored at run time):
/// each container's `env` names and `args`/`command` flags against its own binary,
/// each key of the shared ConfigMap against the binaries whose containers load it.
#[test]
fn k8s_env_names_and_flags_exist_in_the_binaries_help() {
    let k8s = repo().join("deploy/k8s");
    let mut config_consumers: std::collections::BTreeMap<String, Vec<Help>> = Default::default();
    let mut containers = 0;
    for file in [
        "api-deployment.yaml",
        "relay-deployment.yaml",
        "migrate-job.yaml",
    ] {
        for document in documents(&k8s.join(file)) {
            for container in document["spec"]["template"]["spec"]["containers"]
                .as_array()
                .expect("containers")
            {
                containers += 1;
                let command = strings(&container["command"]);
                assert!(!command.is_empty(), "{file}: container without command");
                let help = help_for_command(&command);
                let args = strings(&container["args"]);
                for flag in flags_in(&command).iter().chain(&flags_in(&args)) {
                    assert!(
                        help.flags.contains(flag),
                        "{file}: {:?} has no {flag}",
                        command
                    );
                }
                for env in container["env"].as_array().into_iter().flatten() {
                    let name = env["name"].as_str().expect("env name");
                    assert!(
                        help.reads_env(name),
                        "{file}: {command:?} does not read {name}"
                    );
                }
                for source in container["envFrom"].as_array().into_iter().flatten() {
                    let map = source["configMapRef"]["name"]
                        .as_str()
                        .expect("configMapRef");
                    config_consumers
                        .entry(map.to_owned())
                        .or_default()
                        .push(help_for_command(&command));
                }
            }
        }
    }
    assert_eq!(containers, 3);
    let config = &documents(&k8s.join("configmap.yaml"))[0];
    let name = config["metadata"]["name"].as_str().expect("ConfigMap name");
    let consumers = config_consumers.get(name).expect("the ConfigMap is loaded");
    let keys = config["data"].as_object().expect("ConfigMap data");
    assert!(keys.len() >= 5);
    for key in keys.keys() {
        assert!(
            consumers.iter().any(|help| help.reads_env(key)),
            "ConfigMap {name}: no binary that loads it reads {key}"
        );
    }
}

/// `${NAME:-default}` → `(NAME, default)`.
fn env_default(value: &str) -> Option<(&str, &str)> {
    value
        .strip_prefix("${")?
        .strip_suffix('}')?
        .split_once(":-")
}

/// deploy/docker-compose.yml (`make compose-demo` runs it): the services exist, their
/// images are `${POSTGRES_IMAGE|BROKER_IMAGE|CHARGES_IMAGE:-upstream}` with the upstream
/// image of deploy/images.env as the default, the application services run the image's
/// binaries, and every environment variable and flag they get is one the binary documents.
#[test]
fn docker_compose_services_and_settings_match_the_binaries() {
    let compose = &documents(&repo().join("deploy/docker-compose.yml"))[0];
    let services = compose["services"].as_object().expect("services");
    for name in [
        "postgres", "kafka", "topic", "migrate", "api", "relay", "consumer",
    ] {
        assert!(services.contains_key(name), "no service {name}");
    }
    let images = std::fs::read_to_string(repo().join("deploy/images.env")).expect("images.env");
    let mut checked = 0;
    for (name, service) in services {
        let image = service["image"].as_str().expect("an image");
        let (variable, default) = env_default(image)
            .unwrap_or_else(|| panic!("{name}: image {image} is not ${{VAR:-default}}"));
        let what = variable.strip_suffix("_IMAGE").expect("a *_IMAGE variable");
        assert!(
            images
                .lines()
                .any(|l| l == format!("docker_{what}_IMAGE={default}")),
            "{name}: {default} is not deploy/images.env's docker_{what}_IMAGE"
        );
        // The image's ENTRYPOINT is charges-api; `entrypoint` replaces it.
        if variable != "CHARGES_IMAGE" {
            continue;
        }
        assert!(
            service["build"]["dockerfile"].as_str() == Some("deploy/Dockerfile"),
            "{name}: builds deploy/Dockerfile"
        );
        let mut command = strings(&service["entrypoint"]);
        if command.is_empty() {
            command.push("charges-api".to_owned());
        }
        command.extend(strings(&service["command"]));
        let help = help_for_command(&command);
        for flag in flags_in(&command) {
            assert!(
                help.flags.contains(&flag),
                "{name}: {command:?} has no {flag}"
            );
        }
        let env = service["environment"]
            .as_object()
            .expect("environment as a mapping");
        assert!(env.contains_key("DATABASE_URL"), "{name}: DATABASE_URL");
        for key in env.keys() {
            assert!(
                help.reads_env(key),
                "{name}: {command:?} does not read {key}"
            );
        }
        checked += 1;
    }
    assert!(checked >= 4, "only {checked} application services");
    let api = &compose["services"]["api"];
    assert_eq!(
        api["depends_on"]["migrate"]["condition"],
        "service_completed_successfully"
    );
    assert_eq!(
        compose["services"]["migrate"]["command"],
        serde_json::json!(["migrate"])
    );
}

/// The recipe of deploy/Dockerfile (the `runtime-from-host` path is built and run by
/// `make image` and tests/tests/containers.rs; the builder stage needs a registry): a
/// builder, a runtime base on slim Debian by default, the two runtime targets; the
/// builder installs what scripts/deps.sh installs for librdkafka, every binary is
/// built and copied (or taken from the host), the runtime runs as a non-root user, and
/// it carries every shared library the binaries really link.
#[test]
fn the_dockerfile_builds_every_binary_into_a_slim_non_root_image() {
    let text =
        std::fs::read_to_string(repo().join("deploy/Dockerfile")).expect("deploy/Dockerfile");
    let code: String = text
        .lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .map(|l| format!("{l}\n"))
        .collect();
    let stages: Vec<&str> = code.split("\nFROM ").skip(1).collect();
    assert_eq!(
        stages.len(),
        4,
        "builder, runtime base, runtime-from-host, runtime"
    );
    let (builder, runtime) = (stages[0], stages[1]);
    assert!(
        builder.contains(" AS builder"),
        "first stage is the builder"
    );
    assert!(
        runtime.starts_with("${RUNTIME_BASE} AS runtime-base")
            && code.contains("ARG RUNTIME_BASE=debian:bookworm-slim"),
        "runtime on slim Debian by default"
    );
    assert!(stages[2].starts_with("runtime-base AS runtime-from-host"));
    assert!(
        stages[3].starts_with("runtime-base AS runtime") && stages[3].contains("--from=builder")
    );
    for binary in ["charges-api", "charges-relay", "charges-consumer"] {
        assert!(
            stages[2].contains(binary),
            "runtime-from-host copies {binary}"
        );
    }
    let deps = std::fs::read_to_string(repo().join("scripts/deps.sh")).expect("deps.sh");
    for package in ["cmake", "libcurl4-openssl-dev"] {
        assert!(
            deps.contains(package) && builder.contains(package),
            "{package} in both"
        );
    }
    for binary in ["charges-api", "charges-relay", "charges-consumer"] {
        assert!(
            builder.contains(&format!("--bin {binary}")),
            "builds {binary}"
        );
        assert!(
            builder.contains(&format!("target/release/{binary}")),
            "copies {binary}"
        );
    }
    assert!(builder.contains("--locked"), "the lock file is honoured");
    let user = runtime
        .lines()
        .find_map(|l| l.strip_prefix("USER "))
        .expect("a USER line in the runtime stage");
    let uid = user.split(':').next().unwrap_or_default();
    assert!(
        uid.parse::<u32>().is_ok_and(|uid| uid != 0),
        "non-root numeric user, got {user}"
    );

    // Every library the binaries link, beyond glibc's own, must come from a runtime package.
    let provided = [
        ("libz.so.1", "zlib1g"),
        ("libssl.so.3", "libssl3"),
        ("libcrypto.so.3", "libssl3"),
    ];
    for binary in ["charges-api", "charges-relay", "charges-consumer"] {
        let path = charges_tests::binary(binary);
        let ldd = std::process::Command::new("ldd")
            .arg(&path)
            .output()
            .expect("run ldd");
        for line in String::from_utf8_lossy(&ldd.stdout).lines() {
            let library = line.split_whitespace().next().unwrap_or_default();
            let glibc = [
                "linux-vdso",
                "libc.so",
                "libm.so",
                "libgcc_s",
                "ld-linux",
                "libpthread",
                "libdl",
                "librt",
            ]
            .iter()
            .any(|base| library.contains(base));
            if glibc || library.is_empty() {
                continue;
            }
            let package = provided
                .iter()
                .find(|(lib, _)| *lib == library)
                .map(|(_, package)| *package)
                .unwrap_or_else(|| panic!("{binary} links {library}: map it to a Debian package here and in the Dockerfile"));
            assert!(
                runtime.contains(package),
                "runtime stage lacks {package} for {library}"
            );
        }
    }
}

/// The one document of `deploy/k8s/<file>`.
fn k8s(file: &str) -> Value {
    documents(&repo().join("deploy/k8s").join(file)).remove(0)
}

fn number(value: &Value, what: &str) -> u64 {
    value
        .as_u64()
        .or_else(|| value.as_str().and_then(|s| s.parse().ok()))
        .unwrap_or_else(|| panic!("{what} is not a number: {value}"))
}

/// The environment variable `name` of a Deployment's or Job's first container: its
/// literal value, `secret:<key>` for a Secret's key, or None.
fn container_env(manifest: &Value, name: &str) -> Option<String> {
    let container = &manifest["spec"]["template"]["spec"]["containers"][0];
    let env = container["env"]
        .as_array()?
        .iter()
        .find(|e| e["name"] == name)?;
    match env["value"].as_str() {
        Some(value) => Some(value.to_owned()),
        None => env["valueFrom"]["secretKeyRef"]["key"]
            .as_str()
            .map(|key| format!("secret:{key}")),
    }
}

/// The pods a Deployment can run at once: its replicas plus a rollout's surge (25 %,
/// rounded up, without a strategy).
fn pods_at_most(deployment: &Value, replicas: u64, what: &str) -> u64 {
    let surge = &deployment["spec"]["strategy"]["rollingUpdate"]["maxSurge"];
    let surge = if surge.is_null() {
        replicas.div_ceil(4)
    } else {
        number(surge, &format!("{what} maxSurge"))
    };
    replicas + surge
}

/// The connection budget (docs/operations.md, "Connection budget"), from the manifests.
/// Postgres sees PgBouncer's server connections (`max_db_connections` per pod, every
/// pod of a surging rollout) and what connects to it directly: one LISTEN session per
/// relay, the migrate Job, the superuser's reserve and operators. No term depends on
/// the API's HPA, and the sum fits `max_connections`. What the pods open as clients (HPA
/// max × DB_POOL_SIZE, the relays' pools) would not fit without the pooler, and fits
/// `max_client_conn` of a single PgBouncer pod (a client stays on the pod it reached).
#[test]
fn connection_budget_fits_max_connections() {
    const MAX_CONNECTIONS: u64 = 100;
    const RESERVED_AND_OPERATORS: u64 = 3 + 5;
    const MIGRATE: u64 = 2;
    // charges-relay's pool (`connect` in crates/charges-relay/src/lib.rs): one
    // connection per batch loop + 4 (jobs, probes), through the pooler; its LISTEN
    // session on Postgres itself.
    const RELAY_POOLED_EXTRA: u64 = 4;
    const RELAY_LISTEN: u64 = 1;

    // The routing the budget assumes: the API and the relays' pools through the pooler,
    // the LISTEN sessions and the Job direct.
    let api = k8s("api-deployment.yaml");
    let relay = k8s("relay-deployment.yaml");
    let job = k8s("migrate-job.yaml");
    for (what, manifest) in [("API", &api), ("relay", &relay)] {
        assert!(
            container_env(manifest, "DB_POOLER").is_some_and(|mode| mode != "none"),
            "the {what} goes through the pooler"
        );
    }
    assert!(
        container_env(&relay, "LISTEN_DATABASE_URL").is_some(),
        "the relays LISTEN on Postgres directly"
    );
    assert_eq!(
        container_env(&job, "DB_POOLER"),
        None,
        "the Job migrates directly"
    );

    let ini = k8s_pgbouncer_ini();
    assert_eq!(ini.settings["pool_mode"], "transaction");
    assert!(!ini.databases.is_empty(), "no [databases] entry");
    let per_pooler: u64 = ini
        .databases
        .iter()
        .map(|(name, entry)| {
            let limit = entry.get("max_db_connections").unwrap_or_else(|| {
                panic!("database {name}: no max_db_connections, so no bound on Postgres")
            });
            number(&Value::from(limit.as_str()), "max_db_connections")
        })
        .sum();
    let pgbouncer = k8s("pgbouncer-deployment.yaml");
    let poolers = pods_at_most(
        &pgbouncer,
        number(&pgbouncer["spec"]["replicas"], "PgBouncer replicas"),
        "PgBouncer",
    );
    let relays = pods_at_most(
        &relay,
        number(&relay["spec"]["replicas"], "relay replicas"),
        "relay",
    );
    let direct = relays * RELAY_LISTEN + MIGRATE + RESERVED_AND_OPERATORS;
    let server = poolers * per_pooler + direct;
    assert!(
        server <= MAX_CONNECTIONS,
        "Postgres can see {server} connections ({poolers} PgBouncer pods × {per_pooler} + \
         {direct} direct), over max_connections {MAX_CONNECTIONS}"
    );

    let config = &k8s("configmap.yaml")["data"];
    let pool = number(&config["DB_POOL_SIZE"], "DB_POOL_SIZE");
    let concurrency = number(&config["RELAY_CONCURRENCY"], "RELAY_CONCURRENCY");
    let api_max = number(&k8s("api-hpa.yaml")["spec"]["maxReplicas"], "maxReplicas");
    let api_pods = pods_at_most(&api, api_max, "API");
    let clients = api_pods * pool + relays * (concurrency + RELAY_POOLED_EXTRA);
    assert!(
        clients + direct > MAX_CONNECTIONS,
        "without the pooler the deployment would open {} connections, which fit \
         max_connections {MAX_CONNECTIONS}: the budget proves nothing about the pooler",
        clients + direct
    );
    let max_client_conn = ini.number("max_client_conn");
    assert!(
        clients <= max_client_conn,
        "{clients} pooled clients can reach one PgBouncer pod, over its max_client_conn \
         {max_client_conn}"
    );
    eprintln!(
        "Postgres: {server} of {MAX_CONNECTIONS} ({poolers} × {per_pooler} via PgBouncer + \
         {direct} direct); clients of PgBouncer: {clients} (≤ max_client_conn \
         {max_client_conn}); without it: {}",
        clients + direct
    );
}

/// The pooler path that ships is the fast one: the API and the relay run
/// `--db-pooler transaction-prepared` in deploy/k8s and deploy/docker-compose.yml, and
/// both PgBouncer configurations keep prepared statements (`max_prepared_statements`)
/// in transaction pooling.
#[test]
fn the_pooled_binaries_keep_their_prepared_statements_through_the_shipped_pgbouncer() {
    const MODE: &str = "transaction-prepared";
    for file in ["api-deployment.yaml", "relay-deployment.yaml"] {
        assert_eq!(
            container_env(&k8s(file), "DB_POOLER").as_deref(),
            Some(MODE),
            "deploy/k8s/{file}"
        );
    }
    let compose = &documents(&repo().join("deploy/docker-compose.yml"))[0];
    for service in ["api", "relay"] {
        assert_eq!(
            compose["services"][service]["environment"]["DB_POOLER"], MODE,
            "deploy/docker-compose.yml, {service}"
        );
    }
    let compose_ini = PgBouncerIni::parse(
        &std::fs::read_to_string(repo().join("deploy/compose/pgbouncer.ini"))
            .expect("deploy/compose/pgbouncer.ini"),
    );
    for (what, ini) in [
        ("deploy/k8s", k8s_pgbouncer_ini()),
        ("deploy/compose", compose_ini),
    ] {
        assert_eq!(ini.settings["pool_mode"], "transaction", "{what}");
        assert!(
            ini.settings.contains_key("max_prepared_statements")
                && ini.number("max_prepared_statements") > 0,
            "{what}: PgBouncer keeps no prepared statements without max_prepared_statements"
        );
    }
}

/// Every PgBouncer image is the release deploy/podman/pgbouncer-source.env pins, and
/// that release keeps prepared statements in transaction pooling (1.21 and later):
/// deploy/images.env's tags (deploy/docker-compose.yml's default is the docker one:
/// docker_compose_services_and_settings_match_the_binaries) and deploy/k8s's image.
/// containers.rs checks that the running image says so.
#[test]
fn every_pgbouncer_image_is_the_pinned_release() {
    let version = pinned_version();
    let release: Vec<u32> = version
        .split('.')
        .map(|part| part.parse().expect("a numeric version"))
        .collect();
    assert!(
        release[..] >= [1, 21][..],
        "PgBouncer {version} keeps no prepared statements in transaction pooling (1.21 does)"
    );
    let images = std::fs::read_to_string(repo().join("deploy/images.env")).expect("images.env");
    let mut tags: Vec<(String, String)> = images
        .lines()
        .filter_map(|line| line.split_once("_PGBOUNCER_IMAGE="))
        .map(|(kind, image)| (format!("deploy/images.env, {kind}"), image.to_owned()))
        .collect();
    assert_eq!(tags.len(), 2, "a PgBouncer image per engine kind");
    let kustomized = k8s("kustomization.yaml")["images"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|image| image["name"] == "charges-pgbouncer")
        .and_then(|image| image["newTag"].as_str())
        .expect("the charges-pgbouncer image's newTag")
        .to_owned();
    tags.push((
        "deploy/k8s/kustomization.yaml".into(),
        format!("charges-pgbouncer:{kustomized}"),
    ));
    for (what, image) in tags {
        assert_eq!(
            image.rsplit_once(':').map(|(_, tag)| tag),
            Some(version.as_str()),
            "{what}: {image} is not tagged as the pinned PgBouncer \
             (deploy/podman/pgbouncer-source.env)"
        );
    }
}

/// A Job's pod template is immutable: applying a new release with the old Job name
/// fails. The migrate Job is named after the image tag it runs.
#[test]
fn the_migrate_job_is_named_after_the_release() {
    let kustomization = k8s("kustomization.yaml");
    let tag = kustomization["images"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|image| image["name"] == "charges")
        .and_then(|image| image["newTag"].as_str())
        .expect("the charges image's newTag");
    let job = k8s("migrate-job.yaml");
    assert_eq!(job["kind"], "Job");
    assert_eq!(
        job["metadata"]["name"],
        format!("charges-migrate-{}", tag.replace('.', "-")),
        "rename the migrate Job with the release (deploy/k8s/migrate-job.yaml)"
    );
}
