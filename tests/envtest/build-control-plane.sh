#!/bin/bash
# Builds the control plane the integration tests run against, offline, from Debian's packages only:
#   kube-apiserver + kube-controller-manager v1.20.2 compiled from Debian bookworm's `kubernetes` source
#   package (the upstream tree with vendor/) using Debian's golang-1.19, unpacked rather than installed so
#   the machine's Go (if any) is untouched; etcd 3.4.23 and kubectl 1.20.2 unpacked from Debian's
#   etcd-server and kubernetes-client packages.
# Why Go 1.19 needs two swapped vendored modules: reflect2 1.0.1 / json-iterator 1.1.10 crash at runtime
# under Go >= 1.18, so Debian's reflect2 1.0.2 / json-iterator 1.1.12 replace them.
# Cold build: about 5 minutes on 2 cores; later calls with the same OUTDIR return at once.
# The output folder follows envtest's KUBEBUILDER_ASSETS convention (a folder holding the binaries).
#
# Usage: build-control-plane.sh OUTDIR   -> OUTDIR/{kube-apiserver,kube-controller-manager,etcd,kubectl}
set -euo pipefail
OUT=${1:?usage: build-control-plane.sh OUTDIR}
KUBE_DEB_VERSION=${ROSETTA_KUBE_DEB_VERSION:-1.20.5+really1.20.2-1.1+deb12u1}
BINARIES="kube-apiserver kube-controller-manager etcd kubectl"
# Bump when the recipe changes what the binaries do: a folder built by an older recipe is rebuilt.
RECIPE=3

mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
built() {
  for b in $BINARIES; do [ -x "$OUT/$b" ] || return 1; done
  [ "$(cat "$OUT/.recipe" 2>/dev/null)" = "$RECIPE" ]
}
if built; then echo "control plane already built in $OUT"; exit 0; fi

# Two test sessions starting at once on a fresh machine must not build into the same folder.
exec 9>"$OUT/.build.lock"
flock 9
if built; then echo "control plane already built in $OUT"; exit 0; fi

need_root() { [ "$(id -u)" = 0 ] || { echo "build-control-plane.sh: missing $*; install it (or run as root)" >&2; exit 1; }; }
missing=""
for tool in rsync patch make xz dpkg-deb apt-get; do command -v $tool >/dev/null || missing="$missing $tool"; done
if [ -n "$missing" ]; then
  need_root "$missing"
  apt-get update -q >/dev/null
  apt-get install -y -q --no-install-recommends rsync patch make xz-utils >/dev/null
fi

WORK=$OUT/work; rm -rf "$WORK"; mkdir -p "$WORK"/{debs,lists/partial,cache/archives/partial,go,root,srcparts}
trap 'rm -rf "$WORK"' EXIT

# A private apt state whose sources are the deb-src twins of the machine's own deb sources, so the
# machine's apt configuration and lists are never touched. Both the deb822 and the one-line formats.
{
  for f in /etc/apt/sources.list.d/*.sources; do [ -f "$f" ] && { sed -n '/^Types:/,/^$/p' "$f"; echo; }; done \
    | sed 's/^Types: deb$/Types: deb-src/'
} > "$WORK/srcparts/src.sources"
{
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do [ -f "$f" ] && grep -E '^deb ' "$f" || true; done \
    | sed 's/^deb /deb-src /'
} > "$WORK/srcparts/src.list"
[ -s "$WORK/srcparts/src.list" ] || rm "$WORK/srcparts/src.list"
APT="-q -o Dir::Etc::SourceList=/dev/null -o Dir::Etc::SourceParts=$WORK/srcparts -o Dir::State::Lists=$WORK/lists -o Dir::Cache=$WORK/cache"
[ "$(id -u)" = 0 ] && APT="$APT -o APT::Sandbox::User=root"
apt-get $APT update >/dev/null
(cd "$WORK" && apt-get $APT source --download-only "kubernetes=$KUBE_DEB_VERSION")
# Binary packages come from the machine's ordinary (deb) sources, whose lists may be stale on a fresh box.
if [ "$(id -u)" = 0 ]; then apt-get update -q >/dev/null; fi
SANDBOX=""; [ "$(id -u)" = 0 ] && SANDBOX="-o APT::Sandbox::User=root"
(cd "$WORK/debs" && apt-get -q $SANDBOX download \
   golang-1.19-go golang-1.19-src golang-github-modern-go-reflect2-dev golang-github-json-iterator-go-dev \
   etcd-server kubernetes-client)
for d in "$WORK"/debs/golang*.deb; do dpkg-deb -x "$d" "$WORK/go"; done
for d in "$WORK"/debs/etcd-server*.deb "$WORK"/debs/kubernetes-client*.deb; do dpkg-deb -x "$d" "$WORK/root"; done

UPSTREAM=${KUBE_DEB_VERSION%-*}
cd "$WORK"
tar xzf "kubernetes_${UPSTREAM}.orig.tar.gz"
tar xJf "kubernetes_${KUBE_DEB_VERSION}.debian.tar.xz"
cd "$WORK"/kubernetes-*/
for p in $(cat ../debian/patches/series); do patch -p1 -s < "../debian/patches/$p"; done
G=$WORK/go/usr/share/gocode/src/github.com
rm -rf vendor/github.com/modern-go/reflect2 vendor/github.com/json-iterator/go
cp -r "$G/modern-go/reflect2" vendor/github.com/modern-go/reflect2
cp -r "$G/json-iterator/go" vendor/github.com/json-iterator/go
find vendor/github.com/modern-go/reflect2 vendor/github.com/json-iterator/go -name '*_test.go' -delete
# go-openapi/validate (and its fork in kube-openapi, which CRD validation uses) tells null from a value by
# comparing two reflect.Values with DeepEqual; since Go 1.18 that holds for "" (both point at the
# runtime's zero value), so every CRD field of type string rejected "" as null. Later kube-openapi
# dropped the comparison; so do we, in both copies.
ZERO_CHECK='if data == nil || reflect.DeepEqual(reflect.Zero(reflect.TypeOf(data)), reflect.ValueOf(data)) {'
ZERO_FILES="vendor/k8s.io/kube-openapi/pkg/validation/validate/type.go vendor/github.com/go-openapi/validate/type.go"
for f in $ZERO_FILES; do
  grep -qF "$ZERO_CHECK" "$f" || { echo "build-control-plane.sh: no zero-value check in $f; update the patch" >&2; exit 1; }
  sed -i "s/$(printf '%s' "$ZERO_CHECK" | sed 's/[][\\.*^$/]/\\&/g')/if data == nil {/" "$f"
  if grep -qF "$ZERO_CHECK" "$f"; then echo "build-control-plane.sh: patching $f failed" >&2; exit 1; fi
done

export GOROOT=$WORK/go/usr/lib/go-1.19 PATH=$WORK/go/usr/lib/go-1.19/bin:$PATH GOPROXY=off CGO_ENABLED=0
export GOCACHE=$WORK/gocache HOME=$WORK/home GOPATH=$PWD/.go
export KUBE_GIT_VERSION=v1.20.2 KUBE_GIT_TREE_STATE=archive KUBE_GIT_MAJOR=1 KUBE_GIT_MINOR=20
export KUBE_BUILD_PLATFORMS=linux/$(dpkg --print-architecture) GOLDFLAGS="-s -w"
# The Makefile expects the tree inside a GOPATH at k8s.io/kubernetes.
mkdir -p "$HOME" .go/src/k8s.io; [ -L .go/src/k8s.io/kubernetes ] || ln -s ../../.. .go/src/k8s.io/kubernetes
make WHAT="cmd/kube-apiserver cmd/kube-controller-manager"

# Binaries land under temporary names first so a killed build never leaves a half-written "built" folder.
for b in kube-apiserver kube-controller-manager; do cp "_output/bin/$b" "$OUT/.$b.tmp"; done
for b in etcd kubectl; do cp "$WORK/root/usr/bin/$b" "$OUT/.$b.tmp"; done
for b in $BINARIES; do chmod +x "$OUT/.$b.tmp"; mv "$OUT/.$b.tmp" "$OUT/$b"; done
echo "$RECIPE" > "$OUT/.recipe"
"$OUT/kube-apiserver" --version
