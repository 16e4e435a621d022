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
#   coredns, with the plugins the node's Corefile uses                          (coredns/coredns)
#   pause (the pod sandbox's process, compiled from the kubernetes module's C source)
#
# Usage: build-cluster.sh OUTDIR   -> OUTDIR/bin/<binary>, OUTDIR/manifests/<component>/
#
# Each component is built once and stamped with the recipe that built it, so a second call returns at
# once and a bump of one version rebuilds only that component (and what it shares a family with:
# build_family below). The Go module and build caches live in
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

# Components whose module graphs overlap build in one `go build` of one wrapper module: what they
# share (k8s.io/api, apimachinery, client-go, apiserver, controller-runtime...) is compiled once, at
# one version, instead of once per component at each one's own patch release (seven versions of
# k8s.io/api between them). Two families: the Kubernetes release's (the release itself, JobSet, kwok,
# CoreDNS: every k8s.io/* module at the release's version) and Kueue with Helm (Kubernetes 1.34's).
# A family builds the members asked for and not built yet; each member keeps its own stamp.
#
# k8s.io/kubernetes points its k8s.io/* staging modules at ./staging with replace directives, which
# `go install pkg@version` refuses. The wrapper replaces them with the published v0.X.Y modules of
# the same release instead, for every member; the cmd packages then build as dependencies of it.
KUBERNETES_BINS="kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl"
# CoreDNS with the plugins the node's Corefile uses (tests/envtest/node.py) and no others: its
# default build links sixty, with the cloud DNS providers' SDKs.
COREDNS_PLUGINS="cache errors health kubernetes loop ready"

member_stamp() {  # member_stamp NAME: what its stamp must say (its family's versions: one module graph)
  case $1 in
    kubernetes|jobset|kwok|coredns)
      stamp_of "family $KUBERNETES_VERSION jobset-$JOBSET_VERSION kwok-$KWOK_VERSION coredns-$COREDNS_VERSION $COREDNS_PLUGINS" ;;
    kueue|helm) stamp_of "family kueue-$KUEUE_VERSION helm-$HELM_VERSION" ;;
    *) stamp_of "unknown member $1" ;;
  esac
}
member_bins() {
  case $1 in
    kubernetes) echo "$KUBERNETES_BINS" ;; jobset) echo jobset-controller ;; *) echo "$1" ;;
  esac
}
# Wanted members of a family that are not built yet (kubernetes: unless $KUBEBUILDER_ASSETS has them).
to_build() {
  local m out=""
  for m in "$@"; do
    wanted "$m" || continue
    # shellcheck disable=SC2046
    is_built "$m" "$(member_stamp "$m")" $(member_bins "$m") && continue
    out="$out $m"
  done
  echo "$out"
}
wanted() { case " $COMPONENTS " in *" $1 "*) return 0 ;; esac; return 1; }

# build_family NAME MEMBERS...: one wrapper module requiring every member's module (so that the
# versions it resolves are the same whichever members a call builds), one `go build` of those asked
# for and not built yet.
build_family() {
  local family=$1; shift
  local members; members=$(to_build "$@")
  [ -n "$members" ] || return 0
  local w="$OUT/.work-$family"; rm -rf "$w"; mkdir -p "$w/bin"
  local requires="" replaces="" imports="" pkgs="" ldflags="" missing_k8s="" m b
  if [ "$family" = kubernetes ]; then  # every member at the release's k8s.io/* versions
    local kdir staging; kdir=$(module_dir "k8s.io/kubernetes@$KUBERNETES_VERSION")
    staging="v0.${KUBERNETES_VERSION#v1.}"
    replaces=$(sed -n 's#^\s*\(k8s.io/[a-z0-9-]*\) => ./staging/.*#replace \1 => \1 '"$staging"'#p' "$kdir/go.mod")
    echo "$replaces" | grep -q '^replace k8s.io/api ' || { echo "no staging replaces found in $kdir/go.mod" >&2; exit 1; }
  fi
  for m in "$@"; do  # the module graph: every member
    case $m in
      kubernetes) requires="$requires k8s.io/kubernetes@$KUBERNETES_VERSION"
        # kubectl's main package has no app/ package; its command lives in k8s.io/kubectl.
        imports="$imports k8s.io/kubectl/pkg/cmd"
        for b in $KUBERNETES_BINS; do [ "$b" = kubectl ] || imports="$imports k8s.io/kubernetes/cmd/$b/app"; done ;;
      jobset) requires="$requires sigs.k8s.io/jobset@$JOBSET_VERSION"; imports="$imports sigs.k8s.io/jobset/pkg/controllers" ;;
      kwok) requires="$requires sigs.k8s.io/kwok@$KWOK_VERSION"; imports="$imports sigs.k8s.io/kwok/pkg/kwok/cmd" ;;
      coredns) requires="$requires github.com/coredns/coredns@$COREDNS_VERSION"
        for b in $COREDNS_PLUGINS; do imports="$imports github.com/coredns/coredns/plugin/$b"; done ;;
      kueue) requires="$requires sigs.k8s.io/kueue@$KUEUE_VERSION"; imports="$imports sigs.k8s.io/kueue/pkg/controller/core" ;;
      helm) requires="$requires helm.sh/helm/v3@$HELM_VERSION"; imports="$imports helm.sh/helm/v3/pkg/action" ;;
    esac
  done
  for m in $members; do  # what this call builds
    case $m in
      kubernetes)
        for b in $KUBERNETES_BINS; do from_assets "$b" || missing_k8s="$missing_k8s $b"; done
        for b in $missing_k8s; do pkgs="$pkgs k8s.io/kubernetes/cmd/$b"; done
        local v=k8s.io/component-base/version minor=${KUBERNETES_VERSION#v1.}; minor=${minor%%.*}
        ldflags="$ldflags -X $v.gitVersion=$KUBERNETES_VERSION -X $v.gitMajor=1 -X $v.gitMinor=$minor"
        ldflags="$ldflags -X $v.gitTreeState=clean -X $v.buildDate=1970-01-01T00:00:00Z"
        ldflags="$ldflags -X k8s.io/client-go/pkg/version.gitVersion=$KUBERNETES_VERSION" ;;
      jobset) pkgs="$pkgs sigs.k8s.io/jobset" ;;
      kwok) pkgs="$pkgs sigs.k8s.io/kwok/cmd/kwok" ;;
      coredns) pkgs="$pkgs ./coredns"; mkdir -p "$w/coredns"
        {
          echo "// CoreDNS with the node's plugins only (coredns.go of the release imports all of them)."
          echo "package main"; echo; echo "import ("
          for b in $COREDNS_PLUGINS; do echo "	_ \"github.com/coredns/coredns/plugin/$b\""; done
          echo "	\"github.com/coredns/coredns/coremain\""; echo ")"; echo; echo "func main() { coremain.Run() }"
        } > "$w/coredns/main.go" ;;
      kueue) pkgs="$pkgs sigs.k8s.io/kueue/cmd/kueue" ;;
      helm) pkgs="$pkgs helm.sh/helm/v3/cmd/helm"; ldflags="$ldflags -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION" ;;
    esac
  done
  if [ -n "$pkgs" ]; then
    log "$family family:$members (one go build)"
    {
      echo "module rosetta.test/$family"; echo; echo "go 1.26"; echo
      for r in $requires; do echo "require ${r%@*} ${r#*@}"; done; echo
      echo "$replaces"
    } > "$w/go.mod"
    {
      echo "//go:build tools"; echo; echo "package tools"; echo; echo "import ("
      for b in $imports; do echo "	_ \"$b\""; done
      echo ")"
    } > "$w/tools.go"
    (cd "$w" && go mod tidy)
    # shellcheck disable=SC2086
    (cd "$w" && go build -trimpath -ldflags="-s -w $ldflags" -o "$w/bin/" $pkgs)
    for m in $members; do
      case $m in
        kubernetes) for b in $missing_k8s; do install_bin "$w/bin/$b" "$b"; done ;;
        jobset) install_bin "$w/bin/jobset" jobset-controller ;;
        *) install_bin "$w/bin/$m" "$m" ;;
      esac
    done
  fi
  rm -rf "$w"
  for m in $members; do copy_manifests "$m"; mark_built "$m" "$(member_stamp "$m")"; done
}

# The manifests that ship in a controller's module (CRDs, webhook configurations, kwok's stages and
# CRDs), so the CRDs always match the controller that serves them; under manifests/NAME/.
copy_manifests() {
  local name=$1 module version paths
  case $name in
    jobset) module=sigs.k8s.io/jobset version=$JOBSET_VERSION
      paths="config/components/crd/bases/*.yaml config/components/webhook/manifests.yaml" ;;
    kueue) module=sigs.k8s.io/kueue version=$KUEUE_VERSION
      paths="config/components/crd/bases/*.yaml config/components/webhook/manifests.yaml" ;;
    kwok) module=sigs.k8s.io/kwok version=$KWOK_VERSION paths="kustomize/stage" ;;
    *) return 0 ;;
  esac
  local src p; src=$(module_dir "$module@$version")
  rm -rf "$OUT/manifests/$name"; mkdir -p "$OUT/manifests/$name"
  # shellcheck disable=SC2086
  for p in $paths; do cp -r "$src"/$p "$OUT/manifests/$name/"; done
  if [ "$name" = kwok ]; then  # kwok's own CRDs (Logs, for the log node of tests/cluster/test_cli_verbs.py)
    mkdir -p "$OUT/manifests/kwok/crd"; cp "$src"/kustomize/crd/bases/*.yaml "$OUT/manifests/kwok/crd/"
  fi
  chmod -R u+w "$OUT/manifests/$name"
}

build_kubernetes_family() { build_family kubernetes kubernetes jobset kwok coredns; }
build_kueue_family() { build_family kueue kueue helm; }

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
COMPONENTS=${ROSETTA_CLUSTER_COMPONENTS:-etcd kubernetes jobset kueue kwok helm containerd runc coredns pause}
build_kubernetes_family
build_kueue_family
for component in etcd containerd runc pause; do
  if wanted "$component"; then "build_$component"; fi
done
cp "$HERE/versions.env" "$OUT/versions.env"
# Every binary is stamped and kept: Go's compile cache (about 8 GB after Kubernetes) only speeds up
# a rebuild, which a version change does anyway from the module cache. Dropped so that the disk
# holds the images and the node's store instead.
if [ -d "$GOCACHE" ] && [ -n "$(ls -A "$GOCACHE" 2>/dev/null)" ]; then
  go clean -cache
fi
log "cluster binaries ready in $OUT/bin ($(( $(date +%s) - started )) s)"
