"""Every command's --help: examples the parser accepts, the variables it reads, 80 columns; the man page."""

from __future__ import annotations

import functools
import shlex
import shutil
import subprocess

import pytest

from envbuilder.cli import dispatch, helptext, manpage
from envbuilder.cli import parser as cliparser
from envbuilder.cli import parts as cliparts
from envbuilder.core.shells import registry


@functools.cache
def parser_once():
    """One parser for the tests that only parse or format with it (neither changes a parser); 25 ms a build."""
    return cliparser.build_parser()


def commands():
    parser = parser_once()
    return [("", parser), *((name, sub) for name, _, sub in helptext.subcommands(parser))]


def command_names():
    return [name for name, _ in commands()]


def example_argv(line):
    """An example as the parser gets it: no leading `envbuilder`, no shell redirection or pipe, no program."""
    words = shlex.split(line)
    assert words[0] == "envbuilder"
    words = words[1 : next((i for i, w in enumerate(words) if w in (">", "|")), len(words))]
    argv, _program = dispatch._split_program(words)
    return argv


def test_every_command_has_examples_and_hidden_ones_are_hidden():
    names = command_names()
    assert "completion" in names
    assert "man" in names
    assert "__complete" not in names  # the completion scripts' callback is not for people
    for name in names:
        # completion's: one per shell it writes for
        most = len(registry.COMPLETED) if name == "completion" else 3
        assert 2 <= len(helptext.examples(name)) <= most, name


def test_a_mistyped_command_lists_the_public_commands_only():
    with pytest.raises(cliparts.UsageExit) as raised:
        cliparser.build_parser().parse_args(["nosuch"])
    message = str(raised.value)
    assert "invalid choice: 'nosuch'" in message and "'create'" in message and "'man'" in message
    assert "__complete" not in message
    with pytest.raises(cliparts.UsageExit) as raised:
        cliparser.build_parser().parse_args(["__complet"])
    assert "__complete" not in str(raised.value) + raised.value.hint  # nor suggested
    assert cliparser.build_parser().parse_args(["__complete", "envs"]).kind == "envs"  # still there


@pytest.mark.parametrize("command", command_names())
def test_examples_parse_as_the_command_they_illustrate(command):
    for line in helptext.examples(command):
        argv = example_argv(line)
        args = parser_once().parse_args(argv)  # raises on a usage error
        words = [w for w in argv if not w.startswith("-")]
        assert " ".join(words).startswith(command), line
        assert command == "" or args.handler is not None


def test_sbatch_examples_name_an_env_whose_recipe_has_a_scheduler():
    # `sbatch local --dry-run` was an example: local names no scheduler, so sbatch refuses it (exit 2).
    from envbuilder.recipe import loader
    from envbuilder.recipe.catalog import Catalog

    catalog = Catalog.from_env({})
    for line in helptext.examples("sbatch"):
        args = parser_once().parse_args(example_argv(line))
        assert loader.load(args.env, catalog).scheduler.type != "none", line


@pytest.mark.parametrize("command", command_names())
def test_help_ends_with_examples_and_variables_in_80_columns(command, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    parser = dict(commands())[command]
    text = parser.format_help()
    too_wide = [line for line in text.splitlines() if len(line) > 80]
    assert not too_wide, too_wide
    tail = text[text.index("\nexamples:\n") :]
    for line in helptext.examples(command):
        assert f"\n  {line}\n" in tail + "\n"
    for name in helptext.variables(command):
        assert f"\n  {name} " in tail
    for name in helptext.variables(command):
        assert name in helptext.VARIABLES


def test_long_descriptions_are_filled_to_the_width():
    parser = cliparser.build_parser()
    assert parser.description
    assert all(len(line) <= helptext.WIDTH - 2 for line in parser.description.splitlines())


def roff():
    return manpage.render(cliparser.build_parser())


def test_man_page_structure():
    page = roff()
    assert page.startswith(".TH ENVBUILDER 1 ")
    for section in (
        ".SH NAME",
        ".SH SYNOPSIS",
        ".SH OPTIONS",
        ".SH EXAMPLES",
        ".SH COMMANDS",
        ".SH ENVIRONMENT",
    ):
        assert f"\n{section}\n" in page
    for name in command_names()[1:]:
        assert f'\n.SS "{name.replace("-", chr(92) + "-")}"\n' in page
    # nothing in the page reads as a roff request by accident
    requests = {line.split()[0] for line in page.splitlines() if line.startswith((".", "'"))}
    assert requests <= {".TH", ".SH", ".SS", ".TP", ".B", ".PP", ".RS", ".RE", ".nf", ".fi"}


@pytest.mark.skipif(shutil.which("groff") is None, reason="groff is not installed")
def test_man_page_renders_without_warnings(tmp_path):
    page = tmp_path / "envbuilder.1"
    page.write_text(roff())
    res = subprocess.run(
        ["groff", "-man", "-Tutf8", "-ww", "-P", "-cbou", str(page)],  # plain text: no overstrike,
        capture_output=True,
        text=True,
        check=False,
        env={"PATH": "/usr/bin:/bin", "MANWIDTH": "80"},
    )
    assert res.returncode == 0, res.stderr
    assert res.stderr == ""
    text = res.stdout
    assert "envbuilder create vista-venv-cu124" in text
    assert "ENVBUILDER_RECIPE_PATH" in text
    assert "--no-validate" in text.replace("\u2010", "-")


# A command line naming a command is parsed by that command's part of the grammar alone (cli.parser.PARTS):
# these keep the parts and the whole grammar saying the same.


def test_each_part_adds_the_commands_it_names_and_all_of_them_make_the_grammar():
    whole = [name for action in parser_once()._subparsers._group_actions for name in action.choices]
    assert whole == [name for _add, names in cliparser.PARTS for name in names]
    for _add, names in cliparser.PARTS:
        part = cliparser.build_parser(names[0])
        assert [n for a in part._subparsers._group_actions for n in a.choices] == list(names)


def _help_of(parser, path):
    for name, _line, sub in helptext.subcommands(parser):
        if name == path:
            return sub.format_help()
    raise AssertionError(f"no command {path!r}")


@pytest.mark.parametrize("command", command_names()[1:])
def test_a_part_shows_the_same_help_as_the_whole_grammar(command, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    part = cliparser.build_parser(command.split()[0])
    assert _help_of(part, command) == _help_of(parser_once(), command)


@pytest.mark.parametrize("command", command_names()[1:])
def test_a_part_parses_each_example_as_the_whole_grammar_does(command):
    def parsed(parser, argv):
        args = vars(parser.parse_args(argv))
        handler = args.pop("handler", None)  # a LazyCommand: the same module and function
        args["handler"] = (handler.module, handler.function) if handler is not None else None
        return {k: v for k, v in args.items() if k not in ("parsed_by", "subparser")}

    for line in helptext.examples(command):
        argv = example_argv(line)
        named = cliparser.command_named(argv)
        assert named == command.split()[0], line
        assert parsed(cliparser.build_parser(named), argv) == parsed(parser_once(), argv), line


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["create", "local"], "create"),
        (["-v", "--json", "-qv", "--traceback", "list"], "list"),
        (["__stage-node", "x"], "__stage-node"),
        (["recipes", "list"], "recipes"),
        ([], None),  # no command: the whole grammar's usage
        (["--version"], None),
        (["-h", "create"], None),  # envbuilder's own help, which lists every command
        (["--bogus", "create"], None),  # an unknown option is reported by the whole grammar
        (["-vx", "create"], None),
        (["creat", "local"], None),  # a mistyped command gets the whole grammar's "did you mean"
    ],
)
def test_only_a_line_that_begins_with_global_flags_and_a_command_is_parsed_by_its_part(argv, named):
    assert cliparser.command_named(argv) == named


def test_a_usage_error_under_a_part_reads_as_under_the_whole_grammar(capsys):
    assert dispatch.main(["-q", "create", "local", "--bogus-flag"]) == 2
    err = capsys.readouterr().err
    assert "envbuilder create: unrecognized arguments: --bogus-flag" in err
    assert dispatch.main(["-h", "create"]) == 0  # envbuilder's own help, not create's
    out = capsys.readouterr().out
    assert "COMMAND" in out and "restore" in out and "--prefix" not in out
