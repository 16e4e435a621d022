#!/usr/bin/env bash
# Builds the test cluster's binaries from Go modules, at the versions pinned in versions.env:
#   kube-apiserver, kube-controller-manager, kube-scheduler, kubelet,
#   kube-proxy, kubectl                                                        (k8s.io/kubernetes)
#   etcd                                                                       (go.etcd.io/etcd/server/v3)
#   jobset-controller + its CRDs and webhook manifests                          (sigs.k8s.io/jobset)
#   kueue + its CRDs and webhook manifests                                      (sigs.k8s.io/kueue)
#   kwok + its stage manifests                                                  (sigs.k8s.io/kwok)
#   helm                                                                        (helm.sh/helm/v3)
#   containerd, containerd-shim-runc-v2, ctr                                    (containerd/v2)
#   runc  (cgo, with libseccomp: node-packages.sh installs gcc and libseccomp-dev)  (opencontainers/runc)
#   coredns                                                                     (coredns/coredns)
#   pause (the pod sandbox's process, compiled from the kubernetes module's C source)
#
# Usage: build-cluster.sh OUTDIR   -> OUTDIR/bin/<binary>, OUTDIR/manifests/<component>/
#
# Each component is built once and stamped with the recipe that built it, so a second call returns at
# once and a bump of one version rebuilds only that component. The Go module and build caches live in
# ${ROSETTA_GO_CACHE:-~/.cache/rosetta/go}, so a rebuild after a bump recompiles only what changed.
# Binaries already in $KUBEBUILDER_ASSETS (kube-apiserver, etcd, kubectl, ...) are linked, not built.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=versions.env
. "$HERE/versions.env"
OUT=${1:?usage: build-cluster.sh OUTDIR}
mkdir -p "$OUT/bin" "$OUT/manifests" "$OUT/stamps"; OUT=$(cd "$OUT" && pwd)

GO_CACHE=${ROSETTA_GO_CACHE:-$HOME/.cache/rosetta/go}
export GOMODCACHE=$GO_CACHE/mod GOCACHE=$GO_CACHE/build GOFLAGS=-mod=mod CGO_ENABLED=0 GOTOOLCHAIN=local
export GOPROXY=${GOPROXY:-https://proxy.golang.org,direct}
# A login shell puts Go on PATH; a CI job or a cron line may not have read that profile.
command -v go >/dev/null || [ ! -x /usr/local/go/bin/go ] || export PATH="$PATH:/usr/local/go/bin"
command -v go >/dev/null || { echo "build-cluster.sh: needs Go (1.26 or newer) on PATH" >&2; exit 1; }

# Two test sessions starting at once on a fresh machine must not build into the same folder.
exec 9>"$OUT/.build.lock"
flock 9

stamp_of() { echo "$RECIPE $*"; }
is_built() {  # is_built NAME STAMP BINARIES...
  local name=$1 want=$2; shift 2
  [ "$(cat "$OUT/stamps/$name" 2>/dev/null)" = "$want" ] || return 1
  for b in "$@"; do [ -x "$OUT/bin/$b" ] || return 1; done
}
mark_built() { echo "$2" > "$OUT/stamps/$1"; }
log() { echo "[build-cluster $(date +%H:%M:%S)] $*"; }
# Binaries land under temporary names first: a killed build never leaves a half-written one.
install_bin() { chmod +x "$1"; mv -f "$1" "$OUT/bin/$2"; }
from_assets() {  # from_assets BINARY: link it from $KUBEBUILDER_ASSETS when that folder has it
  [ -n "${KUBEBUILDER_ASSETS:-}" ] && [ -x "$KUBEBUILDER_ASSETS/$1" ] || return 1
  ln -sf "$KUBEBUILDER_ASSETS/$1" "$OUT/bin/$1"
}

module_dir() { go mod download -json "$1" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p'; }

# A small wrapper module that requires the component's module at the pinned version and builds its
# main package as a dependency. (`go install pkg@version` would be shorter, but it reads the module's
# version list for deprecation notices, and the proxy does not list every module's versions.)
go_build() {  # go_build NAME MODULE@VERSION PACKAGE BINARY [LDFLAGS]
  local w="$OUT/.work-$1"; rm -rf "$w"; mkdir -p "$w"
  printf 'module rosetta.test/%s\n\ngo 1.26\n\nrequire %s %s\n' "$1" "${2%@*}" "${2#*@}" > "$w/go.mod"
  (cd "$w" && go build -trimpath -ldflags="-s -w ${5:-}" -o "$w/$4" "$3")
  install_bin "$w/$4" "$4"; rm -rf "$w"
}

# k8s.io/kubernetes points its k8s.io/* staging modules at ./staging with replace directives, which
# `go install pkg@version` refuses. A small wrapper module replaces them with the published v0.X.Y
# modules of the same release instead; the cmd packages then build as dependencies of it.
build_kubernetes() {
  local bins="kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl"
  local stamp; stamp=$(stamp_of "$KUBERNETES_VERSION")
  is_built kubernetes "$stamp" $bins && return 0
  local missing=""
  for b in $bins; do from_assets "$b" || missing="$missing $b"; done
  if [ -n "$missing" ]; then
    log "kubernetes $KUBERNETES_VERSION:$missing (about 12 minutes on 2 cores)"
    local w="$OUT/.work-kubernetes"; rm -rf "$w"; mkdir -p "$w"
    local kdir staging; kdir=$(module_dir "k8s.io/kubernetes@$KUBERNETES_VERSION")
    staging="v0.${KUBERNETES_VERSION#v1.}"
    {
      echo "module rosetta.test/kubernetes"; echo; echo "go 1.26"; echo
      echo "require k8s.io/kubernetes $KUBERNETES_VERSION"; echo
      sed -n 's#^\s*\(k8s.io/[a-z0-9-]*\) => ./staging/.*#replace \1 => \1 '"$staging"'#p' "$kdir/go.mod"
    } > "$w/go.mod"
    grep -q '^replace k8s.io/api ' "$w/go.mod" || { echo "no staging replaces found in $kdir/go.mod" >&2; exit 1; }
    {
      echo "//go:build tools"; echo; echo "package tools"; echo; echo "import ("
      for b in $missing; do echo "	_ \"k8s.io/kubernetes/cmd/$b/app\""; done
      echo ")"
    } > "$w/tools.go"
    # kubectl's main package has no app/ package; its command lives in k8s.io/kubectl.
    sed -i 's#k8s.io/kubernetes/cmd/kubectl/app#k8s.io/kubectl/pkg/cmd#' "$w/tools.go"
    (cd "$w" && go mod tidy)
    local v=k8s.io/component-base/version minor=${KUBERNETES_VERSION#v1.}; minor=${minor%%.*}
    local ldflags="-X $v.gitVersion=$KUBERNETES_VERSION -X $v.gitMajor=1 -X $v.gitMinor=$minor"
    ldflags="$ldflags -X $v.gitTreeState=clean -X $v.buildDate=1970-01-01T00:00:00Z"
    ldflags="$ldflags -X k8s.io/client-go/pkg/version.gitVersion=$KUBERNETES_VERSION"
    local pkgs=""; for b in $missing; do pkgs="$pkgs k8s.io/kubernetes/cmd/$b"; done
    mkdir -p "$w/bin"
    (cd "$w" && go build -trimpath -ldflags="-s -w $ldflags" -o "$w/bin/" $pkgs)
    for b in $missing; do install_bin "$w/bin/$b" "$b"; done
    rm -rf "$w"
  fi
  mark_built kubernetes "$stamp"
}

# etcd's server module replaces its sibling modules with ../ paths; the same wrapper trick applies.
build_etcd() {
  local stamp; stamp=$(stamp_of "$ETCD_VERSION")
  is_built etcd "$stamp" etcd && return 0
  if ! from_assets etcd; then
    log "etcd $ETCD_VERSION"
    local w="$OUT/.work-etcd"; rm -rf "$w"; mkdir -p "$w"
    printf 'module rosetta.test/etcd\n\ngo 1.26\n\nrequire go.etcd.io/etcd/server/v3 %s\n' "$ETCD_VERSION" > "$w/go.mod"
    printf '//go:build tools\n\npackage tools\n\nimport _ "go.etcd.io/etcd/server/v3/etcdmain"\n' > "$w/tools.go"
    (cd "$w" && go mod tidy && go build -trimpath -ldflags="-s -w" -o "$w/etcd" go.etcd.io/etcd/server/v3)
    install_bin "$w/etcd" etcd; rm -rf "$w"
  fi
  mark_built etcd "$stamp"
}

# One Go binary from its module, plus (for controllers) the manifests that ship in the same module
# (CRDs, webhook configurations, kwok's stages), so the CRDs always match the controller that serves
# them. Each `manifests` argument is a path inside the module, copied under manifests/NAME/.
build_module() {  # build_module NAME VERSION MODULE PACKAGE BINARY LDFLAGS [manifests...]
  local name=$1 version=$2 module=$3 package=$4 binary=$5 ldflags=$6; shift 6
  local stamp; stamp=$(stamp_of "$version")
  is_built "$name" "$stamp" "$binary" && return 0
  log "$name $version"
  go_build "$name" "$module@$version" "$package" "$binary" "$ldflags"
  if [ $# -gt 0 ]; then
    local src; src=$(module_dir "$module@$version")
    rm -rf "$OUT/manifests/$name"; mkdir -p "$OUT/manifests/$name"
    for path in "$@"; do cp -r "$src"/$path "$OUT/manifests/$name/"; done
    chmod -R u+w "$OUT/manifests/$name"
  fi
  mark_built "$name" "$stamp"
}

build_jobset() {
  build_module jobset "$JOBSET_VERSION" sigs.k8s.io/jobset sigs.k8s.io/jobset jobset-controller "" \
    'config/components/crd/bases/*.yaml' config/components/webhook/manifests.yaml
}
build_kueue() {
  build_module kueue "$KUEUE_VERSION" sigs.k8s.io/kueue sigs.k8s.io/kueue/cmd/kueue kueue "" \
    'config/components/crd/bases/*.yaml' config/components/webhook/manifests.yaml
}
build_kwok() {
  build_module kwok "$KWOK_VERSION" sigs.k8s.io/kwok sigs.k8s.io/kwok/cmd/kwok kwok "" kustomize/stage
  # kwok's own CRDs (Logs for the log node of tests/cluster/test_cli_verbs.py), checked apart from the
  # stamp so that a cache built before they were needed gets them too.
  if [ ! -f "$OUT/manifests/kwok/crd/kwok.x-k8s.io_logs.yaml" ]; then
    local src; src=$(module_dir "sigs.k8s.io/kwok@$KWOK_VERSION")
    mkdir -p "$OUT/manifests/kwok/crd"
    cp "$src"/kustomize/crd/bases/*.yaml "$OUT/manifests/kwok/crd/"
    chmod -R u+w "$OUT/manifests/kwok/crd"
  fi
}
build_helm() {
  build_module helm "$HELM_VERSION" helm.sh/helm/v3 helm.sh/helm/v3/cmd/helm helm \
    "-X helm.sh/helm/v3/internal/version.version=$HELM_VERSION"
}

# The real node's runtime. Debian 12's containerd (1.6) is older than the 2.x this kubelet needs, and
# its runc (1.1) cannot start what containerd 2.x asks for, so both are built here; the CNI plugins
# are Debian's (node-packages.sh installs them).
build_containerd() {
  local bins="containerd containerd-shim-runc-v2 ctr"
  local stamp; stamp=$(stamp_of "$CONTAINERD_VERSION")
  is_built containerd "$stamp" $bins && return 0
  log "containerd $CONTAINERD_VERSION"
  local m=github.com/containerd/containerd/v2 w="$OUT/.work-containerd"
  rm -rf "$w"; mkdir -p "$w/bin"
  printf 'module rosetta.test/containerd\n\ngo 1.26\n\nrequire %s %s\n' "$m" "$CONTAINERD_VERSION" > "$w/go.mod"
  printf '//go:build tools\n\npackage tools\n\nimport (\n\t_ "%s/cmd/containerd"\n\t_ "%s/cmd/ctr"\n\t_ "%s/cmd/containerd-shim-runc-v2"\n)\n' "$m" "$m" "$m" > "$w/tools.go"
  (cd "$w" && go mod tidy && go build -trimpath -tags no_btrfs \
    -ldflags="-s -w -X $m/version.Version=$CONTAINERD_VERSION" -o "$w/bin/" \
    "$m/cmd/containerd" "$m/cmd/ctr" "$m/cmd/containerd-shim-runc-v2")
  for b in $bins; do install_bin "$w/bin/$b" "$b"; done
  rm -rf "$w"; mark_built containerd "$stamp"
}
build_runc() {
  local stamp; stamp=$(stamp_of "$RUNC_VERSION")
  is_built runc "$stamp" runc && return 0
  bash "$HERE/node-packages.sh"  # gcc, libseccomp-dev, pkg-config
  log "runc $RUNC_VERSION"
  CGO_ENABLED=1 GOFLAGS="$GOFLAGS -tags=seccomp" go_build runc "github.com/opencontainers/runc@$RUNC_VERSION" \
    github.com/opencontainers/runc runc "-X main.version=${RUNC_VERSION#v}"
  mark_built runc "$stamp"
}
build_coredns() {
  build_module coredns "$COREDNS_VERSION" github.com/coredns/coredns github.com/coredns/coredns coredns ""
}
# The sandbox ("pause") image's process: the C source ships in the kubernetes module; a static
# binary goes into an image FROM scratch that the node imports (no registry can be reached).
build_pause() {
  local stamp; stamp=$(stamp_of "$KUBERNETES_VERSION $PAUSE_VERSION")
  is_built pause "$stamp" pause && return 0
  bash "$HERE/node-packages.sh"  # gcc, libc6-dev (a static libc)
  log "pause $PAUSE_VERSION"
  local kdir; kdir=$(module_dir "k8s.io/kubernetes@$KUBERNETES_VERSION")
  gcc -Os -Wall -Werror -static -DVERSION="v$PAUSE_VERSION" -o "$OUT/bin/.pause.tmp" "$kdir/build/pause/linux/pause.c"
  strip "$OUT/bin/.pause.tmp"; install_bin "$OUT/bin/.pause.tmp" pause
  mark_built pause "$stamp"
}

started=$(date +%s)
for component in ${ROSETTA_CLUSTER_COMPONENTS:-etcd kubernetes jobset kueue kwok helm containerd runc coredns pause}; do
  "build_$component"
done
cp "$HERE/versions.env" "$OUT/versions.env"
# Every binary is stamped and kept: Go's compile cache (about 8 GB after Kubernetes) only speeds up
# a rebuild, which a version change does anyway from the module cache. Dropped so that the disk
# holds the images and the node's store instead.
if [ -d "$GOCACHE" ] && [ -n "$(ls -A "$GOCACHE" 2>/dev/null)" ]; then
  go clean -cache
fi
log "cluster binaries ready in $OUT/bin ($(( $(date +%s) - started )) s)"
