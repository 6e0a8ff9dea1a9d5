"""When torch and the recipe's packages go into one installer run (plan.steps.one_resolution), and its indexes."""

from __future__ import annotations

import dataclasses

import pytest

from envbuilder.plan import steps
from envbuilder.resolver.mirror import PYPI
from envbuilder.resolver.wheels import Resolution

CPU = "https://download.pytorch.org/whl/cpu"
LABELLED = Resolution(
    torch="2.13.0",
    variant="cpu",
    channel="stable",
    index_url=CPU,
    requirements=("torch==2.13.0+cpu",),
    pip_flags=("--index-url", CPU),
    cuda=None,
    local="cpu",
)


@pytest.mark.parametrize(
    ("installer", "change", "plain", "one"),
    [
        ("uv", {}, ["numpy"], True),
        ("pip", {}, ["numpy"], False),  # pip merges indexes its own way: two runs, as before
        ("uv", {}, [], False),  # nothing to merge
        ("uv", {"requirements": ("torch==2.13.0",)}, ["numpy"], False),  # PyPI's build could satisfy it
        ("uv", {"requirements": ("torch==2.13.0+cpu", "torchvision==0.28.0")}, ["numpy"], False),
        ("uv", {"channel": "nightly", "pip_flags": ("--index-url", CPU, "--pre")}, ["numpy"], False),
    ],
)
def test_one_run_only_where_torch_cannot_come_from_another_index(installer, change, plain, one):
    assert steps.one_resolution(installer, dataclasses.replace(LABELLED, **change), plain) is one


def test_one_run_reads_pypi_and_torchs_index_for_the_best_match():
    flags = steps.one_resolution_flags(LABELLED)
    assert flags == ["--index-url", PYPI, "--extra-index-url", CPU, "--index-strategy", "unsafe-best-match"]
