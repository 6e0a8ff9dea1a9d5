"""The torch build guard: after an install that brings torch, is the installed build the planned one?

A login node has no GPU, so the smoke check cannot tell a CPU wheel from a CUDA one; the build's own files can.
The guard reads, inside the env and without importing torch, the distribution's version (its local label,
``+cu126``/``+cpu``, where the index gave one) and ``torch/version.py`` (the CUDA version it was built with);
where the plan targets known GPUs it also asks the env's python for the compiled arch list
(``torch._C._cuda_getArchFlags()``, which works without a GPU), once per wheel: the list is remembered in the
home keyed by the wheel's content (``torcharch``), so a second create of the same wheel imports nothing. Any
difference from the plan is a BackendError
and the env is not put in place. ``lock`` checks the locked torch file names the same way (a name tells the
version and label, not the CUDA version).

The comparison (``Expected``, ``Build``, ``compare``) is pure; ``read_build`` and ``guard`` read the env.
"""

from __future__ import annotations

import ast
import json
import os
import re
import time
import urllib.parse
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Optional

from packaging.utils import InvalidWheelFilename, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from envbuilder import payloads
from envbuilder.backends import torcharch
from envbuilder.backends.torcharch import ArchCache
from envbuilder.core.errors import BackendError, HostProbeError, LockError
from envbuilder.core.facts import HostFacts, facts_from_json
from envbuilder.core.structs import dataclass
from envbuilder.lockfile import PlatformLock
from envbuilder.plan.record import Plan
from envbuilder.resolver.indexfacts import label_variant
from envbuilder.resolver.matrix import gpu_capability, minor_tuple
from envbuilder.resolver.mirror import PYPI, VAR
from envbuilder.system import proc

PAYLOAD = payloads.DIR / "torch_build.py"
ARCH_TIMEOUT_S = 300.0
#: How compare() starts the line for target GPUs the compiled arch list cannot run.
ARCH_PROBLEM = "no code for the target GPU's"

# ---------------------------------------------------------------------------------------------------------------
# Pure: what was planned, what arrived, how they differ


@dataclass(frozen=True)
class Expected:
    """The build the plan asked for."""

    version: str  # the pin's public version: "2.13.0", "2.16.0.dev20261120"
    variant: str  # "cpu", "cu126", ...
    cuda: Optional[str]  # "12.6"; None for cpu
    local: str  # the local label the planned index gives its files ("cu126"), "" where none or unknown
    sms: tuple[str, ...]  # the target GPUs' compute capabilities ("9.0"); () where unknown or none
    index_url: str  # the planned (upstream) index

    @property
    def is_cuda(self) -> bool:
        return self.variant != "cpu" and bool(self.cuda)

    def describe(self) -> str:
        cuda = f"CUDA {self.cuda}" if self.is_cuda else "no CUDA"
        return f"torch {self.version} {self.variant} ({cuda})"


@dataclass(frozen=True)
class Build:
    """What arrived: read from the env (``cuda_known``) or from a locked file's name (CUDA not told)."""

    version: str  # as installed or named: "2.13.0+cpu"
    cuda: Optional[str] = None  # torch.version.cuda; None for a CPU build
    cuda_known: bool = True
    #: torch._C._cuda_getArchFlags() split ("sm_80", "compute_90"); None where not read.
    arch_flags: Optional[tuple[str, ...]] = None
    #: Where it was read: the dist-info directory, or the locked file name.
    where: str = ""

    @property
    def public(self) -> str:
        return self.version.split("+", 1)[0]

    @property
    def local(self) -> str:
        return self.version.split("+", 1)[1] if "+" in self.version else ""

    def describe(self) -> str:
        if not self.cuda_known:
            return f"{self.version} ({self.where})" if self.where else self.version
        arch = f", arch list {' '.join(self.arch_flags)}" if self.arch_flags else ""
        return f"{self.version} ({f'CUDA {self.cuda}' if self.cuda else 'no CUDA'}{arch})"


def expected_from(resolution: Any, target_gpus_cc: Iterable[str] = ()) -> Expected:
    """The Expected build of a wheels.Resolution (or anything with its fields) for GPUs of these capabilities."""
    variant = str(resolution.variant)
    return Expected(
        version=str(resolution.torch),
        variant=variant,
        cuda=str(resolution.cuda) if resolution.cuda and variant != "cpu" else None,
        local=str(getattr(resolution, "local", "") or ""),
        sms=tuple(dict.fromkeys(str(cc) for cc in target_gpus_cc if cc)),
        index_url=str(resolution.index_url),
    )


def expected_from_json(torch: Mapping[str, Any], target_gpus_cc: Iterable[str] = ()) -> Expected:
    """The same from a recorded plan's ``torch`` table (Resolution.to_json)."""
    variant = str(torch.get("variant") or "cpu")
    return Expected(
        version=str(torch.get("torch") or ""),
        variant=variant,
        cuda=str(torch["cuda"]) if torch.get("cuda") and variant != "cpu" else None,
        local=str(torch.get("local") or ""),
        sms=tuple(dict.fromkeys(str(cc) for cc in target_gpus_cc if cc)),
        index_url=str(torch.get("index_url") or ""),
    )


def target_sms(target: Optional[HostFacts]) -> tuple[str, ...]:
    """The compute capabilities of the target's GPUs (as reported, else from the model name), each once."""
    if target is None or not target.gpus:
        return ()
    found = (gpu_capability(g) for g in target.gpus)
    return tuple(dict.fromkeys(cc for cc in found if cc))


def _public(version: str) -> str:
    try:
        return Version(version).public
    except InvalidVersion:
        return version.split("+", 1)[0]


def _sm_name(cc: str) -> str:
    major, minor = minor_tuple(cc)
    return f"sm_{major}{minor}"


def _flag(flag: str) -> Optional[tuple[str, int, int, str]]:
    """("sm"|"compute", major, minor, suffix) of ``sm_90a``/``compute_120``; None for anything else."""
    m = re.fullmatch(r"(sm|compute)_(\d+)(\d)([af]?)", flag.strip())
    return (m.group(1), int(m.group(2)), int(m.group(3)), m.group(4)) if m else None


def runs_on(flags: Sequence[str], cc: str) -> bool:
    """Can a build with these arch flags run on a GPU of compute capability ``cc``? SASS runs on its own major at
    an equal or higher minor (``a`` code only on exactly its own capability); PTX at or below ``cc`` is JIT
    compiled by the driver."""
    want = minor_tuple(cc)
    for flag in flags:
        parsed = _flag(flag)
        if parsed is None:
            continue
        kind, major, minor, suffix = parsed
        if kind == "sm":
            if suffix == "a" and (major, minor) == want:
                return True
            if suffix != "a" and major == want[0] and minor <= want[1]:
                return True
        elif (major, minor) <= want:
            return True
    return False


def compare(expected: Expected, build: Build) -> list[str]:
    """What differs between the planned and the installed build, one line each ([] when it is the plan's)."""
    problems: list[str] = []
    if _public(build.version) != _public(expected.version):
        problems.append(f"version {build.public}, planned {expected.version}")
    want_label = expected.local or expected.variant
    label = build.local
    # A label's first segment names the variant, the rest is kept and shown: "cpu.cxx11.abi" is a CPU build,
    # "cu130.post1" a cu130 one.
    if label and label_variant(label) != label_variant(want_label):
        problems.append(f"local label +{label}, planned +{want_label}")
    elif not label and expected.local and not build.cuda_known:
        # Only a file name to go on: the planned index labels its files, so an unlabeled one came from
        # elsewhere (PyPI's default build carries no label, and is a CUDA build).
        problems.append(
            f"no local label, planned +{expected.local}: not a file of the planned index "
            "(PyPI's default build has no label and is a CUDA build)"
        )
    if build.cuda_known:
        problems.extend(_cuda_problems(expected, build))
    if expected.is_cuda and build.cuda and expected.sms and build.arch_flags is not None:
        missing = [cc for cc in expected.sms if not runs_on(build.arch_flags, cc)]
        if missing:
            listed = " ".join(build.arch_flags) or "(empty)"
            gpus = ", ".join(f"{_sm_name(cc)} (compute capability {cc})" for cc in missing)
            problems.append(f"{ARCH_PROBLEM} {gpus}; its arch list: {listed}")
    return problems


def _cuda_problems(expected: Expected, build: Build) -> list[str]:
    if expected.is_cuda and not build.cuda:
        return [f"built without CUDA, planned CUDA {expected.cuda}"]
    if not expected.is_cuda and build.cuda:
        return [f"built for CUDA {build.cuda}, planned a CPU build ({expected.variant})"]
    if expected.cuda and build.cuda and minor_tuple(build.cuda) != minor_tuple(expected.cuda):
        return [f"built for CUDA {build.cuda}, planned CUDA {expected.cuda}"]
    return []


def install_indexes(commands: Iterable[Sequence[str]]) -> list[str]:
    """The indexes and wheel directories the install commands that bring torch read (after mirroring): their
    ``--index-url``/``--extra-index-url``/``--find-links`` values, PyPI where one names none."""
    out: list[str] = []
    for cmd in commands:
        if "install" not in cmd or not any(_brings_torch(a) for a in cmd):
            continue
        named = False
        for flag, value in zip(cmd, cmd[1:]):
            if flag in ("--index-url", "--extra-index-url", "--find-links"):
                out.append(value)
                named = True
        if not named and "--no-index" not in cmd:
            out.append(PYPI)
    return list(dict.fromkeys(out))


def _brings_torch(arg: str) -> bool:
    # torch==X (the resolver's pin) or a locked requirements file (which holds torch's hashed pin).
    return bool(re.match(r"torch(\[[^\]]*\])?\s*(==|===|~=|>=|<=|!=|<|>|@|$)", arg)) or arg.endswith(
        "lock-requirements.txt"
    )


def served_by(build: Build, indexes: Sequence[str]) -> str:
    """Which index served ``build``, as well as the install's indexes tell."""
    if not indexes:
        return "no index (the install read none)"
    if len(indexes) == 1:
        return indexes[0]
    if not build.local and PYPI in indexes:
        return f"{PYPI}, most likely (PyPI's default build has no local label; the install read {', '.join(indexes)})"
    return "one of " + ", ".join(indexes)


def mismatch_message(expected: Expected, build: Build, served: str, problems: Sequence[str]) -> str:
    head = (
        f"torch build mismatch: planned {expected.describe()} from {expected.index_url}, "
        f"the installer brought {build.describe()}, served by {served}"
    )
    return head + "".join(f"\n  - {p}" for p in problems)


def mismatch_hint(recipe: str, problems: Sequence[str] = ()) -> str:
    kept = "nothing was put in place, a previous env is untouched"
    if problems and all(p.startswith(ARCH_PROBLEM) for p in problems):
        return (
            f"the build is the planned variant but lacks the target's GPU code: a newer CUDA variant may carry "
            f"it (`envbuilder plan {recipe}` checks the target against the table), or the index serves another "
            f"build than PyTorch's ({VAR} names the mirror); {kept}"
        )
    return (
        f"the index the install read does not serve the planned build there: check {VAR} (the mirror) and "
        f"`envbuilder plan {recipe}` (the indexes each install step reads); {kept}"
    )


# ---------------------------------------------------------------------------------------------------------------
# Locks: the locked torch file names


def build_from_filename(url: str) -> Optional[Build]:
    """The Build a locked torch wheel's name tells (version and label, not CUDA); None for other files."""
    name = urllib.parse.unquote(url.rsplit("/", 1)[-1].split("#", 1)[0])
    try:
        project, version, _, _ = parse_wheel_filename(name)
    except InvalidWheelFilename:
        return None
    if project != "torch":
        return None
    return Build(version=str(version), cuda_known=False, where=name)


def lock_problems(expected: Expected, platform: PlatformLock) -> list[tuple[str, Build, list[str]]]:
    """Every locked torch wheel of ``platform`` whose name differs from the plan: (its URL, what its name tells,
    what differs)."""
    out = []
    for pkg in platform.wheels:
        if pkg.name != "torch":
            continue
        for f in pkg.files:
            build = build_from_filename(f.url)
            if build is None:
                continue
            problems = compare(expected, build)
            if problems:
                out.append((f.url, build, problems))
    return out


def check_lock(resolution: Any, target: Optional[HostFacts], platform: PlatformLock, recipe: str) -> None:
    """Refuse (LockError) a lock whose torch files are not the planned build."""
    if resolution is None:
        return
    expected = expected_from(resolution, target_sms(target))
    bad = lock_problems(expected, platform)
    if not bad:
        return
    url, build, problems = bad[0]
    more = f" (and {len(bad) - 1} more torch file(s))" if len(bad) > 1 else ""
    served = url.rsplit("/", 1)[0] if "/" in url else url
    raise LockError(
        f"torch build mismatch in the lock for {platform.arch}: planned {expected.describe()} from "
        f"{expected.index_url}, the resolver picked {build.where} from {served}{more}"
        + "".join(f"\n  - {p}" for p in problems),
        hint=f"the indexes the lock read (after {VAR}) do not serve the planned build first; "
        f"`envbuilder plan {recipe}` shows them. No lock was written",
    )


# ---------------------------------------------------------------------------------------------------------------
# Reading an env


def _site_dirs(env_dir: Path) -> list[Path]:
    """site-packages of a venv, a conda env, or a user base (PYTHONUSERBASE/--prefix layout)."""
    found: list[Path] = []
    for pattern in ("lib/python*/site-packages", "lib64/python*/site-packages"):
        found.extend(p for p in sorted(env_dir.glob(pattern)) if p.is_dir())
    return found


def metadata_name_version(dist_info: Path) -> Optional[tuple[str, str]]:
    """(Name, Version) from a dist-info's METADATA headers."""
    try:
        text = (dist_info / "METADATA").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    fields: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            break  # the headers end at the first blank line
        key, sep, value = line.partition(":")
        if sep and key in ("Name", "Version"):
            fields.setdefault(key, value.strip())
    if "Version" not in fields:
        return None
    return fields.get("Name", ""), fields["Version"]


def read_version_py(path: Path) -> dict[str, Any]:
    """The literal top-level assignments of torch/version.py (``cuda: Optional[str] = '12.6'``), never run."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8", errors="replace"), str(path))
    except (OSError, SyntaxError, ValueError):
        return {}
    out: dict[str, Any] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            target, value = node.target, node.value
        else:
            continue
        if isinstance(target, ast.Name):
            try:
                out[target.id] = ast.literal_eval(value)
            except ValueError:
                continue
    return out


def _find_in_env(env_dir: Path) -> Optional[tuple[Path, str, Path]]:
    """(dist-info, version, torch package dir) of the torch installed in ``env_dir`` itself."""
    for site in _site_dirs(env_dir):
        for dist_info in sorted(site.glob("torch-*.dist-info")):
            meta = metadata_name_version(dist_info)
            if meta is None or meta[0].lower() not in ("torch", ""):
                continue
            return dist_info, meta[1], site / "torch"
    return None


def _run_payload(
    python: str, env: Mapping[str, str], arch: bool, log: Callable[[str], None]
) -> dict[str, Any]:
    argv = [python, str(PAYLOAD), *(["--arch-flags"] if arch else [])]
    log("+ " + proc.quote(argv))
    began = time.monotonic()
    res = proc.run(argv, env=dict(env), check=False, timeout=ARCH_TIMEOUT_S)
    log(f"(exit {res.returncode}, {time.monotonic() - began:.1f} s)")
    lines = res.stdout.strip().splitlines()
    try:
        data = json.loads(lines[-1]) if lines else None
    except ValueError:
        data = None
    if res.returncode != 0 or not isinstance(data, dict):
        raise BackendError(
            f"cannot read the installed torch build with {python} (exit {res.returncode}):\n"
            + (proc.tail(res.stderr).rstrip() or "(no message)"),
            hint="run with -v; the build log has the command",
        )
    return data


def read_build(
    env_dir: Path,
    python: Optional[str] = None,
    *,
    env: Optional[Mapping[str, str]] = None,
    arch_flags: bool = False,
    log: Callable[[str], None] = lambda _: None,
    cache: Optional[ArchCache] = None,
) -> Optional[Build]:
    """The torch build in ``env_dir`` (None when there is none). Files are read where torch sits in the env's
    own site-packages; otherwise (an overlay whose torch is the site's) the env's python says where it is.
    ``arch_flags`` adds the compiled arch list: from ``cache`` where this wheel's was read before, else from that
    python (it imports torch)."""
    python = python or str(env_dir / "bin" / "python")
    # The caller's env is used as given (user-prefix builds need its PYTHONUSERBASE).
    run_env = dict(env) if env is not None else proc.scrubbed_env()
    found = _find_in_env(env_dir)
    if found is not None:
        where, version, package = str(found[0]), found[1], found[2]
    else:
        located = _run_payload(python, run_env, False, log)
        if not located.get("version"):
            return None
        version = str(located["version"])
        where = str(located.get("dist_info") or "")
        package = Path(str(located.get("package_dir") or ""))
    info = read_version_py(package / "version.py") if str(package) else {}
    cuda = info.get("cuda")
    build = Build(version=version, cuda=str(cuda) if cuda else None, cuda_known=True, where=where)
    if arch_flags:
        build = replace(build, arch_flags=read_arch_flags(build, python, run_env, log, cache))
    return build


def read_arch_flags(
    build: Build,
    python: str,
    env: Mapping[str, str],
    log: Callable[[str], None],
    cache: Optional[ArchCache],
) -> Optional[tuple[str, ...]]:
    """The compiled arch list of the torch ``build`` (read from its dist-info ``build.where``): remembered in
    ``cache`` for this wheel's digest, else read from its library's bytes or, where they cannot tell, through
    ``python`` (an import), and remembered; None where unreadable."""
    digest = torcharch.wheel_digest(Path(build.where)) if cache is not None and build.where else None
    if cache is not None and digest is not None:
        flags = cache.recall(digest)
        if flags is not None:
            log(f"torch arch list: remembered for this wheel ({cache.path(digest)})")
            return flags
    if build.where:
        flags = torcharch.library_flags(Path(build.where).parent / "torch")
        if flags is not None:
            log(f"torch arch list: read from {Path(build.where).parent / 'torch' / torcharch.LIBRARY}")
            if cache is not None and digest is not None:
                cache.remember(digest, build.version, flags)
            return flags
    located = _run_payload(python, dict(env), True, log)
    if located.get("arch_flags") is None:
        log(f"could not read torch's arch list: {located.get('arch_error') or 'not reported'}")
        return None
    flags = tuple(str(f) for f in located["arch_flags"])
    # Kept only when the torch that python imported is the one whose digest it is.
    if cache is not None and digest is not None and _same_file(located.get("dist_info"), build.where):
        cache.remember(digest, build.version, flags)
    return flags


def _same_file(a: Any, b: str) -> bool:
    return bool(a) and os.path.realpath(str(a)) == os.path.realpath(b)


def guard(
    plan: Plan,
    env_dir: Path,
    *,
    python: Optional[str],
    env: Mapping[str, str],
    log: Callable[[str], None],
    home: Optional[Path] = None,
) -> Optional[Build]:
    """create's check: the torch in ``env_dir`` is the plan's (None, no check, where the plan installs none).
    ``home``: the envbuilder home whose cache remembers each wheel's arch list (None: read it every time)."""
    if plan.resolution is None:
        return None
    expected = expected_from(plan.resolution, target_sms(plan.target))
    served_from = install_indexes(s.argv for s in plan.install_steps)

    def served(build: Build) -> str:
        return served_by(build, served_from)

    return _checked(
        expected,
        env_dir,
        python,
        env,
        served=served,
        hint=lambda problems: mismatch_hint(plan.recipe, problems),
        log=log,
        cache=ArchCache(home, log) if home is not None else None,
    )


def guard_restore(
    plan: Mapping[str, Any],
    env_dir: Path,
    *,
    source: str,
    python: Optional[str],
    env: Mapping[str, str],
    log: Callable[[str], None],
    home: Optional[Path] = None,
) -> Optional[Build]:
    """restore's check: the restored torch is the one the recorded plan asked for (``home`` as for ``guard``)."""
    torch = plan.get("torch")
    if not isinstance(torch, Mapping) or not torch.get("torch"):
        return None
    target: Optional[HostFacts] = None
    if isinstance(plan.get("target"), dict):
        try:
            target = facts_from_json(plan["target"], "the recorded plan's target")
        except HostProbeError:  # a record from another release: the arch check is skipped, not the restore
            target = None
    expected = expected_from_json(torch, target_sms(target))
    hint = (
        "the backup holds another torch build than the env's recorded plan (was torch replaced after the env "
        f"was built?); nothing was put in place. {VAR} plays no part in a restore"
    )
    cache = ArchCache(home, log) if home is not None else None
    return _checked(
        expected, env_dir, python, env, served=lambda _b: source, hint=lambda _p: hint, log=log, cache=cache
    )


def _checked(
    expected: Expected,
    env_dir: Path,
    python: Optional[str],
    env: Mapping[str, str],
    *,
    served: Callable[[Build], str],
    hint: Callable[[Sequence[str]], str],
    log: Callable[[str], None],
    cache: Optional[ArchCache],
) -> Build:
    run_env = dict(env)
    build = read_build(env_dir, python, env=run_env, log=log)
    if build is None:
        message = (
            f"torch build mismatch: planned {expected.describe()} from {expected.index_url}, "
            "but the env holds no torch after the install"
        )
        log(message)
        raise BackendError(message, hint=hint(()))
    if expected.is_cuda and expected.sms and build.cuda and not compare(expected, build):
        # Only a build right by its files needs its arch list: remembered per wheel, else imported (seconds).
        python = python or str(env_dir / "bin" / "python")
        build = replace(build, arch_flags=read_arch_flags(build, python, run_env, log, cache))
    problems = compare(expected, build)
    if problems:
        message = mismatch_message(expected, build, served(build), problems)
        log(message)
        raise BackendError(message, hint=hint(problems))
    log(f"torch build: {build.describe()} is the planned {expected.describe()} ({build.where})")
    return build
