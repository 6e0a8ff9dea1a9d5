"""What the command line's grammar (:mod:`envbuilder.cli.parser`) is built from: command handlers imported only
when their command runs, choices read from their one home when first needed, a parser that raises (so main()
stays the single exit point) and offers "did you mean", and the value types of numeric options."""

from __future__ import annotations

import argparse
import copy
import importlib
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, Callable, Optional

from envbuilder.core.errors import did_you_mean

if TYPE_CHECKING:
    from envbuilder.system.console import Out

Handler = Callable[[argparse.Namespace, "Out"], Any]


class LazyCommand:
    """A command's handler, imported when the command runs: ``envbuilder --help`` and every other command do not
    pay for the imports of all of them."""

    def __init__(self, module: str, function: str) -> None:
        self.module = module
        self.function = function

    def __call__(self, args: argparse.Namespace, out: Out) -> Any:
        handler: Handler = getattr(
            importlib.import_module(f"envbuilder.commands.{self.module}"), self.function
        )
        return handler(args, out)


def command(module: str, function: str) -> Handler:
    return LazyCommand(module, function)


class Choices:
    """An option's choices, read from their one home when argparse first checks or shows them (the metavar is
    set, so building the parser does not)."""

    def __init__(self, module: str, name: str) -> None:
        self.module = module
        self.name = name

    def _values(self) -> tuple[str, ...]:
        return tuple(getattr(importlib.import_module(self.module), self.name))

    def __iter__(self) -> Iterator[str]:
        return iter(self._values())

    def __contains__(self, value: object) -> bool:
        return value in self._values()


class Parser(argparse.ArgumentParser):
    """argparse that raises instead of exiting, so main() stays the single exit point; a usage error names the
    help of the command that was typed, and what a mistyped choice was probably meant to be."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageExit(f"{self.prog}: {message}", self.prog)

    def _check_value(self, action: argparse.Action, value: Any) -> None:
        # argparse's check of a choice (a command, --installer, ...): its own "did you mean" came only in 3.14.
        if action.choices is not None and value in action.choices:
            return
        shown = public(action)
        try:
            super()._check_value(shown, value)
        except argparse.ArgumentError as exc:
            close = did_you_mean(str(value), [str(c) for c in shown.choices or ()])
            raise UsageExit(f"{self.prog}: {exc}", self.prog, close) from None

    def parse_known_args(  # type: ignore[override]
        self, args: Optional[Sequence[str]] = None, namespace: Optional[argparse.Namespace] = None
    ) -> tuple[argparse.Namespace, list[str]]:
        parsed, extras = super().parse_known_args(args, namespace)
        # The innermost command's parser finishes first: main() names its options and its --help for extras.
        if not hasattr(parsed, "parsed_by"):
            parsed.parsed_by = self
        return parsed, extras


def public(action: argparse.Action) -> argparse.Action:
    """``action`` with only the choices a user is shown: a command list without the hidden commands (those
    without help, such as the completion scripts' ``__complete``), which argparse would list among the choices of
    a mistyped command."""
    # argparse names its subcommand action nowhere public.
    if not isinstance(action, argparse._SubParsersAction):
        return action
    shown = copy.copy(action)
    shown.choices = {choice.dest: action.choices[choice.dest] for choice in action._get_subactions()}
    return shown


class UsageExit(Exception):
    """A usage error: main() prints it, with its hint, and exits 2."""

    def __init__(self, message: str, prog: str, close: Optional[str] = None) -> None:
        super().__init__(message)
        #: The hint: the close match, if any, and the typed command's help.
        self.hint = f"{close} See `{prog} --help`" if close else f"see `{prog} --help`"


def unrecognized(parser: argparse.ArgumentParser, extras: Sequence[str]) -> UsageExit:
    """Arguments the typed command does not take, with the option each mistyped flag was probably meant to be."""
    # argparse lists a parser's options nowhere public.
    options = [s for a in parser._actions for s in a.option_strings]
    close = [did_you_mean(e.partition("=")[0], options) for e in extras if e.startswith("-")]
    return UsageExit(
        f"{parser.prog}: unrecognized arguments: {' '.join(extras)}",
        parser.prog,
        " ".join(c for c in close if c) or None,
    )


def add_json(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print one versioned JSON object on stdout")


def positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, found {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected 1 or more, found {value}")
    return value


def seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, found {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected 0 or more, found {value:g}")
    return value


class SchedulerValue:
    """The type of an option whose value lands in a job script or a scheduler's argv (--partition, --account):
    a value of the kind :mod:`envbuilder.core.values` names ``word`` (PARTITION, ACCOUNT), read when the option
    is given, so a value that would be an option of its own, or split into one, is a usage error naming the
    option."""

    def __init__(self, word: str) -> None:
        self.word = word

    def __call__(self, text: str) -> str:
        from envbuilder.core import values  # noqa: PLC0415 - only a command that takes the option pays for it

        problem = getattr(values, self.word).problem(text)
        if problem is not None:
            raise argparse.ArgumentTypeError(f"{problem[0]}; {problem[1]}")
        return text
