#!/usr/bin/env bash
# A Docker engine from Debian's own packages, for the image tests and CI (no registry needed).
#
#   sudo tests/images/docker-engine.sh
#
# Idempotent: installs `docker.io` with apt-get when dockerd is missing, and starts dockerd in the
# background when `docker info` does not answer (the machine may have no systemd), logging to
# $DOCKERD_LOG (default /var/log/rosetta-dockerd.log); then waits until the engine answers
# (at most $DOCKERD_WAIT seconds, default 90). Runs as root. On bookworm this is Docker 20.10
# (containerd, runc and the nft-backed iptables come with it); the bridge network NATs
# containers (and `docker build`'s RUN steps) out to the internet.
set -euo pipefail

LOG="${DOCKERD_LOG:-/var/log/rosetta-dockerd.log}"
WAIT="${DOCKERD_WAIT:-90}"
DOCKER="${DOCKER:-docker}"

say() { echo "docker-engine.sh: $*" >&2; }
die() { say "$*"; exit 1; }
answers() { "$DOCKER" info >/dev/null 2>&1; }

if answers; then
  exit 0
fi
[[ $(id -u) -eq 0 ]] || die "run as root (installs packages, starts dockerd)"

if ! command -v dockerd >/dev/null 2>&1; then
  say "installing docker.io from Debian's repositories"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends docker.io >/dev/null
fi
command -v "$DOCKER" >/dev/null 2>&1 || die "no '$DOCKER' client after installing docker.io"

# A dockerd that is already starting (pid file alive) is waited for, not started twice.
pidfile=/var/run/docker.pid
if [[ -s $pidfile ]] && kill -0 "$(cat "$pidfile")" 2>/dev/null; then
  say "dockerd $(cat "$pidfile") is running; waiting for it"
elif ! answers; then
  # The package's service may have started it; otherwise no init system did.
  say "starting dockerd (log: $LOG)"
  mkdir -p "$(dirname "$LOG")"
  setsid nohup dockerd >>"$LOG" 2>&1 </dev/null &
fi

for ((i = 0; i < WAIT; i++)); do
  if answers; then
    say "engine $("$DOCKER" version --format '{{.Server.Version}}') answers"
    exit 0
  fi
  sleep 1
done
tail -n 30 "$LOG" >&2 || true
die "dockerd did not answer within ${WAIT}s (log: $LOG)"
