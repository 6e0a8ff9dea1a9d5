"""What ``envbuilder explain`` reads (the I/O beside the pure :mod:`.signatures` and :mod:`.explanation`): the
registry's files (shipped, and a site's directory, refused where another user could change it), a job's output
(a log file's end, or the files the scheduler's record names), and the env a job ran (its record, its torch's
compiled arch list)."""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from importlib.resources import files
from pathlib import Path
from typing import Optional

from envbuilder.backends import torcharch
from envbuilder.core import settings
from envbuilder.core._toml import TOMLDecodeError, loads
from envbuilder.core.errors import CommandFailed, DiskError, RecipeError, StateError, UsageError
from envbuilder.core.schedulers.base import JobRecord
from envbuilder.core.schedulers.registry import SCHEDULERS
from envbuilder.core.structs import dataclass
from envbuilder.doctor import signatures
from envbuilder.doctor.explanation import EnvFacts
from envbuilder.system import proc, state, strictmodes, textfile

#: The variable (setting ``signatures_dir``) that names a site's directory of extra registry files.
SITE_VAR = "ENVBUILDER_SIGNATURES_DIR"
MAX_REGISTRY_FILE = 1024 * 1024
MAX_SCRIPT = 1024 * 1024
QUERY_TIMEOUT = 60.0


def registry(env: Mapping[str, str]) -> list[signatures.Signature]:
    """The shipped signatures, with the site's (its files replace shipped entries of the same id)."""
    shipped: list[signatures.Signature] = []
    folder = files("envbuilder").joinpath("data/signatures")
    for item in sorted(folder.iterdir(), key=lambda f: f.name):
        if item.name.endswith(".toml"):
            shipped += _parse(item.read_text(encoding="utf-8"), item.name)
    site_dir = env.get(SITE_VAR)
    return signatures.merge(shipped, _site(Path(site_dir)) if site_dir else [])


def _site(folder: Path) -> list[signatures.Signature]:
    elsewhere = f"ask the admins to fix its mode, or unset {SITE_VAR} (setting signatures_dir)"
    if not folder.is_dir():
        raise DiskError(
            f"{SITE_VAR} names {folder}, which is not a directory",
            path=str(folder),
            hint=f"point {SITE_VAR} (setting signatures_dir) at the site's directory of signature files",
        )
    strictmodes.check(folder, what="the site's signatures directory", elsewhere=elsewhere)
    out: list[signatures.Signature] = []
    for path in sorted(folder.glob("*.toml")):
        strictmodes.check(path, what="a site signature file", elsewhere=elsewhere, root=folder, above=False)
        try:
            text = textfile.read_text(path, MAX_REGISTRY_FILE, "signature file")
        except textfile.UnreadableFile as exc:
            raise RecipeError(exc.reason, file=str(path)) from None
        out += _parse(text, str(path))
    return out


def _parse(text: str, file: str) -> list[signatures.Signature]:
    try:
        doc = loads(text)
    except TOMLDecodeError as exc:
        raise RecipeError(f"not valid TOML: {exc}", file=file) from None
    return signatures.parse(doc, file)


@dataclass(frozen=True)
class Output:
    """A job's output as read: the text (the end of each file, stdout's first), what was read, whether a file's
    start was left out."""

    text: str
    paths: tuple[str, ...]
    cut: bool
    missing: tuple[tuple[str, str], ...] = ()


def read_log(path: Path) -> Output:
    try:
        text, cut = textfile.read_tail(path, signatures.MAX_TEXT)
    except textfile.UnreadableFile as exc:
        raise DiskError(f"cannot read the log {path}: {exc.reason}", path=str(path)) from None
    return Output(text, (str(path),), cut)


def read_outputs(record: JobRecord, scheduler: str) -> Output:
    """The job's output files the record names, those that can be read; an error where none can."""
    texts, read, missing, cut = [], [], [], False
    for name in record.outputs:
        path = Path(name) if Path(name).is_absolute() or not record.workdir else Path(record.workdir) / name
        try:
            text, was_cut = textfile.read_tail(path, signatures.MAX_TEXT // max(1, len(record.outputs)))
        except textfile.UnreadableFile as exc:
            missing.append((str(path), exc.reason))
            continue
        texts.append(text)
        read.append(str(path))
        cut = cut or was_cut
    if not read:
        why = "; ".join(f"{p}: {r}" for p, r in missing) or f"{record.source} names no output file"
        raise DiskError(
            f"job {record.job}'s output cannot be read ({why})",
            path=missing[0][0] if missing else "",
            hint=f"{scheduler} wrote it on the node that ran the job: pass the log file itself "
            "(envbuilder explain LOG) where it is on another file system",
        )
    return Output("\n".join(texts), tuple(read), cut, tuple(missing))


def job_record(job: str, env: Mapping[str, str]) -> tuple[JobRecord, str, tuple[str, ...]]:
    """The scheduler's record of ``job`` (the first scheduler whose tools are here and that knows it), the
    scheduler's title, and what the queries tried before it answered (sacct without accounting); an error that
    says what each answered where none does."""
    asked: list[str] = []
    run_env = proc.scrubbed_env(env)
    for adapter in SCHEDULERS.values():
        for argv in adapter.record_queries(job):
            if not shutil.which(argv[0], path=env.get("PATH")):
                continue
            try:
                result = proc.run(argv, env=run_env, timeout=QUERY_TIMEOUT, check=False)
            except CommandFailed as exc:  # the time limit
                asked.append(f"{proc.quote(argv)}: {exc.message}")
                continue
            record = adapter.job_record(job, argv, result.stdout) if result.returncode == 0 else None
            if record is not None:
                return record, adapter.title, tuple(asked)
            answer = proc.tail(result.stderr or result.stdout, 2).strip() or "no record of the job"
            asked.append(f"`{proc.quote(argv)}`: {answer}")
    if not asked:
        tools = ", ".join(q[0] for a in SCHEDULERS.values() for q in a.record_queries(job)[:1])
        raise UsageError(
            f"{job!r} is not a file, and no scheduler's tools ({tools}) are on PATH to ask about a job",
            hint="pass the job's log file (envbuilder explain LOG)",
        )
    raise UsageError(
        f"no scheduler here knows job {job!r}: " + "; ".join(asked),
        hint="a finished job leaves the controller's memory after a while where there is no accounting: "
        "pass its log file (envbuilder explain LOG)",
    )


def ending(record: JobRecord, title: str) -> Optional[str]:
    """How the job ended, as the scheduler whose title is ``title`` reads its record."""
    adapter = next((a for a in SCHEDULERS.values() if a.title == title), None)
    return adapter.ending(record) if adapter else None


def read_script(record: JobRecord) -> str:
    """The job's script where the record names one that can still be read ("" otherwise)."""
    if not record.script or not Path(record.script).is_absolute():
        return ""
    try:
        return textfile.read_text(Path(record.script), MAX_SCRIPT, "job script")
    except textfile.UnreadableFile:
        return ""


def env_prefixes(home: Path) -> dict[str, str]:
    """Every recorded env's prefix: its name."""
    out = {}
    for name in state.names(home):
        try:
            out[state.load(home, name).prefix] = name
        except StateError:
            continue
    return out


def env_facts(name: str, named_by: str, env: Mapping[str, str]) -> EnvFacts:
    """What the record of the env ``name`` and its torch tell; an error where no env of that name is recorded."""
    home = settings.home(env)
    record = state.load(home, name)
    torch = (record.plan or {}).get("torch") or {}
    flags, why = arch_flags(Path(record.prefix), home)
    packages = tuple(str(p.get("name", "")) for p in record.packages if p.get("name"))
    modules = tuple(str(m) for m in ((record.plan or {}).get("activate") or {}).get("modules") or ())
    return EnvFacts(
        name=record.name,
        named_by=named_by,
        torch=str(torch.get("torch") or ""),
        variant=str(torch.get("variant") or ""),
        cuda=str(torch.get("cuda") or ""),
        arch_flags=flags,
        arch_unknown=why,
        packages=packages,
        modules=modules,
        recipe=record.recipe,
    )


def arch_flags(prefix: Path, home: Path) -> tuple[Optional[tuple[str, ...]], str]:
    """The compiled arch list of the torch in the env at ``prefix`` (remembered per wheel where a create read it
    before, else read from its library), or None and why not."""
    for site in sorted(prefix.glob("lib/python*/site-packages")):
        dist = sorted(site.glob("torch-*.dist-info"))
        if not (site / "torch").is_dir() or not dist:
            continue
        digest = torcharch.wheel_digest(dist[0])
        if digest is not None:
            remembered = torcharch.ArchCache(home).recall(digest)
            if remembered is not None:
                return remembered, ""
        flags = torcharch.library_flags(site / "torch")
        if flags is not None:
            return flags, ""
        return None, f"no single arch list in {site / 'torch' / torcharch.LIBRARY}"
    return None, f"no torch installed under {prefix}"
