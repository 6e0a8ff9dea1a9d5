"""Run one envbuilder command in this process under cProfile and write where its time went (issue 36: the parts
of a warm create that no build-log line accounts for). ``python scripts/profile_create.py OUT ARGS...``: OUT gets
the 45 calls of most cumulative time, then the 25 of most own time; the command's exit status is returned."""

from __future__ import annotations

import cProfile
import io
import pstats
import sys
from pathlib import Path

from envbuilder.cli import main as envbuilder_main


def main(argv: list[str]) -> int:
    out, args = argv[0], argv[1:]
    profile = cProfile.Profile()
    code = 1
    profile.enable()
    try:
        code = envbuilder_main(args)
    finally:
        profile.disable()
        text = io.StringIO()
        stats = pstats.Stats(profile, stream=text)
        stats.sort_stats("cumulative").print_stats(45)
        stats.sort_stats("tottime").print_stats(25)
        Path(out).write_text(text.getvalue(), encoding="utf-8")
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
