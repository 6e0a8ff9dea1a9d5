"""`envbuilder pack ENV [--to DIR]`: the env as one squashfs image, recorded in its record."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from envbuilder.core import settings
from envbuilder.core.space import Need
from envbuilder.plan import preflight as estimate
from envbuilder.scale import image
from envbuilder.system import fsutil, space, state
from envbuilder.system.console import Out


def handle(args: argparse.Namespace, out: Out) -> dict[str, Any]:
    home = settings.home(os.environ)
    to = Path(args.to).expanduser().resolve() if args.to else None
    with state.mutex(home, args.env):
        record = state.load(home, args.env)
        if image.container_file(record) is not None:
            return _one_file_already(record, out, args.json)
        way_out = "write the image elsewhere with --to DIR"
        if not image.refusal(record) and not space.skipped(args.no_preflight, os.environ, out.warn):
            fig = estimate.of_record(record.to_json())
            # squashfs compresses; the env's own size is the most the image can take.
            into = str(image.image_path(record, to).parent)
            space.check(
                [Need(into, f"the image of {record.name}", fig.bytes, 2, fig.source)],
                env=os.environ,
                warn=out.warn,
                way_out=way_out,
            )
        with fsutil.disk_errors((to or Path(record.prefix).parent, way_out)):
            record = image.pack(home, record, to)
    made = dict(record.image)
    if not args.json:
        out.result.line(
            f"packed {record.name} into {made['path']} ({made['bytes'] / 2**20:.1f} MiB, {made['compression']})"
        )
        out.result.field("sha256", made["sha256"])
        out.result.field(
            "use", f"envbuilder activate {record.name} --image (run and validate take --image too)"
        )
    return {"name": record.name, **{k: v for k, v in made.items() if k != "packages"}}


def _one_file_already(record: state.EnvRecord, out: Out, as_json: bool) -> dict[str, Any]:
    """A container env is one image file already: nothing to pack; stage copies that file node-local."""
    path, digest = image.container_usable(record)
    if not as_json:
        out.result.line(
            f"{record.name} is a container env: its image {path} is one file already; nothing packed"
        )
        out.result.field("sha256", digest)
        out.result.field("use", f"envbuilder stage {record.name} (in an allocation) copies it to each node")
    return {
        "name": record.name,
        "path": str(path),
        "sha256": digest,
        "bytes": path.stat().st_size,
        "packed": False,
    }
