"""Test fixtures for conda envs: real conda packages (.tar.bz2 with info/index.json, paths.json, files and a
payload) built here, in a local channel that py-rattler indexes, so the conda backend solves and installs them as
it would packages from conda-forge.

There is no relocatable CPython conda package offline, so ``python_package`` wraps this machine's interpreter the way
a venv does: ``bin/python3.X`` links to it and ``pyvenv.cfg`` makes the env its ``sys.prefix``. ``pip_package``
repacks the pip wheel that ships with CPython (ensurepip) as a conda package, as conda-forge's pip is.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import io
import json
import os
import shlex
import sys
import sysconfig
import tarfile
import time
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Union

PLACEHOLDER = "/opt/anaconda1anaconda2anaconda3"
#: conda-build's kind of placeholder for compiled files: long, so any real prefix fits in its place.
LONG_PLACEHOLDER = "/opt/conda-bld/_h_env" + "_placehold" * 22
Content = Union[str, bytes]


@dataclass(frozen=True)
class Package:
    """A conda package to build. ``prefixed`` files hold ``placeholder``, which the installer replaces with the
    env's prefix (as text, or with ``binary`` NUL-padded in place, as conda does for compiled files)."""

    name: str
    version: str
    files: Mapping[str, Content] = field(default_factory=dict)
    depends: Sequence[str] = ()
    build: str = "0"
    subdir: str = "linux-64"
    softlinks: Mapping[str, str] = field(default_factory=dict)
    prefixed: Sequence[str] = ()
    binary: bool = False
    placeholder: str = PLACEHOLDER


def build_package(channel: Path, pkg: Package) -> Path:
    """``pkg`` as a .tar.bz2 in ``channel``'s subdir."""
    out = channel / pkg.subdir
    out.mkdir(parents=True, exist_ok=True)
    (channel / "noarch").mkdir(parents=True, exist_ok=True)
    payload = {p: (c.encode() if isinstance(c, str) else c) for p, c in pkg.files.items()}
    paths = []
    for rel, data in sorted(payload.items()):
        entry = {"_path": rel, "path_type": "hardlink", "sha256": hashlib.sha256(data).hexdigest()}
        entry["size_in_bytes"] = len(data)
        if rel in pkg.prefixed:
            entry.update(file_mode="binary" if pkg.binary else "text", prefix_placeholder=pkg.placeholder)
        paths.append(entry)
    for rel in sorted(pkg.softlinks):
        paths.append({"_path": rel, "path_type": "softlink", "size_in_bytes": 0})
    index = {
        "name": pkg.name,
        "version": pkg.version,
        "build": pkg.build,
        "build_number": 0,
        "depends": list(pkg.depends),
        "subdir": pkg.subdir,
        "license": "BSD-3-Clause",
        "timestamp": int(time.time() * 1000),
    }
    if pkg.subdir == "noarch":
        index["noarch"] = "generic"
    else:
        index.update(
            arch={"linux-64": "x86_64"}.get(pkg.subdir, pkg.subdir.rsplit("-", maxsplit=1)[-1]),
            platform="linux",
        )
    info = {
        "info/index.json": json.dumps(index).encode(),
        "info/paths.json": json.dumps({"paths": paths, "paths_version": 1}).encode(),
        "info/files": ("\n".join([*sorted(payload), *sorted(pkg.softlinks)]) + "\n").encode(),
    }
    if pkg.prefixed:
        mode = "binary" if pkg.binary else "text"
        info["info/has_prefix"] = "".join(f"{pkg.placeholder} {mode} {p}\n" for p in pkg.prefixed).encode()
    path = out / f"{pkg.name}-{pkg.version}-{pkg.build}.tar.bz2"
    with tarfile.open(path, "w:bz2") as tf:
        for rel, data in [*info.items(), *payload.items()]:
            ti = tarfile.TarInfo(rel)
            ti.size = len(data)
            ti.mode = 0o755 if rel.startswith("bin/") else 0o644
            tf.addfile(ti, io.BytesIO(data))
        for rel, target in pkg.softlinks.items():
            ti = tarfile.TarInfo(rel)
            ti.type = tarfile.SYMTYPE
            ti.linkname = target
            tf.addfile(ti)
    return path


def python_package(channel: Path, subdir: str = "linux-64") -> Path:
    """``python`` at this interpreter's version, wrapping it venv-style (see the module docstring). Built for
    another subdir it is only for locks made for that platform: its links point at this machine's interpreter."""
    exe = Path(sys.executable).resolve()
    major_minor = f"{sys.version_info[0]}.{sys.version_info[1]}"
    version = ".".join(str(v) for v in sys.version_info[:3])
    cfg = f"home = {exe.parent}\ninclude-system-site-packages = false\nversion = {version}\n"
    return build_package(
        channel,
        Package(
            "python",
            version,
            files={"pyvenv.cfg": cfg, f"lib/python{major_minor}/site-packages/.keep": ""},
            build="h0_envbuilder_tests",
            subdir=subdir,
            softlinks={
                f"bin/python{major_minor}": str(exe),
                "bin/python3": f"python{major_minor}",
                "bin/python": f"python{major_minor}",
            },
        ),
    )


def pip_package(channel: Path, wheel: Optional[Path] = None) -> Path:
    """pip from CPython's own bundled wheel (or ``wheel``, where a distribution's python has none), as a noarch
    conda package for this interpreter's site-packages (as conda-forge's pip is noarch)."""
    if wheel is None:
        bundled = Path(sysconfig.get_paths()["stdlib"]) / "ensurepip" / "_bundled"
        wheel = next(bundled.glob("pip-*.whl"))
    version = wheel.name.split("-")[1]
    site = f"lib/python{sys.version_info[0]}.{sys.version_info[1]}/site-packages"
    files: dict[str, Content] = {}
    with zipfile.ZipFile(wheel) as zf:
        for member in zf.namelist():
            if not member.endswith("/"):
                files[f"{site}/{member}"] = zf.read(member)
    files["bin/pip"] = (
        f"#!{PLACEHOLDER}/bin/python\nimport sys\nfrom pip._internal.cli.main import main\nsys.exit(main())\n"
    )
    major_minor = f"{sys.version_info[0]}.{sys.version_info[1]}"
    return build_package(
        channel,
        Package(
            "pip",
            version,
            files=files,
            depends=[f"python {major_minor}.*"],
            prefixed=["bin/pip"],
            subdir="noarch",
        ),
    )


def index(channel: Path) -> None:
    """repodata.json for every subdir, written by py-rattler's indexer."""
    from rattler.index import index_fs

    asyncio.run(index_fs(channel, write_zst=False, write_shards=False, force=True))


def conda_shim(bin_dir: Path) -> Path:
    """A stand-in for a site's ``conda`` binary (none can be installed here), solved and installed by py-rattler.
    It implements the parts of conda's command line that envbuilder and conda-lock run, with conda's output:

    - ``conda create --yes --prefix P ...``: installs at exactly P, as conda does (it cannot write another prefix
      into the files);
    - ``conda create --dry-run --json ...``: prints the plan as conda does, every record in ``actions.FETCH`` and
      ``LINK``, for the subdir in ``CONDA_SUBDIR`` with the virtual packages from ``CONDA_OVERRIDE_*`` (conda's
      variables; conda-lock sets both); a failed solve prints conda's JSON error and exits 1;
    - ``conda create --file EXPLICIT --prefix P`` and ``conda run --prefix P CMD`` (what ``conda-lock install``
      runs);
    - ``conda --version`` and ``conda info --json`` (``pkgs_dirs`` from ``CONDA_PKGS_DIRS``)."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    shim = bin_dir / "conda"
    shim.write_text(
        f"#!{sys.executable}\n"
        "# Test stand-in for conda (see tests/condachannel.py: conda_shim).\n"
        "import os, sys\n"
        f"sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        "from condachannel import shim_main\n"
        "status = shim_main(sys.argv[1:])\n"
        "sys.stdout.flush(); sys.stderr.flush()\n"
        "os._exit(status)\n"
    )
    shim.chmod(0o755)
    return shim


#: The body of the stand-in ``conda`` shell function (bash and zsh), ``{root}`` its base env, shell-quoted.
_CONDA_FUNCTION = """\
local root={root}
case "${{1:-}}" in
activate)
    if [ "${{2:-base}}" != base ]; then echo "EnvironmentNameNotFound: $2 (stand-in conda)" >&2; return 1; fi
    CONDA_SHLVL=$(( ${{CONDA_SHLVL:-0}} + 1 )); CONDA_PREFIX=$root; CONDA_DEFAULT_ENV=base
    CONDA_PROMPT_MODIFIER="(base) "; PATH="$root/bin:$PATH"
    export CONDA_SHLVL CONDA_PREFIX CONDA_DEFAULT_ENV CONDA_PROMPT_MODIFIER PATH ;;
deactivate)
    local p=":$PATH:"
    p="${{p%%:"$root/bin":*}}:${{p#*:"$root/bin":}}"; p=${{p#:}}; PATH=${{p%:}}
    CONDA_SHLVL=$(( ${{CONDA_SHLVL:-1}} - 1 )); unset CONDA_PREFIX CONDA_DEFAULT_ENV CONDA_PROMPT_MODIFIER
    export PATH CONDA_SHLVL ;;
*) echo "stand-in conda: only activate and deactivate" >&2; return 1 ;;
esac"""


def conda_function_module(path: Path, root: Path) -> Path:
    """A stand-in for a site's conda module (ALCF's ``conda/DATE``), written as the Lmod modulefile ``path``: it
    puts ``root/bin`` on PATH and defines the ``conda`` shell function that conda's shell hook would, where no
    real conda exists. ``conda activate [base]`` sets what conda sets (CONDA_PREFIX, CONDA_DEFAULT_ENV,
    CONDA_PROMPT_MODIFIER, CONDA_SHLVL + 1) and puts ``root/bin`` first; ``conda deactivate`` takes its PATH
    entry out and leaves CONDA_SHLVL behind one lower, as conda does; any other env name fails as conda's
    EnvironmentNameNotFound."""
    body = _CONDA_FUNCTION.format(root=shlex.quote(str(root)))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        "-- Test stand-in for a site's conda module (tests/condachannel.py: conda_function_module).\n"
        f'prepend_path("PATH", {json.dumps(str(root / "bin"))})\n'
        f'set_shell_function("conda", [==[\n{body}\n]==], "")\n'
    )
    return path


SHIM_VERSION = "conda 25.3.1"


def shim_main(argv: Sequence[str]) -> int:
    from envbuilder.backends.rattler_engine import main

    if list(argv) == ["--version"]:
        print(SHIM_VERSION)
        return 0
    if list(argv[:1]) == ["info"] and "--json" in argv:
        print(
            json.dumps(
                {
                    "conda_version": SHIM_VERSION.split()[1],
                    "pkgs_dirs": [os.environ.get("CONDA_PKGS_DIRS", "")],
                }
            )
        )
        return 0
    if list(argv[:1]) == ["run"]:
        return _shim_run(argv[1:])
    if list(argv[:1]) == ["create"] and "--file" in argv:
        argv = _shim_explicit(argv[1:])
    if list(argv[:1]) != ["create"] or any(a.startswith("--final-prefix") for a in argv):
        print(f"conda shim: `conda {' '.join(argv[:2])}` is not implemented", file=sys.stderr)
        return 2
    if "--dry-run" in argv:
        return _shim_dry_run([a for a in argv[1:] if a not in {"--dry-run", "--json", "--yes"}])
    return main(list(argv))


def _shim_explicit(argv: Sequence[str]) -> list[str]:
    """``conda create --file EXPLICIT --prefix P``, as conda-lock install runs it: the explicit file's URLs as
    exact ``name=version=build`` specs from their channels (the stand-in solves them; conda would link them)."""
    p = argparse.ArgumentParser(prog="conda create")
    p.add_argument("--file", required=True)
    p.add_argument("--prefix", required=True)
    p.add_argument("--quiet", action="store_true")
    p.add_argument("--yes", action="store_true")
    args = p.parse_args(argv)
    channels: list[str] = []
    specs = []
    for line in Path(args.file).read_text().splitlines():
        if "://" not in line or line.startswith("#"):
            continue
        url = line.split("#", 1)[0]
        channel, stem = url.rsplit("/", 2)[0], url.rsplit("/", 1)[1]
        stem = stem[: -len(".tar.bz2")] if stem.endswith(".tar.bz2") else stem[: -len(".conda")]
        name, version, build = stem.rsplit("-", 2)
        specs.append(f"{name}={version}={build}")
        channels += [] if channel in channels else [channel]
    return ["create", "--yes", "--prefix", args.prefix, "--override-channels",
            *(a for c in channels for a in ("--channel", c)), *specs]  # fmt: skip


def _shim_run(argv: Sequence[str]) -> int:
    """``conda run ... --prefix P COMMAND...`` (conda-lock puts the prefix after ``run``): COMMAND with the env's
    bin first on PATH."""
    rest = list(argv)
    prefix = rest[rest.index("--prefix") + 1]
    del rest[rest.index("--prefix") : rest.index("--prefix") + 2]
    env = {**os.environ, "PATH": f"{prefix}/bin:{os.environ.get('PATH', '')}", "CONDA_PREFIX": prefix}
    import subprocess

    return subprocess.run(rest, env=env, check=False).returncode


def _shim_dry_run(argv: Sequence[str]) -> int:
    import rattler

    p = argparse.ArgumentParser(prog="conda create")
    p.add_argument("--prefix", required=True)
    p.add_argument("--override-channels", action="store_true")
    p.add_argument("--channel", action="append", default=[])
    p.add_argument("specs", nargs="+")
    args = p.parse_args(argv)
    subdir = os.environ.get("CONDA_SUBDIR") or str(rattler.Platform.current())
    overrides = rattler.VirtualPackageOverrides.from_env()
    virtual = [v.into_generic() for v in rattler.VirtualPackage.detect(overrides)]
    try:
        records = asyncio.run(
            rattler.solve(
                sources=args.channel, specs=args.specs, platforms=[subdir, "noarch"], virtual_packages=virtual
            )
        )
    except Exception as exc:  # conda reports any failure to plan as a JSON error on stdout
        message = f"{type(exc).__name__}: {exc}"
        print(json.dumps({"exception_name": "UnsatisfiableError", "message": message, "error": message}))
        return 1
    fetch = [json.loads(r.to_json()) for r in records]
    for rec in fetch:
        rec.setdefault("channel", rec["url"].rsplit("/", 2)[0])
    plan = {"FETCH": fetch, "LINK": fetch, "PREFIX": args.prefix}
    print(json.dumps({"actions": plan, "dry_run": True, "prefix": args.prefix, "success": True}))
    return 0
