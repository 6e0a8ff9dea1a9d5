"""`envbuilder stage ENV`: the env's image on every node of this Slurm allocation, unpacked node-local."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from envbuilder import settings, staging, state
from envbuilder.console import Out


def handle(args: argparse.Namespace, out: Out) -> dict[str, Any]:
    env = dict(os.environ)
    staged = staging.stage(state.load(settings.home(env), args.env), env)
    if not args.json:
        how = "copied with sbcast and unpacked" if staged.copied else "already there"
        out.result.line(f"staged {staged.name} on {staged.nodes} node(s): {staged.path} ({how})")
        out.result.field("use", f"envbuilder run {staged.name} --stage -- PROGRAM (in this allocation)")
    return staged.to_json()


def handle_node(args: argparse.Namespace, out: Out) -> None:
    sys.stdout.write(staging.on_node(args.step, args.key, args.sha256) + "\n")
