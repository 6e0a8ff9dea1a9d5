#!/usr/bin/env bash
# The torch build guard and `doctor` on a real GPU node (the lent 2x H200 machine, which has no network):
#   1. the planned index serves a CPU build of the planned release (a stand-in: no CPU wheel for the node's Python
#      can be carried there); where the plan reads that index (a wheel directory), plan refuses (exit 4); where it
#      cannot (an HTTP index on 127.0.0.1 with ENVBUILDER_OFFLINE=1: the table alone), the install brings it and
#      the guard refuses (exit 7), leaving nothing at the prefix;
#   2. the planned index serves the node's own cu130 torch (repacked as wheels): create passes the guard (the real
#      compiled arch list must carry the H200's sm_90) and validates on both GPUs;
#      A second create of the same wheel takes the arch list from the cache (no torch import); bench_guard.py
#      times the guard's parts on that env;
#   3. the CPU build again with --force over that env: refused, the env left as it was and still importing;
#   4. `envbuilder doctor` on the node, and with a facts file of an older driver.
# Results go to $OUT (or ./gpu-guard).
set -uo pipefail
out=${OUT:-gpu-guard}
mkdir -p "$out"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} NO_COLOR=1 PYTHONUNBUFFERED=1 COLUMNS=160
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export ENVBUILDER_HOME=/tmp/eb-home SCRATCH=/tmp/eb-scratch ENVBUILDER_RECIPE_PATH=/tmp/eb-recipes
mkdir -p "$SCRATCH" "$ENVBUILDER_RECIPE_PATH"
eb() { python3 -m envbuilder "$@"; }
. "$(dirname "$0")/gpu_common.sh"

node_torch
echo "node torch: $(python3 -c 'import torch; print(torch.__version__, torch.version.cuda, torch.cuda.get_arch_list())')"
step repack python3 scripts/repack_wheels.py "$node_env" /tmp/wheels-cu130
# The wrong build: a stand-in CPU torch of the same release (tests/torchindex.py), beside the real dependencies.
mkdir -p /tmp/wheels-cpu
PYTHONPATH=$PWD/tests python3 -c '
import sys
from pathlib import Path
from torchindex import build_torch_wheel
print(build_torch_wheel(Path("/tmp/wheels-cpu"), sys.argv[1], "cpu", None, "", tag="py3-none-manylinux_2_28_x86_64").name)
' "$torch_version"

cat > "$ENVBUILDER_RECIPE_PATH/gpu-guard.toml" <<EOF
schema_version = 1
[recipe]
name = "gpu-guard"
description = "venv with the node's CUDA torch from its (local) index; variant chosen for the node"
[env]
kind = "venv"
installer = "uv"
prefix = "\${SCRATCH}/envs/{name}"
[python]
command = "python3"
[torch]
version = "$torch_version"
variant = "auto"
packages = ["torch"]
[validation]
checks = ["import", "gpu", "arch", "cuda", "libraries", "nccl", "ddp"]
EOF

# The same stand-in behind an HTTP index on 127.0.0.1 (tests/torchindex.py), under every variant's root.
PYTHONPATH=$PWD/tests python3 - <<'PY' &
import time
from pathlib import Path
from torchindex import TorchIndex, serve
index = TorchIndex()
wheel = next(Path("/tmp/wheels-cpu").glob("torch-*.whl"))
for variant in ("cpu", "cu126", "cu128", "cu130", "cu132"):
    index.add(f"whl/{variant}", wheel)
with serve(index) as server:
    Path("/tmp/idx-url.tmp").write_text(server.url)
    Path("/tmp/idx-url.tmp").rename("/tmp/idx-url")
    time.sleep(900)
PY
server_pid=$!
for _ in $(seq 50); do [ -f /tmp/idx-url ] && break; sleep 0.1; done
wrong="https://download.pytorch.org/whl/=/tmp/wheels-cpu pypi=/tmp/wheels-cu130"
wrong_http="https://download.pytorch.org/whl/=$(cat /tmp/idx-url)/whl/ pypi=/tmp/wheels-cu130"
right="https://download.pytorch.org/whl/=/tmp/wheels-cu130 pypi=/tmp/wheels-cu130"
step plan-wrong env ENVBUILDER_INDEX_MIRROR="$wrong" python3 -m envbuilder plan gpu-guard
step create-wrong-table env ENVBUILDER_INDEX_MIRROR="$wrong_http" ENVBUILDER_OFFLINE=1 \
  python3 -m envbuilder create gpu-guard --no-validate
echo "after the refused create: $(ls -A "$SCRATCH/envs" 2>/dev/null | tr '\n' ' ')"
step plan-right env ENVBUILDER_INDEX_MIRROR="$right" python3 -m envbuilder plan gpu-guard
step create-right env ENVBUILDER_INDEX_MIRROR="$right" python3 -m envbuilder create gpu-guard --json
# The arch list is read once per wheel (issue 36): a second create of the same wheel takes it from the home's
# cache (the log says "torch arch list: remembered"), and what each part of the guard costs on the real CUDA torch.
step create-again env ENVBUILDER_INDEX_MIRROR="$right" python3 -m envbuilder create gpu-guard --force --no-validate
echo "== guard step, first create and the same wheel again"
grep -h "checking the installed torch build" "$out/create-right.err" "$out/create-again.err" | grep -v "→"
step bench-guard python3 scripts/bench_guard.py "$SCRATCH/envs/gpu-guard" --repeat 5
cat "$out/bench-guard.out"
step force-wrong env ENVBUILDER_INDEX_MIRROR="$wrong_http" ENVBUILDER_OFFLINE=1 \
  python3 -m envbuilder create gpu-guard --force --no-validate
echo "after the refused --force: $("$SCRATCH/envs/gpu-guard/bin/python" -c 'import torch; print(torch.__version__, torch.cuda.device_count())')"
step doctor python3 -m envbuilder doctor --offline
python3 - <<'PY' > /tmp/old-driver.json
import json, subprocess
data = json.loads(subprocess.run(["python3", "-m", "envbuilder", "probe", "--json"], capture_output=True, text=True).stdout)["data"]
data["driver_version"], data["max_cuda"] = "550.54.15", "12.4"
print(json.dumps(data))
PY
step doctor-old-driver python3 -m envbuilder doctor --offline --facts /tmp/old-driver.json
kill "$server_pid" 2>/dev/null
for f in plan-wrong create-wrong-table force-wrong doctor doctor-old-driver; do
  echo "== $f"; tail -n 12 "$out/$f.err"; head -c 2500 "$out/$f.out"; echo
done
echo "== guard lines in the build logs"; grep -h "torch build\|arch flags\|arch list" "$ENVBUILDER_HOME"/logs/*.log | cut -c1-300
echo "== plan-right"; grep -A8 "Where the torch facts" "$out/plan-right.err" | cut -c1-200
python3 - "$out/create-right.out" <<'PY'
import json, sys
data = json.loads(open(sys.argv[1]).read())["data"]
env = data["env"]
print("torch", next(p["version"] for p in env["packages"] if p["name"] == "torch"))
v = (data.get("validation") or {})
for name, c in (v.get("checks") or {}).items():
    figs = ", ".join(f"{k}={x['value']}{x.get('unit', '')}" for k, x in c.get("figures", {}).items())
    print(f"   {name:10} {c['status']:4} {figs}"[:300])
PY
echo "== steps"; cat "$out/steps.txt"
# What comes back (8 files at most): the step list, the refusals, the passing create, both doctor reports.
rm -f "$out"/repack.* "$out"/create-again.* "$out"/bench-guard.* "$out"/plan-wrong.out "$out"/create-wrong-table.out "$out"/force-wrong.out \
  "$out"/plan-right.out "$out"/create-right.err "$out"/doctor.err "$out"/doctor-old-driver.err
