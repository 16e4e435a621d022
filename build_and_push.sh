#!/usr/bin/env bash
# Build the trainer and operator images (Dockerfile targets) and push them to a registry.
#
#   Google Artifact Registry:
#     PROJECT_ID=my-proj REGION=us-central1 REPO_NAME=ml TAG=0.1.0 ./build_and_push.sh
#       → us-central1-docker.pkg.dev/my-proj/ml/rosetta-trainer:0.1.0 (and rosetta-operator)
#   Amazon ECR:
#     AWS_ACCOUNT_ID=123456789012 AWS_REGION=us-east-1 REPO_NAME=ml TAG=0.1.0 ./build_and_push.sh
#       → 123456789012.dkr.ecr.us-east-1.amazonaws.com/ml/rosetta-trainer:0.1.0 (and rosetta-operator)
#   Any other registry you are already logged in to:
#     REGISTRY=ghcr.io/my-org TAG=0.1.0 ./build_and_push.sh
#
#   A local registry (Docker allows plain HTTP to 127.0.0.1), on test bases built from Debian:
#     REGISTRY=127.0.0.1:5000 TAG=test BUILD_ARGS="PYTHON_IMAGE=rosetta-test/python:3.11-bookworm
#       TRAINER_BASE_IMAGE=rosetta-test/python:3.11-bookworm" ./build_and_push.sh
#
# Optional: IMAGE_NAME (default rosetta: images IMAGE_NAME-trainer and IMAGE_NAME-operator),
# TARGETS (default "trainer operator"; add "chart" to push charts/rosetta as an OCI artifact,
# PREFIX/charts/rosetta:TAG, installable with `helm install rosetta oci://PREFIX/charts/rosetta
# --version TAG`; TAG must then be a SemVer version, a leading v is dropped; on ECR create the
# repository REPO_NAME/charts/rosetta first), PLATFORM (default linux/amd64), DOCKER (default docker),
# BUILD_ARGS (whitespace-separated NAME=VALUE pairs, each passed as --build-arg: the Dockerfile's
# PYTHON_IMAGE and TRAINER_BASE_IMAGE (base images) and TORCH (default torch==2.13.0)),
# PIN_BASES (default auto; require, off) and PYTHON (default python3), for the base images below.
# --dry-run prints every command instead of running it.
#
# Base images by digest: a base given by digest (the Dockerfile's default after
# `scripts/pin_base_images.py --write`, or a BUILD_ARGS value NAME@sha256:...) is built from as it is.
# A base given by a tag is resolved to the digest the tag names now and built from that digest
# (PIN_BASES=auto: when the registry cannot be asked, a warning, and the build uses the tag;
# PIN_BASES=require: the build stops instead; PIN_BASES=off and --dry-run look nothing up). Each image
# built from a digest carries it: labels org.opencontainers.image.base.name and .base.digest.
set -euo pipefail

DRY_RUN=0
for arg in "$@"; do
  case "$arg" in
    --dry-run) DRY_RUN=1 ;;
    -h|--help) sed -n '2,33p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "build_and_push.sh: unknown argument: $arg (only --dry-run)" >&2; exit 2 ;;
  esac
done

die() { echo "build_and_push.sh: $*" >&2; exit 1; }
need() {
  local name
  for name in "$@"; do
    [[ -n "${!name:-}" ]] || die "$name is not set (${MODE} needs: $*)"
  done
}
run() {
  if (( DRY_RUN )); then
    echo "$*"
  else
    "$@"
  fi
}

DOCKER="${DOCKER:-docker}"
HELM="${HELM:-helm}"
IMAGE_NAME="${IMAGE_NAME:-rosetta}"
TARGETS="${TARGETS:-trainer operator}"
PLATFORM="${PLATFORM:-linux/amd64}"
CONTEXT="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

if [[ -n "${PROJECT_ID:-}" ]]; then
  MODE="Artifact Registry (PROJECT_ID)"
  need PROJECT_ID REGION REPO_NAME TAG
  HOST="${REGION}-docker.pkg.dev"
  PREFIX="${HOST}/${PROJECT_ID}/${REPO_NAME}"
  login() { run gcloud auth configure-docker "$HOST" --quiet; }
  helm_login() {
    if (( DRY_RUN )); then
      echo "gcloud auth print-access-token | ${HELM} registry login --username oauth2accesstoken --password-stdin ${HOST}"
    else
      gcloud auth print-access-token | "$HELM" registry login --username oauth2accesstoken --password-stdin "$HOST"
    fi
  }
elif [[ -n "${AWS_ACCOUNT_ID:-}" ]]; then
  MODE="ECR (AWS_ACCOUNT_ID)"
  need AWS_ACCOUNT_ID AWS_REGION REPO_NAME TAG
  HOST="${AWS_ACCOUNT_ID}.dkr.ecr.${AWS_REGION}.amazonaws.com"
  PREFIX="${HOST}/${REPO_NAME}"
  login() {
    if (( DRY_RUN )); then
      echo "aws ecr get-login-password --region ${AWS_REGION} | ${DOCKER} login --username AWS --password-stdin ${HOST}"
    else
      aws ecr get-login-password --region "$AWS_REGION" | "$DOCKER" login --username AWS --password-stdin "$HOST"
    fi
  }
  helm_login() {
    if (( DRY_RUN )); then
      echo "aws ecr get-login-password --region ${AWS_REGION} | ${HELM} registry login --username AWS --password-stdin ${HOST}"
    else
      aws ecr get-login-password --region "$AWS_REGION" | "$HELM" registry login --username AWS --password-stdin "$HOST"
    fi
  }
elif [[ -n "${REGISTRY:-}" ]]; then
  MODE="REGISTRY"
  need REGISTRY TAG
  PREFIX="${REGISTRY%/}"
  login() { :; }
  helm_login() { :; }  # as for docker: log in to your registry yourself (helm registry login)
else
  die "no registry: set PROJECT_ID (with REGION, REPO_NAME) for Artifact Registry, AWS_ACCOUNT_ID (with AWS_REGION, REPO_NAME) for ECR, or REGISTRY"
fi

read -r -d "" -a pairs <<<"${BUILD_ARGS:-}" || true  # any whitespace, newlines too
for pair in "${pairs[@]}"; do
  [[ "$pair" == [A-Za-z_]*=* ]] || die "BUILD_ARGS: '$pair' is not NAME=VALUE"
done

for target in $TARGETS; do
  case "$target" in
    trainer|operator|chart) ;;
    *) die "TARGETS: unknown target '$target' (trainer, operator, chart)" ;;
  esac
done
# A chart's version is SemVer where an image tag need not be: checked before anything is pushed.
# appVersion is the tag as given, so the chart's default images are the ones pushed beside it.
CHART_VERSION="${TAG#v}"
SEMVER='^[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.-]+)?(\+[0-9A-Za-z.-]+)?$'
if [[ " $TARGETS " == *" chart "* && ! "$CHART_VERSION" =~ $SEMVER ]]; then
  die "TAG '$TAG' is not a SemVer version (like 0.1.0), which a chart needs"
fi
push_chart() {
  helm_login
  run "$HELM" package "${CONTEXT}/charts/rosetta" --version "$CHART_VERSION" --app-version "$TAG" \
    --destination "${CONTEXT}/dist"
  run "$HELM" push "${CONTEXT}/dist/rosetta-${CHART_VERSION}.tgz" "oci://${PREFIX}/charts"
}

# The bases, settled before anything is pushed: scripts/pin_base_images.py answers with a line
# `build-arg NAME=REFERENCE@DIGEST` per base it resolved (it replaces that BUILD_ARGS pair) and
# `label TARGET KEY=VALUE` per label; what it could not pin it says on stderr.
PIN_BASES="${PIN_BASES:-auto}"
PYTHON="${PYTHON:-python3}"
plan_flags=()
case "$PIN_BASES" in
  auto) ;;
  require) plan_flags+=(--require) ;;
  off) plan_flags+=(--offline) ;;
  *) die "PIN_BASES: '$PIN_BASES' is none of auto, require, off" ;;
esac
if (( DRY_RUN )); then
  plan_flags=(--offline)
fi
for target in $TARGETS; do
  [[ "$target" == chart ]] || plan_flags+=(--target "$target")
done
plan=""
if [[ " ${plan_flags[*]} " == *" --target "* ]]; then
  command -v "$PYTHON" >/dev/null 2>&1 || die "PYTHON: '$PYTHON' not found (it runs scripts/pin_base_images.py)"
  for pair in "${pairs[@]}"; do
    plan_flags+=(--build-arg "$pair")
  done
  plan="$("$PYTHON" "${CONTEXT}/scripts/pin_base_images.py" --dockerfile "${CONTEXT}/Dockerfile" --build-plan \
    "${plan_flags[@]}")" || die "the base images are not settled (scripts/pin_base_images.py, above)"
fi
while read -r kind value; do
  [[ "$kind" == build-arg ]] || continue
  replaced=0
  for i in "${!pairs[@]}"; do
    if [[ "${pairs[$i]%%=*}" == "${value%%=*}" ]]; then
      pairs[$i]="$value"
      replaced=1
    fi
  done
  (( replaced )) || pairs+=("$value")
done <<<"$plan"
build_args=()
for pair in "${pairs[@]}"; do
  build_args+=(--build-arg "$pair")
done

login
for target in $TARGETS; do
  if [[ "$target" == chart ]]; then
    push_chart
    continue
  fi
  labels=()
  while read -r kind which label; do
    if [[ "$kind" == label && "$which" == "$target" ]]; then
      labels+=(--label "$label")
    fi
  done <<<"$plan"
  image="${PREFIX}/${IMAGE_NAME}-${target}:${TAG}"
  run "$DOCKER" build --platform "$PLATFORM" "${build_args[@]}" "${labels[@]}" --target "$target" --tag "$image" \
    "$CONTEXT"
  run "$DOCKER" push "$image"
done
