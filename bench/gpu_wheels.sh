#!/usr/bin/env bash
# Fetches, as wheels for CPython 3.12 on x86-64 Linux, what bench/gpu_checks.sh needs and a stock CUDA
# image with PyTorch, transformers and tokenizers usually lacks, into DIR (default .whl):
#
#   bench/gpu_wheels.sh [DIR]
#   # on the GPU machine, before gpu_checks.sh:
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site DIR/*.whl && export PYTHONPATH=/tmp/site
#
# The versions are constraints.txt's where it pins them (transformers, tokenizers, DeepSpeed, PyYAML),
# so that the GPU runs the stack the tests ran.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
dir=${1:-.whl}
pin() { sed -n "s/^$1==//p" "$repo/constraints.txt"; }
wheels=(
  "pydantic==2.14.4" "pydantic-core==2.50.5" "annotated-types==0.8.0" "typing-inspection==0.4.5"
  "transformers==$(pin transformers)" "tokenizers==$(pin tokenizers)"
  "deepspeed==$(pin deepspeed)" "hjson==3.1.0"
  "sacrebleu==2.6.0" "rouge-score==0.1.2" "nltk==3.10.4"
)
mkdir -p "$dir"
for wheel in "${wheels[@]}"; do
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any -d "$dir" "$wheel" ||
  # DeepSpeed and rouge-score publish sources only: build their (pure Python) wheels here.
  python3 -m pip wheel -q --no-deps -w "$dir" "$wheel"
done
ls -1 "$dir"
