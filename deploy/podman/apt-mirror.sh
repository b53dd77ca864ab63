#!/usr/bin/env bash
# Prints the Debian archive apt is configured with: the URI of the first `deb` entry
# (one-line sources.list or deb822 .sources) for this system's release, else the first
# whose URI ends in /debian. Whatever downloads from the Debian archive asks this, so
# that nothing names a package host and everything works behind the machine's mirror:
# debootstrap of the image base (scripts/containers.sh) and PgBouncer's source
# (pgbouncer-build.sh, on the host and inside the image build).
set -euo pipefail

files=()
for file in /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
  [ -f "$file" ] && files+=("$file")
done
[ ${#files[@]} -gt 0 ] || { echo "apt-mirror: no apt sources in /etc/apt" >&2; exit 1; }
codename="$(. /etc/os-release && echo "${VERSION_CODENAME:-}")"

# Each entry as "URI SUITE" lines: one-line `deb [options] URI SUITE COMPONENTS...`, and
# deb822 stanzas (blank-line separated) whose Types include deb, one line per URI and
# suite. A file of one format never holds the other (apt's rule), so the stanza state
# is reset per file.
entries="$(awk '
  function flush(   i, j, u, s, nu, ns) {
    if (types ~ /(^| )deb( |$)/ && enabled != "no") {
      nu = split(uris, u, " "); ns = split(suites, s, " ")
      for (i = 1; i <= nu; i++) for (j = 1; j <= ns; j++) print u[i], s[j]
    }
    types = ""; uris = ""; suites = ""; enabled = ""
  }
  FNR == 1 { flush() }
  /^[ \t]*#/ { next }
  /^deb[ \t]/ {
    line = $0; sub(/^deb[ \t]+(\[[^]]*\][ \t]+)?/, "", line); split(line, f, /[ \t]+/)
    print f[1], f[2]; next
  }
  /^[ \t]*$/ { flush(); next }
  tolower($1) == "types:" { $1 = ""; types = $0 }
  tolower($1) == "uris:" { $1 = ""; uris = $0 }
  tolower($1) == "suites:" { $1 = ""; suites = $0 }
  tolower($1) == "enabled:" { enabled = tolower($2) }
  END { flush() }
' "${files[@]}")"

mirror="$(awk -v codename="$codename" 'codename != "" && $2 == codename { print $1; exit }' <<<"$entries")"
[ -n "$mirror" ] || mirror="$(awk '$1 ~ /\/debian\/?$/ { print $1; exit }' <<<"$entries")"
[ -n "$mirror" ] || {
  echo "apt-mirror: no Debian archive (a deb entry for ${codename:-this release}, or a URI ending in /debian) in ${files[*]}" >&2
  exit 1
}
echo "${mirror%/}"
