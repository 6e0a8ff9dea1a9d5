"""Index facts (pure): wheel file names, PEP 691 JSON and PEP 503 HTML project pages, and the questions the
resolver asks of them."""

from __future__ import annotations

import json

import pytest

from envbuilder.resolver.indexfacts import (
    IndexFacts,
    PageRead,
    parse_simple_html,
    parse_simple_json,
    parse_wheel_filename,
    project_wheel,
    wheel_from_json,
)

CU130 = "https://download.pytorch.org/whl/cu130"


@pytest.mark.parametrize(
    ("name", "version", "local", "pythons", "abi", "arch", "glibc"),
    [
        ("torch-2.15.0+cu130-cp311-cp311-manylinux_2_28_x86_64.whl", "2.15.0", "cu130", ("3.11",), "cp311", "x86_64", "2.28"),
        ("torch-2.15.0-cp314-cp314t-manylinux_2_28_aarch64.whl", "2.15.0", "", ("3.14",), "cp314t", "aarch64", "2.28"),
        ("torch-2.15.0+cpu-cp314t-cp314t-manylinux_2_28_x86_64.whl", "2.15.0", "cpu", ("3.14t",), "cp314t", "x86_64", "2.28"),
        ("torch-2.3.0-cp311-cp311-manylinux2014_aarch64.whl", "2.3.0", "", ("3.11",), "cp311", "aarch64", "2.17"),
        ("torch-1.4.0-cp37-cp37m-manylinux1_x86_64.whl", "1.4.0", "", ("3.7",), "cp37m", "x86_64", "2.5"),
        ("torch-1.9.0-cp39-cp39-manylinux2010_x86_64.whl", "1.9.0", "", ("3.9",), "cp39", "x86_64", "2.12"),
        ("torch-2.1.0+cpu-cp310-cp310-linux_x86_64.whl", "2.1.0", "cpu", ("3.10",), "cp310", "x86_64", None),
        ("torch-2.15.0-cp311-cp311-win_amd64.whl", "2.15.0", "", ("3.11",), "cp311", None, None),
        ("torch-2.15.0-cp311-none-macosx_11_0_arm64.whl", "2.15.0", "", ("3.11",), "none", None, None),
        ("torch-2.16.0.dev20261101+cu130-cp312-cp312-manylinux_2_28_x86_64.whl", "2.16.0.dev20261101", "cu130", ("3.12",), "cp312", "x86_64", "2.28"),
        ("torch-2.0.1-cp38-cp38-manylinux2014_ppc64le.whl", "2.0.1", "", ("3.8",), "cp38", "ppc64le", "2.17"),
        ("torch-2.0.1-cp38-cp38-musllinux_1_2_s390x.whl", "2.0.1", "", ("3.8",), "cp38", "s390x", None),
        ("torch-2.0.1-cp38-cp38-manylinux_2_31_riscv64.whl", "2.0.1", "", ("3.8",), "cp38", "riscv64", "2.31"),
        ("torch-2.0.1-cp38-cp38-manylinux_2_17_i686.manylinux2014_i686.whl", "2.0.1", "", ("3.8",), "cp38", "i686", "2.17"),
        ("numpy-2.3.0-cp311.cp312-abi3-manylinux_2_28_x86_64.manylinux_2_17_x86_64.whl", "2.3.0", "", ("3.11", "3.12"), "abi3", "x86_64", "2.17"),
        ("filelock-3.20.0-py3-none-any.whl", "3.20.0", "", ("py3",), "none", None, None),
        ("six-1.17.0-py2.py3-none-any.whl", "1.17.0", "", ("py2", "py3"), "none", None, None),
    ],
)  # fmt: skip
def test_wheel_file_names(*, name, version, local, pythons, abi, arch, glibc):
    wheel = parse_wheel_filename(name)
    assert wheel is not None
    assert (wheel.version, wheel.local, wheel.pythons, wheel.abi_tag) == (version, local, pythons, abi)
    assert (wheel.arch, wheel.glibc) == (arch, glibc)
    assert wheel.filename == name


def test_compressed_tag_sets_and_full_version():
    wheel = parse_wheel_filename("torch-2.15.0+cu130-cp311.cp312-cp311.cp312-manylinux_2_28_x86_64.whl")
    assert wheel is not None
    assert wheel.python_tags == ("cp311", "cp312")
    assert wheel.platforms == ("manylinux_2_28_x86_64",)
    assert wheel.full_version == "2.15.0+cu130"
    assert wheel.project == "torch"


def test_build_tag_and_project_normalization():
    wheel = parse_wheel_filename("Torch_Vision-0.29.2-1-py3-none-any.whl")
    assert wheel is not None
    assert (wheel.project, wheel.version) == ("torch-vision", "0.29.2")


@pytest.mark.parametrize(
    "name",
    [
        "torch-2.15.0.tar.gz",  # an sdist
        "torch-2.15.0-cp311-manylinux_2_28_x86_64.whl",  # a tag missing
        "torch-not.a.version-cp311-cp311-linux_x86_64.whl",
        "torch-2.15.0-x1-cp311-cp311-linux_x86_64.whl",  # a build tag must start with a digit
        "torch-2.15.0--cp311-cp311-linux_x86_64.whl",
        "torch.whl",
    ],
)
def test_not_wheels(name):
    assert parse_wheel_filename(name) is None


def test_python_support_from_tags_and_requires_python():
    cp311 = project_wheel("torch-2.15.0-cp311-cp311-manylinux_2_28_x86_64.whl", "torch", ">=3.11")
    free = project_wheel("torch-2.15.0-cp314t-cp314t-manylinux_2_28_x86_64.whl", "torch", ">=3.11")
    abi3 = project_wheel("x-1.0-cp39-abi3-manylinux_2_17_x86_64.whl", "x")
    pure = project_wheel("x-1.0-py3-none-any.whl", "x", ">=3.12")
    assert cp311 is not None and free is not None and abi3 is not None and pure is not None
    assert cp311.supports("3.11") and not cp311.supports("3.12") and not cp311.supports("3.11t")
    assert free.supports("3.14t") and not free.supports("3.14")
    assert (
        abi3.supports("3.9")
        and abi3.supports("3.13")
        and not abi3.supports("3.8")
        and not abi3.supports("3.13t")
    )
    assert pure.supports("3.12") and not pure.supports(
        "3.11"
    )  # requires-python rules out what the tag allows
    assert pure.runs_on("aarch64") and cp311.runs_on("x86_64") and not cp311.runs_on("aarch64")


JSON_PAGE = {
    "meta": {"api-version": "1.1"},
    "name": "torch",
    "files": [
        {"filename": "torch-2.15.0+cu130-cp311-cp311-manylinux_2_28_x86_64.whl", "requires-python": ">=3.11", "yanked": False},
        {"filename": "torch-2.14.0+cu130-cp311-cp311-manylinux_2_28_x86_64.whl", "requires-python": ">=3.10", "yanked": "broken build"},
        {"filename": "torch-2.14.1+cu130-cp310-cp310-manylinux_2_28_x86_64.whl", "requires-python": None},
        {"filename": "torch-2.15.0.tar.gz", "requires-python": ">=3.11"},
        {"filename": "torchvision-0.29.2+cu130-cp311-cp311-manylinux_2_28_x86_64.whl"},
    ],
}  # fmt: skip


def test_json_page():
    files = parse_simple_json(json.dumps(JSON_PAGE).encode(), "torch")
    assert [f.full_version for f in files] == ["2.15.0+cu130", "2.14.0+cu130", "2.14.1+cu130"]
    assert [f.requires_python for f in files] == [">=3.11", ">=3.10", None]
    assert [f.yanked for f in files] == [False, True, False]


@pytest.mark.parametrize(
    "body", [b"<html>no json</html>", b'{"name": "torch"}', b"[]", b'{"files": [{"url": "x"}]}']
)
def test_json_page_that_is_none(body):
    with pytest.raises(ValueError, match=r"."):
        parse_simple_json(body, "torch")


HTML_PAGE = """<!DOCTYPE html>
<html><head><meta name="pypi:repository-version" content="1.1"></head><body>
<h1>Links for torch</h1>
<a href="/whl/cu130/torch-2.15.0%2Bcu130-cp311-cp311-manylinux_2_28_x86_64.whl#sha256=ab"
   data-requires-python="&gt;=3.11" data-dist-info-metadata="sha256=cd">torch-2.15.0+cu130-cp311-cp311-manylinux_2_28_x86_64.whl</a><br/>
<a href="https://download-r2.pytorch.org/whl/cu130/torch-2.14.0%2Bcu130-cp310-cp310-manylinux_2_28_aarch64.whl"
   data-requires-python="&gt;=3.10,&lt;3.15" data-yanked="">torch-2.14.0+cu130-cp310-cp310-manylinux_2_28_aarch64.whl</a><br/>
<a href="../../files/torch-2.14.1-cp311-cp311-manylinux_2_28_x86_64.whl" data-yanked="the &quot;wrong&quot; build">x</a>
<a href="/whl/torch-2.15.0.tar.gz">torch-2.15.0.tar.gz</a>
<a href="/whl/cu130/torchaudio-2.11.0%2Bcu130-cp311-cp311-manylinux_2_28_x86_64.whl">torchaudio-2.11.0+cu130-cp311-cp311-manylinux_2_28_x86_64.whl</a>
<a href="/elsewhere">torch-2.13.0+cu130-cp311-cp311-manylinux_2_28_x86_64.whl</a>
</body></html>
"""


def test_html_page():
    files = parse_simple_html(HTML_PAGE.encode(), "torch")
    assert [f.full_version for f in files] == ["2.15.0+cu130", "2.14.0+cu130", "2.14.1", "2.13.0+cu130"]
    assert [f.requires_python for f in files] == [">=3.11", ">=3.10,<3.15", None, None]
    assert [f.yanked for f in files] == [False, True, True, False]
    assert files[1].arch == "aarch64"


def test_html_page_without_links_has_no_files():
    assert parse_simple_html(b"<html><body><p>nothing</p></body></html>", "torch") == []


def test_json_cache_round_trip():
    files = parse_simple_json(json.dumps(JSON_PAGE), "torch")
    assert [wheel_from_json(f.to_json(), "torch") for f in files] == files
    assert wheel_from_json({"filename": 3}, "torch") is None


def _facts(files_by_name, error=None):
    files = tuple(project_wheel(n, "torch", r) for n, r in files_by_name)
    page = PageRead(CU130, ("http://m/cu130",), tuple(f for f in files if f), read_at=0.0, error=error)
    return IndexFacts({CU130: page})


LISTING = [
    ("torch-2.13.0+cu130-cp311-cp311-manylinux_2_28_x86_64.whl", ">=3.10"),
    ("torch-2.15.0+cu130-cp311-cp311-manylinux_2_28_x86_64.whl", ">=3.11"),
    ("torch-2.15.0+cu130-cp312-cp312-manylinux_2_28_aarch64.whl", ">=3.11"),
    ("torch-2.9.1+cu130-cp310-cp310-manylinux_2_28_x86_64.whl", ">=3.10"),
    ("torch-2.16.0.dev20261101+cu130-cp311-cp311-manylinux_2_28_x86_64.whl", ">=3.11"),
    ("torch-2.10.0+cu130-cp311-cp311-manylinux_2_28_x86_64.whl", ">=3.10"),
]


def test_versions_sorted_as_versions_and_filtered():
    facts = _facts(LISTING)
    assert facts.versions(CU130) == ["2.9.1", "2.10.0", "2.13.0", "2.15.0", "2.16.0.dev20261101"]
    assert facts.versions(CU130 + "/", arch="aarch64") == ["2.15.0"]
    assert facts.versions(CU130, python="3.10") == ["2.9.1"]
    assert facts.versions(CU130, arch="x86_64", python="3.12") == []


def test_files_for_and_locals():
    facts = _facts(LISTING)
    assert [f.arch for f in facts.files_for(CU130, "2.15.0")] == ["x86_64", "aarch64"]
    assert len(facts.files_for(CU130, "2.15.0+cu130", arch="aarch64")) == 1
    assert facts.files_for(CU130, "2.15.0+cu126") == []
    assert facts.files_for(CU130, "2.16.0.dev20260815") == []  # a pruned nightly
    assert facts.locals(CU130, "2.15") == ["cu130"]


def test_yanked_versions_are_left_out_unless_asked():
    yanked = project_wheel("torch-2.14.0+cu130-cp311-cp311-manylinux_2_28_x86_64.whl", "torch", None, True)
    assert yanked is not None
    facts = IndexFacts({CU130: PageRead(CU130, (CU130,), (yanked,))})
    assert facts.versions(CU130) == []
    assert facts.versions(CU130, yanked=True) == ["2.14.0"]
    assert facts.files_for(CU130, "2.14.0") == [yanked]  # a pin still finds it


def test_failed_pages_are_not_facts():
    facts = _facts(LISTING, error="http://m/cu130/torch/: HTTP 500")
    assert facts.page(CU130) is None
    assert facts.versions(CU130) == []
    assert IndexFacts().page(CU130) is None


def test_to_json_and_line():
    facts = IndexFacts({CU130: PageRead(CU130, ("http://m/cu130",), read_at=1795000000.0, cached=True)}, None)
    data = facts.to_json()
    assert data["fallback"] is None
    assert data["pages"][0]["versions"] == [] and data["pages"][0]["cached"] is True
    page = facts.page(CU130)
    assert page is not None
    assert page.line() == "read from http://m/cu130 at 2026-11-18 11:06 UTC (cached)"


@pytest.mark.parametrize(
    "text",
    [
        "2.15.0", "2.15.0+cu130", "2.16.0.dev20261101+cu130", "2.15.0rc1", "2.15.0.post1", "1.0a2.dev3",
        "2.15.0+cpu.cxx11.abi", "2.15", "0.29.2+7", "2.15.0RC1", "2.15.0_rc1", "02.15.0", "1!2.0", "2.0+CU130",
        "2.0+cu.01", "2.0+01", "2.0.0.post01", "v2.0", "2.0.dev", "2.0+cu0130",
    ],
)  # fmt: skip
def test_versions_read_as_packaging_reads_them(text):
    """File names carry normal-form versions, read by a quick path; every other spelling by packaging."""
    from packaging.version import Version

    wheel = parse_wheel_filename(f"torch-{text}-py3-none-any.whl")
    assert wheel is not None
    assert (wheel.version, wheel.local) == (Version(text).public, Version(text).local or "")


def test_a_version_that_is_none_is_no_wheel():
    assert parse_wheel_filename("torch-2.x-py3-none-any.whl") is None
