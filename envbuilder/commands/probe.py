"""`envbuilder probe`: this machine's facts, as a replayable JSON document."""

from __future__ import annotations

import argparse
import os
from dataclasses import replace
from typing import Any

from envbuilder.system import host, modules
from envbuilder.system.console import Out


def handle(args: argparse.Namespace, out: Out) -> dict[str, Any]:
    facts = host.probe()
    if args.modules:
        # What `module -t avail` lists here: an admin edits this list to plan a module tree's change (impact).
        facts = replace(facts, modules=modules.detect(os.environ).available(os.environ))
    data = facts.to_json()
    if not args.json:
        out.result.heading(f"Host {facts.hostname or '?'}")
        for key in ("arch", "glibc", "python", "driver_version", "max_cuda", "module_system", "scheduler"):
            value = data[key]
            missing = "none found" if key in ("module_system", "scheduler") else "unknown"
            out.result.field(key, missing if value is None else str(value))
        if facts.gpus is None:
            out.result.field("gpus", "unknown")
        elif not facts.gpus:
            out.result.field("gpus", "none")
        for key in ("amdgpu_version", "level_zero"):  # AMD and Intel nodes only
            if key in data:
                out.result.field(key, str(data[key]) or "not installed")
        for gpu in facts.gpus or ():
            code = (
                f"{gpu.vendor} {gpu.arch}"
                if gpu.arch
                else f"compute capability {gpu.compute_capability or '?'}"
            )
            out.result.field("gpu", f"{gpu.name} ({code})")
        for key, value in facts.allocation.items():
            out.result.field(key, value)
        for key, value in facts.filesystems.items():
            out.result.field(f"${key}", value)
        if facts.modules is not None:
            out.result.field("modules", " ".join(facts.modules) or "none listed")
        out.line("(save with `envbuilder probe --json > facts.json`; replay with `plan --facts facts.json`)")
    return data
