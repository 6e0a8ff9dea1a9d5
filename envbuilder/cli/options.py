"""Options several commands share (a lockfile to use, where torch facts come from, the shape of a launch, the
partition) and the one-env verb shape, for :mod:`envbuilder.cli.parser` and :mod:`envbuilder.cli.siteparser`."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Optional

from envbuilder.cli.parts import Choices, Handler, SchedulerValue, add_json, hide_aliases, positive

if TYPE_CHECKING:
    from envbuilder.cli.parts import Sub


def add_lock_use(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--lock",
        metavar="FILE",
        help="use this lockfile, envbuilder's or a PEP 751 pylock.toml (default: yours, else the published one)",
    )
    group = p.add_mutually_exclusive_group()
    group.add_argument(
        "--locked",
        action="store_true",
        help="fail unless a lock applies (it matches the recipe and platform)",
    )
    group.add_argument("--no-lock", action="store_true", help="resolve afresh even where a lock exists")


def add_index(p: argparse.ArgumentParser) -> None:
    """Where the torch facts come from: the wheel indexes (cached a day), or the shipped table alone."""
    group = p.add_mutually_exclusive_group()
    group.add_argument(
        "--refresh", action="store_true", help="read the wheel indexes again instead of the day-old cache"
    )
    group.add_argument(
        "--offline",
        action="store_true",
        help="read no index: plan from the shipped table (also ENVBUILDER_OFFLINE=1)",
    )


def add_launch(p: argparse.ArgumentParser, per_node_help: Optional[str] = None) -> None:
    """How a launch is shaped (plan shows it, validate and run start it): launcher, nodes, ranks per node,
    account, partition."""
    p.add_argument(
        "--launcher",
        choices=Choices("envbuilder.core.launchers", "LAUNCHERS"),
        metavar="LAUNCHER",
        help="%(choices)s (default: the recipe's)",
    )
    p.add_argument("--nodes", type=positive, metavar="N")
    # One name on every command; torchrun's word and the one run and sbatch had are aliases (man page only).
    per_node = p.add_argument(
        "--ranks-per-node",
        "--nproc-per-node",
        "--gpus-per-node",
        type=positive,
        metavar="N",
        help=per_node_help,
    )
    hide_aliases(per_node)
    p.add_argument(
        "--account", type=SchedulerValue("ACCOUNT"), metavar="NAME", help="allocation account for batch jobs"
    )
    add_partition(p)


def add_partition(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--partition",
        type=SchedulerValue("PARTITION"),
        metavar="NAME",
        help="the partition (PBS: queue) to plan, build or run for: its GPUs and cores (default: the recipe's)",
    )


def env_verb(
    sub: Sub,
    name: str,
    help_text: str,
    handler: Handler,
) -> argparse.ArgumentParser:
    """A verb that acts on one recorded env: ``envbuilder NAME ENV [--json]``."""
    p: argparse.ArgumentParser = sub.add_parser(name, help=help_text)
    p.add_argument("env")
    add_json(p)
    p.set_defaults(handler=handler)
    return p


def add_preflight(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--no-preflight",
        action="store_true",
        help="skip the pre-flight check of space, inodes and quota before writing (said on stderr)",
    )
