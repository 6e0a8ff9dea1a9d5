"""The validation payload's device-generic helpers (issue 41): which GPU stack a torch build drives, the collective
backend it offers, and the gfx targets a ROCm build lacks. Pure: no torch, no GPU (none of AMD's or Intel's exists
here); the CPU torch env tests run the payload's CPU paths."""

from __future__ import annotations

import sys

import pytest
from helpers import REPO

sys.path.insert(0, str(REPO / "envbuilder" / "payloads"))
import envbuilder_facts as facts


@pytest.mark.parametrize(
    ("cuda", "hip", "xpu", "kind", "backend"),
    [
        ("13.0", None, False, "cuda", "nccl"),
        (None, "7.2.53211", False, "rocm", "nccl"),  # RCCL answers to torch's "nccl" name
        (None, None, True, "xpu", "xccl"),
        (None, None, False, "", "gloo"),
    ],
)
def test_the_stack_and_its_collective_backend(cuda, hip, xpu, kind, backend):
    assert facts.accelerator(cuda, hip, xpu) == kind
    assert facts.dist_backend(kind) == backend


def test_gfx_gaps_compares_targets_without_their_feature_flags():
    built = ["gfx900", "gfx906", "gfx908", "gfx90a", "gfx942"]
    assert facts.gfx_gaps(built, ["gfx90a:sramecc+:xnack-", "gfx942:sramecc+:xnack-"]) == []
    assert facts.gfx_gaps(built, ["gfx950:sramecc+:xnack-", "gfx90a"]) == ["gfx950"]


def test_rocm_and_level_zero_libraries_are_tracked_for_provenance():
    for stem in ("libamdhip64", "librccl", "libMIOpen", "libhsa-runtime64", "libze_loader", "libsycl"):
        assert stem in facts.TRACKED_LIBS


def test_device_code_is_what_each_stack_compares():
    from types import SimpleNamespace

    assert facts.device_code("cuda", SimpleNamespace(major=9, minor=0)) == "9.0"
    assert (
        facts.device_code("rocm", SimpleNamespace(gcnArchName="gfx90a:sramecc+:xnack-"))
        == "gfx90a:sramecc+:xnack-"
    )
    assert facts.device_code("xpu", SimpleNamespace(name="Intel(R) Data Center GPU Max 1550")) is None
