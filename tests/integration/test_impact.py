"""`envbuilder impact` through the real CLI: the shipped recipes and a signed registry (published here with real
ssh-keygen keys) re-planned for a node's facts before and after a driver upgrade, a driver downgrade, an OS
upgrade and a module tree that drops a module; a record a user shared with `envbuilder share`; the wheel index
read from the fixture server on 127.0.0.1 (tests/torchindex.py), where cu126 is gone from torch 2.15.

Every test reads no index (ENVBUILDER_OFFLINE=1) or points the mirror at the local fixture server."""

from __future__ import annotations

import json
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pngread
import pytest
from helpers import DATA, UserWorld, ok, refused
from test_report_page import chromium, counter, dom_of, needs_browser
from torchindex import pytorch_like, serve, torch_mirror

from envbuilder.recipe.catalog import Catalog, Layer, builtin_dir
from envbuilder.render.report_md import cell
from envbuilder.system import modules, state

pytestmark = pytest.mark.integration
SSH_KEYGEN = shutil.which("ssh-keygen")
PY = ".".join(map(str, sys.version_info[:3]))
CP = f"cp{sys.version_info[0]}{sys.version_info[1]}"
A100 = json.loads((DATA / "facts" / "a100-sxm4-x4.json").read_text())
#: The drivers of the tests: a CUDA 13 one, a 12.x one (CUDA 13 wheels do not run there) and an 11.x one.
D580 = {"driver_version": "580.65.06", "max_cuda": "13.0"}
D550 = {"driver_version": "550.54.15", "max_cuda": "12.4"}
D470 = {"driver_version": "470.57.02", "max_cuda": "11.4"}

PINNED = """
schema_version = 1
[recipe]
name = "{name}"
description = "impact test"
[env]
kind = "venv"
installer = "uv"
prefix = "${{SCRATCH}}/envs/{{name}}"
[python]
command = "python3"
version = "{py}"
[torch]
version = "{version}"
variant = "{variant}"
packages = ["torch"]
{modules}
"""


def node(tmp_path: Path, name: str, **changes: Any) -> str:
    """A node's facts as `envbuilder probe --json` saved them, edited by an admin for a planned change."""
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps({**A100, "python": PY, **changes}))
    return str(path)


def rows(data: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {s["subject"]: s for s in data["subjects"]}


class Site(UserWorld):
    def impact(self, *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
        return self.cli("impact", *args, **extra)

    def report(self, *args: str, code: int = 0, **extra: str) -> dict[str, Any]:
        """The ``data`` of ``impact --json``, which exits ``code``."""
        res = self.impact(*args, "--json", **extra)
        assert res.returncode == code, f"exit {res.returncode}\n{res.stdout}\n{res.stderr}"
        return json.loads(res.stdout)["data"]


@pytest.fixture
def site(tmp_path):
    return Site(tmp_path, ENVBUILDER_OFFLINE="1")


# ---------------------------------------------------------------------------------------------------------------
# The shipped recipes (no registry named), from the shipped table


def test_a_driver_upgrade_changes_what_an_auto_recipe_plans_and_breaks_nothing(site, tmp_path):
    before = node(tmp_path, "d550", **D550)
    after = node(tmp_path, "d580", **D580)
    data = site.report("--facts", after, "--before", before)
    assert data["breaks"] is False and data["counts"]["BREAKS"] == 0
    assert any("ENVBUILDER_OFFLINE=1" in n for n in data["notes"])
    found = rows(data)
    # `local` asks for torch.variant = "auto": the CUDA 13 driver gets CUDA 13 wheels.
    local = found["local"]
    assert local["status"] == "CHANGES", local
    assert " cu12" in local["before"]["build"] and " cu13" in local["after"]["build"], local
    assert local["why"] == f"{local['before']['build']} -> {local['after']['build']}"
    # The recipes that pin a CUDA 12 variant plan the same build on the newer driver.
    for name in ("frontera-venv-cu126", "stampede3-venv-cu126", "lonestar6-venv-cu128"):
        assert found[name]["status"] == "UNAFFECTED", found[name]
        assert found[name]["before"]["build"] == found[name]["after"]["build"]
    assert all(s["source"] == "shipped" for s in data["subjects"])


def test_an_old_driver_breaks_cuda_12_recipes_with_the_driver_floor_and_exits_16(site, tmp_path):
    before = node(tmp_path, "d580", **D580)
    after = node(tmp_path, "d470", **D470)
    res = site.impact("--facts", after, "--before", before, COLUMNS="80")
    refused(res, 16, "error: the change breaks")
    assert max(len(line) for line in res.stdout.splitlines()) <= 80, res.stdout
    text = " ".join(res.stdout.split())
    # A long path is cut where the line ends: compared without the breaks.
    assert f"before:{before}" in "".join(res.stdout.split()) and "driver 470.57.02 (CUDA 11.4)" in text
    assert re.search(r"^BREAKS +frontera-venv-cu126 +driver floor: cu126 wheels need", res.stdout, re.M)

    envelope = json.loads(site.impact("--facts", after, "--before", before, "--json").stdout)
    assert envelope["status"] == "error" and envelope["command"] == "impact"
    assert (envelope["errors"][0]["exit_code"], envelope["errors"][0]["family"]) == (16, "impact")
    data = envelope["data"]
    assert data["breaks"] is True
    broken = {name: s for name, s in rows(data).items() if s["status"] == "BREAKS"}
    assert {"frontera-venv-cu126", "lonestar6-venv-cu128", "zurada-conda-cu128"} <= set(broken)
    for s in broken.values():
        assert s["after"]["reasons"][0]["cause"] == "driver floor", s
        assert "470.57.02" in s["after"]["reasons"][0]["message"]
        assert s["before"]["reasons"] == [] and s["before"]["build"]
    # The table lists what breaks first.
    assert data["subjects"][0]["status"] == "BREAKS"


def test_an_os_upgrade_fixes_the_glibc_gate_and_a_new_module_tree_breaks_what_loads_a_retired_module(
    site, tmp_path
):
    old_os = node(tmp_path, "el7", glibc="2.17", **D580)
    new_os = node(tmp_path, "el9", glibc="2.34", **D580)
    data = site.report("--facts", new_os, "--before", old_os)
    found = rows(data)
    fixed = found["frontera-venv-cu126"]
    assert fixed["status"] == "FIXED", fixed
    assert (
        fixed["before"]["reasons"][0]["cause"] == "glibc"
        and "2.17" in fixed["before"]["reasons"][0]["message"]
    )
    # lonestar6's site file says glibc 2.28: the node's facts, not the site file, decide what the node runs.
    assert found["lonestar6-venv-cu128"]["status"] == "FIXED", found["lonestar6-venv-cu128"]
    assert data["counts"]["BREAKS"] == 0

    # The image's next module tree has python3/3.9.7 no longer: lonestar6's recipe loads it.
    modules = ["python3/3.11.8", "gcc/15.1.0", "gcc/13.2.0", "python3/3.9.2"]
    now = node(tmp_path, "el9-now", glibc="2.34", modules=[*modules, "python3/3.9.7"], **D580)
    tree = node(tmp_path, "el9-modules", glibc="2.34", modules=modules, **D580)
    data = site.report("--facts", tree, "--before", now, code=16)
    found = rows(data)
    gone = found["lonestar6-venv-cu128"]
    assert gone["status"] == "BREAKS", gone
    [reason] = gone["after"]["reasons"]
    assert reason == {
        "cause": "module",
        "message": "module python3/3.9.7 is not among the node's modules (it offers python3/3.11.8, python3/3.9.2)",
    }
    assert found["frontera-venv-cu126"]["status"] == "UNAFFECTED"  # python3/3.9.2 is still there
    assert data["counts"]["BREAKS"] == sum(1 for s in data["subjects"] if s["status"] == "BREAKS")


def test_without_before_the_node_probes_itself(site, tmp_path):
    data = site.report("--facts", node(tmp_path, "d580", **D580), "--offline")
    assert data["before"].startswith("this node (")
    shipped = Catalog([Layer("builtin", builtin_dir())]).names()
    assert sorted(rows(data)) == sorted(shipped)


def test_a_facts_file_with_bad_modules_is_refused_naming_the_file(site, tmp_path):
    bad = node(tmp_path, "bad", modules="cuda/12.8")
    refused(
        site.impact("--facts", bad, "--before", bad), 5, f"{bad}: modules: expected a list of module names"
    )


# ---------------------------------------------------------------------------------------------------------------
# A signed registry, every published version, with the index read from the fixture server


needs_ssh = pytest.mark.skipif(SSH_KEYGEN is None, reason="ssh-keygen is not installed (openssh-client)")


@pytest.fixture
def server(tmp_path):
    with serve(pytorch_like(tmp_path / "files", CP)) as index:
        yield index


def _publish_signed(site: Site, tmp_path: Path, versions: list[str]) -> Path:
    """Publish each recipe text as the next version of ``cuda`` to a registry that requires signatures."""
    keys = tmp_path / "keys"
    keys.mkdir()
    key = keys / "admin"
    subprocess.run(
        [str(SSH_KEYGEN), "-q", "-t", "ed25519", "-N", "", "-C", "admin", "-f", str(key)], check=True
    )
    allowed = keys / "allowed_signers"
    allowed.write_text(f"admin@site {(keys / 'admin.pub').read_text().strip()}\n")
    registry = tmp_path / "registry"
    source = tmp_path / "admin-recipes"
    source.mkdir()
    for n, text in enumerate(versions):
        (source / "cuda.toml").write_text(text)
        args = ["publish", "cuda", "--registry", str(registry), "--sign-key", str(key)]
        if n == 0:
            args += ["--allowed-signers", str(allowed), "--require-signatures"]
        ok(site.cli(*args, ENVBUILDER_RECIPE_PATH=str(source)))
    return registry


@needs_ssh
def test_every_published_version_of_a_signed_registry_against_the_live_index(tmp_path, server):
    site = Site(tmp_path, torch_mirror(server))
    registry = _publish_signed(
        site,
        tmp_path,
        [
            PINNED.format(name="cuda", py=PY, version="2.14.1", variant="cu126", modules=""),
            PINNED.format(name="cuda", py=PY, version="2.14.1", variant="cu130", modules=""),
            PINNED.format(name="cuda", py=PY, version="2.15.0", variant="auto", modules=""),
        ],
    )
    before = node(tmp_path, "d580", **D580)
    after = node(tmp_path, "d550", **D550)
    data = site.report("--facts", after, "--before", before, "--registry", str(registry), code=16)
    assert not data["notes"], data["notes"]  # the index was read: no fallback on the table
    found = rows(data)
    assert set(found) == {"cuda@1", "cuda@2", "cuda@3"}
    assert found["cuda@1"]["status"] == "UNAFFECTED"
    # CUDA 13 wheels on a 12.x driver.
    v2 = found["cuda@2"]
    assert v2["status"] == "BREAKS" and v2["after"]["reasons"][0]["cause"] == "driver floor", v2
    assert v2["before"]["build"] == "torch 2.14.1 cu130"
    # torch 2.15 on a 12.4 driver would need a CUDA 12 build, and the index has none for 2.15 any more.
    v3 = found["cuda@3"]
    assert v3["status"] == "BREAKS", v3
    assert v3["before"]["build"] == "torch 2.15.0 cu130"
    assert v3["after"]["reasons"][0]["cause"] == "driver floor", v3
    assert all(s["source"] == str(registry) for s in data["subjects"])

    # The A100 nodes replaced by GH200s (aarch64): the index has no aarch64 file of the cu126 build.
    gh200 = node(
        tmp_path,
        "gh200",
        arch="aarch64",
        gpus=[{"name": "NVIDIA GH200 480GB", "compute_capability": "9.0"}],
        **D580,
    )
    found = rows(site.report("--facts", gh200, "--before", before, "--registry", str(registry), code=16))
    v1 = found["cuda@1"]
    assert v1["status"] == "BREAKS" and v1["after"]["reasons"][0]["cause"] == "not on the index", v1
    assert "has no torch 2.14.1 file for aarch64" in v1["after"]["reasons"][0]["message"]
    assert found["cuda@3"]["status"] == "UNAFFECTED"

    # A registry file changed behind the index is refused for that version, the others still judged.
    published = registry / "recipes" / "cuda" / "1.toml"
    published.chmod(0o644)
    published.write_text(published.read_text().replace("impact test", "tampered"))
    found = rows(site.report("--facts", after, "--before", before, "--registry", str(registry), code=16))
    assert found["cuda@1"]["status"] == "BROKEN", found["cuda@1"]
    assert found["cuda@1"]["before"]["reasons"][0]["cause"] == "recipe"
    assert found["cuda@2"]["status"] == "BREAKS"


def test_a_registry_that_is_a_url_or_no_registry_is_refused(site, tmp_path):
    facts = node(tmp_path, "n", **D580)
    refused(
        site.impact("--facts", facts, "--before", facts, "--registry", "https://example.org/reg"),
        2,
        "a registry is a directory",
    )
    refused(
        site.impact("--facts", facts, "--before", facts, "--registry", str(tmp_path)),
        3,
        "is not a recipe registry",
    )


# ---------------------------------------------------------------------------------------------------------------
# Records users shared with the site


def _record(site: Site, name: str, variant: str, modules: list[str]) -> None:
    """An env's record as create writes it (state.save), for a cu13 or cu12 torch build and its modules."""
    prefix = site.scratch / "envs" / name
    record = state.EnvRecord(
        name=name,
        recipe=name,
        recipe_digest="sha256:00",
        prefix=str(prefix),
        created="2026-11-01T12:00:00+0000",
        plan={
            "kind": "venv",
            "torch": {"torch": "2.14.1", "variant": variant, "channel": "stable"},
            "modules": modules,
        },
        tools={"python": PY, "installer": "uv"},
    )
    state.save(site.home, record)


def test_a_shared_record_that_the_change_breaks(site, tmp_path):
    shared = tmp_path / "shared-envs"
    shared.mkdir()
    shared.chmod(0o1777)
    _record(site, "new", "cu130", ["gcc/13.2.0"])
    _record(site, "old", "cu126", ["gcc/13.2.0"])
    _record(site, "mine", "cu126", [])
    for name in ("new", "old"):
        res = ok(site.cli("share", name, "--to", str(shared)))
        assert "readable by all" in res.stdout
    user = next(shared.glob("new@*.json")).stem.split("@", 1)[1]
    for path in shared.iterdir():
        assert stat.S_IMODE(path.stat().st_mode) == 0o644, path
    assert not list(shared.glob("mine@*")), "only what the user shared is there"
    (shared / "junk.json").write_text("{")
    private = site.home / "envs" / "mine.json"  # another user's own record, linked in by someone
    (shared / "link.json").symlink_to(private)

    before = node(tmp_path, "d580", modules=["gcc/13.2.0"], **D580)
    after = node(tmp_path, "d550", modules=["gcc/15.1.0"], **D550)
    data = site.report("--facts", after, "--before", before, "--records", str(shared), code=16)
    found = rows(data)
    new, old = found[f"new@{user}"], found[f"old@{user}"]
    assert new["kind"] == "env" and new["status"] == "BREAKS"
    assert {r["cause"] for r in new["after"]["reasons"]} == {"driver floor", "module"}, new
    assert old["status"] == "BREAKS" and [r["cause"] for r in old["after"]["reasons"]] == ["module"], old
    assert "gcc/13.2.0" in old["after"]["reasons"][0]["message"]
    assert found["junk"]["status"] == "BROKEN" and "not valid JSON" in found["junk"]["why"]
    assert found["link"]["status"] == "BROKEN" and "a symlink: not followed" in found["link"]["why"]

    # On a node keeping the modules, only the CUDA 13 build breaks.
    keeps = node(tmp_path, "d550-keeps", modules=["gcc/13.2.0"], **D550)
    found = rows(site.report("--facts", keeps, "--before", before, "--records", str(shared), code=16))
    assert found[f"new@{user}"]["status"] == "BREAKS" and found[f"old@{user}"]["status"] == "UNAFFECTED"


def test_share_refuses_a_directory_that_is_not_there(site, tmp_path):
    _record(site, "gone", "cu126", [])
    refused(site.cli("share", "gone", "--to", str(tmp_path / "nowhere")), 9, "is not a directory")


# ---------------------------------------------------------------------------------------------------------------
# The node's modules, as `probe --modules` lists them (real Lmod and Tcl Environment Modules)

LMOD_CMD = Path("/usr/share/lmod/lmod/libexec/lmod")


@pytest.mark.skipif(not LMOD_CMD.is_file(), reason="Lmod not installed (.ci/run installs Debian's lmod)")
def test_probe_lists_lmods_modules_and_impact_names_the_one_a_new_tree_drops(site, tmp_path):
    lmod = {"LMOD_CMD": str(LMOD_CMD), "MODULEPATH": str(DATA / "modules" / "site")}
    res = ok(site.cli("probe", "--modules", "--json", **lmod))
    now = json.loads(res.stdout)["data"]
    assert {"python3/3.9.7", "gcc/13.2.0", "cuda/12.6"} <= set(now["modules"])
    assert not [m for m in now["modules"] if m.endswith(("/", ":"))]
    human = ok(site.cli("probe", "--modules", **lmod)).stdout
    assert "python3/3.9.7" in human
    before = tmp_path / "now.json"
    before.write_text(res.stdout)  # the envelope, as `probe --json > now.json` saves it
    after = tmp_path / "after.json"
    after.write_text(json.dumps({**now, "modules": [m for m in now["modules"] if m != "python3/3.9.7"]}))
    found = rows(site.report("--facts", str(after), "--before", str(before), code=16))
    broken = [name for name, s in found.items() if s["status"] == "BREAKS"]
    assert broken == ["lonestar6-venv-cu128"], found
    assert found["lonestar6-venv-cu128"]["after"]["reasons"][0]["message"].startswith(
        "module python3/3.9.7 is not among the node's modules (it offers python3/3.11.8, python3/3.9.2)"
    )


def test_tcl_environment_modules_list_their_modules(envmodules_init):
    ms = modules.ModuleSystem("environment-modules", str(envmodules_init / "bash"))
    env = {"HOME": str(Path.home()), "PATH": "/usr/bin:/bin", "MODULEPATH": str(DATA / "modules" / "site")}
    listed = ms.available(env)
    # The tree's Tcl modulefiles (Tcl modules do not read the .lua ones).
    assert set(listed) == {"cmake/3.25.2", "python/3.12.1-gpu"}, listed
    assert modules.ModuleSystem("none").available(env) == ()


@needs_browser
def test_the_impact_page_renders_in_headless_chromium(site, tmp_path):
    """The table of an old driver's impact on the shipped recipes as an HTML page in the report's style, opened
    in a real headless Chromium: the verdicts' rows and their reasons on the page, BREAKS drawn red, nothing
    fetched; the exit status still says that something breaks."""
    before = node(tmp_path, "d580", **D580)
    after = node(tmp_path, "d470", **D470)
    page = tmp_path / "impact.html"
    res = site.impact("--facts", after, "--before", before, "--format", "html", "-o", str(page))
    refused(res, 16, "error: the change breaks")
    data = site.report("--facts", after, "--before", before, code=16)
    assert f"wrote the impact on {len(data['subjects'])} recipe(s) and env(s) to {page}" in res.stderr
    assert res.stdout == ""

    shot = tmp_path / "shot.png"
    with counter() as listener:
        dumped = chromium(page, tmp_path, listener.port, "--dump-dom").stdout
        chromium(page, tmp_path, listener.port, "--window-size=1280,900", f"--screenshot={shot}")
        assert listener.count == 0
    dom = dom_of(dumped)
    text = " ".join(" ".join(dom.text).split())
    assert "envbuilder impact of a planned node change" in text
    assert f"before {before} driver 580.65.06 (CUDA 13.0)" in text
    assert f"after {after} driver 470.57.02 (CUDA 11.4)" in text
    counts = data["counts"]
    summary = ", ".join(
        f"{counts[s]} {s.lower()}" for s in ("BREAKS", "BROKEN", "CHANGES", "FIXED", "UNAFFECTED")
    )
    assert f"{len(data['subjects'])} recipe(s) and env(s): {summary}" in text
    assert dom.count("tr", "verdict") == len(data["subjects"])
    assert dom.count("span", "status-fail") == counts["BREAKS"] > 0
    for subject in data["subjects"]:
        assert f"{subject['status']} {subject['subject']} {' '.join(subject['why'].split())} shipped" in text
    png = pngread.read(shot)
    assert bytes.fromhex("d1242f") + (b"\xff" if png.channels == 4 else b"") in png.colours(step=1)


def test_the_impact_table_as_markdown_for_a_ticket(site, tmp_path):
    before = node(tmp_path, "d580", **D580)
    after = node(tmp_path, "d470", **D470)
    res = site.impact("--facts", after, "--before", before, "--format", "md")
    refused(res, 16, "error: the change breaks")
    text = res.stdout
    assert text.startswith("# envbuilder impact of a planned node change\n")
    assert f"| after | {cell(after)} | driver 470.57.02 (CUDA 11.4), glibc " in text
    data = site.report("--facts", after, "--before", before, code=16)
    frontera = rows(data)["frontera-venv-cu126"]
    assert frontera["status"] == "BREAKS"
    assert f"| BREAKS | frontera-venv-cu126 | {cell(frontera['why'])} | shipped |" in text
    assert "\n| verdict | recipe or env | why, or old -> new | from |\n" in text


def test_a_page_of_the_impact_is_asked_for_plainly(site, tmp_path):
    after = node(tmp_path, "d470", **D470)
    refused(
        site.impact("--facts", after, "--json", "--format", "html"), 2, "--json or --format html, not both"
    )
    refused(
        site.impact("--facts", after, "-o", str(tmp_path / "x")), 2, "-o writes a page: give --format html"
    )
    refused(
        site.impact("--facts", after, "--format", "md", "-o", str(tmp_path)),
        2,
        f"-o {tmp_path} is a directory",
    )
