"""Plans from the live index, through the real CLI: a fixture server on 127.0.0.1 that imitates
download.pytorch.org and PyPI (tests/torchindex.py) holds a release newer than the shipped table, a variant that
was dropped, files for one architecture only and PyPI's unlabelled default builds. The plan reads each page once,
in parallel, caches it, says where its facts came from, and installs exactly the build it planned."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import ok, refused, run_cli, user_env
from torchindex import NEWEST, pytorch_like, serve, torch_mirror

from envbuilder.resolver.matrix import load_matrix, table_age

pytestmark = pytest.mark.integration

PY_TAG = f"cp{sys.version_info[0]}{sys.version_info[1]}"
PY = f"{sys.version_info[0]}.{sys.version_info[1]}.{sys.version_info[2]}"


def facts(tmp_path: Path, name: str, **values: object) -> str:
    data = {"arch": "x86_64", "glibc": "2.36", "python": PY, "gpus": [], **values}
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(data))
    return str(path)


def recipe(root: Path, name: str = "idx", version: str = "latest", variant: str = "auto") -> dict[str, str]:
    d = root / "recipes"
    d.mkdir(parents=True, exist_ok=True)
    (d / f"{name}.toml").write_text(
        f'schema_version = 1\n[recipe]\nname = "{name}"\ndescription = "index test"\n'
        '[env]\nkind = "venv"\ninstaller = "uv"\nprefix = "${SCRATCH}/envs/{name}"\n'
        '[python]\ncommand = "python3"\n'
        f'[torch]\nversion = "{version}"\nvariant = "{variant}"\npackages = ["torch"]\n'
    )
    return {"ENVBUILDER_RECIPE_PATH": str(d)}


def plan(env: dict[str, str], *args: str) -> dict:
    res = ok(run_cli("plan", *args, "--json", env=env))
    return json.loads(res.stdout)["data"]


@pytest.fixture
def server(tmp_path):
    with serve(pytorch_like(tmp_path / "files", PY_TAG)) as index:
        yield index


def test_latest_is_the_index_newest_read_once_in_parallel_then_cached(server, tmp_path):
    env = user_env(tmp_path, torch_mirror(server), **recipe(tmp_path))
    cpu = facts(tmp_path, "cpu")
    data = plan(env, "idx", "--facts", cpu)
    torch = data["torch"]
    assert torch["torch"] == NEWEST and torch["variant"] == "cpu"
    assert torch["inferred"] is True
    assert torch["requirements"] == [f"torch=={NEWEST}+cpu"]
    assert any("newer than the shipped table" in w for w in data["warnings"])
    assert any(server.url in line and "read from" in line for line in torch["facts_source"])
    assert any("shipped table" in line for line in torch["facts_source"])
    first = server.pages()
    # One request per page: every page once.
    assert len(first) == len(set(first)), first
    assert any(r.startswith("GET /simple/torch/") for r in first)

    # Within a day the answers come from the cache: no request at all.
    again = plan(env, "idx", "--facts", cpu)
    assert again["torch"]["torch"] == NEWEST
    assert server.pages() == first
    assert any("(cached)" in line for line in again["torch"]["facts_source"])
    # --refresh reads every page again.
    plan(env, "idx", "--facts", cpu, "--refresh")
    assert len(server.pages()) == 2 * len(first)


def test_offline_and_an_unreachable_index_fall_back_to_the_table_and_say_so(server, tmp_path):
    env = user_env(tmp_path, torch_mirror(server), **recipe(tmp_path))
    cpu = facts(tmp_path, "cpu")
    newest_in_table = str(max(r.version for r in load_matrix().stable_releases()))
    data = plan(env, "idx", "--facts", cpu, "--offline")
    assert server.pages() == []
    assert data["torch"]["torch"] == newest_in_table
    assert data["torch"]["requirements"] == [f"torch=={newest_in_table}"]
    assert "--offline" in data["torch"]["facts_source"][0]
    # The table's age in words, as of today (the table's as_of moves with every refresh of the facts).
    assert f"(as of {load_matrix().as_of}, {table_age()})" in data["torch"]["facts_source"][0]

    dead = user_env(
        tmp_path,
        "https://download.pytorch.org/whl/=http://127.0.0.1:9/whl/ pypi=http://127.0.0.1:9/simple/",
        **recipe(tmp_path),
    )
    res = ok(run_cli("plan", "idx", "--facts", cpu, env=dead))
    assert "Where the torch facts come from" in res.stderr + res.stdout
    assert "every index read failed" in res.stdout and "the shipped table (as of" in res.stdout


def test_a_v100_asking_for_latest_gets_the_newest_release_that_still_runs_sm70(server, tmp_path):
    env = user_env(tmp_path, torch_mirror(server), **recipe(tmp_path))
    v100 = facts(
        tmp_path,
        "v100",
        glibc="2.34",
        driver_version="560.35.05",
        max_cuda="12.6",
        gpus=[{"name": "Tesla V100-SXM2-16GB", "compute_capability": "7.0"}],
    )
    data = plan(env, "idx", "--facts", v100)
    assert (data["torch"]["torch"], data["torch"]["variant"]) == ("2.14.1", "cu126")
    assert data["torch"]["requirements"] == ["torch==2.14.1+cu126"]
    skipped = next(n for n in data["notes"] if "newer releases do not fit" in n)
    assert NEWEST in skipped and "2.15.0" in skipped

    # Asked for 2.15 outright, it is refused: no 2.15 wheel carries sm_70.
    env15 = user_env(tmp_path, torch_mirror(server), **recipe(tmp_path, version="2.15.0"))
    res = run_cli("plan", "idx", "--facts", v100, "--json", env=env15)
    assert res.returncode == 4, res.stderr
    found = {e["gate"]: e["message"] for e in json.loads(res.stdout)["errors"]}
    assert "sm_70" in found["gpu-arch"], found


def test_files_for_one_architecture_only_are_refused_for_the_other(server, tmp_path):
    env = user_env(tmp_path, torch_mirror(server), **recipe(tmp_path, version="2.14.1", variant="cu126"))
    gh200 = facts(
        tmp_path,
        "gh200",
        arch="aarch64",
        glibc="2.34",
        driver_version="580.95.05",
        gpus=[{"name": "NVIDIA GH200 480GB", "compute_capability": "9.0"}],
    )
    refused(run_cli("plan", "idx", "--facts", gh200, env=env), 4, "aarch64")


def test_create_installs_exactly_the_planned_build_through_a_url_pypi_mirror(server, tmp_path):
    """The README's `URL,pypi` mirror form, where PyPI serves its own (unlabelled CUDA) build of the same
    release: the env gets the mirror's CPU build, with and without the index read."""
    mirror = f"https://download.pytorch.org/whl/={server.url}/whl/,pypi pypi={server.url}/simple/"
    for offline in ("0", "1"):
        root = tmp_path / f"offline{offline}"
        env = user_env(
            root, mirror, ENVBUILDER_OFFLINE=offline, **recipe(root, version="2.15.0", variant="cpu")
        )
        res = ok(run_cli("create", "idx", "--no-validate", "--json", env=env, timeout=300))
        versions = {p["name"]: p["version"] for p in json.loads(res.stdout)["data"]["env"]["packages"]}
        assert versions["torch"] == "2.15.0+cpu", offline
        python = root / "scratch" / "envs" / "idx" / "bin" / "python"
        shown = subprocess.run(
            [str(python), "-c", "import torch; print(torch.version.cuda)"], capture_output=True, text=True
        )
        assert shown.stdout.strip() == "None"


def test_recipes_show_explain_says_which_facts_came_from_the_index_and_which_from_the_table(server, tmp_path):
    env = user_env(tmp_path, torch_mirror(server), **recipe(tmp_path))
    data = json.loads(ok(run_cli("recipes", "show", "idx", "--explain", "--json", env=env)).stdout)["data"]
    lines = data["torch_facts"]
    assert any(
        line.startswith("https://download.pytorch.org/whl/cpu: ") and server.url in line for line in lines
    )
    assert any("GPU arch lists, driver floors" in line and "shipped table" in line for line in lines)
    assert any(NEWEST in line and "newer than the shipped table" in line for line in lines)
    fresh = {**env, "ENVBUILDER_HOME": str(tmp_path / "no-cache")}
    text = ok(run_cli("recipes", "show", "idx", "--explain", "--offline", env=fresh)).stdout
    assert "Where the torch facts come from" in text
    assert "the shipped table (as of" in text and "--offline" in text
