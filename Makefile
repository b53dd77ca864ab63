# The two commands the README promises: `make demo` and `make test`.
SHELL := /bin/bash
DATABASE_URL ?= postgres://postgres@127.0.0.1:5432/test
export DATABASE_URL
# Tests print a short panic message; set RUST_BACKTRACE=1 yourself to dig in.
export RUST_BACKTRACE ?= 0

.PHONY: help deps build release test lint fmt demo clean

help: ## List the targets.
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-10s %s\n", $$1, $$2}'

deps: ## Install what a fresh Debian machine lacks (cmake + libcurl headers for librdkafka, nextest, Postgres up).
	@bash scripts/deps.sh

build: deps ## Debug build of every binary (the tests start them).
	cargo build --bins

release: deps ## target/release/charges-api and target/release/charges-relay.
	cargo build --release --bins

test: build ## Every test, against the Postgres at DATABASE_URL (each test makes its own database).
	cargo fmt --all -- --check
	cargo nextest run --workspace

lint: ## rustfmt and clippy with warnings as errors.
	cargo fmt --all -- --check
	cargo clippy --all-targets -- -D warnings

fmt: ## Format everything.
	cargo fmt --all

demo: build ## API, two relays, kafka-mock and the consumer end to end on this machine (local Postgres, ~15 s).
	@bash scripts/demo.sh

clean:
	cargo clean
