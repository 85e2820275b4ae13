#!/usr/bin/env bash
# Makes a Docker engine available for the sandboxes on a fresh Debian machine (CI or developer box):
#   1. installs docker.io and debootstrap with apt-get when missing,
#   2. starts dockerd in the background when `docker info` does not answer (log: $DOCKERD_LOG),
#   3. waits until the engine answers, at most $DOCKERD_WAIT_S seconds, else prints the log tail and fails.
# Needs root (or sudo) for apt-get and dockerd. Idempotent: does nothing when the engine already answers.
set -euo pipefail

DOCKERD_LOG="${DOCKERD_LOG:-/tmp/dockerd.log}"
DOCKERD_WAIT_S="${DOCKERD_WAIT_S:-60}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi

missing=()
command -v docker >/dev/null 2>&1 || missing+=(docker.io)
command -v dockerd >/dev/null 2>&1 || missing+=(docker.io)
command -v debootstrap >/dev/null 2>&1 || missing+=(debootstrap)
if [ "${#missing[@]}" -gt 0 ]; then
  echo "start_dockerd: installing ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -q
  $SUDO apt-get install -y -q --no-install-recommends $(printf '%s\n' "${missing[@]}" | sort -u)
fi

if docker info >/dev/null 2>&1; then
  echo "start_dockerd: engine already running" >&2
  exit 0
fi

echo "start_dockerd: starting dockerd in the background (log: $DOCKERD_LOG)" >&2
$SUDO nohup dockerd >"$DOCKERD_LOG" 2>&1 &

for ((i = 0; i < DOCKERD_WAIT_S * 2; i++)); do
  if docker info >/dev/null 2>&1; then
    echo "start_dockerd: engine up after $((i / 2)) s" >&2
    exit 0
  fi
  sleep 0.5
done
echo "start_dockerd: ERROR: dockerd did not answer within ${DOCKERD_WAIT_S} s; last lines of $DOCKERD_LOG:" >&2
tail -n 30 "$DOCKERD_LOG" >&2 || true
exit 1
