#!/usr/bin/env bash
# Installs what a fresh Debian machine lacks, and makes sure the local Postgres is
# running. Idempotent: a machine that has everything is left alone. Three levels:
#
#   build  what building the binaries and `make demo` need: the C libraries and tools
#          librdkafka and the OpenSSL bindings build with, and Postgres (server and psql).
#          Checked on every call; each check is a file or PATH test.
#   full   (the default) everything `make test` needs: `build`, plus the Python tools,
#          cargo-nextest, tansu, promtool and the container engine with its images.
#   ha     `build` plus the failover manager of `make chaos` and `make ha-demo`: etcd
#          (Debian's etcd-server) and Patroni (pip). Checked on every call, like build.
#
# The full check (apt, pip, rustup, cargo install) runs once per machine and version of
# this script: a stamp under ~/.cache remembers it. Later calls (every `make test`) only
# check that the tools are still there and that Postgres is up. CHARGES_DEPS_FORCE=1
# runs the full check anyway.
set -euo pipefail

level="${1:-full}"
case "$level" in
  build | full | ha) ;;
  *) echo "usage: $0 [build|full|ha]" >&2; exit 2 ;;
esac
sudo_cmd=""
[ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"

ensure_postgres() {
  if ! pg_isready -q -h 127.0.0.1 -p 5432; then
    echo "deps: starting Postgres"
    # A machine that is still booting has the cluster starting but not yet answering:
    # pg_ctlcluster then says "already running" and fails; waiting is the cure either way.
    pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | sort -V | tail -n 1)" main start ||
      echo "deps: pg_ctlcluster did not start it (see above); waiting for the running one"
    for _ in $(seq 1 60); do pg_isready -q -h 127.0.0.1 -p 5432 && break; sleep 1; done
    pg_isready -h 127.0.0.1 -p 5432 || { echo "deps: Postgres does not answer on 127.0.0.1:5432" >&2; exit 1; }
  fi
}

# build_needs: appends to need_apt what the build level lacks.
build_needs() {
  command -v cmake >/dev/null 2>&1 || need_apt+=(cmake)
  # librdkafka 2.12 (rdkafka's cmake-build) includes curl headers even when unused.
  [ -f /usr/include/x86_64-linux-gnu/curl/curl.h ] || [ -f /usr/include/curl/curl.h ] || need_apt+=(libcurl4-openssl-dev)
  # OpenSSL for TLS to Kafka (rdkafka's ssl feature) and to Postgres (postgres-openssl).
  [ -f /usr/include/openssl/ssl.h ] || need_apt+=(libssl-dev)
  command -v pkg-config >/dev/null 2>&1 || need_apt+=(pkg-config)
  command -v pg_ctlcluster >/dev/null 2>&1 || need_apt+=(postgresql)
  command -v psql >/dev/null 2>&1 || need_apt+=(postgresql-client)
  command -v curl >/dev/null 2>&1 || need_apt+=(curl)
  # The demo finds the relay it kills through its socket (ss -p).
  command -v ss >/dev/null 2>&1 || need_apt+=(iproute2)
}

# apt_install PACKAGE...: refreshes the package lists, then installs; nothing if none.
apt_install() {
  [ $# -gt 0 ] || return 0
  echo "deps: installing $* (apt)"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq "$@" >/dev/null
}

# Patroni in a virtualenv of Debian's python3 under /opt: Patroni runs as the postgres
# user (Postgres refuses root), who cannot read a Python under /root (pyenv's). A
# virtualenv also needs no --break-system-packages. Pinned: the tests and the demo use
# this version's configuration keys and REST API; another version is replaced.
patroni_venv=/opt/charges-tools/patroni
patroni_version=4.1.5
ha_needs() {
  command -v etcd >/dev/null 2>&1 || need_apt+=(etcd-server)
  # A crash is simulated by killing a postmaster and its children, found with pgrep.
  command -v pgrep >/dev/null 2>&1 || need_apt+=(procps)
  /usr/bin/python3 -c 'import ensurepip, venv' >/dev/null 2>&1 || need_apt+=(python3-venv)
}

install_patroni() {
  "$patroni_venv/bin/patroni" --version 2>/dev/null | grep -qx "patroni $patroni_version" && return 0
  echo "deps: installing Patroni $patroni_version into $patroni_venv"
  $sudo_cmd /usr/bin/python3 -m venv --clear "$patroni_venv"
  $sudo_cmd "$patroni_venv/bin/pip" install --quiet --disable-pip-version-check \
    "patroni[psycopg3,etcd3]==$patroni_version" psycopg-binary==3.3.9 python-etcd==0.4.5
}

need_apt=()
if [ "$level" = ha ]; then
  build_needs
  ha_needs
  apt_install "${need_apt[@]}"
  install_patroni
  ensure_postgres
  echo "deps: etcd $(etcd --version | sed -n 's/^etcd Version: //p'), $("$patroni_venv/bin/patroni" --version)"
  exit 0
fi
if [ "$level" = build ]; then
  build_needs
  apt_install "${need_apt[@]}"
  ensure_postgres
  echo "deps: build tools present, Postgres answers on 127.0.0.1:5432"
  exit 0
fi

# promtool and prometheus (make lint-alerts, tests/tests/alerts.rs): Debian's prometheus
# package, unpacked into a cache outside target/ once per machine, never installed as a
# daemon. Checked before the fast path, so that a machine stamped before this block gets
# it too.
promtool_dir="${XDG_CACHE_HOME:-$HOME/.cache}/charges-tools/prometheus"
if [ ! -x "$promtool_dir/usr/bin/promtool" ]; then
  echo "deps: fetching promtool (Debian package prometheus, unpacked into $promtool_dir)"
  download="$(mktemp -d)"
  if ! (cd "$download" && apt-get download -qq prometheus 2>/dev/null); then
    # No package lists yet (a fresh machine): fetch them, then try again.
    $sudo_cmd apt-get update -qq
    (cd "$download" && apt-get download -qq prometheus)
  fi
  rm -rf "$promtool_dir.partial" && mkdir -p "$promtool_dir.partial" && dpkg-deb -x "$download"/prometheus_*.deb "$promtool_dir.partial"
  rm -rf "$promtool_dir" "$download" && mv "$promtool_dir.partial" "$promtool_dir"
fi

# A PgBouncer that keeps prepared statements in transaction pooling (1.21 and later;
# bookworm ships 1.18): the release deploy/podman/pgbouncer-source.env pins, built into
# the cache by the image's own recipe, once per machine and recipe (a minute).
# tests/tests/pooler.rs and make bench run it for --db-pooler transaction-prepared;
# nothing is installed system-wide.
source "$(dirname "$0")/../deploy/podman/pgbouncer-source.env"
pgbouncer_build="$(dirname "$0")/../deploy/podman/pgbouncer-build.sh"
pgbouncer_prepared_dir="${XDG_CACHE_HOME:-$HOME/.cache}/charges-tools/pgbouncer-$PGBOUNCER_VERSION"
if ! bash "$pgbouncer_build" --built "$pgbouncer_prepared_dir"; then
  echo "deps: building PgBouncer $PGBOUNCER_VERSION into $pgbouncer_prepared_dir"
  [ -f /usr/include/event2/event.h ] || apt_install libevent-dev
  [ -f /usr/include/ares.h ] || apt_install libc-ares-dev
  command -v make >/dev/null 2>&1 || apt_install make
  bash "$pgbouncer_build" "$pgbouncer_prepared_dir" >/dev/null
fi

stamp="${XDG_CACHE_HOME:-$HOME/.cache}/charges-deps/$(sha256sum "$0" | cut -c 1-16)"
if [ -f "$stamp" ] && [ -z "${CHARGES_DEPS_FORCE:-}" ] \
  && command -v cmake pg_isready cargo-nextest tansu pgbouncer >/dev/null 2>&1; then
  ensure_postgres
  exit 0
fi

build_needs
# The chaos and TLS tests start Postgres servers of their own and issue certificates.
command -v openssl >/dev/null 2>&1 || need_apt+=(openssl)
# The pooler tests (tests/tests/pooler.rs) put Debian's PgBouncer (1.18) in front of
# Postgres too.
# Installing the package starts no daemon here; the tests run their own.
command -v pgbouncer >/dev/null 2>&1 || need_apt+=(pgbouncer)
# kubernetes-validate (below) checks deploy/k8s against the Kubernetes schemas in make test.
command -v python3 >/dev/null 2>&1 || need_apt+=(python3)
python3 -m pip --version >/dev/null 2>&1 || need_apt+=(python3-pip)
apt_install "${need_apt[@]}"

rustup component list --installed 2>/dev/null | grep -q '^rustfmt' || rustup component add rustfmt clippy
cargo nextest --version >/dev/null 2>&1 || cargo install --locked cargo-nextest
# A real Kafka-protocol broker for the relay's tests (tests/src/tansu.rs). Built from
# its source crate once per machine (10 to 25 minutes on 2 cores), kept in cargo's bin folder.
command -v tansu >/dev/null 2>&1 || {
  echo "deps: building tansu (a Kafka-compatible broker; once per machine, 10 to 25 min)"
  cargo install --locked tansu --version 0.6.0 --features dynostore
}

# Bundles the Kubernetes JSON schemas, so validation works offline (tests/tests/deploy.rs).
if ! python3 -c 'import kubernetes_validate' >/dev/null 2>&1; then
  echo "deps: installing kubernetes-validate"
  python3 -m pip install --quiet --disable-pip-version-check kubernetes-validate==1.37.0 \
    || python3 -m pip install --quiet --disable-pip-version-check --break-system-packages kubernetes-validate==1.37.0
fi

# Fuzzes the live API against openapi.yaml (tests/tests/schemathesis.rs). Pinned: the test
# uses this version's flags, check names and configuration keys; another version is replaced.
schemathesis_version=4.32.5
if ! python3 -c "import importlib.metadata as m, sys; sys.exit(m.version('schemathesis') != '$schemathesis_version')" >/dev/null 2>&1; then
  echo "deps: installing schemathesis $schemathesis_version"
  python3 -m pip install --quiet --disable-pip-version-check "schemathesis==$schemathesis_version" \
    || python3 -m pip install --quiet --disable-pip-version-check --break-system-packages "schemathesis==$schemathesis_version"
fi

bash "$(dirname "$0")/containers.sh" deps  # podman, compose, local images (or a Docker engine's)
ensure_postgres
mkdir -p "$(dirname "$stamp")" && touch "$stamp"
