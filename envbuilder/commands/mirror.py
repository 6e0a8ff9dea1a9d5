"""`envbuilder mirror LOCK... --to DIR [--layout simple|wheelhouse]`: fill a site mirror with exactly the files
the locks name, and say the ENVBUILDER_INDEX_MIRROR value that points the locks' indexes at it."""

from __future__ import annotations

import argparse
import os
import shlex
from pathlib import Path
from typing import Any

from envbuilder import lockfile
from envbuilder.resolver import mirror, mirrorfill, sitemirror
from envbuilder.system.console import Out


def handle(args: argparse.Namespace, out: Out) -> dict[str, Any]:
    locks = [lockfile.read(Path(p).expanduser()) for p in args.locks]
    files = sitemirror.collect(locks)
    root = Path(args.to).expanduser().absolute()
    conda = sitemirror.channels(locks) if any(f.subdir for f in files) else []
    value = sitemirror.env_value(sitemirror.upstreams(locks), str(root), args.layout, conda)
    quiet = bool(args.json or args.quiet)
    if not quiet:
        out.heading(f"Mirroring {len(files)} files from {len(locks)} lockfile(s) into {root} ({args.layout})")
    log = (lambda _: None) if quiet else (lambda text: out.line(f"  {text}"))
    done = mirrorfill.fill(files, root, args.layout, dict(os.environ), log=log)
    if not args.json:
        out.result.line(
            f"{len(done.downloaded)} downloaded ({done.bytes_downloaded} bytes), "
            f"{len(done.skipped)} already there with the locked hash; {done.held} files in {root}"
        )
        out.result.line(f"export {mirror.VAR}={shlex.quote(value)}")
    return {
        "to": str(root),
        "layout": args.layout,
        "locks": [lock.path for lock in locks],
        "files": [
            {"name": f.filename, "url": f.url, "sha256": f.sha256, "path": f.relpath(args.layout)}
            for f in files
        ],
        "downloaded": list(done.downloaded),
        "skipped": list(done.skipped),
        "bytes": done.bytes_downloaded,
        "held": done.held,
        "index_mirror": value,
    }
