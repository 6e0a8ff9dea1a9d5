"""Repack an installed torch, with what it needs, as wheels in a local directory (for machines with no network:
the wheel directory then stands in for the PyTorch index and PyPI through ENVBUILDER_INDEX_MIRROR).

    python scripts/repack_wheels.py ENV_PREFIX OUT_DIR [EXTRA_NAME...]
"""

from __future__ import annotations

import sys
from pathlib import Path

from envbuilder.backup import wheelhouse

WANT = {"torch", "filelock", "typing-extensions", "sympy", "networkx", "jinja2", "fsspec", "setuptools", "mpmath",
        "markupsafe", "triton", "numpy"}  # fmt: skip


def main(argv: list[str]) -> int:
    prefix, out = Path(argv[0]), Path(argv[1])
    want = WANT | set(argv[2:])
    out.mkdir(parents=True, exist_ok=True)
    total = 0
    for dist in wheelhouse.scan(prefix):
        if dist.key not in want and not dist.key.startswith(("nvidia-", "cuda-")):
            continue
        target = out / dist.wheel_filename()
        try:
            with target.open("wb") as fh:
                total += wheelhouse.pack(dist, fh)
        except Exception as exc:  # a file changed after install: leave that one out, and say so
            print(f"skipped {dist.name}: {exc}")
            target.unlink()
            continue
        print(f"packed {dist.name} {dist.version}")
    print(f"{total >> 20} MiB of wheels in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
