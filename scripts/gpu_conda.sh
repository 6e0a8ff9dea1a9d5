#!/usr/bin/env bash
# A conda env on a real GPU node (the lent 2x H200 machine), the way a Zurada user gets one: the embedded engine
# (py-rattler) builds it from a local conda channel (a python wrapping the node's interpreter, and pip; the tests'
# fixture builder), conda-forge mirrored to that channel; the node's CUDA torch goes in with uv from a local wheel
# directory that stands in for the PyTorch index; the suite then validates it through torchrun on every GPU.
# The machine has no network: $WHEELS (default .devrun/conda) holds the py-rattler and pip wheels.
# Results go to $OUT (or ./gpu-conda).
set -uo pipefail
out=${OUT:-gpu-conda}
wheels=${WHEELS:-$PWD/.devrun/conda}
mkdir -p "$out"
export NO_COLOR=1 PYTHONUNBUFFERED=1 COLUMNS=160
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export ENVBUILDER_HOME=/tmp/eb-home SCRATCH=/tmp/eb-scratch WORK=/tmp/eb-work ENVBUILDER_RECIPE_PATH=/tmp/eb-recipes
. "$(dirname "$0")/gpu_common.sh"

# envbuilder from this checkout in a venv of its own: its children, the embedded engine among them, start with
# that venv's python and find envbuilder and the node's packages (rich, packaging) through a .pth file, not
# PYTHONPATH, which envbuilder scrubs from every child's environment.
site=$(python3 -c 'import pathlib, torch; print(pathlib.Path(torch.__file__).parents[1])')
node_torch
python3 -m venv /tmp/eb-venv
py=/tmp/eb-venv/bin/python
$py -m pip install -q --no-index --no-deps "$wheels"/py_rattler-*.whl || exit 1
printf '%s\n%s\n' "$PWD" "$site" > "$($py -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/envbuilder-src.pth"
step wheels $py scripts/repack_wheels.py "$node_env" /tmp/torch-wheels
step channel env PYTHONPATH="$PWD/tests" $py -c '
import os, sys
from pathlib import Path
from condachannel import index, pip_package, python_package
ch = Path("/tmp/conda-channel")
python_package(ch)
pip_package(ch, wheel=next(Path(sys.argv[1]).glob("pip-*.whl")))
index(ch)
sys.stdout.flush()
os._exit(0)  # py-rattler runtime threads can crash at interpreter teardown
' "$wheels"

mkdir -p "$ENVBUILDER_RECIPE_PATH"
cat > "$ENVBUILDER_RECIPE_PATH/gpu-conda.toml" <<EOF
schema_version = 1
[recipe]
name = "gpu-conda"
description = "conda env (embedded engine, python + pip inside) with the node's CUDA torch from its index"
[env]
kind = "conda"
prefix = "\${SCRATCH}/envs/{name}"
[conda]
channels = ["conda-forge"]
engine = "rattler"
[python]
command = "python"
version = "$(python3 -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')"
[torch]
version = "$torch_version"
variant = "$variant"
packages = ["torch"]
[activate]
env = { NCCL_NVLS_ENABLE = "0", TORCH_SYMM_MEM_DISABLE_MULTICAST = "1", NVSHMEM_DISABLE_NVLS = "1" }
[validation]
checks = ["import", "gpu", "arch", "cuda", "libraries", "nccl", "ddp", "filesystem"]
EOF
export ENVBUILDER_INDEX_MIRROR="https://download.pytorch.org/whl/=/tmp/torch-wheels pypi=/tmp/torch-wheels conda-forge=/tmp/conda-channel"
step create $py -m envbuilder create gpu-conda --json
step validate $py -m envbuilder validate gpu-conda --json
step backup $py -m envbuilder backup gpu-conda --mode archive --json
step restore $py -m envbuilder restore gpu-conda --prefix /tmp/eb-scratch/envs/moved --name moved --json
step validate-restored $py -m envbuilder validate moved --checks import,gpu,cuda,nccl,ddp --json
$py - "$out" <<'PY'
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
for name in ("create", "validate", "validate-restored"):
    try:
        doc = json.loads((out / f"{name}.out").read_text())
    except (OSError, ValueError) as exc:
        print(name, "no JSON:", exc)
        continue
    data = doc.get("data") or {}
    report = (data["env"].get("validation") or {}) if isinstance(data.get("env"), dict) else data
    print(name, doc.get("status"), report.get("launcher"), "world", report.get("world"))
    for check, r in (report.get("checks") or {}).items():
        figures = {k: f["value"] for k, f in (r.get("figures") or {}).items()}
        print(f"  {check:11} {r.get('status'):5} {figures} {r.get('reason') or r.get('cause') or ''}")
PY
du -sh /tmp/eb-scratch/envs/gpu-conda /tmp/eb-work 2>/dev/null
for p in gpu-conda moved; do
  /tmp/eb-scratch/envs/$p/bin/python -c 'import sys, torch; print(sys.prefix, torch.__version__, torch.__file__, torch.cuda.device_count())'
done
ls /tmp/eb-scratch/envs/gpu-conda/conda-meta
