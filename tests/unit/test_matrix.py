"""The shipped wheel matrix as of 2026-11-28: every row sourced and dated, the 2.14/2.15 releases and the nightly
stream as PyPI and PyTorch's PRs give them, and the two gates those facts drive (a CPU architecture with no torch
wheel; a GPU that no wheel of the asked release carries).

Expected values come from the facts (../shared/reference/torch-update-2026-11.md and the PRs it names), not from
running the resolver.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import date
from importlib.resources import files
from typing import Any

import pytest
from helpers import load_facts

from envbuilder.core._toml import loads
from envbuilder.core.errors import ResolverErrors
from envbuilder.core.facts import Gpu, HostFacts
from envbuilder.recipe.schema import GATES
from envbuilder.resolver.matrix import covers, load_matrix, matrix_from_data
from envbuilder.resolver.wheels import TorchRequest, resolve

M = load_matrix()
RAW: dict[str, Any] = loads(
    files("envbuilder").joinpath("data/torch_matrix.toml").read_text(encoding="utf-8")
)
AS_OF = date.fromisoformat(RAW["as_of"])


def rows() -> list[tuple[str, dict[str, Any]]]:
    """Every row of the table that states facts, named for the failure message."""
    out: list[tuple[str, dict[str, Any]]] = []
    out += [(f"variant.{name}", row) for name, row in RAW["variant"].items()]
    out += [(f"release {row['torch']}", row) for row in RAW["release"]]
    out += [(f"arch_list {row['variant']} {row['platform']} {row['torch']}", row) for row in RAW["arch_list"]]
    out += [("nightly", RAW["nightly"])]
    for table in ("no_index", "no_wheels", "cpu_only"):
        out += [(f"{table}.{name}", row) for name, row in RAW[table].items()]
    return out


def errors(request: TorchRequest, facts: HostFacts) -> dict[str, str]:
    with pytest.raises(ResolverErrors) as info:
        resolve(request, facts)
    return {e.gate: f"{e.message} | hint: {e.hint}" for e in info.value.errors}


# --- every fact has a source and a date -----------------------------------------------------------------------


@pytest.mark.parametrize(("name", "row"), rows(), ids=[r[0] for r in rows()])
def test_every_row_has_a_source_and_a_real_checked_date(name, row):
    assert isinstance(row, dict), f"{name} is not a table with source and checked"
    assert row.get("source", "").strip(), f"{name} names no source"
    checked = date.fromisoformat(row["checked"])  # a real calendar date, or this raises
    assert date(2023, 1, 1) <= checked <= AS_OF, f"{name} checked {checked}, table as of {AS_OF}"


def test_as_of_is_the_newest_checked_date():
    assert RAW["as_of"] == "2026-11-28"
    assert max(date.fromisoformat(row["checked"]) for _, row in rows()) == AS_OF


def test_loader_keeps_each_rows_date():
    assert M.release("2.15.0").checked == "2026-11-23"
    assert M.release("2.0.0").checked == "2026-08-21"
    assert M.variants["cu132"].checked == "2026-11-28"
    assert M.release("2.13.0").checked == "2026-11-23"  # the day its source says it was re-read
    assert M.variants["cu117"].checked == "2026-08-21"
    assert all(a.checked for a in M.arch_lists)
    assert M.nightly["checked"] == "2026-11-23"
    assert M.provenance["no_wheels.ppc64le"][1] == "2026-11-23"
    assert M.provenance["no_index.cu131"] == (RAW["no_index"]["cu131"]["source"], "2026-08-21")
    assert all(r.origin == "table" for r in M.releases)


def test_age_days_counts_from_as_of():
    assert M.age_days(date(2026, 11, 28)) == 0
    assert M.age_days(date(2027, 1, 1)) == 34
    assert M.age_days(date(2026, 11, 1)) == -27


def test_plain_string_rows_still_load():
    # A table written before rows carried their sources (one reason string per name) loads the same way.
    data = {**RAW, "no_index": {"cu131": "PyTorch never built CUDA 13.1"}}
    data.pop("no_wheels")
    m = matrix_from_data(data)
    assert m.no_index == {"cu131": "PyTorch never built CUDA 13.1"}
    assert m.no_wheels == {}


# --- releases -------------------------------------------------------------------------------------------------


def test_stable_releases_reach_2_15_and_no_candidate_is_left():
    assert [r.torch for r in M.stable_releases()][-4:] == ["2.13.0", "2.14.0", "2.14.1", "2.15.0"]
    assert [r.torch for r in M.releases if r.channel != "stable"] == []


@pytest.mark.parametrize(
    ("torch", "vision", "default", "python", "threaded", "released"),
    [
        ("2.14.0", "0.29.0", "cu130", ("3.10", "3.14"), ("3.14t",), "2026-09-02"),
        ("2.14.1", "0.29.1", "cu130", ("3.10", "3.14"), ("3.14t",), "2026-09-30"),
        ("2.15.0", "0.29.2", "cu132", ("3.11", "3.15"), ("3.14t", "3.15t"), "2026-10-28"),
    ],
)
def test_new_release_rows(*, torch, vision, default, python, threaded, released):
    rel = M.release(torch)
    assert rel.torchvision == vision
    assert rel.torchaudio == "2.11.0"  # no torchaudio after 2.11.0
    assert rel.pypi_default == {"x86_64": default, "aarch64": default}
    assert rel.python == python
    assert rel.free_threaded == threaded
    assert rel.released == released
    assert rel.glibc == "2.28"


def test_2_15_dropped_cu126_and_no_2_15_wheel_carries_sm70():
    rel = M.release("2.15.0")
    assert rel.variants == {"x86_64": ("cu130", "cu132"), "aarch64": ("cu130", "cu132")}
    assert M.arch_list("cu126", "x86_64", "2.15.0") is None
    assert M.arch_list("cu126", "aarch64", "2.15.0") is None
    for entry in M.arch_lists:
        if "2.15.0" in entry.torch:
            assert "7.0" not in entry.sm, entry
            assert not covers(entry, "7.0")[0], entry
    # 2.14.x is the last with cu126, and its cu126 build still carries Volta.
    assert "cu126" in M.release("2.14.1").variants["x86_64"]
    assert covers(M.arch_list("cu126", "x86_64", "2.14.1"), "7.0") == (True, False)


def test_newest_with_variant():
    assert M.newest_with_variant("cu126", "x86_64").torch == "2.14.1"
    assert M.newest_with_variant("cu132", "aarch64").torch == "2.15.0"
    assert M.newest_with_variant("cu128", "x86_64").torch == "2.11.0"
    assert M.newest_with_variant("cu118", "aarch64") is None
    assert M.newest_with_variant("cpu", "x86_64").torch == "2.15.0"
    assert M.newest_with_variant("cpu", "ppc64le") is None


def test_driver_floors_of_the_cuda_13_variants():
    assert M.variants["cu132"].toolkit_driver == "595.71.05"  # CUDA 13.2.2
    for v in ("cu130", "cu132", "cu134"):
        # NVIDIA's minor version compatibility table: CUDA 13.x runs on any driver >= 580 (580.65.06 is the
        # 13.0 GA toolkit's own driver, not the floor).
        assert M.variants[v].family_min_driver == "580"
        assert ">= 580" in M.variants[v].source and "2026-11-28" in M.variants[v].source
    assert M.variants["cu134"].nightly_only
    assert "cu135" in M.no_index


def test_a_580_branch_driver_older_than_the_13_0_toolkit_driver_runs_cuda_13_wheels():
    """Any R580 driver runs a CUDA 13 wheel (minor version compatibility), not only 580.65.06 and later."""
    gpus = (Gpu("NVIDIA H100 80GB HBM3", "9.0"),)
    node = HostFacts(arch="x86_64", glibc="2.35", python="3.12.3", driver_version="580.20.01", gpus=gpus)
    res = resolve(TorchRequest("2.15.0", "cu130", packages=("torch",)), node)
    assert res.variant == "cu130"
    assert any("minor-version" in w for w in res.warnings), res.warnings


@pytest.mark.parametrize(
    ("torch", "released"),
    [("2.10.0", "2026-01-21"), ("2.11.0", "2026-03-23"), ("2.12.0", "2026-05-13"), ("2.12.1", "2026-06-17")],
)
def test_the_2_10_to_2_12_rows_have_their_release_day_with_its_source(torch, released):
    rel = M.release(torch)
    assert rel.released == released
    assert "released: " in rel.source and "read 2026-11-28" in rel.source
    assert rel.checked == "2026-08-21"  # only the day was added: the rest of the row was not re-read


# --- nightly --------------------------------------------------------------------------------------------------


def test_nightly_is_2_16_without_cu126_or_python_3_10():
    nightly = M.nightly
    assert nightly["torch"] == "2.16.0"
    for arch in ("x86_64", "aarch64"):
        assert nightly[arch] == ["cu130", "cu132", "cu134"]
    assert "cu126" in nightly["removed"]
    assert "2026-09-08" in nightly["removed"]["cu126"]
    assert nightly["python"] == ["3.11", "3.14"]


def test_cu126_nightly_is_a_removed_stream():
    found = errors(
        TorchRequest("2.16.0.dev20261120", "cu126", channel="nightly", packages=("torch",)),
        load_facts("v100"),
    )
    assert "removed 2026-09-08" in found["nightly-stream-removed"]


# --- 'latest' from the table alone ----------------------------------------------------------------------------


def test_latest_without_an_index_read_is_2_15_for_python_3_11_and_2_14_1_for_3_10():
    cpu = load_facts("cpu-only")
    assert cpu.python == "3.11.7"
    assert resolve(TorchRequest("latest", "cpu"), cpu).torch == "2.15.0"
    assert resolve(TorchRequest("latest", "cpu"), replace(cpu, python="3.10.14")).torch == "2.14.1"


# --- the platform gate ----------------------------------------------------------------------------------------


def ppc64le_v100() -> HostFacts:
    # A POWER9 node with V100s (the Summit/Lassen shape): the V100 facts on a ppc64le CPU.
    return replace(load_facts("v100"), arch="ppc64le", glibc="2.28")


def test_platform_is_a_gate_name():
    assert "platform" in GATES


@pytest.mark.parametrize("variant", ["auto", "cpu", "cu126"])
def test_ppc64le_fails_with_the_platform_gate_for_every_variant(variant):
    found = errors(TorchRequest("latest", variant), ppc64le_v100())
    assert set(found) == {"platform"}
    message = found["platform"]
    assert "ppc64le" in message
    assert "PyPI" in message
    assert "download.pytorch.org" in message
    assert 'env.kind = "conda"' in message
    assert "source" in message


def test_ppc64le_auto_never_plans_the_cpu_index_even_for_a_pinned_release():
    # Before the gate, 'auto' fell back to the CPU index here, where no ppc64le wheel exists.
    assert set(errors(TorchRequest("2.14.1", "auto"), ppc64le_v100())) == {"platform"}
    nightly = TorchRequest("2.16.0.dev20261120", "auto", channel="nightly", packages=("torch",))
    assert set(errors(nightly, ppc64le_v100())) == {"platform"}


def test_the_platform_gate_can_be_allowed():
    r = resolve(
        TorchRequest("2.14.1", "cpu", packages=("torch",), allow=frozenset({"platform"})),
        replace(load_facts("cpu-only"), arch="ppc64le"),
    )
    assert r.index_url == "https://download.pytorch.org/whl/cpu"
    assert any(w.startswith("allowed by the recipe (platform)") for w in r.warnings)


def test_s390x_has_cpu_wheels_but_no_cuda_build():
    z = replace(load_facts("cpu-only"), arch="s390x")
    assert resolve(TorchRequest("2.15.0", "cpu"), z).index_url == "https://download.pytorch.org/whl/cpu"
    found = errors(TorchRequest("2.15.0", "cu130"), z)
    assert set(found) == {"platform"}
    assert "s390x" in found["platform"]
    assert 'variant = "cpu"' in found["platform"]


def test_x86_64_and_aarch64_pass_the_platform_gate():
    for name in ("v100", "gh200-aarch64", "cpu-only"):
        with pytest.raises(ResolverErrors) as info:
            resolve(TorchRequest("2.15.0", "cu126"), load_facts(name))
        assert "platform" not in {e.gate for e in info.value.errors}, name


# --- a V100 asking for 2.15 -----------------------------------------------------------------------------------


@pytest.mark.parametrize("variant", ["auto", "cu126", "cu130", "cu132"])
def test_v100_asking_for_2_15_is_told_no_2_15_wheel_carries_sm70(variant):
    found = errors(TorchRequest("2.15.0", variant), load_facts("v100"))
    assert "gpu-arch" in found
    gpu = found["gpu-arch"]
    assert "sm_70" in gpu
    assert "no torch 2.15.0 wheel for x86_64 carries sm_70" in gpu
    assert "the newest release with sm_70 code is torch 2.14.1 with cu126" in gpu


def test_v100_asking_for_2_15_cu126_is_not_told_to_use_a_cuda_13_build():
    found = errors(TorchRequest("2.15.0", "cu126"), load_facts("v100"))
    assert "2.6.0–2.14.1" in found["variant-not-built"]
    assert "use one of" not in found["variant-not-built"]  # cu130/cu132 carry no sm_70 and need driver 580


def test_v100_with_2_14_still_resolves_cu126():
    v100 = replace(load_facts("v100"), glibc="2.28")
    r = resolve(TorchRequest("2.14", "auto"), v100)
    assert (r.torch, r.variant) == ("2.14.1", "cu126")


def test_v100_latest_stops_at_2_14_1():
    r = resolve(TorchRequest("latest", "auto"), replace(load_facts("v100"), glibc="2.28"))
    assert (r.torch, r.variant) == ("2.14.1", "cu126")
