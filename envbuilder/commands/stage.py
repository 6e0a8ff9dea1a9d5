"""`envbuilder stage ENV`: the env's image on every node of this job (Slurm or PBS), unpacked node-local;
`--clean` removes the nodes' copies."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from envbuilder.core import settings
from envbuilder.scale import staging
from envbuilder.system import space, state
from envbuilder.system.console import Out


def handle(args: argparse.Namespace, out: Out) -> dict[str, Any]:
    env = dict(os.environ)
    record = state.load(settings.home(env), args.env)
    if args.clean:
        cleaned = staging.clean(record, env)
        if not args.json:
            gone = sum(cleaned.removed.values())
            out.result.line(
                f"removed {gone} staged copies of {record.name} from {len(cleaned.removed)} node(s)"
            )
        return cleaned.to_json()
    staged = staging.stage(record, env, preflight=not space.skipped(args.no_preflight, env, out.warn))
    if not args.json:
        how = "copied and unpacked" if staged.copied else "already there"
        out.result.line(f"staged {staged.name} on {staged.nodes} node(s): {staged.path} ({how})")
        out.result.field("use", f"envbuilder run {staged.name} --stage -- PROGRAM (in this allocation)")
    return staged.to_json()


def handle_node(args: argparse.Namespace, out: Out) -> None:
    sys.stdout.write(staging.on_node(args.step, args.key, args.sha256, args.into, args.need) + "\n")
