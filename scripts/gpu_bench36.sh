#!/usr/bin/env bash
# Issue 36's benchmarks on a real GPU node (the lent 2x H200 machine), no network: the node's CUDA torch repacked
# into a local wheel directory ($WHEELS, default /tmp/torch-wheels; kept, so a later call on the same machine
# skips the repack), then scripts/bench_create.py's node mode: raw uv against `envbuilder create --no-validate`
# cold and warm, the default create (validation on every GPU) and its `--force` rebuild against raw uv + the bare
# probe, `backup` + `restore` against raw uv, interleaved, $ROUNDS rounds (default 3), medians and ratios.
#   TREES="OLD=.devrun/old NEW=."  source trees to compare in one run (default: this checkout)
#   PARTS=create,default,restore   which parts (one call of 10 minutes fits about one part of 3 rounds, 2 trees);
#                                  also `validate`: bench_validate.py's suite against the bare program, per tree
#   BENCH_ARGS="--cpu"             more bench_create.py arguments (--cpu: a CPU torch and gloo ranks, to try it out)
#   WORKDIR=/tmp/eb-bench36        envs, caches and backups (emptied first, removed at the end)
# Results go to $OUT (or ./gpu-bench36): bench36.md (the table), bench36.json (every run, with each envbuilder
# run's stderr timed line by line), traces.txt (scripts/trace_steps.py of it), steps.txt (with nvidia-smi's cost).
set -uo pipefail
out=${OUT:-gpu-bench36}
wheels=${WHEELS:-/tmp/torch-wheels}
mkdir -p "$out"
export NO_COLOR=1 PYTHONUNBUFFERED=1 COLUMNS=160
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
. "$(dirname "$0")/gpu_common.sh"
node_torch
# What the host probe's nvidia-smi calls cost here (the full table queries every GPU; --version none).
for args in "" "--version" "--query-gpu=name,compute_cap,driver_version,memory.total --format=csv,noheader,nounits"; do
  s=$EPOCHREALTIME
  # shellcheck disable=SC2086 # args: words
  nvidia-smi $args > /dev/null 2>&1
  echo "nvidia-smi ${args:-(table)}: rc=$? $(python3 -c "print(round($EPOCHREALTIME - $s, 3))") s" | tee -a "$out/steps.txt"
done
if ! compgen -G "$wheels/torch-*.whl" > /dev/null; then
  step wheels env PYTHONPATH="$PWD" python3 scripts/repack_wheels.py "$node_env" "$wheels"
fi
trees=()
for t in ${TREES:-this=$PWD}; do trees+=(--tree "$t"); done
# shellcheck disable=SC2086 # BENCH_ARGS: words
step bench env PYTHONPATH="$PWD" python3 scripts/bench_create.py --wheels "$wheels" "${trees[@]}" \
  --parts "${PARTS:-create,default,restore}" --repeat "${ROUNDS:-3}" --out "$out" --work "${WORKDIR:-/tmp/eb-bench36}" \
  --variant "$variant" ${BENCH_ARGS:-}
grep -E "FAILED|round" "$out/bench.err" | tail -n 40
cat "$out/bench36.md"
python3 scripts/trace_steps.py "$out/bench36.json" > "$out/traces.txt" && head -c 6000 "$out/traces.txt"
# The device returns a few files only: the build logs stay behind unless KEEP_LOGS=1.
[ "${KEEP_LOGS:-0}" = 1 ] || rm -rf "$out/logs" "$out"/*.out
