"""What a recipe value may hold: the rules for names, variables, paths, requirements and conda envs, as checks that
say what is wrong (a message and a hint) and as the ``require_*`` guards every renderer calls again for values
that come from elsewhere (a state record, the command line). Pure; the schema attaches them to its fields."""

from __future__ import annotations

import re
from typing import Any, Callable, Optional

from envbuilder.errors import RecipeError
from envbuilder.structs import dataclass

NAME_RE = r"[a-z0-9][a-z0-9._-]*"
#: Upper ends of counts: far above any machine (16 GPUs, 10,000s of nodes, 1,000s of cores), far below values
#: that overflow what a launcher or scheduler takes.
MAX_GPUS_PER_NODE = 64
MAX_CORES_PER_NODE = 16384
MAX_NODES = 1_000_000
#: A module name Lmod and Tcl Environment Modules take as a name: no whitespace, quotes, $, ;, backslash or colon
#: (LOADEDMODULES is a colon list), and no leading '-' (an option). Lmod evaluates anything else it is handed.
MODULE_RE = r"[A-Za-z0-9_/][A-Za-z0-9._+/@%,-]*"
#: An environment variable name (activate.env keys, profile unsets): the shell's identifier.
VAR_RE = r"[A-Za-z_][A-Za-z0-9_]*"
#: What ``conda activate`` is handed (``activate.conda_env``): an env's name as conda allows it (no '/', ' ', ':',
#: '#'; no leading '-', an option), or an absolute prefix of plain path characters. Nothing a shell would read.
CONDA_ENV_RE = r"[A-Za-z0-9_][A-Za-z0-9._+-]*|(/[A-Za-z0-9._+@%,-]+)+/?"
#: A distribution name as core metadata spells it (PEP 508): what ``packages.name`` holds.
DIST_NAME_RE = r"[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?"
#: The schemes a direct reference (``name @ URL``) may use: pinned remote sources over TLS or ssh. A local path or a
#: plain-http URL would bypass the index, its mirror (ENVBUILDER_INDEX_MIRROR) and transport security.
DIRECT_URL_SCHEMES = ("https://", "git+https://", "git+ssh://")

#: (message, hint) of a value that fails a rule.
Problem = tuple[str, Optional[str]]

_NUL_HINT = "no file name, command-line argument or environment variable can hold a NUL byte"
_LINE_HINT = (
    "activate scripts, modulefiles and batch scripts take one line per value; only description and notes fields "
    "may span lines"
)
_CONTROL_HINT = "terminals and shells act on control characters: remove it"
_MODULE_HINT = (
    "a module name holds letters, digits and . _ + - / @ % , only, and starts with a letter, a digit, _ or / "
    "(a module system would run anything else as shell code or read it as an option)"
)


def control_problem(value: str, prose: bool = False) -> Optional[Problem]:
    """What in ``value`` no generated script, argument or variable can carry: a NUL byte anywhere, a line break
    outside prose (Lmod writes it unescaped into the shell code ``module load`` evaluates), any other control
    character. Tabs pass; prose (descriptions, notes) may also hold line breaks."""
    for ch in value:
        code = ord(ch)
        if code == 0:
            return "a NUL byte", _NUL_HINT
        if ch == "\t" or (prose and ch in "\n\r"):
            continue
        if ch in "\n\r":
            return "a line break", _LINE_HINT
        if code < 32 or 0x7F <= code <= 0x9F:
            return f"the control character U+{code:04X}", _CONTROL_HINT
    return None


def module_name_problem(name: str) -> Optional[Problem]:
    if re.fullmatch(MODULE_RE, name):
        return None
    return f"not a module name: {found(name)}", _MODULE_HINT


def var_name_problem(name: str) -> Optional[Problem]:
    if re.fullmatch(VAR_RE, name):
        return None
    return (
        f"not a variable name: {found(name)}",
        "a variable name holds letters, digits and _ only, and does not start with a digit",
    )


def conda_env_problem(name: str) -> Optional[Problem]:
    if re.fullmatch(CONDA_ENV_RE, name):
        return None
    return (
        f"not a conda env name or absolute prefix: {found(name)}",
        "a name such as base or pytorch-2.14 (letters, digits, . _ + -), or an absolute path such as "
        "/soft/datascience/conda/envs/torch; no spaces, quotes or shell characters",
    )


def path_entry_problem(entry: str) -> Optional[Problem]:
    """One directory of a colon list (PATH, LD_LIBRARY_PATH): an empty entry means the current directory to the
    loader and the shell, and a ':' would make it two entries, which deactivate could not take back exactly."""
    if entry and ":" not in entry:
        return None
    return (
        f"not one directory of a colon-separated list: {found(entry)}",
        "give each directory as its own array item, none empty",
    )


def _option_problem(value: str) -> Optional[Problem]:
    if not value.startswith("-"):
        return None
    return (
        f"a value here cannot start with '-' (a command would read it as an option), found {found(value)}",
        None,
    )


def _dist_name_problem(name: str) -> Optional[Problem]:
    if re.fullmatch(DIST_NAME_RE, name):
        return None
    return (
        f"not a distribution name: {found(name)}",
        "a package name holds letters, digits, '.', '_' and '-', and starts and ends with a letter or digit; "
        "versions, extras and markers go in spec",
    )


def requirement_problem(spec: str) -> Optional[Problem]:
    """A package spec is one PEP 508 requirement: never an installer option, and a direct reference only to a
    pinned remote source (:data:`DIRECT_URL_SCHEMES`)."""
    if spec.lstrip().startswith("-"):
        return (
            f"a requirement cannot start with '-' (the installer would read it as an option), found {found(spec)}",
            "name an index in packages.index; no_build_isolation and no_binary are keys of their own",
        )
    # Imported here: packaging's requirement grammar costs ~6 ms of every start, and only a recipe's packages
    # need it.
    from packaging.requirements import InvalidRequirement, Requirement  # noqa: PLC0415

    try:
        req = Requirement(spec)
    except InvalidRequirement:
        return (
            f"not a PEP 508 requirement: {found(spec)}",
            'a requirement as pip reads it, such as "numpy>=1.26" or '
            "\"mpi4py==4.0.1; platform_machine == 'x86_64'\"",
        )
    if req.url and not req.url.startswith(DIRECT_URL_SCHEMES):
        return (
            f"a direct reference may only use {', '.join(DIRECT_URL_SCHEMES[:-1])} or {DIRECT_URL_SCHEMES[-1]}, "
            f"found {found(spec)}",
            "a local path or a plain-http URL bypasses the index, its mirror and TLS: serve the file from an index "
            "and name it in packages.index",
        )
    return None


def require_carriable(value: str, key: str) -> None:
    """For renderers (activate scripts, modulefiles, batch scripts): refuse what the loader refuses at plan time,
    for values that did not come through it (a state record, a command-line flag, a caller)."""
    bad = control_problem(value)
    if bad is not None:
        raise RecipeError(
            f"{bad[0]} is not allowed in this value, found {found(value)}", key=key, hint=bad[1]
        )


def require_module_name(name: str, key: str) -> None:
    problem = module_name_problem(name)
    if problem is not None:
        raise RecipeError(problem[0], key=key, hint=problem[1])


def require_var_name(name: str, key: str) -> None:
    problem = var_name_problem(name)
    if problem is not None:
        raise RecipeError(problem[0], key=key, hint=problem[1])


def require_conda_env(name: str, key: str) -> None:
    require_carriable(name, key)
    problem = conda_env_problem(name)
    if problem is not None:
        raise RecipeError(problem[0], key=key, hint=problem[1])


def require_path_entry(entry: str, key: str) -> None:
    require_carriable(entry, key)
    problem = path_entry_problem(entry)
    if problem is not None:
        raise RecipeError(problem[0], key=key, hint=problem[1])


@dataclass(frozen=True)
class Rule:
    """A check on a string value, or on each string of an array: a :data:`Problem` or None. ``pattern`` is the
    same rule for the JSON schema, where one exists."""

    check: Callable[[str], Optional[Problem]]
    pattern: Optional[str] = None


MODULE_NAME = Rule(module_name_problem, MODULE_RE)
VAR_NAME = Rule(var_name_problem, VAR_RE)
NOT_AN_OPTION = Rule(_option_problem, r"(?!-)[\s\S]*")
DIST_NAME = Rule(_dist_name_problem, DIST_NAME_RE)
REQUIREMENT = Rule(requirement_problem, r"(?!\s*-)[\s\S]*")
PATH_ENTRY = Rule(path_entry_problem, r"[^:]+")
CONDA_ENV = Rule(conda_env_problem, CONDA_ENV_RE)


def found(value: Any) -> str:
    """A value as an error message shows it: its TOML type and its repr, cut at 60 characters."""
    kind = {
        str: "string",
        bool: "boolean",
        int: "integer",
        float: "number",
        list: "array",
        dict: "table",
    }.get(type(value), type(value).__name__)
    shown = repr(value)
    if len(shown) > 60:
        shown = shown[:57] + "..."
    return f"{kind} {shown}"
