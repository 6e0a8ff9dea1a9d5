"""What each command's ``--help`` ends with: a few examples and the environment variables the command reads.
The same text feeds the man page (``envbuilder man``), so the two cannot drift apart. Pure data and string work:
importing it costs nothing at startup."""

from __future__ import annotations

import argparse
import textwrap
from collections.abc import Iterator

from envbuilder.cli.parts import HelpFormatter

#: Help text is written for this width: the width of a pipe, of a default terminal, of ``man``.
WIDTH = 80

#: Every environment variable a command reads, described once.
VARIABLES = {
    "ENVBUILDER_HOME": "records, logs, lockfiles and caches (default $WORK/.envbuilder, else an existing "
    "~/.envbuilder, else $XDG_DATA_HOME/envbuilder)",
    "XDG_CONFIG_HOME": "your config file is $XDG_CONFIG_HOME/envbuilder/config.toml (default ~/.config)",
    "XDG_DATA_HOME": "the envbuilder home where no variable names one (default ~/.local/share)",
    "WORK": "where records and backups go when the variables naming them are unset",
    "SCRATCH": "envs are built in $SCRATCH/envbuilder/envs unless the recipe says otherwise",
    "ENVBUILDER_RECIPE_PATH": "your recipe directories, colon-separated, searched before the built-in ones",
    "ENVBUILDER_CONFIG": "the site config to read (default /etc/envbuilder/config.toml)",
    "ENVBUILDER_INDEX_MIRROR": "UPSTREAM=TARGET pairs: where wheel index and channel reads really go",
    "ENVBUILDER_OFFLINE": "1 reads no index: plan from the shipped table (like --offline)",
    "ENVBUILDER_INDEX_TIMEOUT": "seconds to wait for the wheel indexes to answer, name lookup included",
    "ENVBUILDER_MANAGED_PYTHON": '0 refuses recipes with python.source = "managed" (a site may lock it)',
    "ENVBUILDER_PYTHON_MIRROR": "where uv downloads managed CPython from (a URL or directory standing for "
    "python-build-standalone's releases)",
    "ENVBUILDER_PYTHON_DOWNLOADS": "a list of Python downloads in uv's JSON format, instead of uv's own",
    "UV_CACHE_DIR": "uv's package cache (else $ENVBUILDER_UV_CACHE, else beside the envs)",
    "ENVBUILDER_CONDA_PKGS": "the conda package cache (default $SCRATCH/envbuilder/conda-pkgs)",
    "ENVBUILDER_COMPILE_BYTECODE": "1 or 0: uv writes all bytecode as it installs (default: with 8+ CPUs)",
    "ENVBUILDER_BACKUP_ROOT": "where backups go (default $WORK/envbuilder/backups)",
    "SLURM_JOB_ID": "inside a Slurm (or PBS) job, checks and programs use its allocation",
    "PBS_NODEFILE": "inside a PBS job, its hosts: stage copies the image to each",
    "NO_COLOR": "set to any value: no colour, even on a terminal",
    "ENVBUILDER_PROGRESS_EVERY": "seconds between progress lines when stderr is not a terminal (default 10)",
    "ENVBUILDER_TRACEBACK": "set to any value: show the Python stack on internal errors",
    "SHELL": "the shell to write completion for when none is named",
    "TMPDIR": "node-local directory for image mounts and unpacked copies (default /tmp)",
    "ENVBUILDER_NO_FUSE": "1 unpacks an image instead of mounting it with squashfuse (a node without FUSE)",
    "ENVBUILDER_SIGNATURES_DIR": "the site's directory of extra failure signatures (*.toml) explain reads",
    "ENVBUILDER_NO_PREFLIGHT": "1 skips the space, inode and quota check before create, restore, pack, stage and backup "
    "write (as --no-preflight does)",
    "ENVBUILDER_HISTORY_DIR": "the site's shared validation history: runs of envs of published recipes go there too",
}

_RECIPES = ("ENVBUILDER_RECIPE_PATH", "ENVBUILDER_CONFIG")
_INDEX = ("ENVBUILDER_INDEX_MIRROR", "ENVBUILDER_OFFLINE", "ENVBUILDER_INDEX_TIMEOUT")
_PYTHONS = ("ENVBUILDER_MANAGED_PYTHON", "ENVBUILDER_PYTHON_MIRROR", "ENVBUILDER_PYTHON_DOWNLOADS")
_RECORDS = ("ENVBUILDER_HOME", "WORK")
_BACKUPS = ("ENVBUILDER_BACKUP_ROOT", "WORK")
_PROGRESS = "ENVBUILDER_PROGRESS_EVERY"
_COMPILE = "ENVBUILDER_COMPILE_BYTECODE"
_PREFLIGHT = "ENVBUILDER_NO_PREFLIGHT"

#: Per command (``recipes list`` for nested ones): its examples (without the leading ``envbuilder``, each one
#: a command line the parser accepts, which a test checks) and the variables it reads.
COMMANDS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "": (
        ("recipes list", "create vista-venv-cu124", "plan local --offline"),
        ("ENVBUILDER_HOME", "NO_COLOR", "ENVBUILDER_TRACEBACK"),
    ),
    "plan": (
        ("plan vista-venv-cu124", "plan local --offline --json", "plan local --facts gh200.json"),
        (*_RECIPES, *_INDEX, _PYTHONS[0], "ENVBUILDER_HOME", "SCRATCH"),
    ),
    "lock": (
        (
            "lock vista-venv-cu124",
            "lock local --platform x86_64 --platform aarch64",
            "lock local -o locks/local.lock.toml --format pylock",
        ),
        (*_RECIPES, *_INDEX, "ENVBUILDER_HOME"),
    ),
    "mirror": (
        (
            "mirror ~/.envbuilder/lockfiles/local.lock.toml --to /srv/mirror",
            "mirror a.lock.toml b.lock.toml --to /srv/wheels --layout wheelhouse",
        ),
        (),
    ),
    "create": (
        (
            "create vista-venv-cu124",
            "create local --prefix ~/envs/local --force",
            "create local --no-validate -q --no-preflight",
        ),
        (
            *_RECIPES,
            *_INDEX,
            *_PYTHONS,
            *_RECORDS,
            "SCRATCH",
            "UV_CACHE_DIR",
            "ENVBUILDER_CONDA_PKGS",
            _COMPILE,
            _PROGRESS,
            _PREFLIGHT,
        ),
    ),
    "validate": (
        (
            "validate local --cpu",
            "validate vista-venv-cu124 --nodes 2 --submit",
            "validate local --checks gpu,nccl",
        ),
        (*_RECORDS, "SCRATCH", "SLURM_JOB_ID", "TMPDIR", "ENVBUILDER_NO_FUSE", "ENVBUILDER_HISTORY_DIR"),
    ),
    "run": (
        (
            "run local -- python train.py",
            "run vista-venv-cu124 --nodes 2 -- python train.py",
            "run local --image -- python train.py",
        ),
        (*_RECORDS, "SLURM_JOB_ID", "TMPDIR", "ENVBUILDER_NO_FUSE"),
    ),
    "sbatch": (
        (
            "sbatch vista-venv-cu124 --nodes 4 -- python train.py",
            "sbatch zurada-conda-cu126 --dry-run -- python train.py",
            "sbatch vista-venv-cu124 --output logs/ -- python train.py",
        ),
        _RECORDS,
    ),
    "list": (("list", "list --json"), (*_RECORDS, "ENVBUILDER_BACKUP_ROOT")),
    "show": (("show local", "show local --json"), _RECORDS),
    "activate": (
        ("activate local", "activate vista-venv-cu124 --json", "activate local --image"),
        (*_RECORDS, "TMPDIR", "ENVBUILDER_NO_FUSE"),
    ),
    "pack": (("pack local", "pack local --to $WORK/images"), (*_RECORDS, _PREFLIGHT)),
    "stage": (
        ("stage local", "stage vista-venv-cu124 --json", "stage local --clean"),
        (*_RECORDS, "SLURM_JOB_ID", "PBS_NODEFILE", "TMPDIR"),
    ),
    "remove": (("remove local", "remove local --yes"), _RECORDS),
    "modulefile": (
        ("modulefile local", "modulefile local -o ~/modulefiles/torch", "modulefile local --format tcl"),
        _RECORDS,
    ),
    "backup": (
        ("backup --all", "backup local --mode archive --to /work/me/backups", "backup local --portable"),
        (*_BACKUPS, "ENVBUILDER_HOME", _PROGRESS, _PREFLIGHT),
    ),
    "backups": (("backups", "backups local --json"), (*_BACKUPS, "ENVBUILDER_HOME")),
    "restore": (
        ("restore local", "restore local --backup local@20261123T101500Z --force"),
        (*_BACKUPS, "ENVBUILDER_HOME", _PROGRESS, _PYTHONS[1], _PYTHONS[2], _PREFLIGHT),
    ),
    "verify-backup": (("verify-backup local", "verify-backup local@20261123T101500Z"), _BACKUPS),
    "prune-backups": (("prune-backups --keep 3", "prune-backups --keep 1 --env local --dry-run"), _BACKUPS),
    "touch": (("touch local", "touch local --json"), _RECORDS),
    "doctor": (
        ("doctor", "doctor local --json", "doctor --facts gh200.json"),
        (*_RECORDS, *_RECIPES, *_INDEX),
    ),
    "alloc": (
        ("alloc local", "alloc local --nodes 2 --account ABC23001", "alloc zurada-conda-cu126 --json"),
        (*_RECORDS, *_RECIPES, "SLURM_JOB_ID"),
    ),
    "explain": (
        ("explain slurm-1234.out", "explain 1234 --env local", "explain job.log --json"),
        ("ENVBUILDER_SIGNATURES_DIR", *_RECORDS),
    ),
    "impact": (
        (
            "impact --facts after.json --before now.json --json",
            "impact --facts new.json --registry /srv/reg --records /srv/envs",
            "impact --facts after.json --format html -o impact.html",
        ),
        (*_RECIPES, *_INDEX),
    ),
    "share": (("share local --to /shared/envs", "share local --to /shared/envs --json"), _RECORDS),
    "probe": (("probe", "probe --json > facts.json", "probe --modules --json > now.json"), ("SLURM_JOB_ID",)),
    "report": (
        (
            "report local -o report.html",
            "report --all --format md",
            "report --site --recipe pytorch-gpu -o site.html",
        ),
        (*_RECORDS, "ENVBUILDER_HISTORY_DIR"),
    ),
    "recipes": (("recipes list", "recipes show local --explain"), _RECIPES),
    "recipes list": (("recipes list", "recipes list --json"), _RECIPES),
    "recipes show": (("recipes show local", "recipes show vista-venv-cu124 --explain"), (*_RECIPES, *_INDEX)),
    "recipes schema": (("recipes schema", "recipes schema > recipe.schema.json"), ()),
    "recipes diff": (("recipes diff vista-venv-cu124 1 2", "recipes diff local 1 2 --json"), _RECIPES),
    "recipes update": (("recipes update", "recipes update --json"), (*_RECIPES, *_RECORDS)),
    "publish": (
        (
            "publish vista-venv-cu124 --registry /shared/recipes",
            "publish site.toml --registry /shared/recipes --sign-key ~/.ssh/id",
        ),
        (*_RECIPES, *_INDEX, "ENVBUILDER_HOME"),
    ),
    "config": (
        ("config", "config list --json"),
        ("XDG_CONFIG_HOME", "ENVBUILDER_CONFIG", "ENVBUILDER_HOME", "XDG_DATA_HOME", "WORK"),
    ),
    "config list": (("config list", "config list --json"), ("XDG_CONFIG_HOME", "ENVBUILDER_CONFIG")),
    "completion": ((), ("SHELL",)),  # its examples: one a shell, from the shells' registry
    "man": (("man | man -l -", "man > ~/.local/share/man/man1/envbuilder.1"), ()),
}


def subcommands(
    parser: argparse.ArgumentParser, path: str = ""
) -> Iterator[tuple[str, str, argparse.ArgumentParser]]:
    """Each public command below ``parser`` as ``(path, one-line help, parser)``, ``recipes`` before ``recipes
    list``, in the order ``--help`` lists them (hidden ones, which have no help, are left out)."""
    for action in parser._actions:  # argparse keeps its subcommands here only
        if not isinstance(action, argparse._SubParsersAction):
            continue
        for choice in action._get_subactions():
            name = f"{path} {choice.dest}".strip()
            sub = action.choices[choice.dest]
            yield name, choice.help or "", sub
            yield from subcommands(sub, name)


def examples(command: str) -> tuple[str, ...]:
    lines = COMMANDS.get(command, ((), ()))[0]
    if command == "completion":
        lines = _completion_examples()
    return tuple(f"envbuilder {line}" for line in lines)


def _completion_examples() -> tuple[str, ...]:
    """Where each shell's completion script goes."""
    from envbuilder.core.shells import registry  # noqa: PLC0415 - only the completion command's help reads it

    return tuple(f"completion {name} > {shell.completion_file}" for name, shell in registry.COMPLETED.items())


def variables(command: str) -> tuple[str, ...]:
    return COMMANDS.get(command, ((), ()))[1]


def epilog(command: str) -> str:
    """The examples and the variables, laid out to fit ``WIDTH`` columns."""
    lines = ["examples:", *(f"  {line}" for line in examples(command))]
    names = variables(command)
    if names:
        lines += ["", "environment:"]
        column = max(len(name) for name in names) + 4
        for name in names:
            lines += textwrap.wrap(
                VARIABLES[name],
                WIDTH - 2,
                initial_indent=f"  {name}".ljust(column),
                subsequent_indent=" " * column,
            )
    return "\n".join(lines)


def apply(parser: argparse.ArgumentParser) -> None:
    """Give the parser and every command below it its epilog, kept as written (argparse would refill it)."""
    for command, parsed in (("", parser), *((name, sub) for name, _, sub in subcommands(parser))):
        if command not in COMMANDS:  # a command without examples yet: its help stays as it was (a test fails)
            continue
        parsed.epilog = epilog(command)
        parsed.formatter_class = HelpFormatter
        if parsed.description:  # kept as written too now, so filled here
            parsed.description = textwrap.fill(parsed.description, WIDTH - 2)
