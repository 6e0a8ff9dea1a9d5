"""End to end with real torch: the embedded default recipe, pointed at a local HTTP index holding the CPU build of
torch 2.13.0 that the machine image carries (and its dependencies), created, activated, imported, deactivated."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from helpers import run_cli
from wheelindex import mirror_env, serve

pytestmark = pytest.mark.integration


@pytest.fixture
def torch_index(torch_files):
    """The torch files on an index of this test's own: it reads the index's requests."""
    with serve(torch_files) as index:
        yield index


def test_local_recipe_creates_a_working_torch_env(torch_index, tmp_path):
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(tmp_path / "home"),
        "SCRATCH": str(tmp_path / "scratch"),
        "NO_COLOR": "1",
        "ENVBUILDER_HOME": str(tmp_path / "envbuilder-home"),
        "ENVBUILDER_INDEX_MIRROR": mirror_env(torch_index),
        # As on this machine and many sites: the validation after the create writes the env's bytecode all the same.
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    torch_index.requested.clear()
    res = run_cli("create", "local", "--json", env=env, timeout=900)
    assert res.returncode == 0, res.stderr
    # The recipe's upstream index, not PyPI's torch, served the wheel: the mirror was used.
    assert any(r.startswith("GET /whl/cpu/torch") for r in torch_index.requested)
    data = json.loads(res.stdout)["data"]
    prefix = tmp_path / "scratch" / "envbuilder" / "envs" / "local"
    assert data["env"]["prefix"] == str(prefix)
    versions = {p["name"]: p["version"] for p in data["env"]["packages"] if p["in_env"]}
    assert versions["torch"] == "2.13.0+cpu"
    assert "numpy" in versions
    # torch's pin carries the index's label, so torch and numpy went in through one uv run over both indexes.
    installs = [line for line in Path(data["log"]).read_text().splitlines() if " pip install " in line]
    assert len(installs) == 1 and installs[0].endswith("-- torch==2.13.0+cpu numpy"), installs
    assert "--index-strategy unsafe-best-match" in installs[0]
    assert data["env"]["validation"]["checks"]["import"]["status"] == "pass"
    # torch was imported once: by the validation's ranks, which replaced the smoke check (none in the build log).
    assert data["env"]["validation"]["kind"] == "suite" and data["validation"]["ok"]
    assert "payloads/validate.py" not in Path(data["log"]).read_text()
    assert len(list((prefix / "envbuilder" / "validation").glob("run-*"))) == 1
    # The ranks' import compiled what torch loads, so later imports (ranks, jobs) read bytecode.
    site = next(prefix.glob("lib/python3*/site-packages"))
    compiled = list((site / "torch").rglob("*.pyc"))
    assert (site / "torch" / "__pycache__").is_dir() and len(compiled) > 100, len(compiled)
    # And what DDP's constructor imports beyond torch (compiled in the background while the validation ran).
    assert list((site / "torch" / "_dynamo" / "__pycache__").glob("eval_frame.*.pyc"))
    assert not [p for p in compiled if p.stat().st_mode & 0o002]
    # uv's cache went beside the envs on $SCRATCH, and hardlinks were chosen because they share a file system.
    assert any("link mode hardlink" in n for n in data["notes"])
    assert (tmp_path / "scratch" / "envbuilder" / "uv-cache").is_dir()

    script = (
        f"source '{prefix}/bin/activate' && "
        "python -c 'import torch; x = torch.ones(3); print(torch.__version__, float((x @ x).item()))' && "
        "deactivate && command -v python"
    )
    run = subprocess.run(
        ["bash", "--noprofile", "--norc", "-c", script], env=env, capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr
    first, after = run.stdout.splitlines()[:2]
    assert first == "2.13.0+cpu 3.0"
    assert not after.startswith(str(prefix))
