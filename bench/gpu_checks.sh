#!/usr/bin/env bash
# The GPU figures of docs/benchmarks.md (bench/gpu_checks.py says what each step measures).
#
#   bench/gpu_checks.sh [--cpu] [--part 1|2] DATA_DIR RESULTS_DIR
#
# DATA_DIR holds Multi30k's {train,val,test_2016_flickr}.{en,de}.gz; RESULTS_DIR receives
# gpu_checks.jsonl (a line per step, written as each ends), gpu_checks.md and logs.tgz. --cpu runs
# every step at tiny sizes on the CPU, as CI does, so that the script never fails first on a GPU.
# The repository's packages are used from the source tree. On a machine without network access,
# bring what its Python lacks as wheels (bench/gpu_wheels.sh lists and fetches them) and install
# them into a directory on PYTHONPATH first.
set -uo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
python=${PYTHON:-python3}
# gpu_checks.py puts the sources on PYTHONPATH for itself and every process it starts.
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
args=("$@")
results=${args[-1]:?usage: gpu_checks.sh [--cpu] DATA_DIR RESULTS_DIR}
work=${WORK:-/tmp/rosetta-gpu-checks}
rm -rf "$work" && mkdir -p "$work" "$results"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv 2>/dev/null || true
WORK="$work" "$python" "$repo/bench/gpu_checks.py" "$@" --work "$work"
status=$?
tar -czf "$results/logs.tgz" -C "$work" --exclude='*.safetensors' --exclude='*.pt' --exclude='*.bin' \
    --exclude='checkpoints' --exclude='init-model' --exclude='global_step*' . 2>/dev/null
exit $status
