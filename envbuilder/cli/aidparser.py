"""The grammar of the first-aid commands (what an env's launch needs from an allocation, what a failed job's
output means); :mod:`envbuilder.cli.parser` registers them in the order ``--help`` lists them."""

from __future__ import annotations

from typing import TYPE_CHECKING

from envbuilder.cli.parts import add_json, command

if TYPE_CHECKING:
    from envbuilder.cli.parts import Sub


def add_explain(sub: Sub) -> None:
    p = sub.add_parser(
        "explain", help="what a failed job's output means: known failure signatures, the fact and the fix"
    )
    p.add_argument(
        "what",
        metavar="LOG|JOBID",
        help="a job's log file, or a job id whose output files the scheduler's record names",
    )
    p.add_argument(
        "--env",
        metavar="ENV",
        help="the env the job ran (default: the one its script or variables name, where they do)",
    )
    add_json(p)
    p.set_defaults(handler=command("explain", "handle"))
