"""Start-up by structure (issue 35): what a command imports is what it prints with. ``envbuilder --help``,
``--version`` and the completion scripts print through argparse and shtab, so they never import rich (some 70% of
the CLI's imports before); the first line of human output does. A pure module of a package is importable without
the package's I/O modules: ``doctor.report`` without ``doctor.collect`` and ``proc``.

Each case runs in a fresh interpreter (the test runner has long since imported everything) and reports the modules
loaded. This pins the structure, not a time: scripts/bench_startup.py measures the time.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

_CHILD = textwrap.dedent(
    """
    import contextlib, io, json, sys

    argv = sys.argv[1:]
    if argv[0] == "--import":
        __import__(argv[1])
    else:
        from envbuilder.cli import main

        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()) as err:
            code = main(argv)
        print(json.dumps({"code": code, "stderr": err.getvalue()}), file=sys.__stderr__)
    print(json.dumps(sorted(sys.modules)))
    """
)


def loaded_by(*argv: str) -> tuple[set[str], str]:
    """The modules a fresh interpreter holds after ``argv`` (the CLI's arguments, run in-process through
    ``main``, or ``--import MODULE``), and what the child wrote on stderr."""
    res = subprocess.run(
        [sys.executable, "-c", _CHILD, *argv], capture_output=True, text=True, timeout=120, check=False
    )
    assert res.returncode == 0, res.stderr
    return set(json.loads(res.stdout.splitlines()[-1])), res.stderr


@pytest.mark.parametrize(
    "argv",
    [("--help",), ("--version",), ("completion", "bash"), ("completion", "fish")],
    ids=["help", "version", "completion-bash", "completion-fish"],
)
def test_output_without_rich_does_not_import_rich(argv: tuple[str, ...]) -> None:
    modules, stderr = loaded_by(*argv)
    assert '"code": 0' in stderr
    assert not {m for m in modules if m.partition(".")[0] == "rich"}, (
        f"envbuilder {' '.join(argv)} imported rich"
    )


#: What a command's help and the completion scripts print with: the grammar (``cli``) and the names it offers as
#: choices (``core``: shells, launchers, env kinds and installers, modulefile and backup formats), besides the
#: console module the dispatcher holds and the one verb module that writes a script.
_PRINTS_WITH = ("envbuilder.cli", "envbuilder.core")
_ALSO = {
    "envbuilder",
    "envbuilder.system",
    "envbuilder.system.console",
    "envbuilder.commands",
    "envbuilder.commands.docs",
}


@pytest.mark.parametrize(
    "argv",
    [
        ("activate", "--help"),
        ("modulefile", "--help"),
        ("backup", "--help"),
        ("completion", "bash"),
        ("completion", "zsh"),
        ("completion", "fish"),
    ],
    ids=lambda argv: "-".join(a.strip("-") for a in argv),
)
def test_help_and_completion_import_only_what_they_print(argv: tuple[str, ...]) -> None:
    """Their choices (``--format``, ``--mode``, ``--installer``...) are read from core, not from the modules that
    write modulefiles, backups or envs: the help lists them, and a completion script offers every one."""
    modules, stderr = loaded_by(*argv)
    assert '"code": 0' in stderr
    extra = {
        m
        for m in modules
        if m.partition(".")[0] == "envbuilder"
        and m not in _ALSO
        and not any(m == top or m.startswith(top + ".") for top in _PRINTS_WITH)
    }
    assert not extra, f"envbuilder {' '.join(argv)} imported {sorted(extra)}"


def test_importing_the_cli_imports_neither_rich_nor_the_commands() -> None:
    modules, _ = loaded_by("--import", "envbuilder.cli")
    assert not {m for m in modules if m.partition(".")[0] == "rich"}
    assert not {m for m in modules if m.startswith("envbuilder.commands")}
    assert "envbuilder.system.tables" not in modules  # a renderer: it imports rich


def test_the_first_line_of_output_imports_rich() -> None:
    """The other side (and the check's own check): a usage error is printed through rich, as before."""
    modules, stderr = loaded_by("nosuchcommand")
    assert '"code": 2' in stderr and "invalid choice" in stderr
    assert "rich.console" in modules


def test_a_pure_doctor_module_comes_without_the_io_one() -> None:
    """``doctor.report`` is pure (its docstring): importing it must not run the package's I/O module."""
    modules, _ = loaded_by("--import", "envbuilder.doctor.report")
    assert "envbuilder.doctor.report" in modules
    assert "envbuilder.doctor.collect" not in modules
    assert "envbuilder.system.proc" not in modules


_COUNT_COMPILES = textwrap.dedent(
    """
    import builtins, json, sys, typing  # typing and its own patterns first: only the code below is counted

    compiled = []
    real = builtins.compile

    def counting(source, *args, **kwargs):
        if isinstance(source, str):  # a module's own source comes as bytes, where it has no bytecode yet
            compiled.append(source[:60])
        return real(source, *args, **kwargs)

    builtins.compile = counting
    exec(sys.argv[1])
    builtins.compile = real
    print(json.dumps(compiled))
    """
)


def compiled_by(code: str) -> list[str]:
    """What ``code`` compiles (``compile``: a string annotation becoming a ForwardRef) in a fresh interpreter."""
    res = subprocess.run(
        [sys.executable, "-c", _COUNT_COMPILES, code], capture_output=True, text=True, timeout=60, check=True
    )
    found: list[str] = json.loads(res.stdout)
    return found


def test_the_record_types_compile_no_annotation_at_import() -> None:
    """The recorded plan's TypedDicts hold evaluated annotations: as strings, each was compiled into a ForwardRef
    as its class was made (54 compiles in every command that plans)."""
    assert compiled_by("import envbuilder.core.records") == []
    # The counter is not blind: the same TypedDict shape with a string annotation compiles it.
    assert compiled_by("class T(typing.TypedDict):\n    a: 'list[str]'\n") == ["list[str]"]
