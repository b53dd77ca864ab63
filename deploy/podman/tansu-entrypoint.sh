#!/bin/sh
set -eu
if [ -z "${ADVERTISED_LISTENER_URL:-}" ]; then
  ADVERTISED_LISTENER_URL="tcp://$(hostname -i | cut -d ' ' -f 1):9092"
  export ADVERTISED_LISTENER_URL
fi
exec tansu "$@"
