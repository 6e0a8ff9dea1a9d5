"""The wheel-index resolver: every gate, the 'auto' variant, release picking, and the matrix's own consistency.

Expected values come from the facts in the matrix (torch-matrix sources), not from running the resolver.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from packaging.version import Version

from envbuilder.core.errors import ResolverErrors
from envbuilder.core.facts import Gpu, HostFacts
from envbuilder.resolver.wheels import TorchRequest, covers, gpu_capability, load_matrix, resolve

M = load_matrix()


def host(*, arch="x86_64", python="3.11.7", glibc="2.34", driver=None, max_cuda=None, gpus=(), cc=None, n=1):
    gpu_list = tuple(Gpu(gpus, cc) for _ in range(n)) if isinstance(gpus, str) else gpus
    return HostFacts(
        arch=arch, python=python, glibc=glibc, driver_version=driver, max_cuda=max_cuda, gpus=gpu_list
    )


def gates(request: TorchRequest, facts: HostFacts) -> dict[str, str]:
    with pytest.raises(ResolverErrors) as info:
        resolve(request, facts)
    return {e.gate: f"{e.message} | hint: {e.hint}" for e in info.value.errors}


# --- success paths --------------------------------------------------------------------------------------------


def test_exact_release_gives_index_url_pins_and_index_url_flag():
    r = resolve(TorchRequest("2.7.1", "cu128"), host(gpus="NVIDIA H100 NVL", cc="9.0", max_cuda="12.9"))
    assert r.index_url == "https://download.pytorch.org/whl/cu128"
    assert r.requirements == ("torch==2.7.1", "torchvision==0.22.1", "torchaudio==2.7.1")
    assert r.pip_flags == ("--index-url", "https://download.pytorch.org/whl/cu128")
    assert r.cuda == "12.8"


def test_minor_version_means_newest_patch():
    r = resolve(TorchRequest("2.9", "cu126"), host())
    assert r.torch == "2.9.1"


def test_latest_respects_target_python():
    # torch 2.8 is the last release with cp39 wheels.
    assert resolve(TorchRequest("latest", "cpu"), host(python="3.9.2")).torch == "2.8.0"
    # torch 2.15 needs Python >= 3.11; 2.14.1 is the newest for 3.10.
    assert resolve(TorchRequest("latest", "cpu"), host(python="3.11.7")).torch == "2.15.0"
    assert resolve(TorchRequest("latest", "cpu"), host(python="3.10.12")).torch == "2.14.1"


def test_torchaudio_frozen_at_2_11_for_later_torch():
    r = resolve(TorchRequest("2.13.0", "cu126"), host())
    assert "torchaudio==2.11.0" in r.requirements
    assert "torchvision==0.28.0" in r.requirements


def test_explicit_companion_versions_win():
    r = resolve(
        TorchRequest("2.3.1", "cu121", torchvision="0.18.1", torchaudio="2.3.1"), host(python="3.12.1")
    )
    assert r.requirements == ("torch==2.3.1", "torchvision==0.18.1", "torchaudio==2.3.1")


def test_test_channel_uses_test_index():
    # No release candidate is on the test index as of the table (2.14 and 2.15 are stable, 2.16's candidates are
    # still to come), so the matrix gets a stand-in 2.16.0 test row shaped like 2.15.0.
    candidate = replace(M.release("2.15.0"), torch="2.16.0", channel="test", torchvision="", torchaudio="")
    with_rc = replace(M, releases=(*M.releases, candidate))
    r = resolve(
        TorchRequest("2.16.0", "cu130", channel="test", packages=("torch",)),
        host(driver="580.95.05"),
        with_rc,
    )
    assert r.index_url == "https://download.pytorch.org/whl/test/cu130"


# --- auto variant ---------------------------------------------------------------------------------------------


def test_auto_without_gpu_is_cpu():
    r = resolve(TorchRequest("2.13.0", "auto", packages=("torch",)), host(gpus=()))
    assert r.variant == "cpu"
    assert r.index_url == "https://download.pytorch.org/whl/cpu"


def test_auto_on_h200_with_cuda13_driver_takes_pypi_default_cu130():
    r = resolve(TorchRequest("2.13.0", "auto"), host(driver="580.159.04", gpus="NVIDIA H200", cc="9.0", n=2))
    assert r.variant == "cu130"


def test_auto_on_cuda12_driver_avoids_cuda13():
    # cu130/cu132 need driver >= 580; cu126 is the only CUDA-12 variant of 2.13.
    r = resolve(
        TorchRequest("2.13.0", "auto"), host(driver="550.54.15", gpus="NVIDIA A100-SXM4-40GB", cc="8.0")
    )
    assert r.variant == "cu126"


def test_auto_on_v100_picks_a_variant_with_sm70():
    r = resolve(
        TorchRequest("2.11.0", "auto"), host(driver="580.65.06", gpus="Tesla V100-SXM2-16GB", cc="7.0")
    )
    assert r.variant == "cu126"  # cu130 never had sm_70; 2.11's cu128 dropped it


# --- gates ----------------------------------------------------------------------------------------------------


def test_gate_driver_too_old_for_cuda13():
    found = gates(TorchRequest("2.13.0", "cu130"), host(driver="550.54.15", gpus="NVIDIA H100", cc="9.0"))
    assert set(found) == {"driver"}
    assert "driver ≥ 580 (CUDA 13.x)" in found["driver"]
    assert "550.54.15" in found["driver"]
    assert "use cu126 with torch 2.13.0" in found["driver"]


def test_gate_driver_from_site_max_cuda_only():
    # Zurada publishes "CUDA up to 12.9" and no driver version.
    found = gates(TorchRequest("2.12.1", "cu130"), host(max_cuda="12.9", gpus="NVIDIA H100 NVL", cc="9.0"))
    assert "driver" in found
    assert "CUDA ≤ 12.9" in found["driver"]


def test_minor_version_compat_is_a_warning_not_an_error():
    r = resolve(TorchRequest("2.7.1", "cu128"), host(driver="535.104.05", gpus="NVIDIA A100", cc="8.0"))
    assert any("minor-version compatibility" in w for w in r.warnings)


def test_gate_v100_on_cu128_from_2_11():
    found = gates(
        TorchRequest("2.11.0", "cu128"), host(driver="570.124.06", gpus="Tesla V100-SXM2-16GB", cc="7.0")
    )
    assert set(found) == {"gpu-arch"}
    assert "sm_70" in found["gpu-arch"]
    assert "use cu126 with torch 2.11.0" in found["gpu-arch"]


def test_v100_on_cu128_2_10_is_fine():
    resolve(TorchRequest("2.10.0", "cu128"), host(driver="570.124.06", gpus="Tesla V100-SXM2-16GB", cc="7.0"))


def test_gate_pascal_on_cu128():
    found = gates(
        TorchRequest("2.8.0", "cu128"), host(driver="570.124.06", gpus="Tesla P100-PCIE-16GB", cc="6.0")
    )
    assert "gpu-arch" in found
    assert "sm_60" in found["gpu-arch"]


def test_gate_blackwell_on_cu126():
    found = gates(TorchRequest("2.12.1", "cu126"), host(driver="580.95.05", gpus="NVIDIA B200", cc="10.0"))
    assert "gpu-arch" in found
    assert "use cu130 with torch 2.12.1" in found["gpu-arch"]


def test_sm89_runs_sm86_code():
    entry = next(a for a in M.arch_lists if a.variant == "cu126" and a.platform == "x86_64")
    assert covers(entry, "8.9") == (True, False)


def test_ptx_only_coverage_warns_about_jit():
    # sm_121 (GB10) runs sm_120 SASS; a future sm_130 could only JIT the 12.0 PTX.
    entry = next(a for a in M.arch_lists if a.variant == "cu132" and a.platform == "x86_64")
    assert covers(entry, "12.1") == (True, False)
    assert covers(entry, "13.0") == (True, True)


def test_gate_aarch64_cu124_is_the_vista_trap():
    found = gates(
        TorchRequest("2.6.0", "cu124"),
        host(arch="aarch64", max_cuda="12.8", gpus="NVIDIA GH200 480GB", cc="9.0"),
    )
    assert set(found) == {"aarch64-no-cuda-wheel"}
    assert "CPU-only" in found["aarch64-no-cuda-wheel"]
    # The first stable release after 2.6 with an aarch64 CUDA wheel is 2.7 (cu128 only).
    assert "use torch 2.7.0 with cu128" in found["aarch64-no-cuda-wheel"]


def test_gate_aarch64_2_8_only_has_cu129():
    found = gates(TorchRequest("2.8.0", "cu128"), host(arch="aarch64", gpus="NVIDIA GH200 480GB", cc="9.0"))
    assert "use cu129 with torch 2.8.0" in found["aarch64-no-cuda-wheel"]


def test_aarch64_secondary_source_warns():
    r = resolve(
        TorchRequest("2.4.0", "cu124", packages=("torch",)),
        host(arch="aarch64", python="3.11.8", gpus="GH200", cc="9.0"),
    )
    assert any("secondary source" in w for w in r.warnings)


def test_gate_python_out_of_range():
    found = gates(TorchRequest("2.10.0", "cu126"), host(python="3.9.2"))
    assert set(found) == {"python"}
    assert "3.10–3.14" in found["python"]
    assert "pin torch 2.8.0" in found["python"]


def test_gate_glibc_below_manylinux_floor():
    found = gates(TorchRequest("2.7.1", "cu126"), host(glibc="2.17"))
    assert set(found) == {"glibc"}
    assert "2.28" in found["glibc"]


def test_glibc_2_6_depends_on_variant():
    resolve(TorchRequest("2.6.0", "cu124"), host(glibc="2.17"))
    assert "glibc" in gates(TorchRequest("2.6.0", "cu126"), host(glibc="2.17"))


@pytest.mark.parametrize(
    ("variant", "suggestion"), [("cu125", "cu126"), ("cu131", "cu130"), ("cu12.4", "cu124")]
)
def test_gate_variant_that_does_not_exist(variant, suggestion):
    found = gates(TorchRequest("2.9.1", variant), host())
    assert set(found) == {"unknown-variant"}
    assert suggestion in found["unknown-variant"]
    assert "never the one nvcc reports" in found["unknown-variant"]


def test_gate_variant_not_built_for_release():
    found = gates(TorchRequest("2.7.1", "cu124"), host())
    assert set(found) == {"variant-not-built"}
    assert "cu118, cu126, cu128" in found["variant-not-built"]
    assert "2.4.0–2.6.0" in found["variant-not-built"]


def test_gate_torchaudio_missing_on_cu132():
    found = gates(TorchRequest("2.13.0", "cu132"), host(driver="595.58.03"))
    assert set(found) == {"package-missing"}
    assert "torchaudio" in found["package-missing"]


def test_gate_nightly_must_be_pinned_and_stream_must_exist():
    found = gates(TorchRequest("latest", "cu124", channel="nightly", packages=("torch",)), host())
    assert {"nightly-unpinned", "nightly-stream-removed"} <= set(found)
    assert "2025-03" in found["nightly-stream-removed"]


def test_pinned_nightly_resolves_with_pre_and_warns():
    r = resolve(
        TorchRequest("2.15.0.dev20260801", "cu130", channel="nightly", packages=("torch",)),
        host(driver="580.95.05"),
    )
    assert r.index_url == "https://download.pytorch.org/whl/nightly/cu130"
    assert "--pre" in r.pip_flags
    assert any("disappear" in w for w in r.warnings)


def test_several_failed_gates_are_reported_together():
    found = gates(
        TorchRequest("2.11.0", "cu128"), host(python="3.9.2", glibc="2.17", gpus="Tesla V100", cc="7.0")
    )
    assert {"python", "glibc", "gpu-arch"} <= set(found)


def test_allow_turns_a_gate_into_a_warning():
    request = TorchRequest("2.11.0", "cu128", allow=frozenset({"gpu-arch"}))
    r = resolve(request, host(driver="570.124.06", gpus="Tesla V100-SXM2-16GB", cc="7.0"))
    assert any(w.startswith("allowed by the recipe (gpu-arch)") for w in r.warnings)


def test_unknown_release_lists_known_ones():
    found = gates(TorchRequest("2.99.0", "cpu"), host())
    assert "2.15.0" in found["unknown-release"]


# --- GPU name lookup ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "cc"),
    [
        ("NVIDIA GH200 480GB", "9.0"),
        ("NVIDIA H200", "9.0"),
        ("Tesla V100-SXM2-16GB", "7.0"),
        ("NVIDIA A100-SXM4-40GB", "8.0"),
        ("Quadro RTX 5000", "7.5"),
        ("NVIDIA A10", "8.6"),
        ("NVIDIA A100 80GB PCIe", "8.0"),
        ("Some Future GPU", None),
    ],
)
def test_gpu_capability_from_name(name, cc):
    assert gpu_capability(Gpu(name)) == cc


# --- the matrix itself ----------------------------------------------------------------------------------------


def test_matrix_releases_are_consistent():
    for rel in M.releases:
        for arch, variants in rel.variants.items():
            for v in variants:
                assert v in M.variants, (rel.torch, arch, v)
        lo, hi = (Version(x) for x in rel.python)
        assert lo <= hi
        assert rel.pypi_default["x86_64"] in (*rel.variants["x86_64"], "cpu")


def test_every_stable_cuda_wheel_has_an_arch_list():
    missing = []
    for rel in M.stable_releases():
        for arch, variants in rel.variants.items():
            for v in variants:
                if not any(
                    a.variant == v and a.platform == arch and Version(rel.torch) in a.torch
                    for a in M.arch_lists
                ):
                    missing.append(f"{rel.torch} {v} {arch}")
    assert missing == []


def test_family_driver_floors():
    assert M.variants["cu118"].family_min_driver == "450.80.02"
    assert M.variants["cu126"].family_min_driver == "525.60.13"
    assert M.variants["cu130"].family_min_driver == "580"  # NVIDIA: CUDA 13.x needs >= 580
