"""What shadows an env's CUDA libraries: which file the dynamic loader would take for each soname the env ships,
given LD_PRELOAD, LD_LIBRARY_PATH and loaded cuda modules. Copies from outside the env are the commonest way a
working torch env breaks. Pure: directory listings come in through a ``listdir`` callable."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Callable, Optional

from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from envbuilder.core.structs import dataclass
from envbuilder.doctor.findings import ACTION, INFO, NODE, WARNING, Finding
from envbuilder.system.state import EnvRecord

#: The CUDA libraries torch loads by soname, whose copies outside the env most often break it.
CUDA_LIBRARIES = ("libcudart", "libnccl", "libcublas", "libcudnn")

_SONAME = re.compile(r"^(libcudart|libnccl|libcublas|libcudnn)([A-Za-z_]*)\.so\.\d+$")
#: The wheel (project name prefix) that ships each library in an env.
_WHEELS = {
    "libcudart": "nvidia-cuda-runtime",
    "libnccl": "nvidia-nccl",
    "libcublas": "nvidia-cublas",
    "libcudnn": "nvidia-cudnn",
}


@dataclass(frozen=True)
class LibraryLoad:
    """Which file the dynamic loader would take for one of the env's CUDA libraries."""

    soname: str
    family: str
    #: The env's own copy.
    own: str
    #: The file that loads instead, or ``own``.
    path: str
    #: "LD_PRELOAD", "LD_LIBRARY_PATH", or "the env" (its own copy wins).
    via: str
    #: The version of the file that loads instead, from its file names (libnccl.so.2.21.5), where they say.
    version: Optional[str] = None

    @property
    def shadowed(self) -> bool:
        return self.via != "the env"


def split_path_list(value: str) -> list[str]:
    """LD_LIBRARY_PATH / LD_PRELOAD entries (LD_PRELOAD also splits on white space); empty entries dropped."""
    return [p for p in re.split(r"[:\s]+", value) if p]


def own_libraries(lib_dirs: Sequence[str], listdir: Callable[[str], Sequence[str]]) -> dict[str, str]:
    """soname -> path of the env's copies of the CUDA libraries, the first directory winning."""
    own: dict[str, str] = {}
    for d in lib_dirs:
        for name in sorted(listdir(d)):
            if _SONAME.match(name) and name not in own:
                own[name] = str(Path(d) / name)
    return own


def library_loads(
    env: Mapping[str, str], lib_dirs: Sequence[str], listdir: Callable[[str], Sequence[str]]
) -> list[LibraryLoad]:
    """For each CUDA library the env has (``lib_dirs``: its nvidia/*/lib and torch/lib), where the loader would
    find that soname first: an LD_PRELOAD entry, then the LD_LIBRARY_PATH directories in order, else the env's
    own copy (torch finds it through its RUNPATH, which LD_LIBRARY_PATH overrides)."""
    own = own_libraries(lib_dirs, listdir)
    preload = split_path_list(env.get("LD_PRELOAD", ""))
    search = split_path_list(env.get("LD_LIBRARY_PATH", ""))
    loads = []
    for soname, own_path in sorted(own.items()):
        match = _SONAME.match(soname)
        family = match.group(1) if match else soname
        unversioned = soname.rsplit(".so.", 1)[0] + ".so"
        own_dir = os.path.normpath(Path(own_path).parent)
        found: Optional[LibraryLoad] = None
        for entry in preload:
            base = Path(entry).name
            if base in (soname, unversioned) or base.startswith(soname + "."):
                version = _version_in(soname, [base])
                found = LibraryLoad(soname, family, own_path, entry, "LD_PRELOAD", version)
                break
        if found is None:
            for d in search:
                if os.path.normpath(d) == own_dir:
                    break
                names = listdir(d)
                if soname in names:
                    found = LibraryLoad(
                        soname,
                        family,
                        own_path,
                        str(Path(d) / soname),
                        "LD_LIBRARY_PATH",
                        _version_in(soname, names),
                    )
                    break
        loads.append(found or LibraryLoad(soname, family, own_path, own_path, "the env"))
    return loads


def _version_in(soname: str, names: Sequence[str]) -> Optional[str]:
    """The full version a directory's file names give a soname (libnccl.so.2.21.5 -> 2.21.5)."""
    stem = soname.rsplit(".so.", 1)[0] + ".so."
    versions = [n[len(stem) :] for n in names if n.startswith(soname + ".")]
    versions = [v for v in versions if re.fullmatch(r"\d+(\.\d+)*", v)]
    return max(versions, key=lambda v: [int(x) for x in v.split(".")]) if versions else None


def wheel_versions(packages: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """The versions of the env's CUDA library wheels, by library family (from the record's packages)."""
    out: dict[str, str] = {}
    for pkg in packages:
        name = canonicalize_name(str(pkg.get("name", "")))
        for family, wheel in _WHEELS.items():
            if name == wheel or name.startswith(wheel + "-"):
                out[family] = str(pkg.get("version", ""))
    return out


def cuda_modules(env: Mapping[str, str]) -> list[str]:
    """The loaded modules that are a CUDA toolkit (LOADEDMODULES, else the modulefiles in _LMFILES_)."""
    loaded = [m for m in env.get("LOADEDMODULES", "").split(":") if m]
    if not loaded:
        for path in split_path_list(env.get("_LMFILES_", "")):
            parts = Path(path).parts
            if len(parts) >= 2:
                stem = parts[-1][: -len(".lua")] if parts[-1].endswith(".lua") else parts[-1]
                loaded.append(f"{parts[-2]}/{stem}")
    return [m for m in loaded if re.match(r"(?i)cuda(toolkit|-toolkit)?(/|$)", m)]


def _cuda_home(env: Mapping[str, str]) -> Optional[str]:
    for var in ("CUDA_HOME", "CUDA_PATH", "CUDA_ROOT"):
        if env.get(var):
            return os.path.normpath(env[var])
    return None


def _source(load: LibraryLoad, env: Mapping[str, str], modules: Sequence[str]) -> str:
    """Who put that file first: the cuda module, CUDA_HOME, or just the variable."""
    home = _cuda_home(env)
    where = os.path.normpath(load.path)
    if home and (where + "/").startswith(home + "/"):
        return f"the {modules[0]} module" if modules else f"CUDA_HOME={home}"
    return ""


def library_findings(
    subject: str,
    loads: Sequence[LibraryLoad],
    env: Mapping[str, str],
    versions: Mapping[str, str],
) -> list[Finding]:
    """One action per library family that a file outside the env shadows, naming the file, why it wins and how
    to stop it."""
    modules = cuda_modules(env)
    groups: dict[tuple[str, str, str], list[LibraryLoad]] = {}
    for load in loads:
        if load.shadowed:
            key = (load.family, load.via, str(Path(load.path).parent))
            groups.setdefault(key, []).append(load)
    findings = []
    for (family, via, where), group in sorted(groups.items()):
        first = group[0]
        names = ", ".join(g.soname for g in group)
        who = _source(first, env, modules)
        mine = versions.get(family)
        age = ""
        if first.version:
            age = f" ({first.version}"
            if mine and _older(first.version, mine):
                age += f", older than the env's {mine}"
            age += ")"
        message = (
            f"{names} would load from {first.path if via == 'LD_PRELOAD' else where}{age} through {via}"
            + (f" ({who})" if who else "")
            + f", not the env's copy in {Path(first.own).parent}"
        )
        if via == "LD_PRELOAD":
            fix = f"remove {first.path} from LD_PRELOAD before using the env"
        elif who.startswith("the "):
            fix = f"module unload {modules[0]} before activating the env"
        else:
            fix = f"take {where} out of LD_LIBRARY_PATH before activating the env"
        findings.append(Finding(ACTION, subject, "libraries", message, fix))
    if not findings and loads:
        findings.append(
            Finding(
                INFO, subject, "libraries", f"its CUDA libraries load from the env ({len(loads)} checked)"
            )
        )
    return findings


def _older(version: str, than: str) -> bool:
    try:
        return Version(version) < Version(than)
    except InvalidVersion:
        return False


def node_library_findings(env: Mapping[str, str]) -> list[Finding]:
    """What this shell puts in front of every program: CUDA libraries in LD_PRELOAD, a loaded cuda module."""
    findings = []
    preload = [p for p in split_path_list(env.get("LD_PRELOAD", "")) if _is_cuda_library(Path(p).name)]
    if preload:
        findings.append(
            Finding(
                WARNING,
                NODE,
                "libraries",
                f"LD_PRELOAD forces {', '.join(preload)} into every program started from this shell",
                "unset LD_PRELOAD unless you mean every program to use that copy",
            )
        )
    modules = cuda_modules(env)
    if modules:
        home = _cuda_home(env)
        findings.append(
            Finding(
                INFO,
                NODE,
                "libraries",
                f"a CUDA module is loaded: {', '.join(modules)}"
                + (f" (CUDA_HOME={home})" if home else "")
                + "; each env's libraries row says whether it shadows that env's copies",
            )
        )
    return findings


def _is_cuda_library(name: str) -> bool:
    return any(name.startswith(lib) and ".so" in name for lib in CUDA_LIBRARIES)


def activation_env(record: EnvRecord, env: Mapping[str, str]) -> dict[str, str]:
    """``env`` as the env's activate extension leaves it (its variables set and unset; modules it loads are not
    known here)."""
    activate = (record.plan or {}).get("activate") or {}
    out = dict(env)
    out.update({str(k): str(v) for k, v in (activate.get("env") or {}).items()})
    for var in activate.get("unset") or []:
        out.pop(var, None)
    return out


def activation_module_findings(record: EnvRecord) -> list[Finding]:
    """Activation loads a cuda module this check cannot see from outside."""
    activate = (record.plan or {}).get("activate") or {}
    loaded = cuda_modules({"LOADEDMODULES": ":".join(activate.get("modules") or [])})
    if not loaded:
        return []
    return [
        Finding(
            INFO,
            record.name,
            "libraries",
            f"activating it loads {', '.join(loaded)}, whose library directories are not known from here",
            f"activate it, then run envbuilder doctor {record.name} to check what that module puts first",
        )
    ]
