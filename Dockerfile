# syntax=docker/dockerfile:1
# Two images from one build context (see build_and_push.sh, README "Images"):
#   docker build --target trainer  -t rosetta-trainer:0.1.0 .   # CUDA PyTorch + DeepSpeed + rosetta
#   docker build --target operator -t rosetta-operator:0.1.0 .  # the operator only: no torch
# The trainer image runs `rosetta train …` (the JobSet's pods call torchrun/deepspeed in it);
# the operator image runs `rosetta operator`.

ARG PYTORCH_IMAGE=pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime
ARG PYTHON_IMAGE=python:3.11-slim
ARG DEEPSPEED_VERSION=0.16.4

# ---------------------------------------------------------------------------- wheel
# Builds the rosetta wheel once; both images install it.
FROM ${PYTHON_IMAGE} AS wheel
WORKDIR /src
RUN pip install --no-cache-dir "build>=1.2"
COPY pyproject.toml README.md ./
COPY trainer ./trainer
COPY operator ./operator
RUN python -m build --wheel --outdir /dist .

# --------------------------------------------------------------------------- trainer
FROM ${PYTORCH_IMAGE} AS trainer
ARG DEEPSPEED_VERSION
ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    HOME=/home/rosetta \
    HF_HOME=/home/rosetta/.cache/huggingface
COPY --from=wheel /dist /tmp/dist
# The base image's CUDA build of torch stays: pinning it as a constraint stops pip from
# replacing it with a CPU or different-CUDA wheel while it resolves rosetta's and DeepSpeed's deps.
# DS_BUILD_OPS=0: DeepSpeed's CUDA ops are JIT-compiled when first used, not at install time.
RUN pip list --format=freeze | grep -iE '^(torch|torchvision|torchaudio|triton)==' > /tmp/constraints.txt \
    && DS_BUILD_OPS=0 pip install -c /tmp/constraints.txt "deepspeed==${DEEPSPEED_VERSION}" /tmp/dist/*.whl \
    && python -c "import torch, deepspeed, rosetta_trainer; print('torch', torch.__version__, 'cuda', torch.version.cuda)" \
    && rm -rf /tmp/dist /tmp/constraints.txt
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

# -------------------------------------------------------------------------- operator
FROM ${PYTHON_IMAGE} AS operator
ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
COPY --from=wheel /dist /tmp/dist
# `pip install rosetta` would pull torch and the whole trainer stack. The operator imports only
# rosetta_operator and the torch-free rosetta_trainer.config: the package without its
# dependencies, plus this list (the same specifiers as pyproject.toml; tests/unit/test_packaging.py
# checks both, and that the operator's modules import with nothing else installed).
RUN pip install --no-deps /tmp/dist/*.whl \
    && pip install "kopf>=1.37" "kubernetes>=29" "prometheus-client>=0.20" "pydantic>=2.6" "pyyaml>=6" "jinja2>=3.1" \
    && python -c "import sys, rosetta_operator.handlers, rosetta_trainer.config; assert 'torch' not in sys.modules" \
    && rm -rf /tmp/dist
RUN groupadd --gid 10001 rosetta \
    && useradd --uid 10001 --gid 10001 --no-create-home --shell /usr/sbin/nologin rosetta
USER 10001:10001
# 8080: /healthz, 8000: Prometheus metrics.
EXPOSE 8080 8000
ENTRYPOINT ["rosetta", "operator"]
