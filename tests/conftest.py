from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from envbuilder.host import HostFacts, facts_from_json

REPO = Path(__file__).resolve().parent.parent
DATA = REPO / "tests" / "data"
FACTS = DATA / "facts"

#: The environment plans are made in: a user on a cluster with $SCRATCH, $WORK and a project code.
PLAN_ENV = {
    "HOME": "/home/u1",
    "USER": "u1",
    "SCRATCH": "/scratch/u1",
    "WORK": "/work/u1",
    "PROJECT": "p01",
}


def load_facts(name: str) -> HostFacts:
    path = FACTS / f"{name}.json"
    return facts_from_json(json.loads(path.read_text()), str(path))


@pytest.fixture
def facts():
    return load_facts


def run_cli(
    *args: str, env: dict[str, str] | None = None, check: bool = False
) -> subprocess.CompletedProcess[str]:
    """The real CLI in a child process (python -m envbuilder), as a user runs it."""
    full_env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "NO_COLOR": "1", **(env or PLAN_ENV)}
    return subprocess.run(
        [sys.executable, "-m", "envbuilder", *args],
        env=full_env,
        capture_output=True,
        text=True,
        timeout=120,
        check=check,
        cwd=REPO,
    )


@pytest.fixture
def cli():
    return run_cli
