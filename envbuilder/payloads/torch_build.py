"""Run by an env's python (stdlib only): where that python finds torch, without importing it, and with
``--arch-flags`` the GPU code list compiled into it (``torch._C._cuda_getArchFlags()``, which needs no GPU).
Prints one JSON line; envbuilder reads torch's version.py itself."""

from __future__ import annotations

import gc
import importlib.util
import json
import os
import sys
from importlib import metadata
from typing import Any


def locate() -> dict[str, Any]:
    out: dict[str, Any] = {"version": None, "package_dir": None, "dist_info": None}
    spec = importlib.util.find_spec("torch")  # a top-level find_spec imports nothing
    if spec is not None and spec.origin:
        out["package_dir"] = os.path.dirname(spec.origin)
    try:
        dist = metadata.distribution("torch")
    except metadata.PackageNotFoundError:
        return out
    out["version"] = dist.version
    path = getattr(dist, "_path", None)
    out["dist_info"] = str(path) if path is not None else None
    return out


def arch_flags() -> dict[str, Any]:
    gc.disable()  # while torch is imported, the collector walked its new objects again and again (payloads/validate)
    try:
        import torch

        read = getattr(torch._C, "_cuda_getArchFlags", None)  # only CUDA builds have it
        flags = read() if read is not None else ""
    except Exception as exc:  # reported, not raised: envbuilder decides what an unreadable list means
        return {"arch_flags": None, "arch_error": f"{type(exc).__name__}: {exc}"}
    return {"arch_flags": (flags or "").split(), "arch_error": None}


def main(argv: list[str]) -> int:
    out = locate()
    if "--arch-flags" in argv:
        out.update(arch_flags())
    sys.stdout.write(json.dumps(out) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
