"""Thin CLI: parse (the grammar is :mod:`.parser`'s), dispatch to a command function, render. Errors are caught
here and nowhere else. Importing it imports argparse and the grammar only: rich comes with the first line of output
(:mod:`.console`), ``json``, ``logging`` and ``traceback`` with the first use (tests/unit/test_startup.py)."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Sequence
from typing import Any, Optional

from envbuilder.cli.parser import build_parser, command_named
from envbuilder.cli.parts import (
    PROGRAM_COMMANDS,
    Handler,
    UsageExit,
    merge_global_options,
    missing_dashes,
    unrecognized,
    wants_json,
)
from envbuilder.core.errors import (
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_PIPE,
    EXIT_USAGE,
    EnvbuilderError,
    UsageError,
)
from envbuilder.system.console import Out

RESULT_VERSION = 1


def envelope(command: str, status: str, data: Any, errors: Sequence[dict[str, Any]] = ()) -> dict[str, Any]:
    return {
        "envbuilder_result_version": RESULT_VERSION,
        "command": command,
        "status": status,
        "data": data,
        "errors": list(errors),
    }


def main(argv: Optional[Sequence[str]] = None) -> int:
    out = Out()
    argv, program = _split_program(list(sys.argv[1:] if argv is None else argv))
    named = command_named(argv)
    parser = build_parser(named)  # the named command's part of the grammar only, else all of it
    try:
        try:
            args = _parse(parser, argv)
        except UsageExit:
            if named is None:
                raise
            parser = build_parser()  # a usage error is told as the whole grammar tells it
            args = _parse(parser, argv)
        if program is not None:
            args.program = tuple(program)
    except UsageExit as exc:
        return _usage_error(exc, argv, out)
    except SystemExit as exc:  # --help / --version
        return int(exc.code or 0)
    out.quiet = args.quiet > 0
    if args.verbose:
        _log(args.verbose)
    handler: Optional[Handler] = getattr(args, "handler", None)
    if handler is None:
        (getattr(args, "subparser", None) or parser).print_help(sys.stderr)
        return EXIT_USAGE
    return _dispatch(handler, args, out)


def _parse(parser: argparse.ArgumentParser, argv: Sequence[str]) -> argparse.Namespace:
    args, extras = parser.parse_known_args(argv)
    if extras:
        raise missing_dashes(args, argv, extras) or unrecognized(args.parsed_by, extras)
    merge_global_options(args)
    return args


def _usage_error(exc: UsageExit, argv: Sequence[str], out: Out) -> int:
    """A usage error: on stderr as every error is, and under ``--json`` (anywhere on the line) also the envelope
    on stdout, so a script reading it gets a document for this failure too."""
    out.error(str(exc), hint=exc.hint)
    if wants_json(argv):
        failure = UsageError(str(exc), hint=exc.hint).to_json()
        _print_json(envelope(" ".join(exc.prog.split()[1:]), "error", None, [failure]))
    return EXIT_USAGE


def _log(verbosity: int) -> None:
    """-v: every command envbuilder runs (its own log); -vv: every library's debug log too, each line named."""
    import logging  # noqa: PLC0415 - only --verbose needs it here

    if verbosity > 1:
        logging.basicConfig(level=logging.DEBUG, format="%(name)s: %(message)s", stream=sys.stderr)
        return
    logging.basicConfig(level=logging.WARNING, format="%(message)s", stream=sys.stderr)
    logging.getLogger("envbuilder").setLevel(logging.DEBUG)


def _split_program(argv: list[str]) -> tuple[list[str], Optional[list[str]]]:
    """``envbuilder run ENV [OPTIONS] -- PROGRAM ARGS...``: the program and its arguments are split off at the
    first ``--`` (for run and sbatch only), so none of them is read as an envbuilder option."""
    command = next((a for a in argv if not a.startswith("-")), None)
    if command not in PROGRAM_COMMANDS or "--" not in argv:
        return argv, None
    cut = argv.index("--")
    return argv[:cut], argv[cut + 1 :]


def _dispatch(handler: Handler, args: argparse.Namespace, out: Out) -> int:
    """Run the command: the one place its errors are caught and turned into an exit code (and an envelope)."""
    command = args.command if args.command != "recipes" else f"recipes {args.recipes_command}"
    as_json = bool(getattr(args, "json", False))
    try:
        if getattr(args, "reads_settings", True):
            _apply_settings(args, out)
        with _probing_early(args):
            data = handler(args, out)
        if isinstance(data, int):  # a program's exit status (envbuilder run), passed on as it is
            return int(data)
    except EnvbuilderError as exc:
        return _failed(exc, command, as_json, args, out)
    except KeyboardInterrupt:
        out.error("interrupted")
        return EXIT_INTERRUPTED
    except (
        BrokenPipeError
    ):  # stdout's reader left (`envbuilder list | head`): stop quietly, as pipe writers do
        return reader_gone()
    except Exception as exc:
        disk = _disk_error(exc) if isinstance(exc, OSError) else None
        return _internal(exc, args, out) if disk is None else _failed(disk, command, as_json, args, out)
    if as_json:
        _print_json(envelope(command, "ok", data))
    return EXIT_OK


def _probing_early(args: argparse.Namespace) -> contextlib.AbstractContextManager[None]:
    """A command that probes this host (``probes_host`` in the grammar, and no ``--facts`` file) has nvidia-smi
    asked at once, while its modules load (``host.asked_early``)."""
    if not getattr(args, "probes_host", False) or getattr(args, "facts", None):
        return contextlib.nullcontext()
    from envbuilder.system import host  # noqa: PLC0415 - not for the commands that do not probe

    return host.asked_early(os.environ)


def _apply_settings(args: argparse.Namespace, out: Out) -> None:
    """The config files' settings, the environment and the flags, resolved in their one place
    (``core.config``), put where every module reads them: the process environment (so the programs a command
    starts see the same), and a locked flag's option turned back off. ``args.settings`` keeps the answer for
    ``envbuilder config``."""
    from envbuilder.core import config  # noqa: PLC0415 - not for --help, --version and the completion scripts
    from envbuilder.system import configfiles  # noqa: PLC0415

    dests = {s.name: s.flag.lstrip("-").replace("-", "_") for s in config.SETTINGS if s.flag}
    flags = {name: "1" for name, dest in dests.items() if getattr(args, dest, False) is True}
    resolved = configfiles.effective(os.environ, flags)
    if args.command != "__complete":  # a tab press prints nothing but names
        for warning in resolved.warnings:
            out.warn(warning)
    for one in resolved.settings:
        if one.locked and one.setting.name in flags:
            setattr(args, dests[one.setting.name], one.value == "1")
    environ = resolved.environ(os.environ)
    for gone in set(os.environ) - set(environ):
        del os.environ[gone]
    os.environ.update(environ)
    args.settings = resolved


def _print_json(document: dict[str, Any]) -> None:
    import json  # noqa: PLC0415 - only --json needs it here

    print(json.dumps(document, indent=2))


def _print_traceback() -> None:
    import traceback  # noqa: PLC0415 - only a failure needs it

    traceback.print_exc()


def _failed(exc: EnvbuilderError, command: str, as_json: bool, args: argparse.Namespace, out: Out) -> int:
    if args.traceback:
        _print_traceback()
    out.error(exc.message, exc.hint)
    if as_json:
        _print_json(envelope(command, "error", exc.data, _errors(exc)))
    return exc.exit_code


def _disk_error(exc: OSError) -> Optional[EnvbuilderError]:
    """The last resort for a file system that said no where no command expected it (read-only, full, over quota,
    missing, not permitted): a disk error that names the path, never an "internal error"."""
    from envbuilder.core import settings  # noqa: PLC0415 - only a failure needs them
    from envbuilder.scale import image  # noqa: PLC0415 - only a failure needs them
    from envbuilder.system import fsutil  # noqa: PLC0415 - only a failure needs them

    node = (image.node_base(os.environ), image.NODE_WAY_OUT)
    return fsutil.disk_error(exc, (*settings.disk_places(os.environ), node))


def _internal(exc: BaseException, args: argparse.Namespace, out: Out) -> int:
    if args.traceback or os.environ.get("ENVBUILDER_TRACEBACK"):
        _print_traceback()
    out.error(f"internal error: {type(exc).__name__}: {exc}", hint="rerun with --traceback and report it")
    return EXIT_INTERNAL


def reader_gone() -> int:
    """stdout's reader has left: point stdout at /dev/null, so that the flush at exit cannot fail again and print a
    traceback, and exit as a writer killed by SIGPIPE would."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return EXIT_PIPE


def _errors(exc: EnvbuilderError) -> list[dict[str, Any]]:
    many = getattr(exc, "errors", None)
    if many:
        return [e.to_json() for e in many]
    return [exc.to_json()]
