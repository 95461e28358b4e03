#!/usr/bin/env bash
# The GPU checks of gym's training speed in one command, for a lent GPU machine (Python 3.12 with
# torch, transformers, peft and accelerate, but no TRL, datasets or Liger, and no network).
#
#   benchmarks/gpu_checks.sh fetch        # here, online: wheels the GPU image lacks -> .whl/ (git-ignored, ~49 MB)
#   benchmarks/gpu_checks.sh run [DIR]    # there, from the repository root, with .whl/ carried along:
#                                         # installs them under /tmp/site, then writes to DIR (default $OUT):
#                                         #   env.txt         GPU, driver and package versions
#   tests:   pytest.log               the GPU-marked tests (pytest -m gpu), QLoRA's tests on CUDA
#   sft:     gpu_train.json           gym's default SFT vs TRL defaults (benchmarks/gpu_train.py)
#   qlora:   gpu_train_qlora.json     gym's QLoRA (NF4 base, LoRA) vs TRL's documented QLoRA set-up
#   windows: preference_windows.json  DPO's loss step, gym vs TRL, at 4 shapes
# ONLY="tests qlora" benchmarks/gpu_checks.sh run  runs some of them (default: all). On an H200,
# tests+sft+qlora took 6.6 min and tests+qlora 4.7; the benchmarks stop after 7, 5 and 2 min. The
# versions fetched are the ones gym pins (constraints/cpu.txt); bitsandbytes (43 MB) carries every CUDA
# version's library.
set -euo pipefail
cd "$(dirname "$0")/.."

# What the GPU image lacks of gym.train's imports, TRL's and Liger's (each without its dependencies:
# the rest are in the image).
WHEELS=(
  trl datasets liger-kernel dill multiprocess xxhash pydantic pydantic-core typing-inspection
  annotated-types jsonschema jsonschema-specifications referencing rpds-py bitsandbytes
)

fetch() {
  rm -rf .whl && mkdir -p .whl
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux1_x86_64 -c constraints/cpu.txt -d .whl "${WHEELS[@]}"
  du -sh .whl
}

run() {
  local out="${1:-${OUT:?give a folder, or run where \$OUT is set}}"
  local only="${ONLY:-tests sft qlora windows}"
  mkdir -p "$out"
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH="/tmp/site:$PWD" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
  {
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
    python3 -c "import torch, transformers, trl, liger_kernel; print(torch.__version__, torch.version.cuda, transformers.__version__, trl.__version__)"
    python3 -c "import flash_attn; print('flash_attn', flash_attn.__version__)" 2>/dev/null || echo "flash_attn absent"
    python3 -c "import bitsandbytes; print('bitsandbytes', bitsandbytes.__version__)" 2>&1 | tail -n 1
  } >"$out/env.txt" 2>&1
  cat "$out/env.txt"
  # Tests first (a minute): a failing kernel check is worth knowing even if the benchmark runs long.
  if [[ " $only " == *" tests "* ]]; then
    {
      python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_varlen.py tests/test_serve_engine.py \
        tests/test_lm_loss.py tests/test_completion_logits.py tests/test_adapters.py tests/test_speed.py
      # QLoRA's CPU-written tests, on CUDA here: bitsandbytes modules, bit width, paged AdamW, learning
      python3 -m pytest -q -p no:cacheprovider -k qlora tests/test_adapters.py
    } 2>&1 | tee "$out/pytest.log" || true
  fi
  if [[ " $only " == *" sft "* ]]; then
    timeout 420 python3 benchmarks/gpu_train.py 2>"$out/gpu_train.err" | tee "$out/gpu_train.json" || true
    tail -n 20 "$out/gpu_train.err"
  fi
  if [[ " $only " == *" qlora "* ]]; then
    timeout 300 python3 benchmarks/gpu_train.py --finetuning-type qlora 2>"$out/gpu_train_qlora.err" \
      | tee "$out/gpu_train_qlora.json" || true
    tail -n 20 "$out/gpu_train_qlora.err"
  fi
  if [[ " $only " == *" windows "* ]]; then
    timeout 120 python3 benchmarks/preference_windows.py --device cuda --repeats 3 \
      2>"$out/preference_windows.err" | tee "$out/preference_windows.json" || true
  fi
}

case "${1:-}" in
  fetch) fetch ;;
  run) shift; run "$@" ;;
  *) sed -n '2,17p' "$0"; exit 2 ;;
esac
