#!/usr/bin/env bash
# Builds the sandbox images (Debian base via debootstrap + `docker import`, then the task image) unless their
# content-addressed tags already exist; prints the task image tag. Run launch/start_dockerd.sh first.
# Pass --force to rebuild. Needs root for debootstrap (uses sudo otherwise).
set -euo pipefail
cd "$(dirname "$0")/.."
export DEBIAN_FRONTEND=noninteractive
PY="${PYTHON:-python3}"
if [ "$(id -u)" -ne 0 ] && ! docker image inspect "$("$PY" -m bat_jax.sandbox.images --print-tag)" >/dev/null 2>&1; then
  exec sudo -E "$PY" -m bat_jax.sandbox.images "$@"
fi
exec "$PY" -m bat_jax.sandbox.images "$@"
