"""`envbuilder doctor` through the real CLI: envs created for real (small wheels from a local index) or recorded
with envbuilder.system.state beside files laid out like an env's; another node's facts; LD_LIBRARY_PATH shadowing; the
index (tests/torchindex.py on 127.0.0.1) knowing a newer torch, a pruned nightly and a lock's vanished file.

Every test either reads no index (ENVBUILDER_OFFLINE=1) or points the mirror at the local fixture server."""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import shutil
import sys
import time
from pathlib import Path

import pytest
from helpers import UserWorld, ok, refused
from torchindex import NEWEST, NIGHTLIES, NIGHTLY_PRUNED, TorchIndex, build_torch_wheel, serve, torch_mirror
from wheelindex import build_wheel, mirror_env
from wheelindex import serve as serve_wheels

from envbuilder import lockfile
from envbuilder.build import lockers
from envbuilder.resolver.matrix import load_matrix
from envbuilder.system import state

pytestmark = pytest.mark.integration

PY = ".".join(map(str, sys.version_info[:3]))
CP = f"cp{sys.version_info[0]}{sys.version_info[1]}"
CU130 = "https://download.pytorch.org/whl/cu130"
NIGHTLY = "https://download.pytorch.org/whl/nightly/cu130"

TORCH_RECIPE = """
schema_version = 1
[recipe]
name = "{name}"
[env]
kind = "venv"
installer = "uv"
[python]
command = "python3"
[torch]
version = "{version}"
variant = "cu130"
channel = "{channel}"
packages = ["torch"]
"""


def newest_cu130() -> str:
    rels = [r for r in load_matrix().stable_releases() if "cu130" in r.variants["x86_64"]]
    return max(rels, key=lambda r: r.version).torch


def node(tmp_path: Path, name: str, driver: str, gpu="NVIDIA H100 80GB HBM3", cc="9.0") -> str:
    """A facts file for a node (what `envbuilder probe --json` reports, saved by an admin)."""
    path = tmp_path / f"{name}.json"
    path.write_text(
        json.dumps(
            {
                "arch": "x86_64",
                "glibc": "2.34",
                "driver_version": driver,
                "max_cuda": "13.0" if driver.startswith("58") else "12.4",
                "gpus": [{"name": gpu, "compute_capability": cc}],
                "hostname": name,
            }
        )
    )
    return str(path)


class Site(UserWorld):
    """A user's world: recipes, the envbuilder home, $SCRATCH, and envs laid out on disk with their records."""

    def torch_env(
        self, name: str, version: str, channel: str = "stable", libs: dict[str, list[str]] | None = None
    ) -> Path:
        """A cu130 env as create leaves it (python, activate, the CUDA library wheels' files), and its record."""
        self.write_recipe(name, TORCH_RECIPE.format(name=name, version=version, channel=channel))
        prefix = self.root / "scratch" / "envs" / name
        (prefix / "bin").mkdir(parents=True)
        (prefix / "bin" / "python").symlink_to(sys.executable)
        (prefix / "bin" / "activate").write_text("")
        site = prefix / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"
        for sub, names in (libs or {"nvidia/nccl/lib": ["libnccl.so.2"]}).items():
            (site / sub).mkdir(parents=True)
            for lib in names:
                (site / sub / lib).write_bytes(b"")
        index = NIGHTLY if channel == "nightly" else CU130
        record = state.EnvRecord(
            name=name,
            recipe=name,
            recipe_digest="sha256:00",
            prefix=str(prefix),
            created="2026-11-01T12:00:00+0000",
            plan={
                "kind": "venv",
                "recipe_version": "",
                "torch": {"torch": version, "variant": "cu130", "channel": channel, "index_url": index},
                "activate": {"modules": [], "module_use": [], "env": {}, "unset": []},
                "target": {"arch": "x86_64"},
            },
            packages=({"name": "nvidia-nccl-cu13", "version": "2.27.3", "in_env": True},),
            tools={"python": PY, "python_path": sys.executable, "installer": "uv"},
        )
        state.save(self.home, record)
        return prefix

    def doctor(self, *args: str, **extra: str):
        return self.cli("doctor", *args, **extra)


@pytest.fixture
def site(tmp_path):
    return Site(tmp_path, ENVBUILDER_OFFLINE="1")


# ---------------------------------------------------------------------------------------------------------------
# Another node's facts


def test_an_older_driver_makes_a_recorded_cu130_env_need_action(site, tmp_path):
    site.torch_env("gpu", newest_cu130())
    old = node(tmp_path, "after-downgrade", "550.54.15")
    res = site.doctor("--facts", old, COLUMNS="80")
    refused(res, 14, "1 finding needs action")
    # Rows wrap at 80 columns: read the report as one text.
    text = " ".join(res.stdout.split())
    assert "(another node: this shell is not checked)" in text
    assert "node: x86_64, glibc 2.34, driver 550.54.15 (CUDA 12.4), GPUs 1× NVIDIA H100" in text
    assert f"ACTION gpu torch {newest_cu130()} cu130 does not fit this node (driver)" in text
    assert "550.54.15" in text
    assert "LD_LIBRARY_PATH" not in res.stdout  # another node: this shell is not checked
    assert max(len(line) for line in res.stdout.splitlines()) <= 80

    data = json.loads(site.doctor("--facts", old, "--json").stdout)
    assert data["status"] == "error" and data["errors"][0]["exit_code"] == 14
    assert data["errors"][0]["family"] == "doctor"
    [action] = [f for f in data["data"]["findings"] if f["severity"] == "action"]
    assert (action["subject"], action["check"], action["gate"]) == ("gpu", "replan", "driver")
    assert data["data"]["facts"]["driver_version"] == "550.54.15"
    assert data["data"]["facts_from"].startswith(f"{old} (another node")

    fine = node(tmp_path, "today", "580.95.05")
    res = ok(site.doctor("--facts", fine))
    assert "still resolves the same" in " ".join(res.stdout.split())


def test_a_v100_node_has_no_code_in_the_wheel(site, tmp_path):
    site.torch_env("gpu", newest_cu130())
    v100 = node(tmp_path, "v100", "580.95.05", gpu="Tesla V100-SXM2-32GB", cc="7.0")
    res = site.doctor("gpu", "--facts", v100, "--json")
    assert res.returncode == 14, res.stderr
    [action] = [f for f in json.loads(res.stdout)["data"]["findings"] if f["severity"] == "action"]
    assert action["gate"] == "gpu-arch" and "sm_70" in action["message"]


# ---------------------------------------------------------------------------------------------------------------
# This shell


def test_ld_library_path_shadowing_is_reported_with_its_fix(site, tmp_path):
    prefix = site.torch_env("gpu", newest_cu130())
    stale = tmp_path / "opt" / "nccl-2.21" / "lib"
    stale.mkdir(parents=True)
    for name in ("libnccl.so.2", "libnccl.so.2.21.5"):
        (stale / name).write_bytes(b"")
    res = site.doctor("gpu", "--json", LD_LIBRARY_PATH=f"/nonexistent:{stale}")
    assert res.returncode == 14, res.stderr
    libs = [f for f in json.loads(res.stdout)["data"]["findings"] if f["check"] == "libraries"]
    assert [f["severity"] for f in libs] == ["action"]
    assert f"libnccl.so.2 would load from {stale} (2.21.5, older than the env's 2.27.3)" in libs[0]["message"]
    assert str(next(prefix.glob("lib/python*/site-packages/nvidia/nccl/lib"))) in libs[0]["message"]
    assert libs[0]["fix"] == f"take {stale} out of LD_LIBRARY_PATH before activating the env"

    # Without it on the path, the env's own copy loads.
    res = site.doctor("gpu", "--json")
    libs = [f for f in json.loads(res.stdout)["data"]["findings"] if f["check"] == "libraries"]
    assert [f["severity"] for f in libs] == ["info"]


def test_a_python_that_is_gone_and_a_recipe_that_is_gone(site, tmp_path):
    prefix = site.torch_env("gpu", newest_cu130())
    record = state.load(site.home, "gpu")
    gone = str(tmp_path / "apps" / "python" / "3.9" / "bin" / "python3")
    state.save(site.home, dataclasses.replace(record, tools={**record.tools, "python_path": gone}))
    (site.recipes / "gpu.toml").unlink()
    res = site.doctor("--facts", node(tmp_path, "n", "580.95.05"), "--json")
    assert res.returncode == 14, res.stderr
    found = {f["check"]: f for f in json.loads(res.stdout)["data"]["findings"] if f["subject"] == "gpu"}
    assert found["python"]["severity"] == "action" and gone in found["python"]["message"]
    assert (
        found["replan"]["severity"] == "warning" and "its recipe 'gpu' is gone" in found["replan"]["message"]
    )
    assert prefix.is_dir()  # doctor changes nothing


def test_an_unknown_env_is_a_state_error(site):
    refused(site.doctor("nope"), 9, "no env named 'nope'")


# ---------------------------------------------------------------------------------------------------------------
# An env created for real: clean, then close to the purge, then gone


SMALL = """
schema_version = 1
[recipe]
name = "demo"
[env]
kind = "venv"
installer = "uv"
prefix = "${SCRATCH}/envs/{name}"
[python]
command = "python3"
[torch]
install = false
[[packages]]
name = "ebdemo"
spec = "ebdemo==1.0"
[filesystems.scratch]
path = "${SCRATCH}"
purge_days = 10
touch_allowed = false
"""


@pytest.fixture(scope="module")
def small_index(tmp_path_factory):
    d = tmp_path_factory.mktemp("small")
    build_wheel(d, "ebdemo", "1.0", {"ebdemo/__init__.py": "VERSION = '1.0'\n"})
    with serve_wheels(d) as idx:
        yield idx


def test_a_created_env_is_clean_then_near_the_purge_then_gone(tmp_path, small_index):
    site = Site(tmp_path, mirror_env(small_index), ENVBUILDER_OFFLINE="1")
    site.write_recipe("demo", SMALL)
    ok(site.cli("create", "demo", "--no-validate", timeout=300))
    prefix = tmp_path / "scratch" / "envs" / "demo"
    res = ok(site.doctor("demo", "--json"))
    data = json.loads(res.stdout)
    assert data["status"] == "ok" and data["data"]["envs"] == ["demo"]
    [purge] = [f for f in data["data"]["findings"] if f["check"] == "purge"]
    assert purge["severity"] == "warning" and purge["fix"] == "envbuilder backup demo"

    # Unread for 8 of its 10 days: two days left and no backup.
    old = time.time() - 8 * 86400
    for path in prefix.rglob("*"):
        if path.is_file() and not path.is_symlink():
            os.utime(path, (old, path.stat().st_mtime))
    res = site.doctor("demo")
    refused(res, 14, "needs action")
    text = " ".join(res.stdout.split())
    assert "scratch purges files unread for 10 days: the purge reaches it in 2 days" in text
    assert "fix: envbuilder backup demo" in text

    shutil.rmtree(prefix)
    res = site.doctor("demo", "--json")
    assert res.returncode == 14
    [health] = [f for f in json.loads(res.stdout)["data"]["findings"] if f["check"] == "health"]
    assert "the env is gone" in health["message"]
    assert health["fix"] == "envbuilder create demo (there is no backup)"


# ---------------------------------------------------------------------------------------------------------------
# What the index says (the fixture server on 127.0.0.1)


@pytest.fixture(scope="module")
def index_layout(tmp_path_factory):
    """cu130 with the table's newest release and one newer (NEWEST); the nightly root without NIGHTLY_PRUNED."""
    out = tmp_path_factory.mktemp("torchfiles")
    index = TorchIndex()
    tag = f"{CP}-{CP}-manylinux_2_28_x86_64"
    for version in (newest_cu130(), NEWEST):
        wheel = build_torch_wheel(out / "cu130", version, "cu130", "13.0", "sm_80 sm_90", tag=tag)
        index.add("whl/cu130", wheel)
        index.add("simple", build_torch_wheel(out / "pypi", version, "", "13.0", "sm_80 sm_90", tag=tag))
    for nightly in NIGHTLIES:
        index.add(
            "whl/nightly/cu130", build_torch_wheel(out / "n", nightly, "cu130", "13.0", "sm_90", tag=tag)
        )
    return index


@pytest.fixture
def served(index_layout):
    index_layout.requested.clear()
    with serve(index_layout) as index:
        yield index


def test_the_index_knows_a_newer_torch_and_a_pinned_nightly_has_left_it(tmp_path, served):
    site = Site(tmp_path, torch_mirror(served))
    site.torch_env("gpu", newest_cu130())
    site.torch_env("nightly", NIGHTLY_PRUNED, channel="nightly")
    site.torch_env("fresh", NIGHTLIES[-1], channel="nightly")
    res = site.doctor("--facts", node(tmp_path, "n", "580.95.05"), "--json")
    assert res.returncode == 14, res.stderr
    findings = json.loads(res.stdout)["data"]["findings"]
    assert any("GET /whl/cu130/torch/" in r for r in served.requested)
    [table] = [f for f in findings if f["check"] == "table"]
    assert table["severity"] == "warning" and f"the index has torch {NEWEST}," in table["message"]
    actions = [f for f in findings if f["severity"] == "action"]
    assert [f["subject"] for f in actions] == ["nightly"]
    assert NIGHTLY_PRUNED in actions[0]["message"]
    assert not [f for f in findings if f["subject"] == "fresh" and f["severity"] != "info"]

    # --offline reads nothing: the day-old cache answers. --refresh reads again.
    served.requested.clear()
    res = site.doctor("--facts", node(tmp_path, "n", "580.95.05"), "--offline", "--json")
    assert served.requested == []
    [table] = [f for f in json.loads(res.stdout)["data"]["findings"] if f["check"] == "table"]
    assert f"the index has torch {NEWEST}," in table["message"]
    site.doctor("--facts", node(tmp_path, "n", "580.95.05"), "--refresh", "--json")
    assert "GET /whl/nightly/cu130/torch/ json" in served.requested


def test_a_lock_whose_torch_file_left_its_index(tmp_path, served):
    site = Site(tmp_path, torch_mirror(served))
    version = newest_cu130()
    site.torch_env("gpu", version)
    there = f"torch-{version}+cu130-{CP}-{CP}-manylinux_2_28_x86_64.whl"
    gone = f"torch-{version}+cu130-{CP}-{CP}-manylinux_2_17_x86_64.whl"
    files = tuple(lockfile.LockedFile(f"{CU130}/{n.replace('+', '%2B')}", "0" * 64) for n in (there, gone))
    inputs = {"index_flags": ["--index-url", CU130], "channel": "stable"}
    platform = lockfile.PlatformLock(
        "x86_64", "x86_64-manylinux_2_28", inputs, (lockfile.LockedPackage("torch", version, "wheel", files),)
    )
    lock = lockfile.Lock("gpu", "", "00", "venv", "uv", "2026-11-01", "test", (platform,))
    lockers.write(lock, lockfile.user_path(site.home, "gpu"))
    res = site.doctor("gpu", "--facts", node(tmp_path, "n", "580.95.05"), "--json")
    assert res.returncode == 14, res.stderr
    [found] = [f for f in json.loads(res.stdout)["data"]["findings"] if f["check"] == "lock"]
    assert found["severity"] == "action" and gone in found["message"] and there not in found["message"]
    assert found["fix"].startswith("make a new lock (envbuilder lock gpu)")


# ---------------------------------------------------------------------------------------------------------------
# The shipped table's own age, row by row


def test_doctor_names_the_shipped_table_rows_last_checked_more_than_90_days_ago(site, tmp_path):
    today = datetime.date.today()
    old = [
        r.torch
        for r in load_matrix().stable_releases()
        if (today - datetime.date.fromisoformat(r.checked)).days > 90
    ]
    res = ok(site.doctor("--facts", node(tmp_path, "n", "580.95.05"), "--json"))
    rows = [f for f in json.loads(res.stdout)["data"]["findings"] if f["check"] == "table-rows"]
    releases = [f for f in rows if " release rows of the shipped table " in f["message"]]
    if not old:
        assert releases == []
        return
    [found] = releases
    assert (found["severity"], found["subject"]) == ("warning", "node")
    assert found["message"].startswith(
        f"{len(old)} release rows of the shipped table were last checked more than 90"
    )
    assert old[0] in found["message"] and old[-1] in found["message"]
    text = " ".join(ok(site.doctor("--facts", node(tmp_path, "n", "580.95.05"))).stdout.split())
    assert "release rows of the shipped table were last checked more than 90 days ago" in text
