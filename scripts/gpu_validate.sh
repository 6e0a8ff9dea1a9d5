#!/usr/bin/env bash
# The validation suite on a real GPU node (the lent 2x H200 machine): `create` ending in the suite's report,
# `validate` through torchrun and mpirun, each injected fault, the affinity check, `envbuilder run` of a DDP
# program, and the benchmark against a raw all_reduce loop.
# Needs the overlay recipe in $ENVBUILDER_RECIPE_PATH (default .devrun/). Results go to $OUT (or ./gpu-validate).
set -uo pipefail
out=${OUT:-gpu-validate}
mkdir -p "$out"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} NO_COLOR=1 PYTHONUNBUFFERED=1 COLUMNS=160
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export ENVBUILDER_HOME=/tmp/eb-home SCRATCH=/tmp/eb-scratch ENVBUILDER_RECIPE_PATH=${ENVBUILDER_RECIPE_PATH:-$PWD/.devrun}
mkdir -p "$SCRATCH"
eb() { python3 -m envbuilder "$@"; }
. "$(dirname "$0")/gpu_common.sh"
step create eb create gpu-overlay --prefix /tmp/envs/gpu-overlay
step torchrun eb validate gpu-overlay --json --junit "$out/junit.xml"
step mpirun eb validate gpu-overlay --launcher mpirun --json
step hidden env CUDA_VISIBLE_DEVICES= python3 -m envbuilder validate gpu-overlay --checks import,gpu --json
step count env CUDA_VISIBLE_DEVICES=0 python3 -m envbuilder validate gpu-overlay --checks import,gpu --json
step arch env ENVBUILDER_VALIDATE_FAULT='*:arch:arch=sm_80+sm_86' python3 -m envbuilder validate gpu-overlay \
  --checks import,arch --json
nccl=$(find /opt/torch/.venv -name 'libnccl.so.2*' | head -n 1)
mkdir -p /tmp/other-nccl && cp "$nccl" /tmp/other-nccl/libnccl.so.2
# torch preloads its CUDA libraries from the wheels by absolute path, so LD_LIBRARY_PATH does not shadow them
# (checked: the check passes); LD_PRELOAD does, and must be caught.
step ldpath env LD_LIBRARY_PATH=/tmp/other-nccl python3 -m envbuilder validate gpu-overlay --checks import,libraries --json
step preload env LD_PRELOAD=/tmp/other-nccl/libnccl.so.2 python3 -m envbuilder validate gpu-overlay \
  --checks import,libraries --json
step exit env ENVBUILDER_VALIDATE_FAULT=1:nccl:exit python3 -m envbuilder validate gpu-overlay --checks import,nccl,ddp --json
step hang env ENVBUILDER_VALIDATE_FAULT=1:ddp:hang python3 -m envbuilder validate gpu-overlay --checks import,ddp \
  --timeout 20 --json
# The user's own DDP program through `envbuilder run`: torchrun (one agent, one rank per GPU) and mpirun.
step run eb run gpu-overlay -- scripts/ddp_train.py
step run_mpirun eb run gpu-overlay --launcher mpirun -- scripts/ddp_train.py
step run_dry eb run gpu-overlay --launcher mpirun --dry-run -- scripts/ddp_train.py
# The affinity check with both ranks squeezed onto one core: it must fail and say so.
step affinity_shared taskset -c 0 python3 -m envbuilder validate gpu-overlay --checks import,affinity --json
step bench python3 scripts/bench_validate.py gpu-overlay --runs 3 --json "$out/bench.json"
python3 - "$out" <<'PY'
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
for f in sorted(out.glob("*.out")):
    try:
        data = json.loads(f.read_text())["data"]
    except Exception:
        continue
    if not isinstance(data, dict) or "checks" not in data:
        continue
    print(f"== {f.stem}: ok={data.get('ok')} launcher={data.get('launcher')} world={data.get('world')} {data.get('seconds')} s")
    for name, c in data["checks"].items():
        figs = ", ".join(f"{k}={v['value']}{v.get('unit','')}" for k, v in c["figures"].items())
        print(f"   {name:10} {c['status']:4} {figs} {c.get('cause') or c.get('reason') or ''}"[:400])
PY
for f in run run_mpirun run_dry; do echo "== $f"; cat "$out/$f.out"; tail -n 3 "$out/$f.err"; done
