"""Backups of a real torch env (torch 2.13.0 CPU and small test wheels from a local index, built with real uv):
backed up, restored offline with the index gone, restored elsewhere, stored once for sibling envs, damaged as a
purge would, and backups and restores killed mid-way."""

from __future__ import annotations

import json
import os
import random
import subprocess
from pathlib import Path

import pytest
from backupworld import World, digests
from helpers import kill_at, ok, size_now

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tworld(tmp_path_factory, backup_index, torch_index, torch_uv_cache):
    """One torch env for the module. torch comes from the session's torch index (the rest from the module's), so
    uv links it from the session's cache instead of unpacking it again."""
    w = World(tmp_path_factory.mktemp("tworld"), backup_index)
    w.env["ENVBUILDER_INDEX_MIRROR"] = (
        f"https://download.pytorch.org/whl/={torch_index.url}/whl/ pypi={backup_index.url}/simple/"
    )
    w.env["UV_CACHE_DIR"] = str(torch_uv_cache)
    ok(w.cli("create", w.torch("tbk"), "--no-validate"))
    return w


# ---------------------------------------------------------------------------------------------------------------
# Round trips


def test_torch_round_trip_offline_same_packages_and_hashes(tworld, tmp_path):
    w = tworld
    before = digests(w.prefix("tbk"))
    assert {"torch", "numpy", "ebdata", "ebtool"} <= set(before)
    made = w.data("backup", "tbk")
    assert made["mode"] == "wheelhouse" and made["packages"] == len(before)
    assert made["new_bytes"] == made["bytes"] > 100 * 2**20  # torch, compressed
    listed = w.data("backups", "tbk")
    assert [b["id"] for b in listed][-1] == made["id"]

    subprocess.run(["rm", "-rf", str(w.prefix("tbk"))], check=True)  # as the purge would
    rows = {r["name"]: r for r in w.data("list")}
    assert rows["tbk"]["health"]["status"] == "gone"
    assert rows["tbk"]["advice"] == "envbuilder restore tbk"

    # No index at all: the mirror points nowhere and uv's cache is new and empty.
    res = ok(
        w.cli(
            "restore",
            "tbk",
            "--json",
            ENVBUILDER_INDEX_MIRROR="https://download.pytorch.org/whl/=http://127.0.0.1:9/ pypi=http://127.0.0.1:9/",
            UV_CACHE_DIR=str(tmp_path / "empty-uv-cache"),
        )
    )
    data = json.loads(res.stdout)["data"]
    assert data["status"] == "restored"
    assert "uv's cache cannot serve this env; restoring from the wheelhouse" in Path(data["log"]).read_text()
    assert data["env"]["origin"]["backup"] == made["id"]
    assert data["env"]["validation"]["checks"]["import"]["status"] == "pass"
    # tbk was created with --no-validate: no import of torch on record, so the restore imported it.
    assert data["import_proven"] is None and "validate.py" in Path(data["log"]).read_text()
    assert digests(w.prefix("tbk")) == before
    assert w.python("tbk", "import torch, ebdata; print(torch.__version__, float(torch.ones(3).sum()))") == (
        "2.13.0+cpu 3.0"
    )
    # Non-package files came back where the wheel put them; the console script and the data script run.
    assert (w.prefix("tbk") / "share" / "ebdata" / "table.txt").read_text() == "row 1\nrow 2\n"
    for script, word in (("ebtool", "ebtool from"), ("ebdata-run", "ebdata-run in")):
        run = subprocess.run([str(w.prefix("tbk") / "bin" / script)], capture_output=True, text=True)
        assert run.stdout.strip() == f"{word} {w.prefix('tbk')}", run.stderr
    assert w.data("list")[0]["health"]["status"] == "ok"


def test_restore_to_a_new_prefix_under_a_new_name(tworld):
    w = tworld
    if not list(w.backups.glob("envs/tbk/*/backup.json")):
        ok(w.cli("backup", "tbk"))
    elsewhere = w.root / "elsewhere" / "tbk copy"
    # uv's cache still holds what tbk was built from (as a warm create would use): restored from it with --offline
    # (uv asks no index), and every package's digest checked against the backup.
    res = ok(w.cli("restore", "tbk", "--prefix", str(elsewhere), "--name", "tbk2", "--no-validate", "--json"))
    log = Path(json.loads(res.stdout)["data"]["log"]).read_text()
    assert "packages from uv's cache; every digest equals the backup's" in log
    assert w.python("tbk2", "import sys, torch; print(sys.prefix)", prefix=elsewhere) == str(elsewhere)
    assert digests(elsewhere) == digests(w.prefix("tbk"))
    run = subprocess.run([str(elsewhere / "bin" / "ebtool")], capture_output=True, text=True)
    assert run.stdout.strip() == f"ebtool from {elsewhere}"
    shown = w.data("show", "tbk2")
    assert shown["prefix"] == str(elsewhere) and shown["health"]["status"] == "ok"
    # A second restore to the same place refuses to overwrite without --force.
    res = w.cli("restore", "tbk", "--prefix", str(elsewhere), "--name", "tbk2", "--no-validate")
    assert res.returncode == 9 and "--force" in res.stderr


def test_restore_imports_torch_again_only_where_the_node_differs_or_when_asked(tworld, tmp_path):
    w = tworld
    if not list(w.backups.glob("envs/tbk/*/backup.json")):
        ok(w.cli("backup", "tbk"))

    def restore(name: str, source: str, *args: str, **extra: str) -> dict:
        prefix = w.root / "again" / name
        res = ok(w.cli("restore", source, "--prefix", str(prefix), "--name", name, "--json", *args, **extra))
        data = json.loads(res.stdout)["data"]
        data["imported"] = "validate.py" in Path(data["log"]).read_text()  # the import check ran in the env
        return data

    # Asked for: the import runs, and the restored env's record now holds its passing import.
    asked = restore("tbk-asked", "tbk", "--check-import")
    assert asked["imported"] and asked["import_proven"] is None
    assert asked["env"]["validation"]["checks"]["import"]["status"] == "pass"
    ok(w.cli("backup", "tbk-asked"))
    # The same node, the files hashed as backed up, a passing import on record: not imported again, and why.
    same = restore("tbk-same", "tbk-asked")
    assert not same["imported"] and "this node shares" in same["import_proven"]
    assert same["env"]["validation"]["checks"]["import"]["status"] == "pass"
    # This node now shows a GPU (the stand-in nvidia-smi, as on a GPU node): not the kind of node it imported on.
    shim = tmp_path / "bin"
    shim.mkdir()
    (shim / "nvidia-smi").symlink_to(REPO / "tests" / "shims" / "nvidia-smi")
    gpus = tmp_path / "gpus.json"
    gpus.write_text(
        json.dumps({"driver": "580.159.04", "cuda": "13.0", "gpus": [{"name": "NVIDIA H200", "cc": "9.0"}]})
    )
    path = f"{shim}:{w.env.get('PATH', os.environ['PATH'])}"
    other = restore("tbk-gpu", "tbk-asked", PATH=path, NVIDIA_SMI_SHIM=str(gpus))
    assert other["imported"] and other["import_proven"] is None
    assert other["env"]["validation"]["checks"]["import"]["status"] == "pass"


def test_sibling_envs_store_torch_once(tworld):
    w = tworld
    ok(w.cli("backup", "tbk"))
    one = w.store_bytes()
    # A second env from the same recipe at another prefix (different script headers, same wheels).
    ok(w.cli("create", w.torch("tbk-sib"), "--no-validate"))
    made = w.data("backup", "tbk-sib")
    assert made["new_bytes"] == 0
    assert w.store_bytes() == one


@pytest.mark.parametrize("point", ["backup directory made", "torch half written", "torch stored"])
def test_killed_backup_leaves_earlier_backups_intact(tworld, point):
    w = tworld
    if not w.data("backups", "tbk"):
        ok(w.cli("backup", "tbk"))
    before = [b["id"] for b in w.data("backups", "tbk")]
    # A copy of the backup root, to kill a backup in.
    root = w.root / ("killed-" + point.replace(" ", "-"))
    for b in w.backups.glob("envs/tbk/*"):
        (root / "envs" / "tbk").mkdir(parents=True, exist_ok=True)
        subprocess.run(["cp", "-a", str(b), str(root / "envs" / "tbk" / b.name)], check=True)
    subprocess.run(["cp", "-a", str(w.backups / "store"), str(root / "store")], check=True)
    torch_blob = next(
        x["path"]
        for x in json.loads(next(root.glob("envs/tbk/*/backup.json")).read_text())["wheels"]
        if x["name"] == "torch"
    )
    # Every wheel is written again (the same bytes: packing is deterministic), so the run lasts.
    for blob in root.glob("store/*/[!.]*"):
        blob.unlink()
    conditions = {
        "backup directory made": lambda: bool(list(root.glob("envs/tbk/.partial-*"))),
        "torch half written": lambda: any(size_now(p) > 20_000_000 for p in root.glob("store/*/.*.tmp-*")),
        "torch stored": (root / torch_blob).exists,
    }
    proc = w.spawn("backup", "tbk", "--to", str(root))
    kill_at(proc, conditions[point], f"the kill point ({point})")
    listed = json.loads(ok(w.cli("backups", "tbk", "--from", str(root), "--json")).stdout)["data"]
    assert [b["id"] for b in listed] == before  # nothing partial is listed
    # The next backup clears what the killed one left and succeeds; the mutex of the dead process is broken.
    ok(w.cli("backup", "tbk", "--to", str(root), "--wait", "0"))
    assert list(root.glob("envs/tbk/.partial-*")) == [] and list(root.glob("store/*/.*.tmp-*")) == []
    for b in json.loads(ok(w.cli("backups", "tbk", "--from", str(root), "--json")).stdout)["data"]:
        ok(w.cli("verify-backup", b["id"], "--from", str(root)))


@pytest.mark.parametrize("point", ["env being created", "torch being installed"])
def test_killed_restore_leaves_the_previous_state(tworld, point):
    w = tworld
    if not w.data("backups", "tbk"):
        ok(w.cli("backup", "tbk"))
    target = w.root / ("restore-" + point.replace(" ", "-")) / "tbk"
    partial = lambda: list(target.parent.glob(".tbk.partial-[0-9]*"))  # noqa: E731
    conditions = {
        "env being created": lambda: any((p / "pyvenv.cfg").exists() for p in partial()),
        "torch being installed": lambda: any(
            list(p.glob("lib/python*/site-packages/torch/lib")) for p in partial()
        ),
    }
    name = "tbk-" + point.split()[0]  # one env per name: each kill point restores its own
    proc = w.spawn("restore", "tbk", "--prefix", str(target), "--name", name, "--no-validate")
    kill_at(proc, conditions[point], f"the kill point ({point})")
    assert not target.exists()  # never half an env at the target
    res = ok(w.cli("restore", "tbk", "--prefix", str(target), "--name", name, "--no-validate", "--wait", "0"))
    assert "interrupted" in res.stderr  # the leftovers were named as they were removed
    assert list(target.parent.glob(".tbk.*")) == []
    assert digests(target) == digests(w.prefix("tbk"))


def test_purge_simulation_damage_is_reported_and_restore_repairs(tworld):
    w = tworld
    if not w.data("backups", "tbk"):
        ok(w.cli("backup", "tbk"))
    files = sorted(p for p in w.prefix("tbk").rglob("*") if p.is_file() and not p.is_symlink())
    doomed = random.Random(42).sample(files, k=len(files) // 20)  # noqa: S311 - a repeatable choice
    for p in doomed:
        p.unlink()
    row = next(r for r in w.data("list") if r["name"] == "tbk")
    assert row["health"]["status"] == "damaged"
    assert row["advice"] == "envbuilder restore tbk --force"
    res = w.cli("backup", "tbk")  # a damaged env is not backed up over the good backups
    assert res.returncode == 12 and "damaged" in res.stderr
    res = w.cli("restore", "tbk", "--no-validate")
    assert res.returncode == 9 and "damaged" in res.stderr and "--force" in res.stderr
    ok(w.cli("restore", "tbk", "--force"))
    row = next(r for r in w.data("list") if r["name"] == "tbk")
    assert row["health"]["status"] == "ok"
    # An installer's record of where a package came from (uv's uv_cache.json, PEP 610's direct_url.json) is not
    # part of the package: a restore from the wheelhouse installs from other files and writes its own, or none.
    provenance = ("uv_cache.json", "direct_url.json")
    lost = [p for p in doomed if "__pycache__" not in p.parts and p.name not in provenance and not p.exists()]
    assert not lost, lost
