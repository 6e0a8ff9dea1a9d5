"""`envbuilder doctor`'s checks, one by one: each pure check gets records, facts, an environment mapping and
index pages, and returns findings. Library shadowing runs against real directories holding empty files named
like the libraries (the loader's search order is what is modelled, not the libraries' contents)."""

from __future__ import annotations

import dataclasses
import datetime
import os
import sys
import time
from importlib.resources import files as package_files
from pathlib import Path

import pytest

from envbuilder import lockfile
from envbuilder.core._toml import loads
from envbuilder.core.errors import RecipeNotFound, StateError
from envbuilder.core.facts import Gpu, HostFacts
from envbuilder.doctor import collect, index_checks, libraries, replan
from envbuilder.doctor.report import Context, EnvInputs, examine, safety_findings
from envbuilder.recipe import loader
from envbuilder.recipe.catalog import Catalog
from envbuilder.resolver.indexfacts import IndexFacts, PageRead, parse_wheel_filename
from envbuilder.resolver.matrix import load_matrix
from envbuilder.system import state
from envbuilder.system.purge import PurgeStatus
from envbuilder.system.state import EnvRecord, Health

TODAY = datetime.date(2026, 11, 23)
H100 = (Gpu("NVIDIA H100 80GB HBM3", "9.0"),)
V100 = (Gpu("Tesla V100-SXM2-16GB", "7.0"),)


def facts(driver="580.95.05", gpus=H100, **kw) -> HostFacts:
    return HostFacts(
        arch="x86_64", glibc="2.39", python="3.12.3", driver_version=driver, gpus=gpus, source="test", **kw
    )


def newest(variant: str) -> str:
    """The newest stable release the shipped table has a ``variant`` build of (x86_64)."""
    return max(
        (r for r in load_matrix().stable_releases() if variant in r.variants["x86_64"]),
        key=lambda r: r.version,
    ).torch


def record(name="gpu", torch=None, variant="cu130", channel="stable", **kw) -> EnvRecord:
    plan = {
        "kind": "venv",
        "torch": {
            "torch": torch or newest(variant),
            "variant": variant,
            "channel": channel,
            "index_url": f"https://download.pytorch.org/whl/{variant}",
        },
    }
    plan.update(kw.pop("plan", {}))
    base = {
        "name": name,
        "recipe": name,
        "recipe_digest": "sha256:00",
        "prefix": "/scratch/u1/envs/" + name,
        "created": "2026-11-01T12:00:00+0000",
        "plan": plan,
        "tools": {"python": "3.12.3", "python_path": "/usr/bin/python3", "installer": "uv"},
    }
    return EnvRecord(**{**base, **kw})


RECIPE = """
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
variant = "{variant}"
packages = ["torch"]
"""


@pytest.fixture
def recipes(tmp_path):
    root = tmp_path / "recipes"
    root.mkdir()
    catalog_env = {"ENVBUILDER_RECIPE_PATH": str(root), "HOME": str(tmp_path)}

    def write(name="gpu", version=None, variant="cu130"):
        text = RECIPE.format(name=name, version=version or newest(variant), variant=variant)
        (root / f"{name}.toml").write_text(text)
        return loader.load(name, Catalog.from_env(catalog_env))

    return write


ENV = {"HOME": "/home/u1", "SCRATCH": "/scratch/u1"}


# ---------------------------------------------------------------------------------------------------------------
# 1. re-planned against this node


def test_an_older_driver_makes_the_recorded_cu130_build_an_action_naming_the_gate(recipes):
    found = replan.replan_findings(record(), recipes(), None, facts(driver="550.54.15"), ENV)
    assert [(f.severity, f.gate) for f in found] == [("action", "driver")]
    assert "550.54.15" in found[0].message and f"torch {newest('cu130')} cu130" in found[0].message
    assert found[0].fix  # the gate's hint


def test_an_auto_recipe_that_replans_to_another_variant_still_flags_the_installed_build(recipes):
    # An `auto` recipe re-planned for a 550 driver picks a CUDA 12 variant, which fits: but the cu130 build the
    # env HAS cannot run under that driver, and that is what needs action (the 2x H200 run found this).
    both = max(
        (r for r in load_matrix().stable_releases() if {"cu126", "cu130"} <= set(r.variants["x86_64"])),
        key=lambda r: r.version,
    ).torch
    rec = record(torch=both)
    found = replan.replan_findings(rec, recipes(version=both, variant="auto"), None,
                                   facts(driver="550.54.15"), ENV)  # fmt: skip
    assert [(f.severity, f.check, f.gate) for f in found] == [("action", "installed", "driver")]
    assert "installed torch" in found[0].message and "550.54.15" in found[0].message
    assert "envbuilder create gpu --force" in found[0].fix and "cu12" in found[0].fix


def test_a_gpu_the_wheel_has_no_code_for_is_the_gpu_arch_gate(recipes):
    found = replan.replan_findings(record(), recipes(), None, facts(gpus=V100), ENV)
    assert [(f.severity, f.gate) for f in found] == [("action", "gpu-arch")]
    assert "sm_70" in found[0].message


def test_the_same_resolution_is_ok(recipes):
    found = replan.replan_findings(record(), recipes(), None, facts(), ENV)
    assert [f.severity for f in found] == ["info"]
    assert "still resolves the same" in found[0].message


def test_a_different_resolution_is_a_warning_naming_what_a_rebuild_installs(recipes):
    older = sorted(load_matrix().stable_releases(), key=lambda r: r.version)
    old = next(r.torch for r in older if "cu130" in r.variants["x86_64"])
    assert old != newest("cu130")
    found = replan.replan_findings(record(torch=old), recipes(version="latest"), None, facts(), ENV)
    assert [f.severity for f in found] == ["warning"]
    assert f"would now install torch {newest('cu130')} cu130, not the torch {old} cu130" in found[0].message
    assert "envbuilder create gpu --force" in found[0].fix


def test_the_env_python_decides_the_python_gate_not_the_node(recipes):
    # The node's python is 3.12; the env was built on 3.9, which no current release supports.
    rec = record(tools={"python": "3.9.18", "python_path": "/usr/bin/python3"})
    found = replan.replan_findings(rec, recipes(), None, facts(), ENV)
    assert "python" in {f.gate for f in found}


def test_a_recipe_that_is_gone_is_a_warning():
    err = RecipeNotFound("no recipe named 'gpu'", hint="envbuilder recipes list")
    found = replan.replan_findings(record(), None, err, facts(), ENV)
    assert [f.severity for f in found] == ["warning"]
    assert "its recipe 'gpu' is gone" in found[0].message
    assert "envbuilder backup gpu" in found[0].fix


def test_no_torch_in_the_record_compares_nothing(recipes):
    rec = record(plan={"torch": None})
    assert replan.replan_findings(rec, recipes(), None, facts(), ENV) == []


# ---------------------------------------------------------------------------------------------------------------
# The env's python


def test_python_findings():
    rec = record(plan={"modules": ["python/3.12.3"]})
    gone = replan.PythonState("/opt/python/3.12/bin/python3", False, "/p/bin/python")
    [f] = replan.python_findings(rec, gone)
    assert f.severity == "action" and "/opt/python/3.12/bin/python3" in f.message
    assert f.fix == "rebuild it with a Python this node has: envbuilder create gpu --force"

    broken = replan.PythonState(
        "/usr/bin/python3", True, "/p/bin/python", False, "libpython3.12.so: not found"
    )
    [f] = replan.python_findings(rec, broken)
    assert f.severity == "action" and "does not start: libpython3.12.so" in f.message

    moved = replan.PythonState("/usr/bin/python3", True, "/p/bin/python", True, "3.13.1")
    [f] = replan.python_findings(rec, moved)
    assert "now 3.13.1, but it was built with 3.12.3" in f.message

    patch = replan.PythonState("/usr/bin/python3", True, "/p/bin/python", True, "3.12.9")
    assert replan.python_findings(rec, patch) == []


def test_a_managed_python_gone_from_the_home_says_restore_or_create_installs_it_again():
    rec = record(plan={"python": {"origin": "managed", "version": "3.12"}})
    gone = replan.PythonState(
        "/h/.envbuilder/pythons/cpython-3.12-linux-x86_64-gnu/bin", False, "/p/bin/python"
    )
    [f] = replan.python_findings(rec, gone)
    assert "/h/.envbuilder/pythons/" in f.message
    assert (
        f.fix == "envbuilder restore gpu --force (or create gpu --force) installs the managed CPython again"
    )


def test_python_state_runs_the_env_python(tmp_path):
    prefix = tmp_path / "env"
    (prefix / "bin").mkdir(parents=True)
    (prefix / "bin" / "python").symlink_to(sys.executable)
    rec = record(prefix=str(prefix), tools={"python": "x", "python_path": sys.executable})
    got = collect.python_state(rec, dict(os.environ))
    assert got.base_exists and got.runs
    assert got.detail == ".".join(map(str, sys.version_info[:3]))

    (prefix / "bin" / "python").unlink()
    (prefix / "bin" / "python").symlink_to(tmp_path / "no-such-python")
    got = collect.python_state(rec, dict(os.environ))
    assert got.runs is False

    rec = record(prefix=str(prefix), tools={"python": "x", "python_path": str(tmp_path / "gone" / "python3")})
    got = collect.python_state(rec, dict(os.environ))
    assert not got.base_exists and got.runs is None


# ---------------------------------------------------------------------------------------------------------------
# 2. What shadows the env's CUDA libraries


def files(directory: Path, *names: str) -> str:
    directory.mkdir(parents=True, exist_ok=True)
    for name in names:
        (directory / name).write_bytes(b"")
    return str(directory)


@pytest.fixture
def env_libs(tmp_path):
    site = tmp_path / "env" / "lib" / "python3.12" / "site-packages"
    return [
        files(site / "nvidia" / "nccl" / "lib", "libnccl.so.2"),
        files(site / "nvidia" / "cu13" / "lib", "libcudart.so.13", "libcublas.so.13", "libcublasLt.so.13"),
        files(site / "nvidia" / "cudnn" / "lib", "libcudnn.so.9", "libcudnn_ops.so.9"),
        files(site / "torch" / "lib", "libtorch_cuda.so", "libc10.so"),
    ]


def test_nothing_on_the_loader_path_means_the_env_copies_load(env_libs):
    loads = libraries.library_loads({}, env_libs, collect.listdir)
    assert sorted(x.soname for x in loads) == [
        "libcublas.so.13",
        "libcublasLt.so.13",
        "libcudart.so.13",
        "libcudnn.so.9",
        "libcudnn_ops.so.9",
        "libnccl.so.2",
    ]
    assert not any(x.shadowed for x in loads)
    [f] = libraries.library_findings("gpu", loads, {}, {})
    assert f.severity == "info" and "6 checked" in f.message


def test_ld_library_path_shadowing_names_the_file_its_version_and_the_order(tmp_path, env_libs):
    empty = files(tmp_path / "empty")
    other = files(tmp_path / "nccl-2.21", "libnccl.so.2", "libnccl.so.2.21.5", "libcudart.so.12")
    later = files(tmp_path / "later", "libnccl.so.2", "libcudnn.so.9")
    env = {"LD_LIBRARY_PATH": f"{empty}::{other}:{tmp_path / 'missing'}:{later}"}
    loads = {x.soname: x for x in libraries.library_loads(env, env_libs, collect.listdir)}
    nccl = loads["libnccl.so.2"]
    assert (nccl.via, nccl.path, nccl.version) == ("LD_LIBRARY_PATH", f"{other}/libnccl.so.2", "2.21.5")
    assert loads["libcudnn.so.9"].path == f"{later}/libcudnn.so.9"
    assert not loads["libcudart.so.13"].shadowed  # libcudart.so.12 is another soname: not what torch asks for
    versions = libraries.wheel_versions([{"name": "nvidia-nccl-cu13", "version": "2.27.3"}])
    found = libraries.library_findings("gpu", list(loads.values()), env, versions)
    assert [f.severity for f in found] == ["action", "action"]
    text = next(f for f in found if "libnccl" in f.message)
    assert (
        f"libnccl.so.2 would load from {other} (2.21.5, older than the env's 2.27.3) through LD_LIBRARY_PATH"
        in (text.message)
    )
    assert text.fix == f"take {other} out of LD_LIBRARY_PATH before activating the env"


def test_the_env_own_directory_first_on_the_path_wins(tmp_path, env_libs):
    other = files(tmp_path / "other", "libnccl.so.2")
    env = {"LD_LIBRARY_PATH": f"{env_libs[0]}/:{other}"}
    loads = {x.soname: x for x in libraries.library_loads(env, env_libs, collect.listdir)}
    assert not loads["libnccl.so.2"].shadowed


def test_ld_preload_wins_over_everything(tmp_path, env_libs):
    other = files(tmp_path / "other", "libnccl.so.2")
    env = {
        "LD_PRELOAD": "/opt/nccl/lib/libnccl.so.2.19.3 libfoo.so:/cuda/lib64/libcudart.so",
        "LD_LIBRARY_PATH": other,
    }
    loads = {x.soname: x for x in libraries.library_loads(env, env_libs, collect.listdir)}
    assert (loads["libnccl.so.2"].via, loads["libnccl.so.2"].version) == ("LD_PRELOAD", "2.19.3")
    assert (loads["libcudart.so.13"].via, loads["libcudart.so.13"].path) == (
        "LD_PRELOAD",
        "/cuda/lib64/libcudart.so",
    )
    found = libraries.library_findings("gpu", list(loads.values()), env, {})
    assert [f.fix for f in found] == [
        "remove /cuda/lib64/libcudart.so from LD_PRELOAD before using the env",
        "remove /opt/nccl/lib/libnccl.so.2.19.3 from LD_PRELOAD before using the env",
    ]
    [node] = libraries.node_library_findings(env)
    assert node.severity == "warning" and "libnccl.so.2.19.3, /cuda/lib64/libcudart.so" in node.message


def test_a_loaded_cuda_module_is_named_and_its_unload_is_the_fix(tmp_path, env_libs):
    cuda = tmp_path / "apps" / "cuda" / "13.0"
    lib64 = files(cuda / "lib64", "libcublas.so.13", "libcublas.so.13.0.2.14", "libcublasLt.so.13")
    env = {
        "LD_LIBRARY_PATH": lib64,
        "CUDA_HOME": str(cuda),
        "LOADEDMODULES": "gcc/13.2.0:cuda/13.0:openmpi/5.0",
    }
    loads = libraries.library_loads(env, env_libs, collect.listdir)
    [f] = libraries.library_findings("gpu", loads, env, {})
    assert f.message.startswith(f"libcublas.so.13, libcublasLt.so.13 would load from {lib64} (13.0.2.14)")
    assert "(the cuda/13.0 module)" in f.message
    assert f.fix.startswith("module unload cuda/13.0")
    [node] = libraries.node_library_findings(env)
    assert node.severity == "info" and "cuda/13.0" in node.message and str(cuda) in node.message


def test_cuda_modules_from_loadedmodules_or_lmfiles():
    assert libraries.cuda_modules({"LOADEDMODULES": "gcc/13:cuda/12.4:cudnn/9"}) == ["cuda/12.4"]
    assert libraries.cuda_modules({"LOADEDMODULES": "cudatoolkit/12.2"}) == ["cudatoolkit/12.2"]
    lm = "/opt/mf/Core/gcc/13.lua:/opt/mf/Core/cuda/12.6.lua"
    assert libraries.cuda_modules({"_LMFILES_": lm}) == ["cuda/12.6"]
    assert libraries.cuda_modules({}) == []


def test_the_activation_unsetting_ld_library_path_is_taken_into_account(tmp_path, env_libs):
    other = files(tmp_path / "other", "libnccl.so.2")
    rec = record(
        plan={"activate": {"env": {"X": "1"}, "unset": ["LD_LIBRARY_PATH"], "modules": ["cuda/12.6"]}}
    )
    shell = libraries.activation_env(rec, {"LD_LIBRARY_PATH": other})
    assert shell == {"X": "1"}
    assert not any(x.shadowed for x in libraries.library_loads(shell, env_libs, collect.listdir))
    [f] = libraries.activation_module_findings(rec)
    assert "activating it loads cuda/12.6" in f.message


def test_env_lib_dirs_finds_the_wheel_and_conda_library_directories(tmp_path, env_libs):
    rec = record(prefix=str(tmp_path / "env"))
    assert sorted(collect.env_lib_dirs(rec)) == sorted(env_libs)
    conda = record(prefix=str(tmp_path / "env"), plan={"kind": "conda"})
    (tmp_path / "env" / "lib" / "libcudart.so.12").write_bytes(b"")
    assert collect.env_lib_dirs(conda)[-1] == str(tmp_path / "env" / "lib")


# ---------------------------------------------------------------------------------------------------------------
# 3. The table's age against the index


def page(url: str, *names: str, error=None) -> PageRead:
    wheels = tuple(w for w in (parse_wheel_filename(n) for n in names) if w is not None)
    return PageRead(upstream=url, sources=(url,), files=wheels, read_at=time.time(), error=error)


CU130 = "https://download.pytorch.org/whl/cu130"
WHEEL = "torch-{v}%2Bcu130-cp312-cp312-manylinux_2_28_x86_64.whl"


def wheel(version: str, local="cu130") -> str:
    return f"torch-{version}+{local}-cp312-cp312-manylinux_2_28_x86_64.whl"


def test_a_release_on_the_index_that_the_table_does_not_know_is_a_warning():
    m = load_matrix()
    known = newest("cu130")
    major, minor, _ = known.split(".")
    unknown = f"{major}.{int(minor) + 5}.0"
    index = IndexFacts(
        {CU130: page(CU130, wheel(known), wheel(unknown), wheel(f"{major}.{int(minor) + 6}.0rc1"))}
    )
    today = datetime.date.fromisoformat(m.as_of) + datetime.timedelta(days=40)
    [f] = index_checks.table_findings(m, today, index, [CU130])
    assert f.severity == "warning"
    assert f"the table is 40 days old (as of {m.as_of}); the index has torch {unknown}," in f.message
    assert "rc1" not in f.message


def test_an_index_with_nothing_newer_is_ok_and_no_index_says_why():
    m = load_matrix()
    index = IndexFacts({CU130: page(CU130, wheel(newest("cu130")))})
    [f] = index_checks.table_findings(m, TODAY, index, [CU130])
    assert f.severity == "info" and "knows the newest torch on the index" in f.message
    [f] = index_checks.table_findings(m, TODAY, IndexFacts({}, fallback="--offline"), [CU130])
    assert f.severity == "info" and "the index was not read (--offline)" in f.message
    failed = IndexFacts(
        {CU130: page(CU130, error="timed out")}, fallback="every index read failed: timed out"
    )
    [f] = index_checks.table_findings(m, TODAY, failed, [CU130])
    assert "every index read failed" in f.message


def test_a_table_row_checked_more_than_90_days_ago_is_named_with_its_day():
    m = load_matrix()
    today = datetime.date.fromisoformat(m.as_of)
    day = lambda n: (today - datetime.timedelta(days=n)).isoformat()  # noqa: E731
    fresh = dataclasses.replace(
        m,
        variants={k: dataclasses.replace(v, checked=day(0)) for k, v in m.variants.items()},
        releases=tuple(dataclasses.replace(r, checked=day(0)) for r in m.releases),
        arch_lists=tuple(dataclasses.replace(a, checked=day(0)) for a in m.arch_lists),
        nightly={**m.nightly, "checked": day(0)},
        provenance={k: (src, day(0)) for k, (src, _) in m.provenance.items()},
    )
    assert index_checks.table_row_findings(fresh, today) == []

    # One release row made old, one just at the limit, one variant row without a day.
    releases = {"2.14.0": day(91), "2.14.1": day(90)}
    aged = dataclasses.replace(
        fresh,
        releases=tuple(
            dataclasses.replace(r, checked=releases.get(r.torch, r.checked)) for r in fresh.releases
        ),
        variants={**fresh.variants, "cu132": dataclasses.replace(fresh.variants["cu132"], checked="")},
    )
    found = {
        f.message.split(" of the shipped table")[0]: f for f in index_checks.table_row_findings(aged, today)
    }
    assert set(found) == {"1 release rows", "1 variant rows"}, found
    rel = found["1 release rows"]
    assert (rel.severity, rel.subject, rel.check) == ("warning", "node", "table-rows")
    assert rel.message.endswith(f"more than 90 days ago: 2.14.0 (checked {day(91)}, 91 days ago)")
    assert "2.14.1" not in rel.message
    assert found["1 variant rows"].message.endswith("cu132 (no checked date)")
    assert "GPU arch lists and driver floors only from this table" in rel.fix


def test_todays_table_names_exactly_its_rows_older_than_90_days():
    """The shipped table as it is: every row doctor names is more than 90 days old, and every such row is named
    (counted from the raw TOML, not through the loader)."""
    raw = loads(package_files("envbuilder").joinpath("data/torch_matrix.toml").read_text(encoding="utf-8"))
    dated = [*raw["variant"].values(), *raw["release"], *raw["arch_list"], raw["nightly"]]
    dated += [row for table in ("no_index", "no_wheels", "cpu_only") for row in raw[table].values()]
    today = datetime.date.today()
    old = [r for r in dated if (today - datetime.date.fromisoformat(r["checked"])).days > 90]
    found = index_checks.table_row_findings(load_matrix(), today)
    assert sum(int(f.message.split()[0]) for f in found) == len(old)
    named = " ".join(f.message for f in found)
    assert all(f"checked {r['checked']}" in named for r in old)
    fresh = [r for r in raw["release"] if r not in old]
    assert not any(f" {r['torch']} " in named or f"–{r['torch']} " in named for r in fresh)


# ---------------------------------------------------------------------------------------------------------------
# 4. Nightly pins and locks


NIGHTLY = "https://download.pytorch.org/whl/nightly/cu130"


def nightly_record(version: str) -> EnvRecord:
    rec = record(name="nightly", torch=version, channel="nightly")
    torch = {**rec.plan["torch"], "index_url": NIGHTLY}
    return dataclasses.replace(rec, plan={**rec.plan, "torch": torch})


def test_a_pruned_nightly_is_an_action_and_an_old_one_a_warning():
    kept = "2.16.0.dev20261120"
    index = IndexFacts({NIGHTLY: page(NIGHTLY, wheel(kept), wheel("2.16.0.dev20260901"))})
    [f] = index_checks.nightly_findings(nightly_record("2.16.0.dev20260815"), index, TODAY, backed_up=False)
    assert f.severity == "action" and f"has left {NIGHTLY}" in f.message
    assert "envbuilder backup nightly" in f.fix
    [f] = index_checks.nightly_findings(nightly_record("2.16.0.dev20260815"), index, TODAY, backed_up=True)
    assert "envbuilder restore nightly" in f.fix
    assert index_checks.nightly_findings(nightly_record(kept), index, TODAY, backed_up=False) == []
    [f] = index_checks.nightly_findings(nightly_record("2.16.0.dev20260901"), index, TODAY, backed_up=False)
    assert f.severity == "warning" and "83 days old (still on its index)" in f.message
    # Not read: only the age speaks.
    [f] = index_checks.nightly_findings(
        nightly_record("2.16.0.dev20260901"), IndexFacts(), TODAY, backed_up=False
    )
    assert f.severity == "warning" and "not checked against its index" in f.message
    assert index_checks.nightly_findings(record(), index, TODAY, backed_up=False) == []


def make_lock(*urls: str, index=CU130) -> lockfile.Lock:
    pkg = lockfile.LockedPackage(
        "torch", "2.15.0+cu130", "wheel", tuple(lockfile.LockedFile(u, "0" * 64) for u in urls)
    )
    dep = lockfile.LockedPackage(
        "numpy", "2.3.0", "wheel", (lockfile.LockedFile("https://files/numpy.whl", "1" * 64),)
    )
    inputs = {"index_flags": ["--index-url", index, "--extra-index-url", "https://pypi.org/simple"]}
    platform = lockfile.PlatformLock("x86_64", "x86_64-manylinux_2_28", inputs, (pkg, dep))
    return lockfile.Lock("gpu", "", "00", "venv", "uv", "", "", (platform,), path="/w/gpu.lock.toml")


def test_a_lock_whose_torch_file_left_its_index_is_an_action():
    there, gone = wheel("2.15.0"), wheel("2.15.0").replace("cp312", "cp311")
    lock = make_lock(f"{CU130}/{there.replace('+', '%2B')}", f"{CU130}/{gone.replace('+', '%2B')}")
    indexes = {"torch": IndexFacts({CU130: page(CU130, there)})}
    [f] = index_checks.lock_findings("gpu", lock, "x86_64", indexes)
    assert f.severity == "action" and gone in f.message and there not in f.message
    assert "envbuilder lock gpu" in f.fix

    indexes = {"torch": IndexFacts({CU130: page(CU130, there, gone)})}
    [f] = index_checks.lock_findings("gpu", lock, "x86_64", indexes)
    assert f.severity == "info" and "2 torch file(s) are still on their index" in f.message
    # An index that could not be read judges nothing; nor does a lock for another platform.
    assert (
        index_checks.lock_findings(
            "gpu", lock, "x86_64", {"torch": IndexFacts({CU130: page(CU130, error="x")})}
        )
        == []
    )
    assert index_checks.lock_findings("gpu", lock, "aarch64", indexes) == []


# ---------------------------------------------------------------------------------------------------------------
# 5. Health and the purge


def purge_status(days_left, touch=False):
    return PurgeStatus("scratch", 10, days_left, "lib/x.py", touch, "")


def test_safety_findings():
    rec = record()
    ok = Health("ok", "all files present")
    gone = Health("gone", "/s/e does not exist (purged or removed)")
    [f] = safety_findings(rec, gone, purge_status(None), [])
    assert f.severity == "action" and f.fix == "envbuilder create gpu (there is no backup)"
    [f] = safety_findings(rec, gone, None, ["gpu@20261101T000000Z"])
    assert f.fix == "envbuilder restore gpu (from gpu@20261101T000000Z)"
    [f] = safety_findings(rec, Health("damaged", "2 file(s) missing", ("a", "b")), None, [])
    assert f.severity == "action" and "create gpu --force" in f.fix

    [f] = safety_findings(rec, ok, purge_status(3.2, touch=True), [])
    assert f.severity == "action" and "reaches it in 3 days" in f.message and "no backup" in f.message
    assert f.fix == "envbuilder backup gpu (the site also allows envbuilder touch gpu)"
    [f] = safety_findings(rec, ok, purge_status(0.4), [])
    assert "the purge is due now" in f.message
    [f] = safety_findings(rec, ok, purge_status(3.2), ["gpu@20261101T000000Z"])
    assert f.severity == "info" and "backed up as gpu@20261101T000000Z" in f.message
    [f] = safety_findings(rec, ok, PurgeStatus("scratch", 30, 25.0, None, False, ""), [])
    assert f.severity == "warning" and f.fix == "envbuilder backup gpu"
    assert safety_findings(rec, ok, None, []) == []


# ---------------------------------------------------------------------------------------------------------------
# Records and the whole report


def test_read_records(tmp_path):
    state.save(tmp_path, record(name="good"))
    (tmp_path / "envs" / "bad.json").write_text("{not json")
    records, found = collect.read_records(tmp_path, state.names(tmp_path), explicit=False)
    assert [r.name for r in records] == ["good"]
    assert [(f.severity, f.subject, f.check) for f in found] == [("action", "bad", "record")]
    with pytest.raises(StateError, match="no env named 'nope'"):
        collect.read_records(tmp_path, ["nope"], explicit=True)


def test_examine_orders_actions_first_and_skips_the_shell_for_another_node(tmp_path, env_libs):
    other = files(tmp_path / "other", "libnccl.so.2")
    rec = record(prefix=str(tmp_path / "env"))
    inp = EnvInputs(
        record=rec,
        recipe=None,
        recipe_error=RecipeNotFound("no recipe named 'gpu'"),
        python=replan.PythonState("/usr/bin/python3", True, "/p", True, "3.12.3"),
        health=Health("ok", "all files present"),
        purge=None,
        backups=(),
        lib_dirs=tuple(env_libs),
    )
    env = {"LD_LIBRARY_PATH": other}
    ctx = Context(facts(), env, TODAY, load_matrix(), {}, (), check_shell=True)
    report = examine([inp], ctx, collect.listdir, "this node")
    assert [f.severity for f in report.findings][:2] == ["action", "warning"]
    assert report.findings[0].check == "libraries" and report.needs_action
    old_rows = [f for f in report.findings if f.check == "table-rows"]  # the shipped table's old rows
    assert report.to_json()["counts"] == {"action": 1, "warning": 1 + len(old_rows), "info": 1}

    other_node = Context(facts(), env, TODAY, load_matrix(), {}, (), check_shell=False)
    report = examine([inp], other_node, collect.listdir, "new-node.json")
    assert not report.needs_action
    assert "libraries" not in {f.check for f in report.findings}
