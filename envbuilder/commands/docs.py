"""`envbuilder completion SHELL`, `envbuilder man`, and the hidden `envbuilder __complete KIND` that completion
scripts call for names. Each prints to stdout, for redirecting to a file."""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING

from envbuilder.cli import completion, manpage
from envbuilder.cli.parser import build_parser
from envbuilder.core.errors import UsageError
from envbuilder.core.shells import registry as shells

if TYPE_CHECKING:
    from envbuilder.system.console import Out


def handle_completion(args: argparse.Namespace, out: Out) -> None:
    shell = args.shell or os.path.basename(os.environ.get("SHELL", ""))  # noqa: PTH119 - a name, not a path
    if shell not in shells.COMPLETED:
        raise UsageError(
            f"no completion for shell {shell or '(none: $SHELL is unset)'!r}",
            hint=f"name one: envbuilder completion {'|'.join(shells.COMPLETED)}",
        )
    sys.stdout.write(completion.script(build_parser(), shell))


def handle_names(args: argparse.Namespace, out: Out) -> None:
    for name in completion.names(args.kind):
        sys.stdout.write(f"{name}\n")


def handle_man(args: argparse.Namespace, out: Out) -> None:
    sys.stdout.write(manpage.render(build_parser()))
