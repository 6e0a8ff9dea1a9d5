"""``envbuilder man``: a man page (roff, ``man(7)`` macros) written from the parser and the help epilogs, so it
describes the installed version and cannot drift from ``--help``."""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterable

from envbuilder import __version__
from envbuilder.cli import helptext
from envbuilder.core.config import PRECEDENCE


def _escape(text: str) -> str:
    """Text as roff reads it literally: backslashes and hyphens escaped, no line read as a request."""
    text = text.replace("\\", "\\e").replace("-", "\\-")
    return re.sub(r"^([.'])", r"\\&\1", text, flags=re.MULTILINE)


def _usage(parser: argparse.ArgumentParser) -> str:
    formatter = argparse.HelpFormatter(prog=parser.prog, width=helptext.WIDTH - 8)
    formatter.add_usage(parser.usage, parser._actions, parser._mutually_exclusive_groups, prefix="")
    return formatter.format_help().strip()


def _options(parser: argparse.ArgumentParser) -> list[str]:
    formatter = argparse.HelpFormatter(prog=parser.prog)
    lines = []
    for action in parser._actions:
        if action.help == argparse.SUPPRESS or isinstance(action, argparse._SubParsersAction):
            continue
        lines += [".TP", f".B {_escape(formatter._format_action_invocation(action))}"]
        # argparse lays out "-o, --output PATH" and fills %(default)s and %(choices)s only in these
        lines.append(_escape(formatter._expand_help(action)) if action.help else "")
    return lines


def _examples(command: str) -> list[str]:
    examples = helptext.examples(command)
    if not examples:
        return []
    return [".PP", "Examples:", ".PP", ".RS", ".nf", *(_escape(line) for line in examples), ".fi", ".RE"]


def _environment(names: Iterable[str]) -> list[str]:
    lines = [".SH ENVIRONMENT"]
    for name in names:
        lines += [".TP", f".B {name}", _escape(helptext.VARIABLES[name])]
    return lines


def render(parser: argparse.ArgumentParser) -> str:
    """The whole page: synopsis, options, each command with its options and examples, every variable."""
    lines = [
        f'.TH ENVBUILDER 1 "" "envbuilder {_escape(__version__)}" "User Commands"',
        ".SH NAME",
        f"envbuilder \\- {_escape(' '.join((parser.description or '').split()))}",
        ".SH SYNOPSIS",
        ".nf",
        _escape(_usage(parser)),
        ".fi",
        ".SH OPTIONS",
        *_options(parser),
        ".SH EXAMPLES",
        ".nf",
        *(_escape(line) for line in helptext.examples("")),
        ".fi",
        ".SH COMMANDS",
    ]
    variables = list(helptext.variables(""))
    for name, summary, sub in helptext.subcommands(parser):
        lines += [f'.SS "{_escape(name)}"', _escape(summary), ".PP", ".nf", _escape(_usage(sub)), ".fi"]
        lines += _options(sub) + _examples(name)
        variables += [v for v in helptext.variables(name) if v not in variables]
    lines += _environment(variables)
    lines += [".SH FILES", _escape(PRECEDENCE)]
    return "\n".join(lines) + "\n"
