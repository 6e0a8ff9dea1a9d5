"""ROCm and XPU builds (issue 41): the resolver plans them from recorded facts and refuses them for a wrong gfx
target, an Intel GPU outside a build's families, a kernel driver too old for the wheel's ROCm, a node without Level
Zero, or GPUs of another vendor. No AMD or Intel GPU exists here: these are the recorded-fact cases only."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from envbuilder.core.errors import ResolverErrors
from envbuilder.core.facts import Gpu, HostFacts
from envbuilder.resolver import mirror
from envbuilder.resolver.indexfacts import IndexFacts, PageRead, parse_wheel_filename
from envbuilder.resolver.vendors import NEW_SUPPORT
from envbuilder.resolver.wheels import TorchRequest, load_matrix, resolve
from envbuilder.system.host import load_facts_file

DATA = Path(__file__).resolve().parents[1] / "data" / "facts"
MI250X = load_facts_file(str(DATA / "mi250x-x8.json"))  # amdgpu 6.10.5: ROCm 6.3's driver
PVC = load_facts_file(str(DATA / "pvc-max1550-x4.json"))
H100 = load_facts_file(str(DATA / "h100.json"))
#: amdgpu-install 30.30 is ROCm 7.2's driver (ROCm/amdgpu-docs PR #97).
MI300A = HostFacts(
    arch="x86_64",
    glibc="2.34",
    python="3.12.4",
    amdgpu_version="30.30.2",
    gpus=(Gpu("AMD Instinct MI300A", vendor="amd", arch="gfx942:sramecc+:xnack-"),),
)


def errors(request: TorchRequest, facts: HostFacts, index: IndexFacts | None = None) -> dict[str, str]:
    with pytest.raises(ResolverErrors) as info:
        resolve(request, facts, index=index)
    return {e.gate: f"{e.message} | hint: {e.hint}" for e in info.value.errors}


def test_auto_on_an_amd_node_picks_the_newest_rocm_build_its_driver_runs():
    r = resolve(TorchRequest("2.13.0"), MI300A)
    assert (r.variant, r.index_url) == ("rocm7.2", "https://download.pytorch.org/whl/rocm7.2")
    assert r.cuda is None
    assert any(n.startswith("variant auto: rocm7.2 (AMD GPU AMD Instinct MI300A)") for n in r.notes)
    assert any(w.startswith(NEW_SUPPORT) for w in r.warnings)


def test_a_rocm_runtime_newer_than_the_kernel_driver_runs_is_refused():
    found = errors(TorchRequest("2.13.0", "rocm7.2"), MI250X)
    assert set(found) == {"driver"}
    assert found["driver"].startswith(
        "rocm7.2 wheels need an AMD kernel driver that runs ROCm 7.2; the target's driver is amdgpu 6.10.5 "
        "(ROCm 6.3's, which runs ROCm 6.1–7.0)"
    )
    # Neither ROCm build of 2.13 runs there: the hint names the newest release with one that does.
    assert found["driver"].endswith(
        "pin torch 2.10.0 with rocm7.0, or ask the site for a newer amdgpu driver"
    )


def test_auto_falls_back_to_the_newest_release_the_amd_driver_runs():
    r = resolve(TorchRequest("latest"), MI250X)
    assert (r.torch, r.variant) == ("2.10.0", "rocm7.0")
    assert any("newer releases do not fit this target: 2.15.0 (driver)" in n for n in r.notes)


def test_a_gfx_target_the_build_lacks_is_refused_in_the_cuda_gates_words():
    navi10 = replace(MI300A, gpus=(Gpu("AMD Radeon RX 5700 XT", vendor="amd", arch="gfx1010"),))
    found = errors(TorchRequest("2.13.0", "rocm7.2"), navi10)
    assert set(found) == {"gpu-arch"}
    assert found["gpu-arch"].startswith(
        "AMD Radeon RX 5700 XT is gfx1010, which torch 2.13.0 rocm7.2 does not carry (it has gfx900, gfx906,"
    )
    assert "no PyTorch ROCm wheel carries gfx1010" in found["gpu-arch"]


def test_gfx906_left_the_rocm_builds_with_rocm_7_14():
    mi50 = replace(MI300A, gpus=(Gpu("AMD Instinct MI50", vendor="amd"),))  # gfx906 from the model table
    found = errors(TorchRequest("2.14.0", "rocm7.14"), mi50)
    assert "AMD Instinct MI50 is gfx906, which torch 2.14.0 rocm7.14 does not carry" in found["gpu-arch"]
    assert found["gpu-arch"].endswith("the newest release with gfx906 code is torch 2.13.0 with rocm7.2")


def test_auto_on_a_pvc_node_picks_xpu():
    r = resolve(TorchRequest("2.13.0"), PVC)
    assert (r.variant, r.index_url) == ("xpu", "https://download.pytorch.org/whl/xpu")
    assert any(w.startswith(NEW_SUPPORT) for w in r.warnings)


def test_xpu_without_level_zero_is_refused():
    found = errors(TorchRequest("2.13.0", "xpu"), replace(PVC, level_zero=""))
    assert set(found) == {"driver"}
    assert "the target has no Level Zero runtime" in found["driver"]


def test_an_intel_gpu_outside_the_xpu_builds_families_is_refused():
    flex = replace(PVC, gpus=(Gpu("Intel(R) Data Center GPU Flex 170", vendor="intel"),))
    found = errors(TorchRequest("2.13.0", "xpu"), flex)
    assert found["gpu-arch"].startswith(
        "Intel(R) Data Center GPU Flex 170 is Intel Data Center GPU Flex Series, which torch 2.13.0 xpu does not "
        "support (it supports pvc,"
    )


def test_no_xpu_build_before_2_5():
    found = errors(TorchRequest("2.4.1", "xpu"), PVC)
    assert found["variant-not-built"].startswith("torch 2.4.1 has no xpu build for x86_64")
    assert "xpu exists for torch 2.5.0–" in found["variant-not-built"]


def test_no_rocm_or_xpu_wheels_for_aarch64():
    found = errors(TorchRequest("2.13.0", "rocm7.2"), replace(MI300A, arch="aarch64"))
    assert found["variant-not-built"].startswith("torch 2.13.0 has no rocm7.2 build for aarch64")


@pytest.mark.parametrize(
    ("variant", "facts", "said"),
    [
        ("rocm7.2", H100, "rocm7.2 wheels run on AMD GPUs; the target's GPUs are NVIDIA (NVIDIA H100 NVL)"),
        ("cu130", MI300A, "cu130 wheels run on NVIDIA GPUs; the target's GPUs are AMD (AMD Instinct MI300A)"),
        ("xpu", MI300A, "xpu wheels run on Intel GPUs; the target's GPUs are AMD (AMD Instinct MI300A)"),
    ],
)
def test_a_build_for_another_vendors_gpus_is_refused(variant, facts, said):
    assert errors(TorchRequest("2.13.0", variant), facts)["gpu-arch"].startswith(said)


def test_an_nvidia_node_still_gets_cuda_from_auto():
    assert resolve(TorchRequest("2.13.0"), H100).variant.startswith("cu")


def test_a_driver_the_table_cannot_place_is_a_warning_not_a_refusal():
    r = resolve(TorchRequest("2.13.0", "rocm7.2"), replace(MI300A, amdgpu_version="9.99.1"))
    assert any("amdgpu driver 9.99.1 is not in the table" in w for w in r.warnings)


def test_the_index_wins_a_rocm_build_the_table_does_not_know_is_planned_from_its_page():
    url = "https://download.pytorch.org/whl/rocm7.3"
    names = ["torch-2.13.0+rocm7.3-cp312-cp312-manylinux_2_28_x86_64.whl"]
    files = tuple(f for f in (parse_wheel_filename(n) for n in names) if f is not None)
    index = IndexFacts(
        {
            url: PageRead(url, ("http://mirror.test/rocm7.3",), files, read_at=1.8e9),
            mirror.PYPI: PageRead(mirror.PYPI, ("http://mirror.test/pypi",), (), read_at=1.8e9),
        }
    )
    unknown_driver = replace(
        MI300A, amdgpu_version=None
    )  # 7.2's driver would refuse a newer ROCm (see above)
    r = resolve(TorchRequest("2.13.0", "rocm7.3", packages=("torch",)), unknown_driver, index=index)
    assert (r.variant, r.requirements) == ("rocm7.3", ("torch==2.13.0+rocm7.3",))
    assert any("rocm7.3 is listed by the index but not in the shipped table" in w for w in r.warnings)
    # Its gfx list is unknown (the table has none for it): said, not guessed.
    assert any("no gfx list known for torch 2.13.0 rocm7.3" in w for w in r.warnings)


def test_every_rocm_variant_of_the_table_has_a_gfx_list_for_each_release_that_offers_it():
    m = load_matrix()
    missing = [
        f"{rel.torch} {v}"
        for rel in m.stable_releases()
        for v in rel.rocm
        if m.vendor.gfx_list(v, rel.torch) is None
    ]
    assert not missing


@pytest.mark.parametrize(
    ("name", "vendor"),
    [
        ("AMD Instinct MI250X", "amd"),
        ("AMD Radeon PRO W7900", "amd"),
        ("Intel(R) Data Center GPU Max 1550", "intel"),
        ("NVIDIA H100 80GB HBM3", "nvidia"),
        ("Tesla V100-SXM2-32GB", "nvidia"),
    ],
)
def test_a_gpu_that_does_not_say_its_vendor_is_known_by_its_name(name, vendor):
    """Facts files written before vendors were recorded, and site GPU names, still reach the right gates."""
    assert HostFacts(gpus=(Gpu(name),)).gpu_vendor == vendor
