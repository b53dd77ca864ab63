# The two commands the README promises: `make demo` and `make test`.
SHELL := /bin/bash
DATABASE_URL ?= postgres://postgres@127.0.0.1:5432/test
export DATABASE_URL
# Tests print a short panic message; set RUST_BACKTRACE=1 yourself to dig in.
export RUST_BACKTRACE ?= 0

.PHONY: help deps build-deps ha-deps ha-demo bench-deps build release image test check doctest chaos lint lint-alerts fmt demo compose-demo bench soak kafka-mock clean

help: ## List the targets.
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-10s %s\n", $$1, $$2}'

# build-deps first, also under make -j: two apt-get runs at once would fight over its lock.
deps: build-deps ## Install everything make test needs (once per machine; later only checks that Postgres is up).
	@bash scripts/deps.sh full

build-deps: ## Install only what building and make demo need (C libraries, cmake, Postgres); start Postgres.
	@bash scripts/deps.sh build

ha-deps: build-deps ## etcd and Patroni (pinned) for make chaos and make ha-demo; not needed by make test.
	@bash scripts/deps.sh ha

# Every binary, also for make demo: building only the demo's three packages resolves their
# dependencies' features differently, so make test or make check would compile ~40 crates again.
build: build-deps ## Debug build of every binary (the tests and the demo start them).
	cargo build --bins

release: build-deps ## target/release/charges-api and target/release/charges-relay.
	cargo build --release --bins

# The container engine (podman here, docker where one answers; docs/development.md).
CONTAINERS := bash scripts/containers.sh
# make test's second run, with Postgres and the broker in containers of each test's own.
CONTAINER_MODE_TESTS := test(/^api::/) | test(/^consumer::/) | test(=relay::a_created_charge_is_published_once_with_its_headers)

image: deps release ## The application image (deploy/Dockerfile) as deploy/images.env names it.
	$(CONTAINERS) deps
	$(CONTAINERS) image

test: deps build image ## Every test against DATABASE_URL, then some in container mode, the compose demo; no container left.
	cargo fmt --all -- --check
	$(MAKE) doctest
	$(CONTAINERS) with-socket cargo nextest run --workspace
	$(CONTAINERS) with-socket env TEST_SERVICES=containers cargo nextest run -p charges-tests -E '$(CONTAINER_MODE_TESTS)'
	$(CONTAINERS) with-socket bash scripts/compose-demo.sh
	$(CONTAINERS) leaks

# The fast loop: no install, no image, no containers. Which tests: the nextest profile
# `check` (.config/nextest.toml) leaves out those that need what only `make deps` installs.
check: ## fmt, build, then the tests that need only the build and Postgres at DATABASE_URL.
	cargo fmt --all -- --check
	@pg_isready -q -d "$(DATABASE_URL)" || { echo "check: no Postgres answers at $(DATABASE_URL) (make build-deps starts the local one)" >&2; exit 1; }
	@command -v cargo-nextest >/dev/null 2>&1 || { echo "check: cargo-nextest is missing (make deps installs it)" >&2; exit 1; }
	cargo build --bins
	$(MAKE) doctest
	cargo nextest run --workspace -P check

# nextest runs no doctests: the building blocks' README examples compile here, every
# feature on.
BUILDING_BLOCKS := pg-plumbing pg-idempotency pg-outbox pg-inbox
doctest: ## The building blocks' documentation examples (their READMEs) compile.
	cargo test --doc $(addprefix -p ,$(BUILDING_BLOCKS)) --all-features

chaos: deps ha-deps build image ## Every fault-injection scenario, the slow ones too (chaos.rs, network_faults.rs, patroni.rs; make test runs the fast ones).
	$(CONTAINERS) with-socket cargo nextest run -p charges-tests --run-ignored all --no-capture -E 'test(/^chaos::/) | test(/^hostile_input::/) | test(/^network_faults::/) | test(/^patroni::/) | test(/::slow_/)'

lint: ## rustfmt, clippy with warnings as errors, cargo-deny (licences, bans; deny.toml).
	cargo fmt --all -- --check
	cargo clippy --all-targets -- -D warnings
	@# Installed on first use only (a few minutes to build); never part of make test.
	@command -v cargo-deny >/dev/null 2>&1 || { echo "installing cargo-deny"; cargo install --locked cargo-deny; }
	cargo deny check --hide-inclusion-graph licenses bans

# promtool: $PROMTOOL, else the one on PATH, else the copy `make deps` (scripts/deps.sh)
# unpacks from Debian's prometheus package into the cache, once per machine.
PROMTOOL ?= $(or $(shell command -v promtool 2>/dev/null),$(or $(XDG_CACHE_HOME),$(HOME)/.cache)/charges-tools/prometheus/usr/bin/promtool)

lint-alerts: deps ## promtool check rules and test rules (alerts.test.yaml) on deploy/prometheus; make test runs both.
	$(PROMTOOL) check rules deploy/prometheus/alerts.yaml
	$(PROMTOOL) test rules deploy/prometheus/alerts.test.yaml

fmt: ## Format everything.
	cargo fmt --all

demo: build ## API, two relays, kafka-mock and the consumer end to end on this machine (local Postgres).
	@bash scripts/demo.sh

ha-demo: ha-deps build ## A Patroni cluster (etcd, two nodes) under the API and two relays; the leader crashes under load.
	@bash scripts/ha-demo.sh

compose-demo: image ## deploy/docker-compose.yml up in containers, one charge applied once, then down.
	@$(CONTAINERS) with-socket bash scripts/compose-demo.sh

bench-deps: deps ## What the benchmarks need besides the build: wrk (HTTP load), pgbench, PgBouncer, jq, gnuplot and valgrind.
	@command -v wrk >/dev/null 2>&1 || { echo "installing wrk"; apt-get install -y -qq wrk >/dev/null; }
	@command -v pgbench >/dev/null 2>&1 || { echo "installing pgbench"; apt-get install -y -qq postgresql-contrib >/dev/null; }
	@command -v pgbouncer >/dev/null 2>&1 || { echo "installing pgbouncer"; apt-get install -y -qq pgbouncer >/dev/null; }
	@command -v jq >/dev/null 2>&1 || { echo "installing jq"; apt-get install -y -qq jq >/dev/null; }
	@command -v gnuplot >/dev/null 2>&1 || { echo "installing gnuplot"; apt-get install -y -qq gnuplot-nox >/dev/null; }
	@command -v valgrind >/dev/null 2>&1 || { echo "installing valgrind"; apt-get install -y -qq valgrind >/dev/null; }

bench: bench-deps ## Throughput and latency against floors measured in the same run (never part of make test).
	@bash scripts/bench.sh

soak: bench-deps ## SOAK_SECONDS (600) of mixed traffic: tables bounded, memory flat, no 5xx.
	@bash scripts/soak.sh

kafka-mock: build ## A local Kafka-protocol broker (librdkafka's mock cluster); prints bootstrap=<addr>.
	./target/debug/kafka-mock --topic charges.events

clean:
	cargo clean
