# Two images from one build context (see build_and_push.sh, README "Images"):
#   docker build --target trainer  -t rosetta-trainer:0.1.0 .   # PyTorch (CUDA wheels) + DeepSpeed + rosetta
#   docker build --target operator -t rosetta-operator:0.1.0 .  # the operator only: no torch
# The trainer image runs `rosetta train …` (the JobSet's pods call torchrun/deepspeed in it);
# the operator image runs `rosetta operator`.
#
# Every base image is a build argument: the defaults are the production bases; tests build both
# targets on a Python 3.11 image made from Debian's packages (tests/images/debian-base.sh) with
# --build-arg PYTHON_IMAGE=… --build-arg TRAINER_BASE_IMAGE=…. A base needs python3 (3.11) with
# the venv module, groupadd/useradd and CA certificates. Everything is installed into a venv at
# /opt/venv, which works on both (Debian's own python3 refuses system-wide pip installs, PEP 668).
# --upgrade-deps: the venv gets PyPI's current pip rather than the base's bundled one (23.0 on
# bookworm), so both bases install alike (DeepSpeed's sdist is built the PEP 517 way).
# No `# syntax=` line and no BuildKit-only instructions: the engine's built-in frontend (or the
# classic builder) builds it without pulling anything but the bases.

# The bases are pinned by digest (name:tag@sha256:...) and refreshed by `scripts/pin_base_images.py
# --write`, which needs the registry; `--check` names those still given by tag (docs/operator.md,
# "Supply chain"). build_and_push.sh labels each image with the digest it was built from.
# wheel and operator stages
ARG PYTHON_IMAGE=python:3.11-slim-bookworm
# trainer stage: PyPI's torch wheel is the CUDA build and brings CUDA's runtime libraries as
# nvidia-* wheels, so a plain Python base serves; a CUDA base with Python 3.11 would too.
ARG TRAINER_BASE_IMAGE=python:3.11-slim-bookworm
# The one torch pin, the same as the Makefile's TORCH (tests/unit/project/test_packaging.py checks).
ARG TORCH=torch==2.13.0
# The trainer image's extras: [trainer] is what the pods run, [deepspeed] and [s3] what a spec may ask
# for; [tracking]: the W&B and MLflow clients for spec.tracking; [export]: CTranslate2 for `rosetta
# export` next to the checkpoints (together some tens of MB beside the CUDA wheels). Not [operator]:
# no pod renders or watches anything. The image ships every pin CI tests.
ARG TRAINER_EXTRAS=trainer,deepspeed,s3,tracking,export

# ---------------------------------------------------------------------------- wheel
# Builds the rosetta wheel once; both images install it.
FROM ${PYTHON_IMAGE} AS wheel
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python3 -m venv --upgrade-deps /opt/build \
    && /opt/build/bin/pip install "build>=1.2"
WORKDIR /src
COPY pyproject.toml README.md ./
COPY contract ./contract
COPY cli ./cli
COPY trainer ./trainer
COPY operator ./operator
RUN /opt/build/bin/python -m build --wheel --outdir /dist .

# -------------------------------------------------------------------------- operator
# Before the trainer stage: the classic builder builds every stage up to the target, and this one
# is small.
FROM ${PYTHON_IMAGE} AS operator
ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
# The package with its [operator] extra: the operator imports only rosetta_operator and the
# torch-free rosetta_contract, so no torch, no trainer stack (tests/unit/project/test_packaging.py checks
# that the operator's modules import with nothing else installed).
# The same pins as CI (constraints.txt): a rebuild months later gets the kopf and client CI tested.
RUN python3 -m venv --upgrade-deps /opt/venv
COPY constraints.txt /etc/rosetta/constraints.txt
COPY --from=wheel /dist /tmp/dist
RUN pip install -c /etc/rosetta/constraints.txt "$(ls /tmp/dist/*.whl)[operator]" \
    && python -c "import sys, rosetta_operator.handlers, rosetta_contract.spec; assert 'torch' not in sys.modules" \
    && rm -rf /tmp/dist
RUN groupadd --gid 10001 rosetta \
    && useradd --uid 10001 --gid 10001 --no-create-home --shell /usr/sbin/nologin rosetta
USER 10001:10001
# 8080: /healthz, 8000: Prometheus metrics.
EXPOSE 8080 8000
ENTRYPOINT ["rosetta", "operator"]

# --------------------------------------------------------------------------- trainer
FROM ${TRAINER_BASE_IMAGE} AS trainer
ARG TORCH
ARG TRAINER_EXTRAS
ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    HOME=/home/rosetta \
    HF_HOME=/home/rosetta/.cache/huggingface
# The same versions CI tests with (constraints.txt, also used by `make install`).
COPY constraints.txt /etc/rosetta/constraints.txt
# The layers go from what changes least to what changes with every commit, so that a rebuild after a
# change to rosetta's sources reuses all but the last: torch and the pinned stack (several GB of CUDA
# wheels), the compiler, the extras' third-party packages (keyed on pyproject.toml), then the wheel.
# DS_BUILD_OPS=0: DeepSpeed's ops are JIT-compiled when first used (see the compiler below).
RUN python3 -m venv --upgrade-deps /opt/venv \
    && DS_BUILD_OPS=0 pip install -c /etc/rosetta/constraints.txt "${TORCH}" transformers tokenizers accelerate deepspeed
# DeepSpeed compiles its ops the first time a run uses one (CPU Adam for ZeRO-Offload, among others),
# and torch.compile builds its kernels' launchers: both need a C++ compiler and Python's headers in
# the image (official python images ship the headers; a Debian-packaged Python needs python3-dev).
RUN apt-get update \
    && apt-get install -y --no-install-recommends g++ $(python3 -c "import os, sysconfig; \
print('' if os.path.exists(os.path.join(sysconfig.get_paths()['include'], 'Python.h')) else 'python3-dev')") \
    && rm -rf /var/lib/apt/lists/*
# The requirements of the package and of its TRAINER_EXTRAS, read from pyproject.toml: this layer is
# rebuilt when they change, not when the sources do ("${TORCH}" again: pip keeps that torch while it
# resolves the rest).
COPY pyproject.toml /tmp/pyproject.toml
RUN python3 -c "import os, tomllib; p = tomllib.load(open('/tmp/pyproject.toml', 'rb'))['project']; \
print(*p['dependencies'], *(r for e in os.environ['TRAINER_EXTRAS'].split(',') for r in p['optional-dependencies'][e]), sep='\n')" \
        > /tmp/requirements.txt \
    && DS_BUILD_OPS=0 pip install -c /etc/rosetta/constraints.txt "${TORCH}" -r /tmp/requirements.txt \
    && rm /tmp/pyproject.toml /tmp/requirements.txt
COPY --from=wheel /dist /tmp/dist
# The wheel with the same extras: everything it needs is installed above, so pip only checks them.
RUN DS_BUILD_OPS=0 pip install -c /etc/rosetta/constraints.txt "${TORCH}" "$(ls /tmp/dist/*.whl)[${TRAINER_EXTRAS}]" \
    && python -c "import torch, deepspeed, rosetta_trainer, wandb, mlflow, ctranslate2; print('torch', torch.__version__, 'cuda', torch.version.cuda)" \
    && rm -rf /tmp/dist
RUN groupadd --gid 10001 rosetta \
    && useradd --uid 10001 --gid 10001 --create-home --home-dir /home/rosetta --shell /usr/sbin/nologin rosetta \
    && mkdir -p /checkpoints /home/rosetta/.cache \
    && chown -R 10001:10001 /checkpoints /home/rosetta
WORKDIR /home/rosetta
# The operator's pods run as this user (spec.py TRAINER_UID) on a read-only root filesystem, with
# emptyDirs at /tmp and at this HOME (HF hub, triton and DeepSpeed JIT caches): keep HOME here.
USER 10001:10001
ENTRYPOINT ["rosetta"]
CMD ["--help"]
