#!/usr/bin/env bash
# Every GPU check and figure, in order of priority, each step under its own time limit so
# that one slow or failing step leaves the others' results: the triton backend's device
# tests, its timing/memory table, pad against triton over restart rates, the whole-pipeline
# figures, the launch-configuration sweep and the reference library's kernels (when
# REF_PYTHONPATH points at an install of torchrl and its tensordict). Results go to $OUT
# (default ./gpu_out), one file per step.
#
# Run: bash benchmarks/gpu_checks.sh [STEP...]   (python3 with torch, triton and recurrl's
# dependencies; STEP among tests triton resets train throughput collect scaling tune
# reference, all by default)
set -u
OUT=${OUT:-gpu_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
PY=${PY:-python3}

STEPS=" ${*:-tests triton resets train throughput collect scaling tune reference} "

step() {  # step NAME SECONDS COMMAND...: run it, its output to $OUT/NAME.txt and stdout
  local name=$1 limit=$2
  shift 2
  [[ $STEPS == *" ${name%%-*} "* ]] || return 0
  echo "=== $name (limit ${limit}s): $*"
  local start=$SECONDS
  timeout "$limit" "$@" 2>&1 | tee "$OUT/$name.txt"
  echo "=== $name: exit ${PIPESTATUS[0]} after $((SECONDS - start))s"
}

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
workers=$("$PY" -c "import xdist" 2>/dev/null && echo "-n 8")
# shellcheck disable=SC2086  # $workers is empty or two words
step tests 150 "$PY" -m pytest tests/functional/recurrent/test_triton_gpu.py \
  tests/envs/torch_envs tests/trainers/test_ppo.py -q -p no:cacheprovider $workers -rP
step triton 90 "$PY" benchmarks/triton_gpu.py --rounds 5
step resets 75 "$PY" benchmarks/triton_gpu.py --resets --rounds 3
step train 50 "$PY" benchmarks/train_device.py --batches 4 --threads 1
# the recipes end to end on the device (torch env on the GPU) beside the CPU rows
step throughput 180 "$PY" benchmarks/throughput.py --recipes default fast gpu --engines torch \
  --devices cuda cpu --threads 1 --batches 3 --rounds 3
step collect 25 "$PY" benchmarks/collect.py --device cuda --envs 1 8 --quick
step scaling 35 "$PY" benchmarks/recurrent_scaling.py --device cuda --quick \
  --steps 64 256 1024 4096
step tune 150 "$PY" benchmarks/triton_gpu.py --tune --rounds 3
ref() { env PYTHONPATH="$REF_PYTHONPATH" "$PY" benchmarks/triton_gpu_reference.py "$@"; }
ref_warm() {  # compile each configuration of the reference's kernels in its own process
  local variant=$1 cell shape k
  for cell in lstm gru; do
    for shape in 0 1; do
      for k in 0 1 2 3 4 5; do
        ref --warm "$k" --variants "$variant" --cells "$cell" --shapes "$shape" &
      done
    done
  done
  wait
}
export -f ref ref_warm
export PY REF_PYTHONPATH
if [ -n "${REF_PYTHONPATH:-}" ]; then
  # its first call autotunes every kernel over up to 6 configurations, each taking tens of
  # seconds to compile at these hidden sizes: compile them on every core first, then time
  # (autotuning then hits the cache). On an H200 the B=128 H=256 kernels compiled within
  # 150 s this way; the H=512 ones did not finish in 165 s more.
  for variant in ${REF_VARIANTS:-ref/tf32 ref/bf16}; do
    step reference-warm-${variant#ref/} 240 bash -c "ref_warm $variant"
    step reference-${variant#ref/} 240 bash -c "ref --rounds 5 --variants $variant"
  done
fi
