#!/usr/bin/env bash
# The container engine for the container-mode tests, `make image`, `make compose-demo`
# and the kube play test. Two kinds of engine (deploy/images.env names the images of each):
#
#   podman  this project's machines: Debian's podman with runc, the settings of
#           deploy/podman/containers.conf, its Docker-compatible API on a socket of the
#           project's own, and every image built here (no registry is reachable). Root only.
#   docker  a Docker engine that answers `docker info` (a laptop, CI elsewhere): the
#           upstream images are pulled. Forced either way with CHARGES_ENGINE=podman|docker.
#
# Subcommands:
#   kind                 prints podman or docker
#   name WHAT            prints the image deploy/images.env names WHAT (BASE, POSTGRES,
#                        BROKER, PGBOUNCER, CHARGES) for this kind
#   deps                 installs what the kind needs (once; cheap when present), then `images`
#   images               the service images of deploy/images.env: built (podman, cached by
#                        recipe) or pulled (docker)
#   image                the application image from deploy/Dockerfile (make image)
#   socket start|stop    podman's API socket; `start` prints "started" when it started it
#   with-socket CMD...   runs CMD with the engine's environment (DOCKER_HOST, CHARGES_ENGINE,
#                        CONTAINERS_CONF), the socket started for it and stopped afterwards
#                        if this call started it
#   env                  the same environment as shell exports: eval "$(scripts/containers.sh env)"
#   leaks                lists what the tests left behind (testcontainers' containers, the
#                        tests' networks, kube play's pods); exits 1 if any
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
export CONTAINERS_CONF="$root/deploy/podman/containers.conf"
socket_dir=/run/charges-podman
socket="$socket_dir/podman.sock"
sudo_cmd=""
[ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"

kind() {
  if [ -n "${CHARGES_ENGINE:-}" ]; then
    echo "$CHARGES_ENGINE"
  elif command -v docker >/dev/null 2>&1 && env -u DOCKER_HOST docker info >/dev/null 2>&1; then
    echo docker
  else
    echo podman
  fi
}

# image NAME: the image deploy/images.env names NAME (BASE, POSTGRES, BROKER, PGBOUNCER, CHARGES) for this kind.
image() {
  local key
  key="$(kind)_$1_IMAGE"
  sed -n "s/^$key=//p" "$root/deploy/images.env"
}

engine() {
  if [ "$(kind)" = podman ]; then podman "$@"; else docker "$@"; fi
}

deps() {
  if [ "$(kind)" = docker ]; then
    command -v docker-compose >/dev/null 2>&1 || docker compose version >/dev/null 2>&1 \
      || { echo "containers: neither docker-compose nor docker compose found" >&2; exit 1; }
  else
    local need=()
    command -v podman >/dev/null 2>&1 || need+=(podman)
    command -v runc >/dev/null 2>&1 || need+=(runc)
    command -v debootstrap >/dev/null 2>&1 || need+=(debootstrap)
    # Compose v1 (Python) speaks the Docker API, so it drives podman's socket here and a
    # Docker engine elsewhere with the same file (docs/operations.md, Deploying).
    command -v docker-compose >/dev/null 2>&1 || need+=(docker-compose)
    # Installed without recommends (below), so the network stack containers.conf names
    # (netavark, with aardvark-dns for names on compose's bridge networks), the init of
    # kube play's pause containers (catatonit) and iptables for published ports are
    # asked for by name.
    [ -x /usr/lib/podman/netavark ] || need+=(netavark)
    [ -x /usr/lib/podman/aardvark-dns ] || need+=(aardvark-dns)
    [ -x /usr/libexec/podman/catatonit ] || command -v catatonit >/dev/null 2>&1 || need+=(catatonit)
    command -v iptables >/dev/null 2>&1 || need+=(iptables)
    if [ ${#need[@]} -gt 0 ]; then
      echo "containers: installing ${need[*]}"
      $sudo_cmd apt-get update -qq
      # No recommends: docker-compose recommends Docker's own engine, which is not used.
      DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends \
        "${need[@]}" >/dev/null
    fi
  fi
  images
}

# recipe_hash FILE...: what a locally built image is labelled with; a change rebuilds it.
recipe_hash() {
  cat "$@" | sha256sum | cut -c 1-16
}

built_recipe() {
  podman image inspect --format '{{index .Labels "charges.recipe"}}' "$1" 2>/dev/null || true
}

# build_local NAME CONTAINERFILE CONTEXT_FILE...: podman build of one service image on the
# base, skipped when an image with the same recipe exists.
build_local() {
  local name="$1" containerfile="$2"
  shift 2
  local recipe context
  recipe="$(recipe_hash "$containerfile" "$@")-$(podman image inspect --format '{{.Id}}' "$(image BASE)" | cut -c 1-12)"
  [ "$(built_recipe "$name")" = "$recipe" ] && return 0
  echo "containers: building $name"
  context="$(mktemp -d)"
  [ $# -eq 0 ] || cp "$@" "$context/"
  podman build --network host --build-arg "BASE=$(image BASE)" \
    --label "charges.recipe=$recipe" -f "$containerfile" -t "$name" "$context" >"$context.log" 2>&1 \
    || { tail -n 30 "$context.log" >&2; exit 1; }
  rm -rf "$context" "$context.log"
}

images() {
  if [ "$(kind)" = docker ]; then
    for name in BASE POSTGRES BROKER; do
      docker image inspect "$(image "$name")" >/dev/null 2>&1 || docker pull "$(image "$name")"
    done
    docker build --build-arg "BASE=$(image BASE)" -t "$(image PGBOUNCER)" \
      -f "$root/deploy/podman/pgbouncer.Containerfile" "$root/deploy/podman"
    return 0
  fi
  local base recipe
  base="$(image BASE)"
  # Bump the number to rebuild the base everywhere.
  recipe="bookworm-minbase-2"
  if [ "$(built_recipe "$base")" != "$recipe" ]; then
    local mirror dir
    # The Debian mirror apt already uses.
    mirror="$(bash "$root/deploy/podman/apt-mirror.sh")"
    dir="$(mktemp -d)"
    echo "containers: building $base (debootstrap --variant=minbase bookworm, under a minute)"
    debootstrap --variant=minbase bookworm "$dir" "$mirror" >"$dir.log" 2>&1 \
      || { tail -n 20 "$dir.log" >&2; exit 1; }
    rm -rf "$dir"/var/lib/apt/lists/* "$dir"/var/cache/apt/*.bin
    # An imported file system has no configuration: PATH as Debian's images set it.
    tar -C "$dir" -c . | podman import --change "LABEL charges.recipe=$recipe" \
      --change "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" \
      --change 'CMD ["bash"]' - "$base" >/dev/null
    rm -rf "$dir" "$dir.log"
  fi
  build_local "$(image POSTGRES)" "$root/deploy/podman/postgres.Containerfile" \
    "$root/deploy/podman/postgres-entrypoint.sh"
  local tansu
  tansu="$(command -v tansu || echo "${CARGO_HOME:-$HOME/.cargo}/bin/tansu")"
  [ -x "$tansu" ] || { echo "containers: tansu is missing (make deps installs it)" >&2; exit 1; }
  build_local "$(image BROKER)" "$root/deploy/podman/tansu.Containerfile" \
    "$tansu" "$root/deploy/podman/tansu-entrypoint.sh"
  # Compiled in the build from the pinned source (a minute or two, once per recipe).
  build_local "$(image PGBOUNCER)" "$root/deploy/podman/pgbouncer.Containerfile" \
    "$root/deploy/podman/pgbouncer-source.env" "$root/deploy/podman/pgbouncer-build.sh" \
    "$root/deploy/podman/apt-mirror.sh"
}

# The application image. podman: the runtime stage on the local base, with the binaries of
# target/release (the Rust builder image cannot be pulled here); docker: the whole
# multi-stage build, upstream base.
app_image() {
  if [ "$(kind)" = docker ]; then
    docker build -f "$root/deploy/Dockerfile" -t "$(image CHARGES)" "$root"
    return 0
  fi
  local context
  context="$(mktemp -d)"
  for binary in charges-api charges-relay charges-consumer; do
    cp "${CARGO_TARGET_DIR:-$root/target}/release/$binary" "$context/"
  done
  podman build --network host --target runtime-from-host \
    --build-arg "RUNTIME_BASE=$(image BASE)" \
    -f "$root/deploy/Dockerfile" -t "$(image CHARGES)" "$context"
  rm -rf "$context"
}

socket_up() {
  curl -sf --max-time 2 --unix-socket "$socket" http://d/_ping >/dev/null 2>&1
}

socket_start() {
  if socket_up; then
    echo running
    return 0
  fi
  mkdir -p "$socket_dir"
  rm -f "$socket"
  nohup podman system service --time=0 "unix://$socket" >"$socket_dir/service.log" 2>&1 &
  echo $! >"$socket_dir/service.pid"
  for _ in $(seq 1 100); do
    socket_up && { echo started; return 0; }
    sleep 0.1
  done
  echo "containers: podman's API did not answer on $socket:" >&2
  cat "$socket_dir/service.log" >&2
  exit 1
}

socket_stop() {
  [ -f "$socket_dir/service.pid" ] || return 0
  local pid
  pid="$(cat "$socket_dir/service.pid")"
  kill "$pid" 2>/dev/null || true
  for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  rm -f "$socket_dir/service.pid" "$socket"
}

engine_env() {
  echo "export CHARGES_ENGINE=$(kind)"
  if [ "$(kind)" = podman ]; then
    echo "export CONTAINERS_CONF=$CONTAINERS_CONF"
    echo "export DOCKER_HOST=unix://$socket"
  fi
}

with_socket() {
  local started=""
  if [ "$(kind)" = podman ] && [ "$(socket_start)" = started ]; then
    started=yes
  fi
  eval "$(engine_env)"
  local status=0
  "$@" || status=$?
  [ -z "$started" ] || socket_stop
  return "$status"
}

leaks() {
  local left
  left="$(engine ps -a --filter label=org.testcontainers.managed-by=testcontainers --format '{{.Names}} {{.Image}}')"
  # The tests' networks (charges-<purpose>-<id>), compose's (charges-demo-<pid>_default)
  # and kube play's pods.
  left+=$'\n'"$(engine network ls --format '{{.Name}}' | grep '^charges-' | sed 's/^/network /' || true)"
  if [ "$(kind)" = podman ]; then
    left+=$'\n'"$(podman pod ps --format '{{.Name}}' | sed 's/^/pod /')"
  fi
  left="$(echo "$left" | sed '/^$/d')"
  if [ -n "$left" ]; then
    echo "left behind by the tests:"
    echo "$left"
    return 1
  fi
}

case "${1:-}" in
  kind) kind ;;
  name) image "${2:?usage: $0 name BASE|POSTGRES|BROKER|PGBOUNCER|CHARGES}" ;;
  deps) deps ;;
  images) images ;;
  image) app_image ;;
  socket)
    case "${2:-}" in
      start) if [ "$(kind)" = podman ]; then socket_start; fi ;;
      stop) socket_stop ;;
      *) echo "usage: $0 socket start|stop" >&2; exit 2 ;;
    esac
    ;;
  with-socket) shift; with_socket "$@" ;;
  env) engine_env ;;
  leaks) leaks ;;
  *) sed -n '2,/^set -e/p' "$0" | sed '$d' >&2; exit 2 ;;
esac
