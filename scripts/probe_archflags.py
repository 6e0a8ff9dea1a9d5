"""Where a CUDA torch keeps its compiled arch list as text, and what finding it costs (issue 36's guard).

``torch._C._cuda_getArchFlags()`` returns a string compiled into one of torch's native libraries. This probe
scans each ``torch/lib/*.so*`` of the torch that ``python3`` imports for runs of arch names separated by
spaces, timing each scan, and prints them beside what torch itself says, so the guard can learn the list by
reading a file instead of importing torch, and what the guard's own read (``torcharch.library_flags``) finds.
Run on a GPU node from the checkout: ``PYTHONPATH=. python3 scripts/probe_archflags.py``.
"""

from __future__ import annotations

import importlib.util
import mmap
import re
import subprocess
import sys
import time
from pathlib import Path

from envbuilder.backends.torcharch import LIBRARY, library_flags

#: Any run of arch names (looser than the guard's C-string rule, to see what else a library holds).
RUN = re.compile(rb"(?:sm|compute)_\d+[af]?(?: (?:sm|compute)_\d+[af]?)+")


def main() -> int:
    spec = importlib.util.find_spec("torch")
    if spec is None or spec.origin is None:
        print("no torch here")
        return 1
    lib = Path(spec.origin).parent / "lib"
    for path in sorted(lib.glob("*.so*")):
        start = time.perf_counter()
        with path.open("rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as data:
            found = sorted({m.group(0).decode() for m in RUN.finditer(data)})
        took = time.perf_counter() - start
        size = path.stat().st_size / 2**20
        print(f"{path.name}: {size:.0f} MiB scanned in {took:.3f} s, {len(found)} run(s): {found[:4]}")
    start = time.perf_counter()
    flags = library_flags(lib.parent)
    print(f"the guard's read of {LIBRARY}: {flags} in {time.perf_counter() - start:.3f} s")
    code = "import torch; print(torch._C._cuda_getArchFlags())"
    start = time.perf_counter()
    said = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    print(f"torch says ({time.perf_counter() - start:.2f} s): {said.stdout.strip()!r} {said.stderr[-300:]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
