#!/usr/bin/env bash
# pgbouncer-build.sh DEST: builds the PgBouncer pgbouncer-source.env pins into
# DEST/pgbouncer. One recipe for the image (pgbouncer.Containerfile's build stage) and
# for the host's copy that the pooler tests and the bench run (scripts/deps.sh). The
# source release comes from the Debian archive apt is configured with (apt-mirror.sh)
# and is checked against the pinned sha256 before it is unpacked. The caller installs
# the tools: curl, a C compiler, make, pkg-config, the libevent, OpenSSL and c-ares
# headers.
# pgbouncer-build.sh --built DEST: exits 0 if DEST holds this recipe's build (DEST/recipe
# names it), 1 if it must be built (again).
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
recipe="$(cat "$here/pgbouncer-source.env" "$here/pgbouncer-build.sh" | sha256sum | cut -c 1-16)"
if [ "${1:-}" = --built ]; then
  dest="${2:?usage: $0 --built DEST_DIR}"
  [ -x "$dest/pgbouncer" ] && [ "$(cat "$dest/recipe" 2>/dev/null)" = "$recipe" ]
  exit
fi
dest="${1:?usage: $0 DEST_DIR}"
# shellcheck source=pgbouncer-source.env
source "$here/pgbouncer-source.env"
mirror="$(bash "$here/apt-mirror.sh")"
build="$(mktemp -d)"
trap 'rm -rf "$build"' EXIT

tarball="pgbouncer_$PGBOUNCER_VERSION.orig.tar.gz"
url="$mirror/pool/main/p/pgbouncer/$tarball"
curl -fsSL --retry 3 -o "$build/$tarball" "$url" \
  || { echo "pgbouncer-build: could not fetch $url" >&2; exit 1; }
echo "$PGBOUNCER_SHA256  $build/$tarball" | sha256sum -c --quiet >/dev/null 2>&1 \
  || { echo "pgbouncer-build: $url is not the pinned release (sha256 $(sha256sum "$build/$tarball" | cut -d' ' -f1), pinned $PGBOUNCER_SHA256)" >&2; exit 1; }
tar -xzf "$build/$tarball" -C "$build"
# c-ares resolves the [databases] hosts as the C library does (search domains, as on a
# compose or pod network); libevent's resolver, the fallback, finds no short names there.
(cd "$build/pgbouncer-$PGBOUNCER_VERSION" && ./configure --with-cares >"$build/configure.log" 2>&1 \
  && make -j"$(nproc)" >"$build/make.log" 2>&1) \
  || { tail -n 30 "$build"/*.log >&2; echo "pgbouncer-build: building PgBouncer $PGBOUNCER_VERSION failed" >&2; exit 1; }
mkdir -p "$dest"
cp "$build/pgbouncer-$PGBOUNCER_VERSION/pgbouncer" "$dest/pgbouncer.partial"
mv "$dest/pgbouncer.partial" "$dest/pgbouncer"
echo "$recipe" >"$dest/recipe"
"$dest/pgbouncer" --version | head -n 1
