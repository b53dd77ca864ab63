//! Services in containers, through testcontainers and the Docker API: podman's, on the
//! socket `scripts/containers.sh` starts, on this project's machines; a Docker engine's
//! elsewhere (`CHARGES_ENGINE`, default podman). Which images: `deploy/images.env`.
//!
//! - `TEST_SERVICES=containers` makes [`TestDb::new`](crate::TestDb::new) and
//!   [`TestKafka::new`](crate::kafka::TestKafka::new) start a Postgres and a broker of the
//!   test's own in containers ([`postgres`], [`broker`]) instead of using `DATABASE_URL`
//!   and librdkafka's mock cluster.
//! - [`Network`] and [`charges`]: the application image (`make image`) and the services on
//!   networks of a test's own, for the image, kube play and network-fault tests.
//!
//! Every container is removed when its value is dropped, a panicking test's too
//! (testcontainers removes it in `Drop`, which runs while a panic unwinds; its watchdog
//! removes them on SIGTERM/SIGINT, which is how nextest ends a test that hangs).

use std::any::Any;
use std::collections::HashMap;
use std::net::IpAddr;

use testcontainers_modules::kafka::apache;
use testcontainers_modules::testcontainers::bollard::Docker;
use testcontainers_modules::testcontainers::bollard::models::{
    NetworkConnectRequest, NetworkCreateRequest, NetworkDisconnectRequest,
};
use testcontainers_modules::testcontainers::bollard::query_parameters::ListContainersOptions;
use testcontainers_modules::testcontainers::core::wait::LogWaitStrategy;
use testcontainers_modules::testcontainers::core::{IntoContainerPort, WaitFor};
use testcontainers_modules::testcontainers::runners::AsyncRunner;
use testcontainers_modules::testcontainers::{
    ContainerAsync, ContainerRequest, GenericImage, ImageExt,
};
use uuid::Uuid;

use crate::kafka::TestKafka;
use crate::manifests::repo;
use crate::{TestDb, block_on_own_runtime, poll_until};

/// A running container of any image, kept only to be removed when dropped.
pub type Held = Box<dyn Any + Send + Sync>;

/// Whether the tests get Postgres and the broker from containers of their own.
pub fn requested() -> bool {
    std::env::var("TEST_SERVICES").is_ok_and(|services| services == "containers")
}

/// The engine kind, as `scripts/containers.sh kind` decides it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Engine {
    /// This project's machines: podman, every image built locally.
    Podman,
    /// An engine with a registry: the upstream images.
    Docker,
}

pub fn engine() -> Engine {
    match std::env::var("CHARGES_ENGINE").as_deref() {
        Ok("docker") => Engine::Docker,
        Ok("podman") | Ok("") | Err(_) => Engine::Podman,
        Ok(other) => panic!("CHARGES_ENGINE={other}: expected podman or docker"),
    }
}

/// The image `deploy/images.env` names `what` (`BASE`, `POSTGRES`, `BROKER`, `PGBOUNCER`, `CHARGES`)
/// for this engine.
pub fn image(what: &str) -> String {
    let kind = match engine() {
        Engine::Podman => "podman",
        Engine::Docker => "docker",
    };
    let key = format!("{kind}_{what}_IMAGE=");
    let path = repo().join("deploy/images.env");
    let text =
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    text.lines()
        .find_map(|line| line.strip_prefix(&key))
        .unwrap_or_else(|| panic!("{} names no {key}", path.display()))
        .to_owned()
}

/// `name:tag` split for testcontainers.
fn generic(image: &str) -> GenericImage {
    let (name, tag) = image
        .rsplit_once(':')
        .unwrap_or_else(|| panic!("{image}: no tag"));
    GenericImage::new(name, tag)
}

const POSTGRES_READY: &str = "database system is ready to accept connections";

/// A Postgres server (superuser `postgres`, trust authentication) on `5432`. The
/// upstream image logs [`POSTGRES_READY`] twice (its initialisation runs a server
/// first); the local one was initialised when it was built.
pub fn postgres_request() -> ContainerRequest<GenericImage> {
    let times = match engine() {
        Engine::Podman => 1,
        Engine::Docker => 2,
    };
    generic(&image("POSTGRES"))
        .with_exposed_port(5432.tcp())
        .with_wait_for(WaitFor::log(
            LogWaitStrategy::stderr(POSTGRES_READY).with_times(times),
        ))
        .with_env_var("POSTGRES_HOST_AUTH_METHOD", "trust")
}

/// A Postgres container for one test, on an internal network of its own; returns it
/// and the URL of its `postgres` database at its address there.
pub async fn postgres() -> (Held, String) {
    let network = Network::create("test-db").await;
    let name = format!("{}-postgres", network.name);
    let container = start_on(postgres_request(), &network, &name).await;
    let ip = network.address(container.id()).await;
    // A tuple drops its fields in order: the container before its network.
    (
        Box::new((container, network)),
        format!("postgres://postgres@{ip}:5432/postgres"),
    )
}

/// A Kafka-protocol broker container for one test; returns it and the bootstrap
/// address. podman: on an internal network of its own, advertising its address there;
/// docker: the upstream image's module, its port published on the host.
pub async fn broker() -> (Held, String) {
    match engine() {
        Engine::Podman => {
            let network = Network::create("test-bus").await;
            let name = format!("{}-broker", network.name);
            let container = start_on(broker_request(), &network, &name).await;
            let ip = network.address(container.id()).await;
            (Box::new((container, network)), format!("{ip}:9092"))
        }
        Engine::Docker => {
            let upstream = image("BROKER");
            let (name, tag) = upstream.rsplit_once(':').expect("a tagged image");
            let container = apache::Kafka::default()
                .with_jvm_image()
                .with_name(name)
                .with_tag(tag)
                .start()
                .await
                .unwrap_or_else(|e| panic!("start {upstream}: {e}"));
            let port = container
                .get_host_port_ipv4(apache::KAFKA_PORT)
                .await
                .expect("the broker's published port");
            (Box::new(container), format!("127.0.0.1:{port}"))
        }
    }
}

/// The engine's API client (`DOCKER_HOST`).
pub fn api() -> Docker {
    Docker::connect_with_defaults().expect("connect to the container engine (DOCKER_HOST)")
}

/// Names of the containers that testcontainers started and that still exist, among
/// those labelled `key=value`.
pub async fn labelled(key: &str, value: &str) -> Vec<String> {
    let filters = HashMap::from([("label".to_owned(), vec![format!("{key}={value}")])]);
    api()
        .list_containers(Some(ListContainersOptions {
            all: true,
            filters: Some(filters),
            ..Default::default()
        }))
        .await
        .expect("list containers")
        .into_iter()
        .flat_map(|c| c.names.unwrap_or_default())
        .collect()
}

/// A network of one test's own, internal: its containers reach each other by name,
/// nothing outside it, and no other network. The host reaches them at their addresses
/// on it (a bridge on this machine). Removed when dropped; drop its containers first.
pub struct Network {
    pub name: String,
}

impl Network {
    pub async fn create(purpose: &str) -> Network {
        let name = format!(
            "charges-{purpose}-{}",
            &Uuid::new_v4().simple().to_string()[..8]
        );
        api()
            .create_network(NetworkCreateRequest {
                name: name.clone(),
                internal: Some(true),
                ..Default::default()
            })
            .await
            .unwrap_or_else(|e| panic!("create network {name}: {e}"));
        Network { name }
    }

    /// Attaches a running container (`podman network connect`).
    pub async fn connect(&self, container: &str) {
        api()
            .connect_network(
                &self.name,
                NetworkConnectRequest {
                    container: container.to_owned(),
                    ..Default::default()
                },
            )
            .await
            .unwrap_or_else(|e| panic!("connect {container} to {}: {e}", self.name));
    }

    /// Cuts a running container off this network (`podman network disconnect`): its
    /// interface on it disappears, its open connections over it stop carrying packets.
    pub async fn disconnect(&self, container: &str) {
        api()
            .disconnect_network(
                &self.name,
                NetworkDisconnectRequest {
                    container: container.to_owned(),
                    force: Some(true),
                },
            )
            .await
            .unwrap_or_else(|e| panic!("disconnect {container} from {}: {e}", self.name));
    }

    /// The address of `container` on this network.
    pub async fn address(&self, container: &str) -> IpAddr {
        let inspect = api()
            .inspect_container(container, None)
            .await
            .unwrap_or_else(|e| panic!("inspect {container}: {e}"));
        inspect
            .network_settings
            .and_then(|settings| settings.networks)
            .and_then(|mut networks| networks.remove(&self.name))
            .and_then(|endpoint| endpoint.ip_address)
            .and_then(|ip| ip.parse().ok())
            .unwrap_or_else(|| panic!("{container} has no address on {}", self.name))
    }
}

impl Drop for Network {
    fn drop(&mut self) {
        let name = self.name.clone();
        let removed = block_on_own_runtime(async move { api().remove_network(&name).await });
        if let Some(Err(e)) = removed {
            eprintln!("could not remove network {}: {e}", self.name);
        }
    }
}

/// A container on `network`, named `name` there (unique per test: prefix it with the
/// network's name).
pub async fn start_on(
    request: ContainerRequest<GenericImage>,
    network: &Network,
    name: &str,
) -> ContainerAsync<GenericImage> {
    request
        .with_network(&network.name)
        .with_container_name(name)
        .start()
        .await
        .unwrap_or_else(|e| panic!("start {name}: {e}"))
}

/// A Kafka-protocol broker that advertises its own address (on the one network it
/// starts on), so the containers on that network and the host reach what they are
/// told. Local images only: the upstream Kafka image needs its advertised listener
/// before it starts.
pub fn broker_request() -> ContainerRequest<GenericImage> {
    assert_eq!(
        engine(),
        Engine::Podman,
        "brokers on a network of a test's own use the local broker image (podman)"
    );
    generic(&image("BROKER"))
        .with_wait_for(WaitFor::message_on_either_std("ready in"))
        .into()
}

/// The application image (`make image`) running `binary` with `args` and `env`; ready
/// once a log line contains `ready`.
pub fn charges(
    binary: &str,
    args: &[&str],
    env: &[(&str, &str)],
    ready: &str,
) -> ContainerRequest<GenericImage> {
    let mut request = generic(&image("CHARGES"))
        .with_entrypoint(binary)
        .with_wait_for(WaitFor::message_on_either_std(ready))
        .with_cmd(args.iter().copied())
        .with_env_var("LOG_FORMAT", "text")
        .with_env_var("NO_COLOR", "1");
    for (key, value) in env {
        request = request.with_env_var(*key, *value);
    }
    request
}

/// Fails early, with the remedy, when `make image` has not built the application image.
pub async fn assert_charges_image_exists() {
    let name = image("CHARGES");
    if let Err(e) = api().inspect_image(&name).await {
        panic!("{name} is missing ({e}): run `make image`");
    }
}

/// Everything a container wrote to stdout and stderr so far.
pub async fn logs(container: &ContainerAsync<GenericImage>) -> String {
    let stdout = container.stdout_to_vec().await.unwrap_or_default();
    let stderr = container.stderr_to_vec().await.unwrap_or_default();
    format!(
        "{}{}",
        String::from_utf8_lossy(&stdout),
        String::from_utf8_lossy(&stderr)
    )
}

/// Runs `command` in `container`; returns its exit code and output.
pub async fn exec(container: &ContainerAsync<GenericImage>, command: &[&str]) -> (i64, String) {
    use testcontainers_modules::testcontainers::core::ExecCommand;
    let mut result = container
        .exec(ExecCommand::new(command.iter().copied()))
        .await
        .unwrap_or_else(|e| panic!("exec {command:?}: {e}"));
    let stdout = result.stdout_to_vec().await.unwrap_or_default();
    let stderr = result.stderr_to_vec().await.unwrap_or_default();
    let code = result.exit_code().await.ok().flatten().unwrap_or(i64::MIN);
    (
        code,
        format!(
            "{}{}",
            String::from_utf8_lossy(&stdout),
            String::from_utf8_lossy(&stderr)
        ),
    )
}

/// The engine's command-line tool (`podman`, with the project's containers.conf, or
/// `docker`) with `args`; panics unless it succeeds; returns its stdout.
pub fn cli(args: &[&str]) -> String {
    let (program, conf) = match engine() {
        Engine::Podman => ("podman", Some(repo().join("deploy/podman/containers.conf"))),
        Engine::Docker => ("docker", None),
    };
    let mut command = std::process::Command::new(program);
    command.args(args);
    if let Some(conf) = conf {
        command.env("CONTAINERS_CONF", conf);
    }
    let output = command
        .output()
        .unwrap_or_else(|e| panic!("run {program}: {e}"));
    assert!(
        output.status.success(),
        "{program} {args:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// Postgres and a broker on internal networks of the test's own; the host reaches
/// them at their addresses there, through a [`TestDb`] and a [`TestKafka`].
pub struct Services {
    pub db: TestDb,
    pub kafka: TestKafka,
    /// The test database's URL as the containers on the network see it.
    pub inside_url: String,
    /// The broker as the containers on its network see it.
    pub inside_brokers: String,
    pub postgres: ContainerAsync<GenericImage>,
    pub broker: ContainerAsync<GenericImage>,
}

impl Services {
    /// Postgres on `db_network`, the broker on `bus_network` (the same one or not).
    pub async fn start(db_network: &Network, bus_network: &Network) -> Services {
        let postgres_name = format!("{}-postgres", db_network.name);
        let broker_name = format!("{}-broker", bus_network.name);
        let postgres = start_on(postgres_request(), db_network, &postgres_name).await;
        let broker = start_on(broker_request(), bus_network, &broker_name).await;
        let postgres_ip = db_network.address(postgres.id()).await;
        let db = TestDb::new_on(&format!("postgres://postgres@{postgres_ip}:5432/postgres")).await;
        let broker_ip = bus_network.address(broker.id()).await;
        let kafka = TestKafka::on(format!("{broker_ip}:9092"), 3).await;
        Services {
            inside_url: format!("postgres://postgres@{postgres_name}:5432/{}", db.name),
            inside_brokers: format!("{broker_name}:9092"),
            db,
            kafka,
            postgres,
            broker,
        }
    }
}

/// `GET url` answers 200, eventually.
pub async fn wait_for_200(url: &str) {
    let http = reqwest::Client::new();
    poll_until(&format!("GET {url} → 200"), async || {
        let response = http.get(url).send().await.ok()?;
        (response.status() == 200).then_some(())
    })
    .await;
}

/// The networked tests need the local broker image, which advertises its own address.
pub fn podman_only(test: &str) -> bool {
    if engine() == Engine::Docker {
        eprintln!("{test}: runs on podman only (the local broker image); skipped on docker");
        return false;
    }
    true
}

/// The application image as `charges-api serve` on `network` against `services`' test
/// database, listening on 8080, with `extra` flags.
pub async fn start_api(
    network: &Network,
    services: &Services,
    extra: &[&str],
) -> ContainerAsync<GenericImage> {
    let args: Vec<&str> = ["serve"].into_iter().chain(extra.iter().copied()).collect();
    let env = [
        ("DATABASE_URL", services.inside_url.as_str()),
        ("LISTEN_ADDR", "0.0.0.0:8080"),
    ];
    let name = format!("{}-api", network.name);
    start_on(
        charges("charges-api", &args, &env, "listening"),
        network,
        &name,
    )
    .await
}

/// The application image as `charges-relay` on `network` against `services` (their
/// test database, broker and topic), metrics on 9091, polling every 200 ms, with
/// `extra` flags.
pub async fn start_relay(
    network: &Network,
    services: &Services,
    extra: &[&str],
) -> ContainerAsync<GenericImage> {
    let args: Vec<&str> = [
        "--metrics-listen",
        "0.0.0.0:9091",
        "--poll-interval",
        "200ms",
    ]
    .into_iter()
    .chain(extra.iter().copied())
    .collect();
    let name = format!("{}-relay", network.name);
    start_on(
        charges("charges-relay", &args, &services.env(), "relay started"),
        network,
        &name,
    )
    .await
}

impl Services {
    /// `DATABASE_URL`, `KAFKA_BROKERS` and `KAFKA_TOPIC` as the containers see them.
    pub fn env(&self) -> [(&str, &str); 3] {
        [
            ("DATABASE_URL", self.inside_url.as_str()),
            ("KAFKA_BROKERS", self.inside_brokers.as_str()),
            ("KAFKA_TOPIC", self.kafka.topic.as_str()),
        ]
    }
}
