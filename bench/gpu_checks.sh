#!/usr/bin/env bash
# The GPU figures of docs/benchmarks.md, in one run on a machine with one CUDA GPU.
#
#   bench/gpu_checks.sh DATA_DIR RESULTS_DIR
#
# DATA_DIR holds Multi30k's {train,val}.{en,de}.gz; RESULTS_DIR receives the tables and a tarball of
# every run's logs. The machine needs python3 with torch (CUDA), transformers, tokenizers, sacrebleu,
# deepspeed, pydantic and psutil; the repository's packages are used from the source tree. Each step
# has its own time limit (about 9 minutes in all at worst), so one that hangs leaves the others'
# figures. On a machine without network access, bring the missing packages as wheels and put them first
# on PYTHONPATH (pip install --no-index --no-deps --target DIR *.whl): the trainer also imports boto3,
# rouge_score (with nltk) and hjson (DeepSpeed's) at start-up.
#   1. the device: torch, CUDA, NCCL versions; a bf16 matrix product's rate (the MFU ceiling in practice)
#   2. Rosetta against Hugging Face's Seq2SeqTrainer, transformer-base from scratch in bf16 on Multi30k
#      (bench/hf_seq2seq.py): target tokens/s, time to validation BLEU, peak GPU memory
#   3. DDP, DDP + torch.compile, DeepSpeed ZeRO-2 and ZeRO-3 under torchrun with NCCL
#      (bench/strategies.py): tokens/s, MFU, peak GPU memory
set -uo pipefail

data=${1:?usage: gpu_checks.sh DATA_DIR RESULTS_DIR}
results=${2:?usage: gpu_checks.sh DATA_DIR RESULTS_DIR}
repo=$(cd "$(dirname "$0")/.." && pwd)
work=${WORK:-/tmp/rosetta-gpu-checks}
python=${PYTHON:-python3}
mkdir -p "$results" "$work"
export PYTHONPATH="$repo/operator:$repo/trainer${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1

step() { echo; echo "== $1 ($(date -u +%H:%M:%S))"; }
# After every step, so that a run stopped from outside still returns the logs of the steps before.
save_logs() {
    tar -czf "$results/logs.tgz" -C "$work" --exclude='*.safetensors' --exclude='*.pt' --exclude='*.bin' \
        --exclude='init-model' --exclude='checkpoint*' --exclude='global_step*' . 2>/dev/null
}

step "device"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv
timeout 120 "$python" - <<'EOF' | tee "$results/device.txt"
import time, torch, transformers, deepspeed
print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, NCCL {'.'.join(map(str, torch.cuda.nccl.version()))}, "
      f"transformers {transformers.__version__}, deepspeed {deepspeed.__version__}")
print(f"device {torch.cuda.get_device_name(0)}, bf16 supported {torch.cuda.is_bf16_supported()}")
n = 8192
a, b = (torch.randn(n, n, device="cuda", dtype=torch.bfloat16) for _ in range(2))
for _ in range(3):
    a @ b
torch.cuda.synchronize()
start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
start.record()
for _ in range(20):
    a @ b
end.record()
torch.cuda.synchronize()
print(f"bf16 {n}^3 matrix product: {2 * n**3 * 20 / (start.elapsed_time(end) / 1000) / 1e12:.0f} TFLOP/s (random data)")
EOF

step "Rosetta vs Seq2SeqTrainer, transformer-base, bf16"
timeout "${HF_TIMEOUT:-240}" "$python" "$repo/bench/hf_seq2seq.py" --device cuda --bf16 --model-size base \
    --steps "${HF_STEPS:-400}" --repeats 1 --batch 256 --lr 7e-4 --eval-interval 100 --eval-samples 300 \
    --skip-steps 100 --data "$data" --work "$work/hf" --results "$results/hf"
echo "exit $?"
save_logs

step "DDP / compile / ZeRO-2 / ZeRO-3, torchrun + NCCL"
# compile last: its compilation is the least predictable, and a stop there keeps the other three.
timeout "${STRATEGY_TIMEOUT:-280}" "$python" "$repo/bench/strategies.py" --config "$work/hf/bench.yaml" \
    --variants ddp,zero2,zero3,ddp+compile --steps "${STRATEGY_STEPS:-200}" --skip-steps 50 --timeout 100 \
    --work "$work/strategies" \
    --results "$results/strategies"
echo "exit $?"
save_logs
cat "$results"/hf/*.md "$results"/strategies/*.md 2>/dev/null
