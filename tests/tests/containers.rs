//! The deployable half run for real, on the container engine (podman here; see
//! docs/development.md, "Container mode"): testcontainers removes what a panicking test
//! started; the application image (`make image`) runs as the API, the relay and the
//! consumer against Postgres and a broker in containers; the Deployments of deploy/k8s
//! run under `podman kube play`.

use std::collections::BTreeMap;
use std::time::Duration;

use base64::Engine as _;
use charges_tests::containers::{
    self, Network, Services, assert_charges_image_exists, charges, cli, exec, logs, podman_only,
    start_on, wait_for_200,
};
use charges_tests::manifests::{
    deployments_running, documents, k8s_pgbouncer_ini, kustomization_entries, repo,
};
use charges_tests::pgbouncer::{
    assert_statements_stay_prepared, bound_server_sessions, pinned_version, show_version,
};
use charges_tests::{DEADLINE, TestDb, new_key, poll_until, poll_within};
use serde_json::{Value, json};
use testcontainers_modules::testcontainers::runners::AsyncRunner;
use testcontainers_modules::testcontainers::{ContainerAsync, GenericImage, ImageExt};
use uuid::Uuid;

#[tokio::test]
async fn a_panicking_test_leaves_no_container_behind() {
    let run = Uuid::new_v4().to_string();
    let label = run.clone();
    let test = tokio::spawn(async move {
        let _postgres = containers::postgres_request()
            .with_label("charges.panic-test", &label)
            .start()
            .await
            .expect("start Postgres");
        assert_eq!(
            containers::labelled("charges.panic-test", &label)
                .await
                .len(),
            1,
            "the container runs"
        );
        panic!("a test failing with its container running (on purpose)");
    });
    let outcome = test.await;
    assert!(
        outcome.as_ref().is_err_and(|e| e.is_panic()),
        "the inner test panicked: {outcome:?}"
    );
    let left = containers::labelled("charges.panic-test", &run).await;
    assert!(left.is_empty(), "left behind: {left:?}");
}

/// The pod's `terminationGracePeriodSeconds` of the Deployment running `binary`, or
/// Docker's default stop timeout (10 s) for a binary no Deployment runs.
fn grace_seconds(binary: &str) -> i32 {
    deployments_running(binary)
        .first()
        .and_then(|d| d["spec"]["template"]["spec"]["terminationGracePeriodSeconds"].as_i64())
        .map_or(10, |s| s as i32)
}

/// What every one of the image's binaries must show: a non-root user, every shared
/// library found, `/healthz` and `/readyz` answering on its operations port.
async fn check_running(
    container: &ContainerAsync<GenericImage>,
    network: &Network,
    binary: &str,
    port: u16,
) {
    let (code, uid) = exec(container, &["id", "-u"]).await;
    assert_eq!((code, uid.trim()), (0, "10001"), "{binary}: runs as 10001");
    let (code, ldd) = exec(container, &["ldd", &format!("/usr/local/bin/{binary}")]).await;
    assert_eq!(code, 0, "{binary}: ldd failed: {ldd}");
    assert!(!ldd.contains("not found"), "{binary}: {ldd}");
    let ip = network.address(container.id()).await;
    for path in ["/healthz", "/readyz"] {
        wait_for_200(&format!("http://{ip}:{port}{path}")).await;
    }
}

/// `podman stop` with the manifests' grace period: the binary exits 0 by itself on
/// SIGTERM (a kill after the grace period would be 137).
async fn stop_within_grace(container: &ContainerAsync<GenericImage>, binary: &str) {
    container
        .stop_with_timeout(Some(grace_seconds(binary)))
        .await
        .unwrap_or_else(|e| panic!("stop {binary}: {e}"));
    let code = container.exit_code().await.expect("exit code");
    assert_eq!(
        code,
        Some(0),
        "{binary} on SIGTERM:\n{}",
        logs(container).await
    );
}

#[tokio::test]
async fn the_image_runs_the_api_the_relay_and_the_consumer_end_to_end() {
    if !podman_only("the image test") {
        return;
    }
    assert_charges_image_exists().await;
    let network = Network::create("image").await;
    let s = Services::start(&network, &network).await;
    let api = containers::start_api(&network, &s, &[]).await;
    let relay = containers::start_relay(&network, &s, &[]).await;
    let consumer = start_on(
        charges(
            "charges-consumer",
            &["--migrate", "--metrics-listen", "0.0.0.0:9095"],
            &s.env(),
            "consumer started",
        ),
        &network,
        &format!("{}-consumer", network.name),
    )
    .await;
    let binaries = [
        (&api, "charges-api", 8080),
        (&relay, "charges-relay", 9091),
        (&consumer, "charges-consumer", 9095),
    ];
    for (container, binary, port) in binaries {
        check_running(container, &network, binary, port).await;
    }

    // A charge posted to the API container reaches the consumer container.
    let api_url = format!("http://{}:8080", network.address(api.id()).await);
    let response = reqwest::Client::new()
        .post(format!("{api_url}/charges"))
        .header("content-type", "application/json")
        .header("idempotency-key", new_key())
        .body(r#"{"amountCents":4900,"currency":"EUR"}"#)
        .send()
        .await
        .expect("POST /charges");
    assert_eq!(response.status(), 201);
    let charge: Value = response.json().await.expect("the charge");
    let charge_id: Uuid = charge["id"].as_str().expect("id").parse().expect("uuid");
    let event: Uuid =
        s.db.client()
            .query_one(
                "SELECT id FROM outbox WHERE aggregate_id = $1",
                &[&charge_id],
            )
            .await
            .expect("the charge's outbox row")
            .get(0);
    s.db.wait_for(
        "SELECT count(*) = 1 FROM processed_events WHERE event_id = $1",
        &[&event],
        "the consumer's inbox row for the event",
    )
    .await;
    poll_until("the consumer logs the event applied", async || {
        logs(&consumer)
            .await
            .lines()
            .any(|l| l.contains("event applied") && l.contains(&format!("id={event}")))
            .then_some(())
    })
    .await;

    for (container, binary, _) in binaries {
        stop_within_grace(container, binary).await;
    }
}

/// Removes what `podman kube play` started and the secrets made for it, also when the
/// test fails.
struct KubeDown {
    file: std::path::PathBuf,
    secrets: Vec<String>,
}

impl Drop for KubeDown {
    fn drop(&mut self) {
        let _ = std::process::Command::new("podman")
            .env(
                "CONTAINERS_CONF",
                repo().join("deploy/podman/containers.conf"),
            )
            .args(["kube", "down"])
            .arg(&self.file)
            .output();
        for secret in &self.secrets {
            let _ = std::process::Command::new("podman")
                .args(["secret", "rm", secret])
                .output();
        }
        let _ = std::fs::remove_file(&self.file);
    }
}

/// What the rendered manifests point at: the test's services, and what the test makes
/// up for the Secrets.
struct Rendering<'a> {
    s: &'a Services,
    api_key: String,
    /// The test's Postgres user and its password at PgBouncer (its userlist.txt).
    user: String,
    password: String,
    /// PgBouncer's first pod, as the pods on the network reach it (podman plays no
    /// Service), and the database name it serves.
    pooler_host: String,
    pooled_database: String,
    /// The file PgBouncer's ini reads the passwords from.
    auth_file: String,
}

impl<'a> Rendering<'a> {
    fn new(s: &'a Services) -> Rendering<'a> {
        let [pgbouncer] = &deployments_running("pgbouncer")[..] else {
            panic!("deploy/k8s has not one PgBouncer Deployment");
        };
        let ini = k8s_pgbouncer_ini();
        let pooled_database = ini.databases.keys().next().expect("a [databases] entry");
        let server: tokio_postgres::Config = s.inside_url.parse().expect("the inside URL");
        Rendering {
            s,
            api_key: Uuid::new_v4().simple().to_string(),
            user: server.get_user().expect("a user").to_owned(),
            password: Uuid::new_v4().simple().to_string(),
            pooler_host: format!(
                "{}-pod-0",
                pgbouncer["metadata"]["name"].as_str().expect("name")
            ),
            pooled_database: pooled_database.clone(),
            auth_file: ini.settings["auth_file"].clone(),
        }
    }

    /// The URL a container with a pooled `DB_POOLER` gets: PgBouncer's.
    fn pooled_url(&self) -> String {
        format!(
            "postgres://{}:{}@{}:5432/{}",
            self.user, self.password, self.pooler_host, self.pooled_database
        )
    }

    /// PgBouncer's admin console on the pod at `address`, as the test user.
    fn console_url(&self, address: &str) -> String {
        format!(
            "postgres://{}:{}@{address}:5432/pgbouncer",
            self.user, self.password
        )
    }

    /// PgBouncer's ini with the test's Postgres behind it, without TLS (the test's
    /// Postgres has none): each `[databases]` entry's host and dbname replaced, the
    /// `server_tls_*` settings commented out; and the test user among `stats_users`, so
    /// that it can read the admin console.
    fn pgbouncer_ini(&self, ini: &str) -> String {
        let server: tokio_postgres::Config = self.s.inside_url.parse().expect("inside URL");
        let host = match server.get_hosts().first() {
            Some(tokio_postgres::config::Host::Tcp(host)) => host.clone(),
            other => panic!("the inside URL's host: {other:?}"),
        };
        let dbname = server.get_dbname().expect("a database");
        let mut section = "";
        let mut lines = Vec::new();
        for line in ini.lines() {
            let trimmed = line.trim();
            if trimmed.starts_with('[') {
                section = trimmed;
                if section == "[pgbouncer]" {
                    lines.push(line.to_owned());
                    lines.push(format!("stats_users = {}", self.user));
                    continue;
                }
            } else if trimmed.starts_with("server_tls_") {
                lines.push(format!("; {line}"));
                continue;
            } else if let Some((name, entry)) = line.split_once('=')
                && section == "[databases]"
                && !trimmed.starts_with(';')
            {
                let entry: Vec<String> = entry
                    .split_whitespace()
                    .map(|pair| match pair.split_once('=') {
                        Some(("host", _)) => format!("host={host}"),
                        Some(("dbname", _)) => format!("dbname={dbname}"),
                        _ => pair.to_owned(),
                    })
                    .collect();
                lines.push(format!("{name}= {}", entry.join(" ")));
                continue;
            }
            lines.push(line.to_owned());
        }
        lines.join("\n") + "\n"
    }
}

/// deploy/k8s as podman 4.3 can play it: the ConfigMaps (broker and topic replaced by
/// the test's, PgBouncer's Postgres by the test's) and the Deployments (images replaced
/// by the local ones; secret volumes marked `optional: false`, without which podman 4.3
/// crashes, and their octal modes as numbers; probes on port numbers and no `ports`,
/// which podman 4.3 would publish on the host); everything else is dropped and named in
/// the returned list. Also returns each Secret the Deployments read: a pooled container's
/// DATABASE_URL points at PgBouncer's first pod, every other database URL at the test
/// database; a file mounted from a secret gets one API key if an environment variable
/// names it, the test user's password if it is PgBouncer's auth_file.
fn render_for_podman(r: &Rendering) -> (String, BTreeMap<String, Secret>, Vec<String>) {
    let mut kept = Vec::new();
    let mut dropped = Vec::new();
    let mut secrets: BTreeMap<String, Secret> = BTreeMap::new();
    for path in kustomization_entries(&repo().join("deploy/k8s")) {
        for mut doc in documents(&path) {
            match doc["kind"].as_str().unwrap_or_default() {
                "ConfigMap" => {
                    render_config(&mut doc, r);
                    kept.push(doc);
                }
                "Deployment" => {
                    render_deployment(&mut doc, r, &mut secrets);
                    kept.push(doc);
                }
                kind => dropped.push(format!(
                    "{kind}/{}",
                    doc["metadata"]["name"].as_str().unwrap_or_default()
                )),
            }
        }
    }
    let yaml = kept
        .iter()
        .map(|doc| serde_norway::to_string(doc).expect("YAML"))
        .collect::<Vec<_>>()
        .join("---\n");
    (yaml, secrets, dropped)
}

fn render_config(doc: &mut Value, r: &Rendering) {
    let data = doc["data"].as_object_mut().expect("ConfigMap data");
    if data.contains_key("KAFKA_BROKERS") {
        data.insert("KAFKA_BROKERS".into(), json!(r.s.inside_brokers));
    }
    if data.contains_key("KAFKA_TOPIC") {
        data.insert("KAFKA_TOPIC".into(), json!(r.s.kafka.topic));
    }
    if let Some(ini) = data.get("pgbouncer.ini").and_then(Value::as_str) {
        let ini = r.pgbouncer_ini(ini);
        data.insert("pgbouncer.ini".into(), json!(ini));
    }
}

/// The local image of a manifest's image name (kustomization.yaml `images`).
fn local_image(name: &str) -> String {
    match name {
        "charges" => containers::image("CHARGES"),
        "charges-pgbouncer" => containers::image("PGBOUNCER"),
        other => panic!("no local image for {other}"),
    }
}

fn render_deployment(doc: &mut Value, r: &Rendering, secrets: &mut BTreeMap<String, Secret>) {
    let spec = &mut doc["spec"]["template"]["spec"];
    let mut mounts = BTreeMap::new();
    for volume in spec["volumes"].as_array_mut().into_iter().flatten() {
        let name = volume["name"].as_str().unwrap_or_default().to_owned();
        if let Some(secret) = volume["secret"].as_object_mut() {
            secret.insert("optional".into(), json!(false));
            // `0440` is octal to Kubernetes (YAML 1.1), a string to our parser.
            if let Some(mode) = secret.get("defaultMode").and_then(Value::as_str) {
                let mode = u32::from_str_radix(mode, 8).expect("an octal mode");
                secret.insert("defaultMode".into(), json!(mode));
            }
            let secret_name = secret["secretName"].as_str().unwrap_or_default();
            mounts.insert(name, secret_name.to_owned());
        }
    }
    for container in spec["containers"].as_array_mut().expect("containers") {
        let image = local_image(container["image"].as_str().expect("an image"));
        container["image"] = json!(image);
        // podman 4.3 publishes every containerPort on the host at the same number
        // (replicas collide): probes get the numbers, ports go.
        for probe in ["readinessProbe", "livenessProbe"] {
            for action in ["httpGet", "tcpSocket"] {
                if container[probe][action].is_object() {
                    let port = probe_port(container, &container[probe][action]["port"]);
                    container[probe][action]["port"] = json!(port);
                }
            }
        }
        if let Some(c) = container.as_object_mut() {
            c.remove("ports");
        }
        // The test creates no optional Secret (e.g. charges-kafka, for SASL settings):
        // Kubernetes then leaves the variable unset, and so does this rendering.
        if let Some(env) = container["env"].as_array_mut() {
            env.retain(|e| e["valueFrom"]["secretKeyRef"]["optional"] != json!(true));
        }
        secret_urls(container, r, secrets);
        secret_files(container, &mounts, r, secrets);
    }
}

/// The database URLs a container reads from Secrets.
fn secret_urls(container: &Value, r: &Rendering, secrets: &mut BTreeMap<String, Secret>) {
    let env = container["env"].as_array().cloned().unwrap_or_default();
    let pooled = env.iter().any(|e| {
        e["name"] == "DB_POOLER"
            && matches!(
                e["value"].as_str(),
                Some("transaction" | "transaction-prepared")
            )
    });
    for variable in &env {
        let Some(reference) = variable["valueFrom"]["secretKeyRef"].as_object() else {
            continue;
        };
        let key = reference["key"].as_str().unwrap_or_default();
        assert!(key.contains("database-url"), "unknown secret {key}");
        let url = if pooled && variable["name"] == "DATABASE_URL" {
            r.pooled_url()
        } else {
            r.s.inside_url.clone()
        };
        secrets
            .entry(reference["name"].as_str().unwrap_or_default().into())
            .or_default()
            .values
            .insert(key.into(), url);
    }
}

/// The files a container reads from mounted Secrets.
fn secret_files(
    container: &Value,
    mounts: &BTreeMap<String, String>,
    r: &Rendering,
    secrets: &mut BTreeMap<String, Secret>,
) {
    let userlist = format!("\"{}\" \"{}\"\n", r.user, r.password);
    let api_keys = format!("kube-test:{}", r.api_key);
    let env_paths = container["env"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|e| e["value"].as_str())
        .map(|path| (path.to_owned(), api_keys.clone()));
    let files: Vec<(String, String)> = env_paths.chain([(r.auth_file.clone(), userlist)]).collect();
    for mount in container["volumeMounts"].as_array().into_iter().flatten() {
        let Some(secret) = mounts.get(mount["name"].as_str().unwrap_or("")) else {
            continue;
        };
        let dir = mount["mountPath"].as_str().unwrap_or_default();
        for (path, contents) in &files {
            if let Some(file) = path.strip_prefix(&format!("{dir}/")) {
                let secret = secrets.entry(secret.clone()).or_default();
                secret.mounted = true;
                secret.values.insert(file.into(), contents.clone());
            }
        }
    }
}

/// A Secret the Deployments read: through `secretKeyRef`, or mounted as files.
#[derive(Default)]
struct Secret {
    mounted: bool,
    values: BTreeMap<String, String>,
}

/// A podman secret as podman 4.3 reads it: for `secretKeyRef`, a JSON object of base64
/// values; for a secret volume, a Kubernetes Secret whose `data` holds the files' plain
/// contents (written as they are).
fn create_secret(name: &str, secret: &Secret) {
    use std::io::Write;
    let json = if secret.mounted {
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name}, "data": secret.values})
    } else {
        let encoded: BTreeMap<&String, String> = secret
            .values
            .iter()
            .map(|(key, value)| (key, base64::engine::general_purpose::STANDARD.encode(value)))
            .collect();
        json!(encoded)
    };
    let mut file = tempfile(&format!("{name}.json"));
    file.1
        .write_all(json.to_string().as_bytes())
        .expect("write the secret");
    cli(&[
        "secret",
        "create",
        name,
        file.0.to_str().expect("a UTF-8 path"),
    ]);
    let _ = std::fs::remove_file(&file.0);
}

fn tempfile(name: &str) -> (std::path::PathBuf, std::fs::File) {
    let path = std::env::temp_dir().join(format!("charges-{}-{name}", Uuid::new_v4().simple()));
    let file = std::fs::File::create(&path).expect("create a temporary file");
    (path, file)
}

/// The port a probe names: a number, or the name of one of the container's ports.
fn probe_port(container: &Value, port: &Value) -> u64 {
    port.as_u64().unwrap_or_else(|| {
        container["ports"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|p| p["name"] == *port)
            .and_then(|p| p["containerPort"].as_u64())
            .unwrap_or_else(|| panic!("no port {port}"))
    })
}

/// Every container of every replica of every played Deployment, by the name podman
/// gives it, with its spec.
fn played_containers(rendered: &[Value]) -> Vec<(String, &Value)> {
    let mut played = Vec::new();
    for deployment in rendered.iter().filter(|d| d["kind"] == "Deployment") {
        let name = deployment["metadata"]["name"].as_str().expect("name");
        let replicas = deployment["spec"]["replicas"].as_u64().unwrap_or(1);
        for replica in 0..replicas {
            for container in deployment["spec"]["template"]["spec"]["containers"]
                .as_array()
                .expect("containers")
            {
                let id = format!(
                    "{name}-pod-{replica}-{}",
                    container["name"].as_str().expect("name")
                );
                played.push((id, container));
            }
        }
    }
    played
}

/// Every replica of every played Deployment runs and answers its `httpGet` probes;
/// returns the pods' addresses on `network` by the command their container runs. A
/// container that exited at start (its database refused it) runs again once its restart
/// policy restarted it.
async fn check_pods(rendered: &[Value], network: &Network) -> BTreeMap<String, Vec<String>> {
    let mut addresses: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (id, container) in played_containers(rendered) {
        let running = poll_within(DEADLINE, async || {
            let state = cli(&["inspect", "--format", "{{.State.Status}}", &id]);
            (state.trim() == "running").then_some(())
        })
        .await;
        assert!(
            running.is_some(),
            "{id} never runs:\n{}",
            cli(&["logs", &id])
        );
        let ip = cli(&[
            "inspect",
            "--format",
            &format!(
                "{{{{(index .NetworkSettings.Networks \"{}\").IPAddress}}}}",
                network.name
            ),
            &id,
        ]);
        let ip = ip.trim();
        for probe in ["readinessProbe", "livenessProbe"] {
            let get = &container[probe]["httpGet"];
            if get.is_null() {
                continue;
            }
            let port = probe_port(container, &get["port"]);
            let path = get["path"].as_str().expect("path");
            let url = format!("http://{ip}:{port}{path}");
            let http = reqwest::Client::new();
            let answered = poll_within(DEADLINE, async || {
                let response = http.get(&url).send().await.ok()?;
                (response.status() == 200).then_some(())
            })
            .await;
            assert!(
                answered.is_some(),
                "{id}: {probe} GET {url} never 200:\n{}",
                cli(&["logs", &id])
            );
        }
        let command = container["command"][0].as_str().unwrap_or_default();
        addresses
            .entry(command.to_owned())
            .or_default()
            .push(ip.to_owned());
    }
    addresses
}

/// Postgres's sessions on `db` from `addresses`.
async fn sessions_from(db: &TestDb, addresses: &[String]) -> i64 {
    db.client()
        .query_one(
            "SELECT count(*) FROM pg_stat_activity
              WHERE datname = current_database() AND host(client_addr) = ANY($1)",
            &[&addresses],
        )
        .await
        .expect("pg_stat_activity")
        .get(0)
}

/// deploy/k8s with PgBouncer in the path: the API and the relays' pools reach Postgres
/// through PgBouncer's pods (whose server sessions carry the roles' timeouts, here the
/// database's), the relays LISTEN on Postgres directly.
#[tokio::test]
async fn the_k8s_deployments_start_pass_their_probes_and_serve_under_podman_kube_play() {
    if !podman_only("the kube play test") {
        return;
    }
    assert_charges_image_exists().await;
    let network = Network::create("kube").await;
    let s = Services::start(&network, &network).await;
    bound_server_sessions(&s.db, Duration::from_secs(5), Duration::from_secs(10)).await;
    let rendering = Rendering::new(&s);
    let (yaml, secrets, dropped) = render_for_podman(&rendering);
    eprintln!("kube play: not played (podman 4.3 does not run them): {dropped:?}");
    let (file, mut handle) = tempfile("kube.yaml");
    std::io::Write::write_all(&mut handle, yaml.as_bytes()).expect("write the manifests");
    let _down = KubeDown {
        file: file.clone(),
        secrets: secrets.keys().cloned().collect(),
    };
    for (name, values) in &secrets {
        create_secret(name, values);
    }
    let file_arg = file.to_str().expect("a UTF-8 path");
    cli(&["kube", "play", "--network", &network.name, file_arg]);
    let rendered = documents(&file);
    // podman 4.3 may start a container before the file of its secret volume is written
    // (about one play in twenty here): PgBouncer then starts without its auth_file's
    // users and refuses every login (`no such user`). It reads the file again on SIGHUP,
    // once the play has written it; Kubernetes writes a volume before the container starts.
    for (id, container) in played_containers(&rendered) {
        if container["command"][0] == "pgbouncer" {
            cli(&["kill", "--signal", "HUP", &id]);
        }
    }
    let pods = check_pods(&rendered, &network).await;

    // They serve: the API takes a charge (with the API key of the mounted secret) and a
    // relay pod publishes its event.
    let api_url = format!("http://{}:8080", pods["charges-api"][0]);
    let charge = async || {
        let response = reqwest::Client::new()
            .post(format!("{api_url}/charges"))
            .header("content-type", "application/json")
            .header("authorization", format!("Bearer {}", rendering.api_key))
            .header("idempotency-key", new_key())
            .body(r#"{"amountCents":4900,"currency":"EUR"}"#)
            .timeout(Duration::from_secs(30))
            .send()
            .await
            .expect("POST /charges");
        assert_eq!(response.status(), 201);
    };
    charge().await;
    s.db.wait_for(
        "SELECT count(*) = 1 FROM outbox WHERE published_at IS NOT NULL",
        &[],
        "a relay pod publishes the charge's event",
    )
    .await;

    // Through the pooler: Postgres has sessions from PgBouncer, none from the API pods,
    // and from each relay pod only its LISTEN session.
    assert!(sessions_from(&s.db, &pods["pgbouncer"]).await > 0);
    assert_eq!(sessions_from(&s.db, &pods["charges-api"]).await, 0);
    let relays = &pods["charges-relay"];
    assert_eq!(
        sessions_from(&s.db, relays).await,
        relays.len() as i64,
        "one LISTEN session per relay"
    );

    // The image's PgBouncer is the pinned release, and it keeps the binaries' prepared
    // statements (transaction-prepared): more charges bind without parsing again. On
    // the first pod, which the pooled URLs name.
    let console = rendering.console_url(&pods["pgbouncer"][0]);
    assert_eq!(
        show_version(&console).await,
        format!("PgBouncer {}", pinned_version())
    );
    assert_statements_stay_prepared(&console, &rendering.pooled_database, 64, async |_| {
        charge().await
    })
    .await;
}
