"""PEP 440 local labels with more than one segment (``+cu130.post1``, ``+cu117.with.pypi.cudnn``,
``+cpu.cxx11.abi``): the first segment names the variant, the rest is kept; and PEP 592 yank reasons as the
two page formats give them."""

from __future__ import annotations

import json
from typing import Optional

import pytest

from envbuilder.backends import torchbuild
from envbuilder.resolver import knowledge
from envbuilder.resolver.indexfacts import (
    label_variant,
    parse_simple_html,
    parse_simple_json,
    parse_wheel_filename,
    split_label,
    wheel_from_json,
)


@pytest.mark.parametrize(
    ("label", "variant", "rest"),
    [
        ("cu130", "cu130", ""),
        ("cu130.post1", "cu130", "post1"),
        ("cu117.with.pypi.cudnn", "cu117", "with.pypi.cudnn"),
        ("cpu.cxx11.abi", "cpu", "cxx11.abi"),
        ("CPU_cxx11-abi", "cpu", "cxx11.abi"),  # PEP 440 also separates with - and _, and folds case
        ("rocm7.1", "rocm7.1", ""),  # a ROCm variant is named with its version: the rocm7.1 index
        ("rocm6.2.4", "rocm6.2.4", ""),
        ("rocm7.1.post1", "rocm7.1", "post1"),
        ("xpu", "xpu", ""),
        ("", "", ""),
    ],
)
def test_a_label_splits_into_its_variant_and_the_rest(label, variant, rest):
    assert split_label(label) == (variant, rest)
    assert label_variant(label) == variant


def test_a_wheel_with_a_suffixed_label_keeps_it_whole_and_names_its_variant():
    wheel = parse_wheel_filename("torch-2.0.1+cu117.with.pypi.cudnn-cp311-cp311-linux_x86_64.whl")
    assert wheel is not None
    assert (wheel.version, wheel.local, wheel.variant) == ("2.0.1", "cu117.with.pypi.cudnn", "cu117")
    assert wheel.full_version == "2.0.1+cu117.with.pypi.cudnn"
    assert knowledge.serves(wheel, "cu117")
    assert not knowledge.serves(wheel, "cu118")


def expected(variant: str, local: str, cuda: Optional[str]) -> torchbuild.Expected:
    return torchbuild.Expected(
        "2.16.0", variant, cuda, local, (), f"https://download.pytorch.org/whl/{variant}"
    )


@pytest.mark.parametrize(
    ("variant", "planned", "arrived", "cuda"),
    [
        ("cu130", "cu130.post1", "cu130.post1", "13.0"),
        ("cu130", "", "cu130.post1", "13.0"),
        ("cu117", "cu117.with.pypi.cudnn", "cu117.with.pypi.cudnn", "11.7"),
        ("cpu", "cpu.cxx11.abi", "cpu.cxx11.abi", None),
    ],
)
def test_the_build_guard_takes_a_suffixed_label_of_the_planned_variant(variant, planned, arrived, cuda):
    build = torchbuild.Build(f"2.16.0+{arrived}", cuda=cuda)
    assert torchbuild.compare(expected(variant, planned, cuda), build) == []


def test_the_build_guard_still_refuses_another_variant_behind_a_suffix():
    build = torchbuild.Build("2.16.0+cpu.cxx11.abi", cuda=None)
    problems = torchbuild.compare(expected("cu130", "cu130.post1", "13.0"), build)
    assert problems[0] == "local label +cpu.cxx11.abi, planned +cu130.post1"


NAME = "torch-2.16.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"


@pytest.mark.parametrize(
    ("value", "yanked", "reason"),
    [
        (True, True, ""),
        ("broken build", True, "broken build"),
        (False, False, ""),
        ("", False, ""),
        (None, False, ""),
    ],
)
def test_a_pep691_yank_keeps_its_reason(value, yanked, reason):
    body = f'{{"meta": {{"api-version": "1.1"}}, "files": [{{"filename": "{NAME}", "yanked": {json.dumps(value)}}}]}}'
    [wheel] = parse_simple_json(body, "torch")
    assert (wheel.yanked, wheel.yanked_reason) == (yanked, reason)


def test_a_pep503_yank_keeps_its_reason():
    body = (
        f'<a href="/a/{NAME}" data-yanked="the &quot;wrong&quot; build">{NAME}</a>\n'
        f'<a href="/b/{NAME.replace("cp311", "cp312")}" data-yanked>x</a>\n'
        f'<a href="/c/{NAME.replace("cp311", "cp313")}">x</a>\n'
    )
    wheels = parse_simple_html(body, "torch")
    assert [(w.yanked, w.yanked_reason) for w in wheels] == [
        (True, 'the "wrong" build'),
        (True, ""),
        (False, ""),
    ]
    # The reason survives the cache.
    assert wheel_from_json(wheels[0].to_json(), "torch") == wheels[0]
