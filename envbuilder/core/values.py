"""What a recipe value may hold: the rules for names, variables, paths, requirements and conda envs, as checks that
say what is wrong (a message and a hint) and as the ``require_*`` guards every renderer calls again for values
that come from elsewhere (a state record, the command line). Pure; the schema attaches them to its fields."""

from __future__ import annotations

import re
from typing import Any, Callable, Optional

from envbuilder.core.errors import RecipeError
from envbuilder.core.structs import dataclass

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
    same rule for the JSON schema, where one exists, and ``doc`` what it allows, in words (the JSON schema adds
    it to the field's description)."""

    check: Callable[[str], Optional[Problem]]
    pattern: Optional[str] = None
    doc: str = ""


# ---------------------------------------------------------------------------------------------------------------
# Scheduler and launcher values. Each lands in a job script directive (``#SBATCH --partition=VALUE``) or an argv
# (``salloc -p VALUE``, ``mpiexec --cpu-bind VALUE``). sbatch and qsub split a directive line at whitespace, and a
# command reads an argument that starts with '-' as an option: so none may start with '-' or hold whitespace, and
# each kind holds only the characters the schedulers' own names and forms use.

#: A Slurm partition (or a comma list of them), account, QOS or reservation; a PBS queue (``queue@server``) or
#: account: gpu-a100, gh-dev, normal, ABC23001, debug@polaris-pbs.
SCHED_NAME_RE = r"[A-Za-z0-9_][A-Za-z0-9_.:+@%,-]*"
#: A walltime in one of Slurm's forms: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS (:func:`walltime` turns it
#: into the HH:MM:SS every scheduler and ``idev`` read alike).
TIME_RE = r"\d+(:\d{1,2}){0,2}|\d+-\d{1,2}(:\d{1,2}){0,2}"
#: A Slurm node-feature expression: features joined by & and |, counts (*4), brackets and parentheses:
#: a100&ib, [rack1|rack2], [rack1*2&rack2*4], (knl&snc4)*4&haswell.
CONSTRAINT_RE = r"[A-Za-z0-9_(\[][A-Za-z0-9_.:=+@%,&|()\[\]*-]*"
#: A job name (``envbuilder-<recipe>``), within what Slurm and PBS both take.
JOB_NAME_RE = r"[A-Za-z0-9_][A-Za-z0-9_.+-]*"
#: A launcher setting handed to one option: srun --mpi (pmi2, pmix_v4, cray_shasta), mpiexec --cpu-bind (depth,
#: core, list:0-7:8-15, verbose,numa).
LAUNCH_WORD_RE = r"[A-Za-z0-9_][A-Za-z0-9_.:,=+-]*"
#: One option as scheduler.forbidden_flags and allowed_flags name it: -e, --gres.
FLAG_RE = r"-[A-Za-z0-9]|--[A-Za-z0-9][A-Za-z0-9_-]*"
#: One directive of scheduler.required_flags: --exclusive, --qos=gpu, -l filesystems=home:eagle. A long option's
#: value follows '=', a short option's one space (and cannot start with '-').
DIRECTIVE_RE = r"--[A-Za-z0-9][A-Za-z0-9_-]*(=\S+)?|-[A-Za-z0-9]( [^\s-]\S*)?"

_NAME_CHARS = "letters, digits and _ . : + @ % , - only, not starting with '-'"


@dataclass(frozen=True)
class Word:
    """One kind of scheduler or launcher value: what it is called, its pattern, and what it may hold in words."""

    what: str
    pattern: str
    hint: str
    #: A rule beyond the pattern, on a value that matches it.
    more: Optional[Callable[[str], Optional[Problem]]] = None

    def problem(self, value: str) -> Optional[Problem]:
        bad = control_problem(value)
        if bad is not None:
            return f"{bad[0]} is not allowed in {self.what}, found {found(value)}", bad[1]
        if value.startswith("-"):
            why = "a command would read it as an option"
            return f"{self.what} cannot start with '-' ({why}), found {found(value)}", self.hint
        if re.search(r"\s", value):
            why = "a scheduler would read what follows as another option"
            return f"{self.what} cannot hold whitespace ({why}), found {found(value)}", self.hint
        if not re.fullmatch(self.pattern, value):
            return f"not {self.what}: {found(value)}", self.hint
        return self.more(value) if self.more else None

    @property
    def rule(self) -> Rule:
        return Rule(self.problem, self.pattern, self.hint)


PARTITION = Word(
    "a partition name", SCHED_NAME_RE, f"a partition (PBS: queue) name: {_NAME_CHARS}; gpu-a100, gh"
)
ACCOUNT = Word("an account name", SCHED_NAME_RE, f"an allocation account: {_NAME_CHARS}; ABC23001")
QOS = Word("a QOS name", SCHED_NAME_RE, f"a quality of service: {_NAME_CHARS}; normal")
RESERVATION = Word("a reservation name", SCHED_NAME_RE, f"a reservation: {_NAME_CHARS}; maint_2026")


def _no_time_problem(text: str) -> Optional[Problem]:
    if time_seconds(text):
        return None
    return f"a walltime of 0, found {found(text)}", "Slurm reads 0 as no limit at all: ask for a time"


TIME = Word(
    "a walltime",
    TIME_RE,
    "a walltime in one of Slurm's forms: minutes (30), MM:SS, HH:MM:SS (2:00:00), D-HH, D-HH:MM or D-HH:MM:SS "
    "(1-00:00:00)",
    _no_time_problem,
)
CONSTRAINT = Word(
    "a node-feature constraint",
    CONSTRAINT_RE,
    "node features (letters, digits, _ . : = + @ % , -) joined by & and |, with counts (*4), [ ] and ( ): "
    "a100&ib, [rack1|rack2]",
)
JOB_NAME = Word("a job name", JOB_NAME_RE, "letters, digits and _ . + - only, not starting with '-'")
MPI_PLUGIN = Word(
    "an srun MPI plugin", LAUNCH_WORD_RE, "a plugin srun --mpi=list names: pmi2, pmix, pmix_v4, cray_shasta"
)
CPU_BIND = Word(
    "an mpiexec CPU binding",
    LAUNCH_WORD_RE,
    "letters, digits and _ . : , = + - only, not starting with '-': depth, core, numa, list:0-7:8-15",
)

#: The values required_flags may give known options, by their Slurm (long and short) and PBS spellings.
_OPTION_VALUES = {
    "--partition": PARTITION,
    "-p": PARTITION,
    "--account": ACCOUNT,
    "-A": ACCOUNT,
    "--qos": QOS,
    "-q": QOS,
    "--reservation": RESERVATION,
    "--constraint": CONSTRAINT,
    "-C": CONSTRAINT,
    "--time": TIME,
    "-t": TIME,
    "--job-name": JOB_NAME,
    "-J": JOB_NAME,
}


def time_seconds(text: str) -> Optional[int]:
    """The seconds a walltime in Slurm's forms (:data:`TIME_RE`) stands for; None when it is none of them. Without
    days, one number is minutes, two are minutes and seconds; after ``D-``, hours come first."""
    if not re.fullmatch(TIME_RE, text):
        return None
    days, _, clock = text.rpartition("-")
    parts = [int(p) for p in clock.split(":")]
    if days:
        hours, mins, secs = (*parts, 0, 0)[:3]
    else:
        hours, mins, secs = {1: (0, parts[0], 0), 2: (0, *parts), 3: tuple(parts)}[len(parts)]
    return int(days or 0) * 86400 + hours * 3600 + mins * 60 + secs


def walltime(text: str, key: str) -> str:
    """``text`` (a walltime in Slurm's forms) as HH:MM:SS, which sbatch, qsub and idev all read the same way
    (qsub would read a bare 30 as seconds, and D-HH:MM:SS not at all)."""
    require(TIME, text, key)
    total = time_seconds(text) or 0
    return f"{total // 3600:02d}:{total % 3600 // 60:02d}:{total % 60:02d}"


def flag_problem(flag: str) -> Optional[Problem]:
    if re.fullmatch(FLAG_RE, flag):
        return None
    return (
        f"not a scheduler option: {found(flag)}",
        "one option as the scheduler spells it, without a value: -e, --gres, --gpus-per-task",
    )


def directive_problem(directive: str) -> Optional[Problem]:
    """One directive a site requires of every job: an option and its value, nothing a scheduler would split
    into a second option, and the value of a known option (--qos, --constraint, -A) of its kind."""
    if not re.fullmatch(DIRECTIVE_RE, directive):
        return (
            f"not one scheduler directive: {found(directive)}",
            "one option and its value: --exclusive, --qos=gpu, --constraint=a100&ib, -l filesystems=home:eagle "
            "(a long option's value after '=', a short option's after one space)",
        )
    option, _, value = directive.partition("=" if directive.startswith("--") else " ")
    word = _OPTION_VALUES.get(option)
    problem = word.problem(value) if word and value else None
    return (f"{option}: {problem[0]}", problem[1]) if problem else None


def require(word: Word, value: str, key: str) -> None:
    """For renderers (job scripts, launcher argv): refuse a value of ``word``'s kind that the loader or the
    command line would refuse, when it comes from elsewhere (a state record, the job's environment, a caller)."""
    problem = word.problem(value)
    if problem is not None:
        raise RecipeError(problem[0], key=key, hint=problem[1])


MODULE_NAME = Rule(module_name_problem, MODULE_RE)
VAR_NAME = Rule(var_name_problem, VAR_RE)
NOT_AN_OPTION = Rule(_option_problem, r"(?!-)[\s\S]*")
DIST_NAME = Rule(_dist_name_problem, DIST_NAME_RE)
REQUIREMENT = Rule(requirement_problem, r"(?!\s*-)[\s\S]*")


def image_requirement_problem(spec: str) -> Optional[Problem]:
    """:func:`requirement_problem` for a requirement installed on top of a container image (container.packages),
    whose index is container.index."""
    problem = requirement_problem(spec)
    if problem is None:
        return None
    if spec.lstrip().startswith("-"):
        return problem[0], "name the index in container.index; each entry is one requirement"
    return problem[0], (problem[1] or "").replace("packages.index", "container.index")


IMAGE_REQUIREMENT = Rule(image_requirement_problem, REQUIREMENT.pattern)
PATH_ENTRY = Rule(path_entry_problem, r"[^:]+")
CONDA_ENV = Rule(conda_env_problem, CONDA_ENV_RE)
FLAG = Rule(flag_problem, FLAG_RE, "one option, without a value: -e, --gres")
DIRECTIVE = Rule(
    directive_problem,
    DIRECTIVE_RE,
    "one option and its value: --exclusive, --qos=gpu, -l filesystems=home:eagle (no second option inside)",
)


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
