#!/usr/bin/env bash
# A local image registry from Debian's `docker-registry` package (Distribution 2.8), in the
# foreground, for testing build_and_push.sh without any outside registry:
#
#   tests/images/local-registry.sh PORT STORAGE_DIR     # serves http://127.0.0.1:PORT until killed
#   tests/images/local-registry.sh --garbage-collect STORAGE_DIR
#       # with no registry serving STORAGE_DIR: deletes the manifests no tag names and the blobs
#       # that no remaining manifest references (`docker-registry garbage-collect --delete-untagged`)
#
# Installs the package with apt-get when the binary is missing (its own service is not used) and
# runs the binary with a config of its own: 127.0.0.1 only, no auth, blobs under STORAGE_DIR/data.
# Docker pushes to and pulls from 127.0.0.1 registries over plain HTTP without configuration.
set -euo pipefail

usage() { echo "usage: $0 PORT STORAGE_DIR | $0 --garbage-collect STORAGE_DIR" >&2; exit 2; }
[[ $# -eq 2 ]] || usage
mode=serve
port="$1"
if [[ "$1" == --garbage-collect ]]; then
  mode=gc
  port=0
elif [[ ! "$1" =~ ^[0-9]+$ ]]; then
  usage
fi
storage="$2"

if ! command -v docker-registry >/dev/null 2>&1; then
  echo "local-registry.sh: installing docker-registry from Debian's repositories" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends docker-registry >/dev/null
fi

mkdir -p "$storage"
config="$storage/config-$mode.yml"
cat >"$config" <<YAML
version: 0.1
log:
  level: warn
storage:
  filesystem:
    rootdirectory: $storage/data
  delete:
    enabled: true
http:
  addr: 127.0.0.1:$port
YAML
if [[ $mode == gc ]]; then
  exec docker-registry garbage-collect --delete-untagged "$config"
fi
exec docker-registry serve "$config"
