from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from slurm import MiniCluster, available

from envbuilder.host import HostFacts, facts_from_json
from envbuilder.resolver import mirror

REPO = Path(__file__).resolve().parent.parent
DATA = REPO / "tests" / "data"
FACTS = DATA / "facts"

#: The environment plans are made in: a user on a cluster with $SCRATCH, $WORK and a project code. Tests talk
#: only to loopback addresses, so plans come from the shipped table here (no read of download.pytorch.org).
PLAN_ENV = {
    "HOME": "/home/u1",
    "USER": "u1",
    "SCRATCH": "/scratch/u1",
    "WORK": "/work/u1",
    "PROJECT": "p01",
    "ENVBUILDER_OFFLINE": "1",
}


def loopback_only(index_mirror: str) -> bool:
    """Whether every index a plan reads (download.pytorch.org's and PyPI's) is sent to 127.0.0.1 or a directory
    by ``index_mirror``: only then may a test let envbuilder read the indexes."""
    rules = {r.upstream: r.targets for r in mirror.parse(index_mirror)}
    needed = ("https://download.pytorch.org/whl/", mirror.PYPI)
    local = ("http://127.0.0.1", "/", "file://")
    return all(u in rules and all(t.startswith(local) for t in rules[u]) for u in needed)


def load_facts(name: str) -> HostFacts:
    path = FACTS / f"{name}.json"
    return facts_from_json(json.loads(path.read_text()), str(path))


@pytest.fixture
def facts():
    return load_facts


def run_cli(
    *args: str, env: dict[str, str] | None = None, check: bool = False, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """The real CLI in a child process (python -m envbuilder), as a user runs it."""
    full_env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "NO_COLOR": "1", **(env or PLAN_ENV)}
    if not loopback_only(full_env.get("ENVBUILDER_INDEX_MIRROR", "")):
        full_env.setdefault("ENVBUILDER_OFFLINE", "1")  # tests reach nothing but loopback addresses
    return subprocess.run(
        [sys.executable, "-m", "envbuilder", *args],
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=check,
        cwd=REPO,
    )


def user_env(root: Path, index_mirror: str, **extra: str) -> dict[str, str]:
    """A user's environment for the CLI, every directory a throwaway one under ``root`` (home, $SCRATCH,
    envbuilder's records, uv's cache), its indexes reached through ``index_mirror`` (ENVBUILDER_INDEX_MIRROR).
    envbuilder reads those indexes only where they are all local; otherwise it plans offline."""
    return {
        **({} if loopback_only(index_mirror) else {"ENVBUILDER_OFFLINE": "1"}),
        "PATH": os.environ["PATH"],
        "HOME": str(root / "home"),
        "NO_COLOR": "1",
        "COLUMNS": "200",
        "SCRATCH": str(root / "scratch"),
        "ENVBUILDER_HOME": str(root / "eb-home"),
        "ENVBUILDER_INDEX_MIRROR": index_mirror,
        "UV_CACHE_DIR": str(root / "uv-cache"),
        **extra,
    }


@pytest.fixture
def cli():
    return run_cli


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory: pytest.TempPathFactory):
    """One real single-node Slurm cluster (tests/slurm.py) shared by the session; skips where it cannot run."""
    reason = available()
    if reason is not None:
        pytest.skip(f"no test Slurm cluster: {reason}")
    with MiniCluster(tmp_path_factory.mktemp("slurm")) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def torch_files(tmp_path_factory):
    """torch 2.13.0 (CPU) and what it needs, plus mpi4py and MPICH, as pip finds them here (its find-links holds
    the torch file; the rest comes from PyPI)."""
    if sys.version_info[:2] != (3, 11):
        pytest.skip("the machine image's torch file is for CPython 3.11")
    d = tmp_path_factory.mktemp("torch-files")
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "-q",
            "--dest",
            str(d),
            "torch==2.13.0",
            "numpy",
            "mpi4py",
            "mpich",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if res.returncode != 0 or not list(d.glob("torch-2.13.0*cpu*.whl")):
        pytest.skip(f"the CPU torch 2.13.0 file is not on this machine (pip find-links): {res.stderr[-300:]}")
    return d


def ok(res: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    """``res``, after asserting that it succeeded (its output in the message when it did not)."""
    assert res.returncode == 0, f"exit {res.returncode}\nstdout:\n{res.stdout}\nstderr:\n{res.stderr}"
    return res


def refused(res: subprocess.CompletedProcess[str], code: int, text: str) -> None:
    """The CLI failed with exit ``code``, said ``text``, and showed no traceback."""
    assert res.returncode == code, f"exit {res.returncode}\n{res.stdout}\n{res.stderr}"
    assert text in res.stderr, res.stderr
    assert "Traceback" not in res.stderr
