"""The command line's grammar: every command, its options and its help, built into one argparse parser. Each
command's handler is named here and imported only when it runs, so ``envbuilder --help`` stays quick."""

from __future__ import annotations

import argparse
import contextlib
import functools
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Optional

from envbuilder import __version__
from envbuilder.cli import aidparser, helptext, siteparser
from envbuilder.cli.options import add_index, add_launch, add_lock_use, add_partition, add_preflight, env_verb
from envbuilder.cli.parts import (
    GLOBAL_FLAGS,
    GLOBAL_SHORT,
    Choices,
    Parser,
    add_global_options,
    add_json,
    command,
    positive,
    seconds,
)
from envbuilder.core.shells import registry as shells

if TYPE_CHECKING:
    from envbuilder.cli.parts import Sub

    #: A part of the grammar: the function that adds its commands, and their names.
    Part = tuple[Callable[[Sub], None], tuple[str, ...]]


def build_parser(command: Optional[str] = None) -> argparse.ArgumentParser:
    """The grammar of every command; where ``command`` names one, the grammar of the part that adds it alone,
    which parses a line naming that command as the whole grammar does (:func:`command_named` says when a line
    may be parsed so). Building one part takes about a tenth of the time of all of them, and every command run
    (and every in-process run of the tests) builds one."""
    with _translations_remembered():
        return _build(_parts_for(command))


@contextlib.contextmanager
def _translations_remembered() -> Iterator[None]:
    """argparse asks gettext for each of its own words (``usage:``, ``show this help message and exit``) at every
    argument added, and gettext looks for a catalog file on disk at each ask: about 400 ``stat`` calls and 8 ms of
    each start, for the same few answers. While the parser is built, each answer is looked up once."""
    ask = argparse._  # type: ignore[attr-defined]  # argparse's own alias of gettext.gettext
    argparse._ = functools.lru_cache(maxsize=None)(ask)  # type: ignore[attr-defined]
    try:
        yield
    finally:
        argparse._ = ask  # type: ignore[attr-defined]


def _build(parts: Sequence[Part]) -> argparse.ArgumentParser:
    parser = Parser(
        prog="envbuilder",
        description="Build, validate and keep PyTorch environments on HPC clusters, from tested site recipes.",
    )
    parser.add_argument("--version", action="version", version=f"envbuilder {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    for add, _names in parts:
        add(sub)
    add_global_options(parser)
    helptext.apply(parser)
    return parser


def command_named(argv: Sequence[str]) -> Optional[str]:
    """The command a line names, where only global flags come before it (so that the grammar of its part
    parses the line as the whole grammar would); None otherwise (no command, a mistyped one, ``-h`` or an
    unknown option first), and the line is parsed by the whole grammar."""
    for word in argv:
        if not word.startswith("-"):
            return word if word in _COMMANDS else None
        if word not in GLOBAL_FLAGS and not GLOBAL_SHORT.fullmatch(word):
            return None
    return None


def _parts_for(command: Optional[str]) -> Sequence[Part]:
    part = _COMMANDS.get(command or "")
    return PARTS if part is None else (part,)


def _add_plan(sub: Sub) -> None:
    p = sub.add_parser("plan", help="show every step create would take for a recipe")
    p.add_argument("recipe", help="recipe name (see `envbuilder recipes list`)")
    p.add_argument("--facts", metavar="FILE", help="host facts as JSON instead of probing this machine")
    p.add_argument("--prefix", metavar="DIR", help="build the env here instead of the recipe's prefix")
    add_lock_use(p)
    add_launch(p)
    add_index(p)
    add_json(p)
    p.set_defaults(handler=command("plan", "handle"), probes_host=True)


def _add_lock(sub: Sub) -> None:
    p = sub.add_parser(
        "lock", help="resolve a recipe's exact packages for each target platform (x86_64, aarch64)"
    )
    p.add_argument("recipe", help="recipe name or NAME@VERSION")
    p.add_argument(
        "--platform",
        action="append",
        metavar="ARCH",
        help="x86_64 or aarch64; repeat for several (default: the site's compute nodes)",
    )
    p.add_argument(
        "--python", metavar="X.Y", help="Python to lock for (default: the recipe's python.version)"
    )
    p.add_argument("-o", "--output", metavar="FILE", help="default: NAME.lock.toml in your envbuilder home")
    p.add_argument(
        "--format",
        choices=("envbuilder", "pylock", "conda-lock"),
        default="envbuilder",
        help="also write the standard file(s) beside the lock given with -o (else in NAME/ beside yours): "
        "pylock, a PEP 751 pylock.ARCH.toml per platform for uv and pip (venv recipes); conda-lock, "
        "conda-lock's conda-lock.yml (conda recipes that conda-lock locks)",
    )
    p.add_argument("--facts", metavar="FILE", help="host facts as JSON instead of probing this machine")
    add_index(p)
    add_json(p)
    p.set_defaults(handler=command("lock", "handle"))


def _add_mirror(sub: Sub) -> None:
    p = sub.add_parser(
        "mirror",
        help="download exactly the files lockfiles name into a site mirror (PEP 503 tree or wheelhouse)",
    )
    p.add_argument(
        "locks", nargs="+", metavar="LOCK", help="lockfiles (NAME.lock.toml); every platform in each"
    )
    p.add_argument("--to", required=True, metavar="DIR", help="the mirror directory (made if missing)")
    p.add_argument(
        "--layout",
        choices=Choices("envbuilder.core.formats", "MIRROR_LAYOUTS"),
        default="simple",
        metavar="LAYOUT",
        help="%(choices)s (default simple: DIR/simple/<project>/index.html; wheelhouse: one flat --find-links DIR); "
        "conda packages go to the channel DIR/conda either way",
    )
    add_json(p)
    p.set_defaults(handler=command("mirror", "handle"))


def _add_create(sub: Sub) -> None:
    p = sub.add_parser("create", help="build an env from a recipe, then check that torch works in it")
    p.add_argument("recipe", help="recipe name (see `envbuilder recipes list`)")
    p.add_argument("--prefix", metavar="DIR", help="build the env here instead of the recipe's prefix")
    p.add_argument(
        "--installer",
        choices=Choices("envbuilder.core.kinds", "INSTALLER_NAMES"),
        metavar="INSTALLER",
        help="override the recipe's installer: %(choices)s",
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="rebuild an existing env (beside it, then swap); with --prefix, move it there",
    )
    p.add_argument(
        "--name", metavar="NAME", help="record the env under this name (default: the recipe's): a second env"
    )
    p.add_argument("--no-validate", action="store_true", help="skip the checks after building")
    add_preflight(p)
    add_partition(p)
    p.add_argument("--facts", metavar="FILE", help="host facts as JSON instead of probing this machine")
    p.add_argument(
        "--wait",
        type=seconds,
        default=3600.0,
        metavar="SECONDS",
        help="how long to wait for another create of the same env (default 3600; 0 fails at once)",
    )
    add_lock_use(p)
    add_index(p)
    add_json(p)
    p.set_defaults(handler=command("create", "handle"), probes_host=True)


def _add_validate(sub: Sub) -> None:
    p = sub.add_parser(
        "validate", help="run the bundled checks (GPU, CUDA, NCCL, DDP, MPI, file system) on an env"
    )
    p.add_argument("env")
    p.add_argument("--checks", metavar="LIST", help="comma-separated checks (default: the recipe's)")
    add_launch(p)
    p.add_argument("--cpu", action="store_true", help="gloo on CPU processes; GPU checks are skipped")
    p.add_argument(
        "--submit", action="store_true", help="submit a batch job, wait for it, collect the report"
    )
    p.add_argument("--timeout", type=seconds, metavar="SECONDS", help="per check (default 120)")
    p.add_argument(
        "--wait-job", type=seconds, metavar="SECONDS", help="give up waiting for the job after this"
    )
    p.add_argument("--junit", metavar="FILE", help="also write the report as JUnit XML")
    p.add_argument("--facts", metavar="FILE", help="host facts as JSON instead of probing this machine")
    _add_image(p, "validate the env from its image (envbuilder pack), mounted on this node")
    p.add_argument(
        "--publish-report",
        action="store_true",
        help="(site admins) attach a passing report to the published recipe version the env was built from",
    )
    p.add_argument(
        "--registry", metavar="DIR", help="the registry to stamp (default: the one the recipe came from)"
    )
    add_json(p)
    p.set_defaults(handler=command("validate", "handle"), probes_host=True)


def _add_run(sub: Sub) -> None:
    """run and sbatch: the user's own program with the launch rules the validation proved."""
    for name, help_text, handler in (
        ("run", "run your own program in an env with the recipe's launch rules", "handle_run"),
        (
            "sbatch",
            "submit your own program as a job (a PBS job on PBS sites) with those rules",
            "handle_sbatch",
        ),
    ):
        p = sub.add_parser(
            name, help=help_text, usage=f"envbuilder {name} [OPTIONS] ENV -- PROGRAM [ARGS...]"
        )
        p.add_argument("env")
        add_launch(p, per_node_help="ranks per node, one per GPU (default: all)")
        p.add_argument(
            "--dry-run",
            action="store_true",
            help="print the exact command (run) or job script (sbatch) instead of starting it",
        )
        if name == "sbatch":
            add_json(p)
            p.add_argument(
                "-o",
                "--output",
                metavar="PATH",
                help="the job's output file, or a directory for the default name in it (default: "
                "envbuilder-ENV-JOBID.out in the directory sbatch runs from; Slurm's patterns such as %%j apply)",
            )
        else:
            _add_image(p, "run the env from its image (envbuilder pack), mounted on this node")
        p.add_argument(
            "--stage",
            action="store_true",
            help="first stage the env's image on every node of the job (envbuilder stage), then run from those "
            "node-local copies",
        )
        # Everything after `--` is the program's (main splits it off before parsing: argparse would read its
        # options as envbuilder's).
        p.set_defaults(handler=command("run", handler), program=())


def _add_env_verbs(sub: Sub) -> None:
    """list, show, activate, remove, modulefile: the verbs on the envs you have built."""
    p = sub.add_parser("list", help="the envs you have built, with their health")
    add_json(p)
    p.set_defaults(handler=command("envs", "handle_list"))
    env_verb(
        sub, "show", "one env's record: recipe, packages, tools, last check", command("envs", "handle_show")
    )
    e = env_verb(
        sub,
        "activate",
        "print the line that activates an env (source it)",
        command("envs", "handle_activate"),
    )
    e.add_argument(
        "--shell",
        choices=Choices("envbuilder.core.shells.registry", "SHELLS"),
        metavar="SHELL",
        help="%(choices)s: the shell the line is for (default: $SHELL's, "
        f"{shells.default().name} where that is none of these)",
    )
    _add_image(e, "mount the env's image (envbuilder pack) on this node and activate from it")
    e = env_verb(sub, "remove", "delete an env and its record", command("envs", "handle_remove"))
    e.add_argument("-y", "--yes", action="store_true", help="do not ask")
    e = env_verb(
        sub,
        "modulefile",
        "write a modulefile (Lmod Lua, or Tcl for Environment Modules) that activates an env",
        command("envs", "handle_modulefile"),
    )
    e.add_argument(
        "-o",
        "--output",
        metavar="PATH",
        help="directory to write ENV.lua (or ENV for tcl) into, made if absent: an existing one, a path ending "
        "in /, or for lua any name without .lua; else the file itself (default: stdout)",
    )
    e.add_argument(
        "--format",
        choices=Choices("envbuilder.core.formats", "MODULEFILE_FORMATS"),
        default="lua",
        metavar="FORMAT",
        help="%(choices)s: lua for Lmod (default), tcl for Environment Modules sites",
    )


def _add_pack(sub: Sub) -> None:
    p = env_verb(
        sub,
        "pack",
        "make a squashfs image of an env, for jobs that import from a node-local mount",
        command("pack", "handle"),
    )
    p.add_argument(
        "--to", metavar="DIR", help="write the image into DIR, e.g. on $WORK (default: beside the env)"
    )
    add_preflight(p)
    p = env_verb(
        sub,
        "stage",
        "copy an env's image to every node of this job (Slurm's sbcast; on PBS each node copies it) and "
        "unpack it there",
        command("stage", "handle"),
    )
    p.add_argument(
        "--clean", action="store_true", help="remove the env's staged copies from every node instead"
    )
    add_preflight(p)
    # The node side of stage, run on each node by its steps (no help: not listed); clean takes the env name as KEY.
    p = sub.add_parser("__stage-node")
    p.add_argument(
        "step", choices=("prepare", "unpack", "fetch", "clean", "prepare-file", "place", "fetch-file")
    )
    p.add_argument("key")
    p.add_argument("sha256", nargs="?", default="")
    p.add_argument(
        "into",
        nargs="?",
        default="",
        help="unpack: the image as sbcast wrote it on the node; fetch: the image",
    )
    p.add_argument("--need", default="", help="BYTES:FILES this node must have room for before it writes")
    p.set_defaults(handler=command("stage", "handle_node"))


def _add_image(p: argparse.ArgumentParser, help_text: str) -> None:
    p.add_argument("--image", action="store_true", help=help_text)


_ROOT_HELP = "backup root (default $WORK/envbuilder/backups) or one backup's directory"
_WAIT_HELP = "how long to wait for another writer of the same backup root (default 3600; 0 fails at once)"


def _add_backup(sub: Sub) -> None:
    p = sub.add_parser("backup", help="back an env up to $WORK (deduplicated wheels, or an exact archive)")
    p.add_argument("env", nargs="?")
    p.add_argument("--all", action="store_true", help="every env you have built")
    p.add_argument("--to", metavar="DIR", help="backup root (default $WORK/envbuilder/backups)")
    p.add_argument(
        "--mode",
        choices=Choices("envbuilder.core.formats", "BACKUP_MODES"),
        metavar="MODE",
        help="%(choices)s (default: wheelhouse for venvs, image for container envs, archive otherwise)",
    )
    p.add_argument(
        "--format",
        choices=Choices("envbuilder.core.formats", "BACKUP_FORMATS"),
        default="tar",
        metavar="FORMAT",
        help="archive mode: %(choices)s (default tar, compressed with zstd)",
    )
    p.add_argument(
        "--portable",
        action="store_true",
        help="write one tar that unpacks at a new prefix with no envbuilder (its unpack.sh needs only sh and tar)",
    )
    p.add_argument(
        "-o", "--output", metavar="FILE", help="--portable: the archive to write (default ./ENV.portable.tar)"
    )
    p.add_argument("--wait", type=seconds, default=3600.0, metavar="SECONDS", help=_WAIT_HELP)
    add_preflight(p)
    add_json(p)
    p.set_defaults(handler=command("backup", "handle_backup"))


def _add_backups(sub: Sub) -> None:
    p = sub.add_parser("backups", help="list backups: id, mode, size, date, verified")
    p.add_argument("env", nargs="?")
    p.add_argument("--from", dest="source", metavar="DIR", help=_ROOT_HELP)
    add_json(p)
    p.set_defaults(handler=command("backup", "handle_backups"))


def _add_restore(sub: Sub) -> None:
    p = sub.add_parser(
        "restore", help="bring an env back from its backup (offline, verified, beside then swap)"
    )
    p.add_argument("env")
    p.add_argument("--from", dest="source", metavar="DIR", help=_ROOT_HELP)
    p.add_argument("--backup", metavar="ID", help="which backup (default: the newest)")
    p.add_argument("--prefix", metavar="DIR", help="restore here instead of the env's prefix")
    p.add_argument("--name", metavar="NAME", help="record the restored env under this name")
    p.add_argument("--force", action="store_true", help="replace an env that exists at the target")
    p.add_argument("--validate", action="store_true", help="run the full validation suite afterwards")
    p.add_argument("--no-validate", action="store_true", help="skip even the torch import check")
    p.add_argument(
        "--check-import",
        action="store_true",
        help="import torch after restoring even on the kind of node the env already imported it on",
    )
    add_preflight(p)
    p.add_argument("--wait", type=seconds, default=3600.0, metavar="SECONDS", help=_WAIT_HELP)
    add_json(p)
    p.set_defaults(handler=command("backup", "handle_restore"), probes_host=True)


def _add_verify_backup(sub: Sub) -> None:
    p = sub.add_parser("verify-backup", help="re-hash a backup (ENV for its newest, or an id ENV@STAMP)")
    p.add_argument("backup", metavar="ENV|ID")
    p.add_argument("--from", dest="source", metavar="DIR", help=_ROOT_HELP)
    add_json(p)
    p.set_defaults(handler=command("backup", "handle_verify"))


def _add_prune_backups(sub: Sub) -> None:
    p = sub.add_parser("prune-backups", help="keep the newest N backups of each env; free unused wheels")
    p.add_argument("--keep", type=positive, required=True, metavar="N")
    p.add_argument("--env", metavar="NAME", help="prune this env's backups only")
    p.add_argument("--dry-run", action="store_true", help="say what would go, remove nothing")
    p.add_argument("--from", dest="source", metavar="DIR", help=_ROOT_HELP)
    p.add_argument("--wait", type=seconds, default=3600.0, metavar="SECONDS", help=_WAIT_HELP)
    add_json(p)
    p.set_defaults(handler=command("backup", "handle_prune"))


def _add_touch(sub: Sub) -> None:
    env_verb(
        sub,
        "touch",
        "refresh an env's access times, only where the site's purge policy allows it",
        command("backup", "handle_touch"),
    )


def _add_doctor(sub: Sub) -> None:
    p = sub.add_parser("doctor", help="what is wrong with your envs on this node, and how to fix it")
    p.add_argument("env", nargs="*", metavar="ENV", help="envs to check (default: every env you have built)")
    p.add_argument("--facts", metavar="FILE", help="another node's facts as JSON: the report for that node")
    add_index(p)
    add_json(p)
    p.set_defaults(handler=command("doctor", "handle"), probes_host=True)


#: The grammar's parts and the commands each adds, in the order ``envbuilder --help`` lists them
#: (tests/unit/test_cli_help.py checks that each part adds exactly the commands named here).
PARTS: tuple[Part, ...] = (
    (_add_plan, ("plan",)),
    (_add_lock, ("lock",)),
    (_add_mirror, ("mirror",)),
    (_add_create, ("create",)),
    (_add_validate, ("validate",)),
    (_add_run, ("run", "sbatch")),
    (_add_env_verbs, ("list", "show", "activate", "remove", "modulefile")),
    (_add_pack, ("pack", "stage", "__stage-node")),
    (_add_backup, ("backup",)),
    (_add_backups, ("backups",)),
    (_add_restore, ("restore",)),
    (_add_verify_backup, ("verify-backup",)),
    (_add_prune_backups, ("prune-backups",)),
    (_add_touch, ("touch",)),
    (_add_doctor, ("doctor",)),
    (aidparser.add_alloc, ("alloc",)),
    (aidparser.add_explain, ("explain",)),
    (siteparser.add_impact, ("impact", "share")),
    (siteparser.add_probe, ("probe",)),
    (siteparser.add_report, ("report",)),
    (siteparser.add_recipes, ("recipes",)),
    (siteparser.add_publish, ("publish",)),
    (siteparser.add_config, ("config",)),
    (siteparser.add_docs, ("completion", "man", "__complete")),
)
_COMMANDS = {name: part for part in PARTS for name in part[1]}
