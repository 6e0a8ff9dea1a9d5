"""The embedded conda engine: py-rattler (the library behind pixi) solves and installs conda packages with no conda
binary. envbuilder runs it as a child process, like any other installer, with conda's own command line:

    python -m envbuilder.backends.rattler_engine create --yes --prefix BUILD --override-channels --channel URL ...
        [--platform linux-64] [--final-prefix=PREFIX] SPEC...

It installs into BUILD but writes PREFIX into the files that embed their prefix, so an env built beside its final
place works once renamed there. A solver failure prints the solver's explanation and exits 1.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Optional, cast

from envbuilder.core import settings

EXIT_SOLVE = 1
EXIT_MISSING = 3


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="envbuilder-rattler")
    sub = p.add_subparsers(dest="command", required=True)
    c = sub.add_parser("create")
    c.add_argument("--yes", action="store_true")
    c.add_argument("--prefix", required=True)
    c.add_argument("--override-channels", action="store_true")
    c.add_argument("--channel", action="append", default=[])
    c.add_argument("--platform")
    c.add_argument("--final-prefix")
    c.add_argument("specs", nargs="+")
    return p


def create(
    prefix: Path,
    channels: Sequence[str],
    specs: Sequence[str],
    platform: Optional[str],
    final: Optional[Path],
) -> list[str]:
    """Solve and install; the installed records as NAME=VERSION=BUILD."""
    import rattler  # noqa: PLC0415 - optional dependency, imported where used

    platforms = cast(Any, [platform or str(rattler.Platform.current()), "noarch"])
    virtual = rattler.VirtualPackage.detect()

    async def run() -> list[str]:
        # Parsed leniently, as conda parses its command line (name=version=build pins included).
        records = await rattler.solve(
            sources=list(channels),
            specs=[rattler.MatchSpec(spec) for spec in specs],
            platforms=platforms,
            virtual_packages=virtual,
        )
        await rattler.install(
            records,
            target_prefix=prefix,
            cache_dir=settings.conda_cache(os.environ),  # create sets it (CONDA_CACHE_VAR)
            show_progress=False,
            alternative_target_prefix=final,
        )
        return [f"{r.name.normalized}={r.version}={r.build}" for r in records]

    return asyncio.run(run())


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = _parser().parse_args(argv)
    try:
        import rattler.exceptions as errors  # noqa: PLC0415
    except ImportError:
        print("envbuilder-rattler: py-rattler is not installed (pip install py-rattler)", file=sys.stderr)
        return EXIT_MISSING
    final = Path(args.final_prefix) if args.final_prefix else None
    try:
        installed = create(Path(args.prefix), args.channel, args.specs, args.platform, final)
    except errors.SolverError as exc:
        print(f"conda solver: {exc}", file=sys.stderr)
        return EXIT_SOLVE
    except (
        errors.FetchRepoDataError,
        errors.GatewayError,
        errors.InvalidMatchSpecError,
        errors.InstallerError,
        errors.LinkError,
        errors.TransactionError,
        errors.ExtractError,
        errors.CacheDirError,
        errors.IoError,
    ) as exc:
        print(f"conda install: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_SOLVE
    for line in installed:
        print(line)
    return 0


if __name__ == "__main__":
    status = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter teardown: py-rattler's runtime threads can crash (SIGSEGV) while Python finalizes, after
    # the env is complete, which would turn a good build into a failed one.
    os._exit(status)
