#!/usr/bin/env bash
# What a real test node needs from Debian besides the binaries build-cluster.sh compiles: the CNI
# plugins (bridge, host-local, firewall, portmap), iptables (kube-proxy, the CNI firewall), and what
# build-cluster.sh needs for the two C parts (runc with libseccomp, the pause binary), and a
# Prometheus server that scrapes the cluster's metrics endpoints as an in-cluster one would.
# Idempotent; installs only what is missing. Root.
set -euo pipefail
missing=()
command -v gcc >/dev/null || missing+=(gcc libc6-dev)
command -v pkg-config >/dev/null || missing+=(pkg-config)
[ -e /usr/include/seccomp.h ] || missing+=(libseccomp-dev)
[ -x /usr/lib/cni/bridge ] || missing+=(containernetworking-plugins)
command -v iptables-restore >/dev/null || missing+=(iptables)
command -v ip >/dev/null || missing+=(iproute2)
command -v prometheus >/dev/null || missing+=(prometheus)
[ ${#missing[@]} -eq 0 ] && exit 0
[ "$(id -u)" -eq 0 ] || { echo "node-packages.sh: run as root to install ${missing[*]}" >&2; exit 1; }
echo "node-packages.sh: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
