#!/usr/bin/env bash
# A Python 3.11 base image made from Debian's packages (no registry), for building the Dockerfile's
# targets in tests and CI:
#
#   sudo tests/images/debian-base.sh            # → rosetta-test/python:3.11-bookworm
#   docker build --build-arg PYTHON_IMAGE=rosetta-test/python:3.11-bookworm \
#                --build-arg TRAINER_BASE_IMAGE=rosetta-test/python:3.11-bookworm --target trainer .
#
# debootstrap makes a minimal bookworm rootfs (python3 3.11 — the production base's minor —,
# python3-venv for the Dockerfile's /opt/venv, ca-certificates) and `docker import` turns it into
# an image. Cached: skipped when the image exists with this recipe's label (org.rosetta.recipe);
# a change to the recipe below (or to the host's extra CAs) rebuilds it. FORCE=1 rebuilds anyway.
#
# The host's own extra CAs (/usr/local/share/ca-certificates, e.g. a TLS-inspecting proxy's) are
# added to the image's trust store, and PIP_CERT points pip at that store: the image is a local
# test artifact, built for the machine that builds it.
#
# Environment: IMAGE (default rosetta-test/python:3.11-bookworm), MIRROR (default
# http://deb.debian.org/debian), DOCKER (default docker), FORCE. Runs as root.
set -euo pipefail

IMAGE="${IMAGE:-rosetta-test/python:3.11-bookworm}"
MIRROR="${MIRROR:-http://deb.debian.org/debian}"
DOCKER="${DOCKER:-docker}"
SUITE=bookworm
PACKAGES=python3,python3-venv,ca-certificates
RECIPE_VERSION=1  # bump when the steps below change in a way the label would not notice

say() { echo "debian-base.sh: $*" >&2; }
die() { say "$*"; exit 1; }

extra_cas=()
if [[ -d /usr/local/share/ca-certificates ]]; then
  mapfile -t extra_cas < <(find /usr/local/share/ca-certificates -name '*.crt' -type f | sort)
fi
recipe="$( { echo "$RECIPE_VERSION $SUITE $PACKAGES"; ((${#extra_cas[@]})) && cat "${extra_cas[@]}"; } | sha256sum | cut -c1-16)"

have="$("$DOCKER" image inspect --format '{{ index .Config.Labels "org.rosetta.recipe" }}' "$IMAGE" 2>/dev/null || true)"
if [[ "$have" == "$recipe" && "${FORCE:-0}" != 1 ]]; then
  say "$IMAGE is current (recipe $recipe)"
  exit 0
fi
[[ $(id -u) -eq 0 ]] || die "run as root (debootstrap)"

if ! command -v debootstrap >/dev/null 2>&1; then
  say "installing debootstrap"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends debootstrap >/dev/null
fi

work="$(mktemp -d /var/tmp/rosetta-debian-base.XXXXXX)"
cleanup() {
  # debootstrap mounts /proc and /sys in the target while it runs; never delete through a mount.
  for m in proc sys dev/pts dev; do
    mountpoint -q "$work/rootfs/$m" 2>/dev/null && umount -l "$work/rootfs/$m" || true
  done
  rm -rf --one-file-system "$work"
}
trap cleanup EXIT
root="$work/rootfs"

say "debootstrap $SUITE ($PACKAGES) from $MIRROR"
debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$root" "$MIRROR" >"$work/debootstrap.log" 2>&1 \
  || { tail -n 30 "$work/debootstrap.log" >&2; die "debootstrap failed"; }

if ((${#extra_cas[@]})); then
  cp "${extra_cas[@]}" "$root/usr/local/share/ca-certificates/"
  chroot "$root" update-ca-certificates >/dev/null 2>&1
fi
chroot "$root" python3 -c 'import sys, venv, ensurepip; assert sys.version_info[:2] == (3, 11), sys.version'
version="$(chroot "$root" python3 -c 'import platform; print(platform.python_version())')"

# What a container never needs: package lists and caches, docs, man pages, translations.
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin "$root"/var/cache/apt/archives/*.deb \
       "$root"/usr/share/doc/* "$root"/usr/share/man/* "$root"/usr/share/locale/* "$root"/var/log/*.log
# The same sources.list a bookworm image has, so `apt-get update` works in it.
echo "deb $MIRROR $SUITE main" >"$root/etc/apt/sources.list"

say "importing as $IMAGE (python $version)"
tar --numeric-owner -C "$root" -c . | "$DOCKER" import \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'ENV LANG=C.UTF-8' \
  --change 'ENV PIP_CERT=/etc/ssl/certs/ca-certificates.crt' \
  --change "LABEL org.rosetta.recipe=$recipe org.rosetta.python=$version" \
  --change 'CMD ["python3"]' \
  - "$IMAGE" >/dev/null
say "$IMAGE built (recipe $recipe)"
