"""The index wins (issue 34): what an index the install will use lists is a fact, the table only fills in what a
file name cannot say. Each world is today's (tests/torchindex.py, served on 127.0.0.1, PEP 691 JSON and PEP 503
HTML) with ONE thing changed: the stable index lists a variant the table calls nightly-only, or one the table has
never heard of; a site mirror of a variant holds only some releases, or cannot be read. Plans go through the real
CLI, each with its own envbuilder home (so its own page cache)."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import ok, run_cli, user_env
from torchindex import TorchIndex, add_build, pytorch_like, serve, torch_mirror

pytestmark = pytest.mark.integration

PY_TAG = f"cp{sys.version_info[0]}{sys.version_info[1]}"
PY = f"{sys.version_info[0]}.{sys.version_info[1]}.{sys.version_info[2]}"
H100 = {"name": "NVIDIA H100 80GB HBM3", "compute_capability": "9.0"}
K80 = {"name": "Tesla K80", "compute_capability": "3.7"}


@pytest.fixture(scope="module")
def layout(tmp_path_factory: pytest.TempPathFactory) -> TorchIndex:
    return pytorch_like(tmp_path_factory.mktemp("torchindex"), PY_TAG)


@pytest.fixture
def server(layout: TorchIndex) -> Iterator[TorchIndex]:
    """Today's world; a test's changes to it (roots added, roots failing) are undone after the test."""
    roots = set(layout.roots)
    layout.requested.clear()
    with serve(layout) as index:
        yield index
    for root in set(layout.roots) - roots:
        del layout.roots[root]
    layout.fail.clear()
    layout.html_only.clear()


def facts(tmp_path: Path, name: str, **values: object) -> str:
    data = {"arch": "x86_64", "glibc": "2.36", "python": PY, "gpus": [], **values}
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(data))
    return str(path)


def h100(tmp_path: Path, driver: str = "580.95.05", **more: object) -> str:
    return facts(tmp_path, f"h100-{driver}", driver_version=driver, gpus=[H100], **more)


def env(
    tmp_path: Path, server: TorchIndex, name: str, version: str, variant: str, *, mirror: str = ""
) -> dict:
    root = tmp_path / name
    d = root / "recipes"
    d.mkdir(parents=True)
    (d / "idx.toml").write_text(
        'schema_version = 1\n[recipe]\nname = "idx"\ndescription = "index rule"\n'
        '[env]\nkind = "venv"\ninstaller = "uv"\nprefix = "${SCRATCH}/envs/idx"\n'
        '[python]\ncommand = "python3"\n'
        f'[torch]\nversion = "{version}"\nvariant = "{variant}"\npackages = ["torch"]\n'
    )
    return user_env(root, f"{torch_mirror(server)} {mirror}".strip(), ENVBUILDER_RECIPE_PATH=str(d))


def plan(environ: dict, facts_file: str) -> dict:
    return json.loads(ok(run_cli("plan", "idx", "--facts", facts_file, "--json", env=environ)).stdout)["data"]


def refusal(environ: dict, facts_file: str) -> dict[str, str]:
    res = run_cli("plan", "idx", "--facts", facts_file, "--json", env=environ)
    assert res.returncode == 4, res.stdout + res.stderr
    return {e["gate"]: e["message"] for e in json.loads(res.stdout)["errors"]}


# ---------------------------------------------------------------------------------------------------------------
# 1. A table fact (cu134 is nightly-only) does not veto the index.


def test_a_variant_the_table_calls_nightly_only_plans_where_the_stable_index_lists_it(server, tmp_path):
    flags = "sm_75 sm_80 sm_86 sm_90 sm_100 sm_120"
    add_build(
        server,
        "whl/cu134",
        tmp_path / "w",
        "2.15.0+cu134",
        python_tag=PY_TAG,
        cuda="13.4",
        arch_flags=flags,
        arches=("x86_64", "aarch64"),
    )
    node = h100(tmp_path)

    pinned = plan(env(tmp_path, server, "pin", "2.15.0", "cu134"), node)["torch"]
    assert (pinned["torch"], pinned["variant"], pinned["cuda"]) == ("2.15.0", "cu134", "13.4")
    assert pinned["requirements"] == ["torch==2.15.0+cu134"]
    assert any("cu134: listed by the stable index" in line for line in pinned["facts_source"])

    # `latest` with cu134 is the newest release its page lists (2.16.0 has no cu134 build).
    latest = plan(env(tmp_path, server, "latest", "latest", "cu134"), node)["torch"]
    assert latest["requirements"] == ["torch==2.15.0+cu134"]

    # `latest` with auto reads the cu134 page too, once.
    server.requested.clear()
    plan(env(tmp_path, server, "auto", "latest", "auto"), node)
    assert server.pages().count("GET /whl/cu134/torch/ json") == 1, server.pages()


# ---------------------------------------------------------------------------------------------------------------
# 2. A variant the table has never heard of is a candidate where the index lists it.


def test_an_unknown_cuda_variant_the_index_lists_plans_with_its_facts_from_its_number(server, tmp_path):
    add_build(
        server,
        "whl/cu140",
        tmp_path / "w",
        "2.15.0+cu140",
        python_tag=PY_TAG,
        cuda="14.0",
        arch_flags="sm_90 sm_100 sm_120",
    )
    server.html_only.add("whl/cu140")  # a PEP 503 HTML page says the same
    cu140 = env(tmp_path, server, "cu140", "2.15.0", "cu140")

    data = plan(cu140, h100(tmp_path, "600.10"))
    torch = data["torch"]
    assert (torch["variant"], torch["cuda"], torch["requirements"]) == (
        "cu140",
        "14.0",
        ["torch==2.15.0+cu140"],
    )
    said = " | ".join(data["warnings"])
    # CUDA 14 is a new major: no driver floor can be inferred, and the plan says so instead of refusing.
    assert "unknown: no driver floor is known for CUDA 14.x" in said, said
    # Its GPU arch list is borrowed from the same release's nearest known CUDA variant.
    assert "inferred from torch 2.15.0 cu132" in said, said

    # The driver's own report (CUDA <= 13.2) decides against it: by the gate, not by the name.
    found = refusal(cu140, h100(tmp_path, "595.71.05", max_cuda="13.2"))
    assert set(found) == {"driver"} and "CUDA 14.x" in found["driver"], found


def test_an_unknown_variant_of_a_known_cuda_major_takes_that_majors_driver_floor(server, tmp_path):
    add_build(
        server,
        "whl/cu136",
        tmp_path / "w",
        "2.15.0+cu136",
        python_tag=PY_TAG,
        cuda="13.6",
        arch_flags="sm_90 sm_100 sm_120",
    )
    cu136 = env(tmp_path, server, "cu136", "2.15.0", "cu136")
    assert plan(cu136, h100(tmp_path))["torch"]["requirements"] == ["torch==2.15.0+cu136"]
    found = refusal(cu136, h100(tmp_path, "575.57.08"))
    assert set(found) == {"driver"} and "≥ 580" in found["driver"], found


def test_a_rocm_page_the_index_lists_is_a_candidate_the_amd_gates_check(server, tmp_path):
    """The table has no rocm6.4 build of 2.15.0 (its ROCm is 7.14), the index does: planned (index-wins), with
    the gfx and driver gates saying what they could not check; an NVIDIA node is refused it (issue 41)."""
    add_build(server, "whl/rocm6.4", tmp_path / "w", "2.15.0+rocm6.4", python_tag=PY_TAG)
    mi = facts(tmp_path, "mi250", gpus=[{"name": "AMD Instinct MI250X"}])  # an AMD GPU by its name
    rocm = env(tmp_path, server, "rocm", "2.15.0", "rocm6.4")
    data = plan(rocm, mi)
    assert data["torch"]["requirements"] == ["torch==2.15.0+rocm6.4"]
    warnings = data["warnings"]
    assert any("no gfx list known for torch 2.15.0 rocm6.4; GPU support unchecked" in w for w in warnings), (
        warnings
    )
    assert any(
        w.startswith("AMD kernel driver unknown; rocm6.4 needs one that runs ROCm 6.4") for w in warnings
    )
    assert any("support for ROCm/XPU is new and has not run on such hardware here" in w for w in warnings)
    found = refusal(rocm, h100(tmp_path))
    assert found["gpu-arch"].startswith("rocm6.4 wheels run on AMD GPUs; the target's GPUs are NVIDIA"), found


# ---------------------------------------------------------------------------------------------------------------
# 3. A partial mirror: only a release its page lists is planned; an unreadable page is "not checked".


def test_a_pinned_minor_on_a_partial_mirror_takes_the_newest_patch_the_mirror_holds(server, tmp_path):
    for version in ("2.13.0", "2.14.0"):
        add_build(server, "site/cu130", tmp_path / "w", f"{version}+cu130", python_tag=PY_TAG, cuda="13.0")
    mirror = f"https://download.pytorch.org/whl/cu130={server.url}/site/cu130"
    data = plan(env(tmp_path, server, "minor", "2.14", "cu130", mirror=mirror), h100(tmp_path))
    assert data["torch"]["requirements"] == ["torch==2.14.0+cu130"]
    assert any("2.14.1" in n for n in data["notes"]), data["notes"]


def k80_world(server: TorchIndex, tmp_path: Path) -> tuple[str, str]:
    """A Kepler node (sm_37, driver 470) only cu118 builds up to torch 2.7 still run on; the site mirrors cu118
    with torch 2.6.0 only. Returns (mirror rule, facts file)."""
    add_build(server, "site/cu118", tmp_path / "w", "2.6.0+cu118", python_tag=PY_TAG, cuda="11.8")
    node = facts(tmp_path, "k80", driver_version="470.256.02", max_cuda="11.4", gpus=[K80])
    return f"https://download.pytorch.org/whl/cu118={server.url}/site/cu118", node


def test_latest_on_a_partial_mirror_plans_only_a_release_the_mirror_lists(server, tmp_path):
    mirror, node = k80_world(server, tmp_path)
    data = plan(env(tmp_path, server, "k80", "latest", "auto", mirror=mirror), node)
    assert data["torch"]["requirements"] == ["torch==2.6.0+cu118"], data["torch"]
    assert "GET /site/cu118/torch/ json" in server.pages()


def test_an_unreadable_mirror_page_makes_the_plan_say_not_checked(server, tmp_path):
    mirror, node = k80_world(server, tmp_path)
    server.fail["site/cu118"] = 503
    data = plan(env(tmp_path, server, "k80", "latest", "auto", mirror=mirror), node)
    # The table stands in for the page it could not read, and the plan says what that leaves unchecked.
    assert data["torch"]["requirements"] == ["torch==2.7.1"], data["torch"]
    said = [w for w in data["warnings"] if w.startswith("not checked:")]
    assert said and "torch 2.7.1 cu118" in said[0] and "HTTP 503" in said[0], data["warnings"]
