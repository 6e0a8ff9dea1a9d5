#!/usr/bin/env bash
# Checks envbuilder's GPU-facing parts on a real NVIDIA machine (the lent device node): the probe against real
# nvidia-smi and /proc/driver/nvidia, `plan local` resolving from those facts, the validation payload under
# torchrun on every GPU, and the GPU-affinity wrapper under mpirun. Results go to $OUT (or ./gpu-check).
set -uo pipefail
out=${OUT:-gpu-check}
mkdir -p "$out"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} NO_COLOR=1 PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
ngpu=$(nvidia-smi -L | grep -c '^GPU')
{
  echo "== nvidia-smi query"; nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total --format=csv,noheader,nounits
  echo "== nvidia-smi header"; nvidia-smi | head -4
  echo "== /proc/driver/nvidia/version"; cat /proc/driver/nvidia/version
  echo "== /proc gpus"; cat /proc/driver/nvidia/gpus/*/information 2>&1 | grep -E '^Model'
} > "$out/raw.txt" 2>&1
python3 -m envbuilder probe --json > "$out/probe.json" 2> "$out/probe.err"; echo "probe rc=$?"
python3 -m envbuilder plan local --json > "$out/plan-local.json" 2> "$out/plan-local.err"; echo "plan rc=$?"
start=$EPOCHREALTIME
torchrun --standalone --nproc-per-node "$ngpu" envbuilder/payloads/validate.py --checks import,gpu,arch \
  --expect-gpus "$ngpu" > "$out/payload.jsonl" 2> "$out/payload.err"; rc=$?; echo "payload rc=$rc wall=$(python3 -c "print(round($EPOCHREALTIME - $start, 2))")s"
CUDA_VISIBLE_DEVICES= python3 envbuilder/payloads/validate.py --checks import,gpu,arch --expect-gpus 1 \
  > "$out/payload-nogpu.jsonl" 2>> "$out/payload.err"; echo "payload without GPUs rc=$? (expected 1)"
for mode in local-rank reverse-local-rank; do
  mpirun --allow-run-as-root --oversubscribe -n "$ngpu" envbuilder/payloads/gpu_affinity.sh "$mode" \
    sh -c 'echo "$OMPI_COMM_WORLD_LOCAL_RANK $CUDA_VISIBLE_DEVICES"' | sort > "$out/affinity-$mode.txt" 2>&1
  echo "affinity $mode rc=$?"
done
cat "$out/payload.jsonl" "$out/affinity-"*.txt
