#!/usr/bin/env bash
# Activation loading the env's modules through real Lmod on a GPU node (issue 33), as a TACC user meets it: a
# site-built python module (the node's CPython copied with its RUNPATH removed, its libpython in the module's own
# lib directory: tests/sitepython.py) under `module load gcc python3`, a venv over it with the node's CUDA torch
# (repacked from the node's python into a local wheel directory, as in gpu_image.sh), then in NEW bash shells:
# the venv's python without the modules (must fail: libpython not found), `source PREFIX/bin/activate` (must load
# gcc and python3 and run torch on the GPUs), `module load` of the env's modulefile (the same), and `validate`
# through torchrun. Results go to $OUT (or ./gpu-modules).
#
# The machine has no network and may have no Lmod: run `bash scripts/gpu_modules.sh prepare` here first, which puts
# Debian's lmod, its Lua and Tcl packages and patchelf into $DEBS (default .devrun/lmod); on the node they are
# unpacked and copied into / without replacing any file that is there (cp -n), where /usr/share/lmod is absent.
# Carry .devrun (git ignores it): run(..., carry=[".devrun"]).
set -uo pipefail
debs=${DEBS:-$PWD/.devrun/lmod}
if [ "${1:-}" = prepare ]; then
  mkdir -p "$debs" && cd "$debs" || exit 1
  apt-get download lmod lua5.3 liblua5.3-0 lua-posix lua-bit32 lua-filesystem lua-json lua-lpeg lua-term tcl8.6 libtcl8.6 \
    patchelf || exit 1
  ls "$debs"
  exit 0
fi
out=${OUT:-gpu-modules}
mkdir -p "$out"
export NO_COLOR=1 PYTHONUNBUFFERED=1 COLUMNS=160
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export ENVBUILDER_HOME=/tmp/eb-home SCRATCH=/tmp/eb-scratch ENVBUILDER_RECIPE_PATH=/tmp/eb-recipes
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
. "$(dirname "$0")/gpu_common.sh"
lmod_init=/usr/share/lmod/lmod/init/bash
if [ ! -f "$lmod_init" ] || ! command -v patchelf > /dev/null; then
  root=/tmp/lmod-debs
  mkdir -p "$root"
  for f in "$debs"/*.deb; do dpkg -x "$f" "$root"; done
  cp -rn "$root"/. / 2> "$out/unpack.err"
fi
{ command -v patchelf lua5.3; ls "$lmod_init"; bash -c ". $lmod_init && module --version" 2>&1; } > "$out/tools.txt" 2>&1

# The site's python: the node's CPython, laid out as a site builds one (fails, saying why, where the node's python
# has no shared libpython).
version=$(python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')
soft=/tmp/eb-soft/python-$version
rm -rf /tmp/eb-soft
step sitepython env PYTHONPATH="$PWD/tests" python3 -c '
import sys
from pathlib import Path
import sitepython
print(sitepython.why_not(sys.argv[1]) or "site-built python: ok")
sitepython.lay_out(sys.argv[1], Path(sys.argv[2]))
' "$version" "$soft"
cat "$out/sitepython.out" "$out/sitepython.err"
mods=/tmp/eb-modules
mkdir -p "$mods/gcc" "$mods/python3"
cat > "$mods/gcc/site.lua" <<'EOF'
family("compiler")
setenv("GCC_VERSION", "site")
EOF
cat > "$mods/python3/site.lua" <<EOF
prereq("gcc")
setenv("TACC_PYTHON_VER", "$version")
prepend_path("PATH", "$soft/bin")
prepend_path("LD_LIBRARY_PATH", "$soft/lib")
EOF

node_torch
step wheels python3 scripts/repack_wheels.py "$node_env" /tmp/torch-wheels
mkdir -p "$ENVBUILDER_RECIPE_PATH"
cat > "$ENVBUILDER_RECIPE_PATH/gpu-modules.toml" <<EOF
schema_version = 1
[recipe]
name = "gpu-modules"
description = "a venv on module load gcc python3 (a site-built python), for scripts/gpu_modules.sh"
[modules]
system = "lmod"
use = ["$mods"]
load = ["gcc/site", "python3/site"]
[env]
kind = "venv"
installer = "uv"
prefix = "\${SCRATCH}/envs/{name}"
[python]
command = "python3"
version = "$version"
[torch]
version = "$torch_version"
variant = "$variant"
packages = ["torch"]
[activate]
env = { NCCL_NVLS_ENABLE = "0", TORCH_SYMM_MEM_DISABLE_MULTICAST = "1", NVSHMEM_DISABLE_NVLS = "1" }
[validation]
checks = ["import", "gpu", "arch", "cuda", "libraries", "nccl", "ddp"]
EOF
export ENVBUILDER_INDEX_MIRROR="https://download.pytorch.org/whl/=/tmp/torch-wheels pypi=/tmp/torch-wheels"
prefix=$SCRATCH/envs/gpu-modules
step plan python3 -m envbuilder plan gpu-modules
step create python3 -m envbuilder create gpu-modules --json
step show python3 -m envbuilder show gpu-modules
step modulefile python3 -m envbuilder modulefile gpu-modules -o /tmp/eb-envmods/
probe='import torch; print(torch.__version__, torch.cuda.device_count(), torch.cuda.get_device_name(0))'
# New shells: nothing loaded, Lmod initialised as a login shell does (bare: not even that).
step bare env -i PATH=/usr/bin:/bin HOME=/tmp "$prefix/bin/python" -c 'import sys'
step activate env -i PATH=/usr/bin:/bin HOME=/tmp bash --noprofile --norc -c \
  ". $lmod_init; source '$prefix/bin/activate' && echo \"loaded: \$LOADEDMODULES\" && python -c '$probe' &&
   deactivate && echo \"after deactivate: \${LOADEDMODULES:-nothing}\""
step module-load env -i PATH=/usr/bin:/bin HOME=/tmp bash --noprofile --norc -c \
  ". $lmod_init; module use /tmp/eb-envmods && module load gpu-modules && echo \"loaded: \$LOADEDMODULES\" &&
   python -c '$probe' && module unload gpu-modules && echo \"after unload: \${LOADEDMODULES:-nothing}\""
step validate python3 -m envbuilder validate gpu-modules --json
for f in plan show bare activate module-load; do echo "== $f"; grep -E -i "activation|loaded|after|libpython|built with|^[0-9]" "$out/$f.out" "$out/$f.err" | head -8; done
python3 - "$out" <<'PY'
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
for name in ("create", "validate"):
    try:
        doc = json.loads((out / f"{name}.out").read_text())
    except (OSError, ValueError) as exc:
        print(name, "no JSON:", exc, (out / f"{name}.err").read_text()[-600:])
        continue
    data = doc.get("data") or {}
    report = (data["env"].get("validation") or {}) if isinstance(data.get("env"), dict) else data
    print(name, doc.get("status"), report.get("launcher"), "world", report.get("world"), report.get("seconds"), "s")
    for check, r in (report.get("checks") or {}).items():
        figures = {k: f["value"] for k, f in (r.get("figures") or {}).items()}
        print(f"  {check:11} {r.get('status'):5} {figures} {r.get('reason') or r.get('cause') or ''}"[:300])
PY
