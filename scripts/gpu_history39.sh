#!/usr/bin/env bash
# Issue 39 on a real GPU node (no network): an env of the node's CUDA torch from the repacked wheel directory
# ($WHEELS, as scripts/gpu_bench36.sh makes it), validated by create and then $RUNS more times, one more run with a
# planted regression (torch's bytecode out of reach: PYTHONPYCACHEPREFIX on an empty directory and
# PYTHONDONTWRITEBYTECODE=1, so every rank compiles torch again and its import time rises), then `envbuilder report`
# of that history as HTML and Markdown. Results in $OUT (or ./gpu-history39): each run's JSON report, the drift
# warnings, report.html, report.md, summary.txt.
set -uo pipefail
out=${OUT:-gpu-history39}
wheels=${WHEELS:-/tmp/torch-wheels}
mkdir -p "$out"
export NO_COLOR=1 PYTHONUNBUFFERED=1 COLUMNS=100
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
. "$(dirname "$0")/gpu_common.sh"
node_torch
if ! compgen -G "$wheels/torch-*.whl" > /dev/null; then
  step wheels env PYTHONPATH="$PWD" python3 scripts/repack_wheels.py "$node_env" "$wheels"
fi
work=$(mktemp -d "${TMPDIR:-/tmp}/eb-hist39-XXXXXX")
mkdir -p "$work/recipes" "$work/scratch" "$work/work"
export ENVBUILDER_HOME=$work/home SCRATCH=$work/scratch WORK=$work/work ENVBUILDER_RECIPE_PATH=$work/recipes
export ENVBUILDER_INDEX_MIRROR="https://download.pytorch.org/whl/=$wheels pypi=$wheels" PYTHONPATH=$PWD
cat > "$work/recipes/h39.toml" <<TOML
schema_version = 1
[recipe]
name = "h39"
description = "the node's CUDA torch from a local wheel directory, validated several times (issue 39)"
[env]
kind = "venv"
installer = "uv"
prefix = "\${SCRATCH}/envs/{name}"
[python]
command = "python3"
[torch]
version = "$torch_version"
variant = "$variant"
packages = ["torch"]
[activate]
env = { NCCL_NVLS_ENABLE = "0", TORCH_SYMM_MEM_DISABLE_MULTICAST = "1", NVSHMEM_DISABLE_NVLS = "1" }
TOML
eb() { python3 -m envbuilder "$@"; }
step create eb create h39 --json
for i in $(seq 1 "${RUNS:-3}"); do
  step "validate-$i" eb validate h39 --json
done
mkdir -p "$work/empty-pycache"
step validate-planted env PYTHONPYCACHEPREFIX="$work/empty-pycache" PYTHONDONTWRITEBYTECODE=1 python3 -m envbuilder validate h39 --json
step report eb report h39 -o "$out/report.html"
eb report h39 --format md > "$out/report.md" 2> "$out/report-md.err"
{
  grep -h "drift" "$out"/validate-planted.err || echo "no drift warning on stderr"
  ls "$ENVBUILDER_HOME/history/h39" | wc -l | sed 's/^/history runs: /'
  python3 - "$out" <<'PY'
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
for f in sorted(out.glob("validate-*.out")) + [out / "create.out"]:
    try:
        data = json.loads(f.read_text())["data"]
    except (ValueError, KeyError, OSError) as exc:
        print(f.name, "unreadable:", exc)
        continue
    report = data.get("validation") or data.get("report") or data
    checks = report.get("checks") or {}
    figs = {name: {k: v.get("value") for k, v in (c.get("figures") or {}).items()} for name, c in checks.items()}
    print(f.name, report.get("ok"), report.get("seconds"), json.dumps(figs)[:400], "drift:", len(report.get("drift") or []))
PY
} > "$out/summary.txt" 2>&1
cat "$out/steps.txt" >> "$out/summary.txt"
cat "$out/summary.txt"
# The device returns a few files only: the summary, the reports, the planted run's JSON.
rm -rf "$work" "$out"/*.err "$out"/validate-[0-9]*.out "$out"/create.out "$out"/report.out "$out"/wheels.out "$out/steps.txt"
