"""The grammar of the first-aid commands (what an env's launch needs from an allocation, what a failed job's
output means); :mod:`envbuilder.cli.parser` registers them in the order ``--help`` lists them."""

from __future__ import annotations

from typing import TYPE_CHECKING

from envbuilder.cli.options import add_launch
from envbuilder.cli.parts import SchedulerValue, add_json, command

if TYPE_CHECKING:
    from envbuilder.cli.parts import Sub


def add_alloc(sub: Sub) -> None:
    p = sub.add_parser(
        "alloc",
        help="the allocation an env's launch needs, as the site's lines; inside a job, what it lacks",
    )
    p.add_argument("env", metavar="ENV", help="a recorded env (or a recipe's name)")
    add_launch(p, per_node_help="ranks per node (default: the last passing validation's, else one per GPU)")
    p.add_argument(
        "--time", type=SchedulerValue("TIME"), metavar="TIME", help="walltime (default: the recipe's)"
    )
    p.add_argument("--cpu", action="store_true", help="the launch of a CPU run (validate --cpu): no GPUs")
    p.add_argument("--script", metavar="PATH", help="the batch line's job script (default: job.sh)")
    p.add_argument("--facts", metavar="FILE", help="host facts as JSON instead of probing this machine")
    add_json(p)
    p.set_defaults(handler=command("alloc", "handle"))


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
