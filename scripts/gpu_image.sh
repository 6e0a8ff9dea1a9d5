#!/usr/bin/env bash
# Scale mode on a real GPU node (a lent H200/H100 machine): a uv venv with the node's CUDA torch (repacked from the
# node's own python into a local wheel directory that stands in for the PyTorch index and PyPI), packed into a
# squashfs image, then validated from that image (`validate --image`: mounted with squashfuse where FUSE works,
# else unpacked to node-local storage), and the first import timed from the env directory and from the image.
# Also the bytecode the create's smoke check writes (PYTHONDONTWRITEBYTECODE set, as many sites do): counted.
# The machine has no network: where it lacks squashfs-tools, $SQFS (default .devrun/sqfs, `dpkg -x` of Debian's
# squashfs-tools and liblzo2-2) provides mksquashfs and unsquashfs. Results go to $OUT (or ./gpu-image).
set -uo pipefail
out=${OUT:-gpu-image}
sqfs=${SQFS:-$PWD/.devrun/sqfs}
mkdir -p "$out"
export NO_COLOR=1 PYTHONUNBUFFERED=1 COLUMNS=160 PYTHONDONTWRITEBYTECODE=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export ENVBUILDER_HOME=/tmp/eb-home SCRATCH=/tmp/eb-scratch WORK=/tmp/eb-work ENVBUILDER_RECIPE_PATH=/tmp/eb-recipes
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
if ! command -v mksquashfs > /dev/null && [ -x "$sqfs/usr/bin/mksquashfs" ]; then
  export PATH=$sqfs/usr/bin:$PATH LD_LIBRARY_PATH=$sqfs/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
# squashfuse too, where $SQFS carries it (`dpkg -x` of squashfuse, libsquashfuse0, libfuse3-3 and fuse3): the image
# is then mounted (as root, /dev/fuse) instead of unpacked.
if ! command -v fusermount3 > /dev/null && [ -x "$sqfs/usr/bin/squashfuse" ] && [ -x "$sqfs/bin/fusermount3" ]; then
  export PATH=$sqfs/usr/bin:$sqfs/bin:$PATH
  export LD_LIBRARY_PATH=$sqfs/usr/lib/x86_64-linux-gnu:$sqfs/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
. "$(dirname "$0")/gpu_common.sh"
{ command -v mksquashfs unsquashfs squashfuse fusermount3 fusermount uv; ls -l /dev/fuse; } > "$out/tools.txt" 2>&1
node_torch
step wheels python3 scripts/repack_wheels.py "$node_env" /tmp/torch-wheels
mkdir -p "$ENVBUILDER_RECIPE_PATH"
cat > "$ENVBUILDER_RECIPE_PATH/gpu-image.toml" <<EOF
schema_version = 1
[recipe]
name = "gpu-image"
description = "uv venv with the node's CUDA torch from its index, for scripts/gpu_image.sh"
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
[validation]
checks = ["import", "gpu", "arch", "cuda", "libraries", "nccl", "ddp", "filesystem"]
EOF
export ENVBUILDER_INDEX_MIRROR="https://download.pytorch.org/whl/=/tmp/torch-wheels pypi=/tmp/torch-wheels"
step create python3 -m envbuilder create gpu-image --json
env_dir=/tmp/eb-scratch/envs/gpu-image
echo "torch .pyc files after create: $(find "$env_dir/lib" -path '*torch*' -name '*.pyc' | wc -l)" > "$out/pyc.txt"
step pack python3 -m envbuilder pack gpu-image --json
step validate-dir python3 -m envbuilder validate gpu-image --json
step validate-image python3 -m envbuilder validate gpu-image --image --json
# How the image was used (mounted with squashfuse, or unpacked), and that nothing stayed mounted after the run.
{ grep -i -E "mount|unpack|image" "$out/validate-image.err" | head -5; echo "squashfuse mounts left: $(grep -c squashfuse /proc/mounts)"; } > "$out/image-use.txt"
step validate-unpacked env ENVBUILDER_NO_FUSE=1 python3 -m envbuilder validate gpu-image --image --json
# The first import of torch in a fresh process: from the env directory, and from the image's copy.
for i in 1 2 3; do
  step "import-dir-$i" "$env_dir/bin/python" -c 'import time; t = time.perf_counter(); import torch; print(round(time.perf_counter() - t, 3), torch.__version__, torch.cuda.device_count())'
done
python3 - "$out" <<'PY'
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
for name in ("create", "validate-dir", "validate-image", "validate-unpacked"):
    try:
        doc = json.loads((out / f"{name}.out").read_text())
    except (OSError, ValueError) as exc:
        print(name, "no JSON:", exc, (out / f"{name}.err").read_text()[-600:])
        continue
    data = doc.get("data") or {}
    report = (data["env"].get("validation") or {}) if isinstance(data.get("env"), dict) else data
    print(name, doc.get("status"), report.get("launcher"), "world", report.get("world"), report.get("seconds"), "s",
          "image:", json.dumps(data.get("image"))[:300] if data.get("image") else "")
    for check, r in (report.get("checks") or {}).items():
        figures = {k: f["value"] for k, f in (r.get("figures") or {}).items()}
        print(f"  {check:11} {r.get('status'):5} {figures} {r.get('reason') or r.get('cause') or ''}"[:300])
PY
cat "$out/tools.txt" "$out/pyc.txt"
for i in 1 2 3; do cat "$out/import-dir-$i.out"; done
