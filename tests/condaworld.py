"""What the conda tests (test_conda.py, test_conda_torch.py) share: their recipe, the local channel of conda
packages built here (a python wrapping this machine's interpreter, pip, a library and a tool that embeds its
prefix), the wheel index beside it, and a user's world whose conda-forge and indexes are those."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from condachannel import (
    LONG_PLACEHOLDER,
    PLACEHOLDER,
    Package,
    build_package,
    index,
    pip_package,
    python_package,
)
from helpers import DATA, UserWorld, ok
from wheelindex import build_wheel, mirror_env

LMOD_INIT = Path("/usr/share/lmod/lmod/init/bash")
needs_lmod = pytest.mark.skipif(not LMOD_INIT.is_file(), reason="Lmod not installed (.ci/run installs it)")
PY = f"{sys.version_info[0]}.{sys.version_info[1]}"
PYTHON_VERSION = ".".join(str(v) for v in sys.version_info[:3])

RECIPE = """
schema_version = 1
[recipe]
name = "{name}"
[env]
kind = "conda"
prefix = "${{SCRATCH}}/envs/{{name}}"
[conda]
channels = ["conda-forge"]
packages = {conda}
[python]
command = "python"
version = "{py}"
[torch]
install = false
[activate]
env = {{ CDEMO = "it's set" }}
[[packages]]
name = "condademo"
spec = "condademo==1.0"
"""


def hpc_lib(ch: Path, version: str, subdir: str = "linux-64", note: str = "") -> None:
    build_package(
        ch, Package("hpc-lib", version, files={"share/hpc-lib/VERSION": f"{version}{note}\n"}, subdir=subdir)
    )


def build_channel(ch: Path) -> Path:
    """The tests' channel in ``ch``, indexed."""
    python_package(ch)
    python_package(ch, subdir="linux-aarch64")
    pip_package(ch)
    hpc_lib(ch, "1.0")
    hpc_lib(ch, "2.0")
    hpc_lib(ch, "1.5", subdir="linux-aarch64")  # aarch64 nodes get another build of the library
    tool = f'#!/bin/sh\necho "hello from {PLACEHOLDER}: hpc-lib $(cat {PLACEHOLDER}/share/hpc-lib/VERSION)"\n'
    build_package(ch, Package("hpc-hello", "0.1", files={"bin/hpc-hello": tool}, depends=["hpc-lib >=1.0,<2"],
                              prefixed=["bin/hpc-hello"], subdir="noarch"))  # fmt: skip
    # A compiled library that embeds its prefix (an RPATH, say): conda patches such files in place.
    blob = b"\x7fELF\x00\x00" + LONG_PLACEHOLDER.encode() + b"/lib\x00" + b"\x00" * 64
    build_package(ch, Package("hpc-blas", "1.0", files={"lib/libhpcblas.so": blob}, prefixed=["lib/libhpcblas.so"],
                              binary=True, placeholder=LONG_PLACEHOLDER))  # fmt: skip
    index(ch)
    return ch


def wheel_files(d: Path, torch_files: Path) -> Path:
    """The wheel index's files in ``d``: links to ``torch_files`` and condademo."""
    for f in torch_files.iterdir():
        os.link(f, d / f.name)
    build_wheel(
        d, "condademo", "1.0", {"condademo/__init__.py": "OK = True\n"}, scripts={"condademo": "condademo:OK"}
    )
    return d


@dataclass(frozen=True)
class Wheels:
    """The conda tests' indexes (conftest's ``conda_wheels``): PyPI at ``url`` (the module's: condademo and the
    torch files), download.pytorch.org at ``torch_url`` (the session's torch index, whose torch the session's uv
    cache already holds unpacked: a conda env's torch is linked from there, not unpacked again per module)."""

    url: str
    torch_url: str


def index_mirror(idx: Any) -> str:
    """ENVBUILDER_INDEX_MIRROR for ``idx``: a :class:`Wheels`' two indexes, or one test index for both."""
    if isinstance(idx, Wheels):
        return f"https://download.pytorch.org/whl/={idx.torch_url}/whl/ pypi={idx.url}/simple/"
    return mirror_env(idx)


class World(UserWorld):
    def __init__(self, root: Path, channel: Path, idx: Any, uv_cache: Path) -> None:
        super().__init__(
            root,
            f"{index_mirror(idx)} conda-forge={channel}",
            ENVBUILDER_HOME=str(root / "eb"),
            MODULEPATH=str(DATA / "modules" / "site"),
            UV_CACHE_DIR=str(uv_cache),
        )
        self.channel = channel

    def recipe(self, name: str = "cdemo", conda: tuple[str, ...] = ("hpc-hello",), extra: str = "") -> None:
        self.write_recipe(name, RECIPE.format(name=name, conda=json.dumps(list(conda)), py=PY) + extra)


def sh(cmd: str, env: dict[str, str]) -> str:
    return ok(subprocess.run(["bash", "--noprofile", "--norc", "-c", cmd], env=env, capture_output=True,
                             text=True, timeout=120)).stdout  # fmt: skip


def conda_meta(prefix: Path) -> dict[str, str]:
    out = {}
    for f in (prefix / "conda-meta").glob("*.json"):
        rec = json.loads(f.read_text())
        out[rec["name"]] = rec["version"]
    return out
