#!/usr/bin/env bash
# What importing torch costs in a freshly installed env on this node, and what writing its bytecode costs each way
# (issue 36: the phases of a create after its install). Raw uv only, no envbuilder: a venv made with `uv venv`,
# torch installed from the wheel directory a GPU run repacked ($WHEELS), then each import timed in a new process.
#   WHEELS=/tmp/torch-wheels  PYTHON=python3  UV=(envbuilder's uv)  OUT=.  (run from the checkout)  (results: $OUT/imports.txt, also printed)
set -uo pipefail
wheels=${WHEELS:-/tmp/torch-wheels}
py=${PYTHON:-python3}
uv=${UV:-$(PYTHONPATH=$PWD python3 -c 'from envbuilder.backends.installers import uv_binary; print(uv_binary())')}
out=${OUT:-.}
work=$(mktemp -d "${TMPDIR:-/tmp}/probe-imports-XXXXXX")
export UV_CACHE_DIR=$work/cache
torch=$(basename "$(compgen -G "$wheels/torch-*.whl" | head -n 1)" | cut -d- -f2)

timed() {
  local label=$1 s=$EPOCHREALTIME rc
  shift
  "$@" > /dev/null 2> "$work/last.err"
  rc=$?
  printf '%-52s rc=%s %6.2f s\n' "$label" "$rc" "$(python3 -c "print($EPOCHREALTIME - $s)")" | tee -a "$out/imports.txt"
  [ "$rc" = 0 ] || tail -n 5 "$work/last.err"
}

install() {  # install PREFIX [uv pip install options]
  local prefix=$1
  shift
  "$uv" venv -q --python "$py" "$prefix" && "$uv" pip install -q --python "$prefix/bin/python" --no-index \
    --find-links "$wheels" "$@" "torch==$torch"
}

echo "torch $torch from $wheels, $(nproc) CPUs" | tee "$out/imports.txt"
timed "uv venv + install, cold cache" install "$work/a"
a=$work/a/bin/python
timed "import torch, no bytecode written" env PYTHONDONTWRITEBYTECODE=1 "$a" -c "import torch"
timed "import torch, writing its bytecode" env -u PYTHONDONTWRITEBYTECODE "$a" -c "import torch"
timed "import torch, from bytecode" "$a" -c "import torch"
timed "arch flags, from bytecode" "$a" -c "import torch; print(getattr(torch._C, '_cuda_getArchFlags', str)())"
timed "import torch._dynamo, writing its bytecode" env -u PYTHONDONTWRITEBYTECODE "$a" -c "import torch._dynamo"
timed "import torch._dynamo, from bytecode" "$a" -c "import torch._dynamo"
timed "uv venv + install, warm cache" install "$work/b"
b=$work/b/bin/python
timed "compileall -j0 of torch (all of it)" "$b" -m compileall -q -j0 "$work"/b/lib/python*/site-packages/torch
timed "import torch._dynamo, from compileall's bytecode" "$b" -c "import torch._dynamo"
timed "uv venv + install --compile-bytecode, warm cache" install "$work/c" --compile-bytecode
timed "import torch._dynamo, from uv's bytecode" "$work/c/bin/python" -c "import torch._dynamo"
rm -rf "$work"
