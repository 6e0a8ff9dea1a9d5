"""What the command line's grammar (:mod:`envbuilder.cli.parser`) is built from: command handlers imported only
when their command runs, choices read from their one home when first needed, a parser that raises (so main()
stays the single exit point) and offers "did you mean", and the value types of numeric options."""

from __future__ import annotations

import argparse
import copy
import importlib
import re
import shlex
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
        self.prog = prog
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


#: The options every command takes before or after its name, repeatable: (flags, dest, action, help).
GLOBAL_OPTIONS = (
    (("-v", "--verbose"), "verbose", "count", "log every command run; -vv also every library's debug log"),
    (("-q", "--quiet"), "quiet", "count", "print only warnings, errors and the result"),
    (("--traceback",), "traceback", "store_true", "show the Python stack on errors"),
)
#: The dest ``--json`` typed before the command lands in (the command's own is ``json``).
JSON_BEFORE = "json@"
#: What may come before the command, each as typed alone (none takes a value).
GLOBAL_FLAGS = frozenset(
    {"--json", *(flag for flags, _dest, _action, _help in GLOBAL_OPTIONS for flag in flags)}
)
#: Their one-letter forms typed together (``-vq``, ``-vv``).
GLOBAL_SHORT = re.compile(f"-[{''.join(sorted(f[1] for f in GLOBAL_FLAGS if len(f) == 2))}]+")


def add_global_options(parser: argparse.ArgumentParser) -> None:
    """Give ``parser`` and every parser below it the global options. argparse parses a command's options into a
    fresh namespace and copies it over its caller's, so each level keeps its own dest (``verbose@LEVEL``, absent
    unless typed) and :func:`merge_global_options` adds them up: ``-v plan -v`` is ``-vv``."""
    parser.add_argument(
        "--json", dest=JSON_BEFORE, action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS
    )
    for each in _all_parsers(parser):
        group = each.add_argument_group("global options (before or after the command)")
        for flags, dest, action, help_text in GLOBAL_OPTIONS:
            shown = help_text if each is parser else argparse.SUPPRESS
            group.add_argument(
                *flags, dest=f"{dest}@{each.prog}", action=action, default=argparse.SUPPRESS, help=shown
            )


def _all_parsers(parser: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    yield parser
    for action in parser._actions:  # argparse keeps its subcommands here only
        if isinstance(action, argparse._SubParsersAction):
            for sub in dict.fromkeys(action.choices.values()):
                yield from _all_parsers(sub)


def merge_global_options(args: argparse.Namespace) -> None:
    """The global options wherever they were typed: ``args.verbose`` and ``args.quiet`` (counts) and
    ``args.traceback``; ``--json`` before the command is the command's own ``--json``."""
    typed = vars(args)
    for _flags, dest, _action, _help in GLOBAL_OPTIONS:
        found = [typed.pop(key) for key in [k for k in typed if k.startswith(f"{dest}@")]]
        setattr(args, dest, sum(found) if dest != "traceback" else any(found))
    if typed.pop(JSON_BEFORE, False):
        parser = getattr(args, "parsed_by", None)
        if parser is not None and "--json" not in parser._option_string_actions:
            raise UsageExit(f"{parser.prog}: --json: this command has no JSON output", parser.prog)
        args.json = True


def wants_json(argv: Sequence[str]) -> bool:
    """``--json`` anywhere on the line (the program's words after ``--`` are split off before)."""
    return "--json" in argv


def hide_aliases(action: argparse.Action) -> None:
    """``--help`` shows the action by its first name only; the man page lists its other names too."""
    setattr(action, "hidden_aliases", tuple(action.option_strings[1:]))  # noqa: B010 - Action has no such field


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """The help's layout, kept as written (argparse would refill the epilog), with an option's aliases left out."""

    def _format_action_invocation(self, action: argparse.Action) -> str:
        hidden = getattr(action, "hidden_aliases", ())
        if hidden:
            action = copy.copy(action)
            action.option_strings = [s for s in action.option_strings if s not in hidden]
        return super()._format_action_invocation(action)


#: The commands that take a program after ``--``.
PROGRAM_COMMANDS = ("run", "sbatch")


def missing_dashes(
    args: argparse.Namespace, argv: Sequence[str], extras: Sequence[str]
) -> Optional[UsageExit]:
    """``run ENV train.py --epochs 3``: a program typed without ``--`` before it. It is refused, not guessed at:
    its options would be read as envbuilder's wherever the names meet (``-v``, ``-q``, ``--dry-run``, ``--nodes``
    go anywhere on the line), so the error shows the line with ``--`` put in."""
    if getattr(args, "command", None) not in PROGRAM_COMMANDS or not extras or extras[0].startswith("-"):
        return None
    words = list(argv)
    after_env = words.index(args.env, words.index(args.command) + 1) + 1
    start = words.index(extras[0], after_env)
    fixed = shlex.join(["envbuilder", *words[:start], "--", *words[start:]])
    prog = args.parsed_by.prog
    exc = UsageExit(f"{prog}: the program must come after `--` (found {extras[0]!r} without it)", prog)
    exc.hint = f"everything after `--` is the program's: {fixed}"
    return exc


if TYPE_CHECKING:
    # argparse's subparsers action has no public name, and is generic only to type checkers.
    Sub = argparse._SubParsersAction[Parser]
