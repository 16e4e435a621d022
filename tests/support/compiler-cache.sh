#!/usr/bin/env bash
# ccache from Debian, for the C++ extensions DeepSpeed compiles on first use: torch puts it in front
# of the compiler when it is on PATH (tests/conftest.py says why). Idempotent; installs only when
# missing, and only as root: without it the extensions still build, from scratch in each new virtualenv.
set -euo pipefail
command -v ccache >/dev/null && exit 0
[ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null || exit 1
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends ccache >/dev/null
