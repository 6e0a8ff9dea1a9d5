"""The resolver with what an index said: releases newer than the table, removed variants, mirrors holding the
wrong build, one-architecture files, pruned nightlies, labelled pins, and the table when nothing was read.

The pages are IndexFacts values built from file names (what envbuilder.resolver.indexread hands the resolver); reading
real pages over HTTP is tested in tests/integration/test_indexread.py and through the CLI in test_index_plan.py.
"""

from __future__ import annotations

import pytest

from envbuilder.core.errors import ResolverErrors
from envbuilder.core.facts import Gpu, HostFacts
from envbuilder.resolver import knowledge, mirror
from envbuilder.resolver.indexfacts import IndexFacts, PageRead, parse_wheel_filename
from envbuilder.resolver.wheels import TorchRequest, load_matrix, resolve

M = load_matrix()
W = "https://download.pytorch.org/whl/"
CPU = HostFacts(arch="x86_64", glibc="2.36", python="3.11.7", gpus=())
H100 = HostFacts(
    arch="x86_64",
    glibc="2.34",
    python="3.12.4",
    driver_version="580.95.05",
    gpus=(Gpu("NVIDIA H100", "9.0"),),
)


def whl(version: str, py: str = "cp311", arch: str = "x86_64") -> str:
    return f"torch-{version}-{py}-{py}-manylinux_2_28_{arch}.whl"


def pages(**by_variant: list[str]) -> IndexFacts:
    """IndexFacts with one page per variant (``pypi`` for PyPI), each listing the given file names."""
    out = {}
    for variant, names in by_variant.items():
        url = mirror.PYPI if variant == "pypi" else W + variant
        files = tuple(f for f in (parse_wheel_filename(n) for n in names) if f is not None)
        out[url] = PageRead(url, (f"http://mirror.test/{variant}",), files, read_at=1.8e9)
    return IndexFacts(out)


def errors(request: TorchRequest, facts: HostFacts, index: IndexFacts) -> dict[str, str]:
    with pytest.raises(ResolverErrors) as info:
        resolve(request, facts, index=index)
    return {e.gate: e.message for e in info.value.errors}


def test_a_release_newer_than_the_table_is_latest_and_marked_inferred():
    newest = max(r.version for r in M.stable_releases())
    ahead = f"{newest.major}.{newest.minor + 3}.0"
    index = pages(cpu=[whl(f"{newest}+cpu"), whl(f"{ahead}+cpu")], pypi=[whl(ahead)])
    r = resolve(TorchRequest("latest", "cpu", packages=("torch",)), CPU, index=index)
    assert r.torch == ahead
    assert r.inferred
    assert r.local == "cpu"
    assert r.requirements == (f"torch=={ahead}+cpu",)
    assert any("newer than the shipped table" in w for w in r.warnings)
    assert any("read from http://mirror.test/cpu" in line for line in r.facts_source)


def test_without_pages_the_table_decides_and_says_why():
    newest = max(r.version for r in M.stable_releases())
    r = resolve(TorchRequest("latest", "cpu", packages=("torch",)), CPU, index=IndexFacts({}, "--offline"))
    assert r.torch == str(newest)
    assert not r.inferred
    assert r.local == ""
    assert r.requirements == (f"torch=={newest}",)
    assert "--offline" in r.facts_source[0]
    assert M.as_of in r.facts_source[0]


def test_latest_is_the_newest_release_the_index_really_has():
    # The table knows newer releases, but this mirror only holds 2.13.0: latest is what can be installed.
    r = resolve(TorchRequest("latest", "cpu", packages=("torch",)), CPU, index=pages(cpu=[whl("2.13.0+cpu")]))
    assert r.torch == "2.13.0"
    assert r.requirements == ("torch==2.13.0+cpu",)


def test_a_mirror_holding_the_cpu_wheel_under_a_cuda_variant_is_refused_at_plan_time():
    index = pages(cu130=[whl("2.13.0+cpu", "cp312")])
    found = errors(TorchRequest("2.13.0", "cu130", packages=("torch",)), H100, index)
    assert "only as +cpu, not as a cu130 build" in found["index"]
    assert "http://mirror.test/cu130" in found["index"]


def test_a_release_missing_from_the_index_is_refused_naming_what_it_has():
    index = pages(cu130=[whl("2.14.1+cu130", "cp312")])
    found = errors(TorchRequest("2.13.0", "cu130", packages=("torch",)), H100, index)
    assert "has no torch 2.13.0 file for x86_64; it has 2.14.1" in found["index"]


def test_files_for_one_architecture_only():
    index = pages(cpu=[whl("2.13.0+cpu", arch="x86_64")])
    arm = HostFacts(arch="aarch64", glibc="2.34", python="3.11.8", gpus=())
    found = errors(TorchRequest("2.13.0", "cpu", packages=("torch",)), arm, index)
    assert "no torch 2.13.0 file for aarch64" in found["index"]


def test_a_python_the_files_do_not_cover():
    index = pages(cpu=[whl("2.13.0+cpu", "cp312")])
    found = errors(TorchRequest("2.13.0", "cpu", packages=("torch",)), CPU, index)
    assert "only for Python 3.12" in found["python"]


def test_a_variant_the_index_dropped_is_no_longer_offered_to_auto():
    # The cu130 page lists 2.13.0 only for aarch64; x86_64 H100s get the next variant the index has.
    index = pages(
        cu130=[whl("2.13.0+cu130", "cp312", "aarch64")],
        cu132=[whl("2.13.0+cu132", "cp312")],
        cu126=[whl("2.13.0+cu126", "cp312")],
    )
    facts = HostFacts(
        arch="x86_64", glibc="2.34", python="3.12.4", driver_version="595.71.05", gpus=(Gpu("H100", "9.0"),)
    )
    r = resolve(TorchRequest("2.13.0", "auto", packages=("torch",)), facts, index=index)
    assert r.variant != "cu130"
    assert r.requirements == (f"torch==2.13.0+{r.variant}",)


def test_pypis_unlabelled_build_is_never_the_pinned_one():
    index = pages(cpu=[whl("2.13.0+cpu")], pypi=[whl("2.13.0")])
    r = resolve(TorchRequest("2.13.0", "cpu", packages=("torch",)), CPU, index=index)
    assert r.requirements == ("torch==2.13.0+cpu",)


def test_a_pruned_nightly_pin_is_refused():
    url = M.index["nightly"].format(variant="cu130")
    names = [whl("2.16.0.dev20261120+cu130", "cp312")]
    files = tuple(f for f in map(parse_wheel_filename, names) if f is not None)
    index = IndexFacts({url: PageRead(url, ("http://mirror.test/nightly/cu130",), files, read_at=1.8e9)})
    request = TorchRequest("2.16.0.dev20260801", "cu130", channel="nightly", packages=("torch",))
    found = errors(request, H100, index)
    assert "no longer on" in found["nightly-pruned"]
    assert "2.16.0.dev20261120" in found["nightly-pruned"]
    ok = resolve(replace_version(request, "2.16.0.dev20261120"), H100, index=index)
    assert ok.requirements == ("torch==2.16.0.dev20261120+cu130",)


def replace_version(request: TorchRequest, version: str) -> TorchRequest:
    return TorchRequest(version, request.variant, request.channel, request.packages)


def test_upstreams_read_for_auto_cover_cpu_recent_variants_and_pypi():
    urls = knowledge.upstreams(TorchRequest("latest", "auto"), M)
    assert urls[0] == W + "cpu"
    assert mirror.PYPI in urls
    newest = max(M.stable_releases(), key=lambda r: r.version)
    for variant in newest.variants["x86_64"]:
        assert W + variant in urls
    assert knowledge.upstreams(TorchRequest("2.13.0", "cu130"), M) == [W + "cu130", mirror.PYPI]


def test_a_pinned_release_reads_the_pages_of_its_own_variants():
    old = next(r for r in M.stable_releases() if "cu128" in r.variants["x86_64"])
    urls = knowledge.upstreams(TorchRequest(old.torch, "auto"), M)
    for variant in old.variants["x86_64"]:
        assert W + variant in urls


# ---------------------------------------------------------------------------------------------------------------
# Variant names follow the index (issue 34): the table fills in only what a name cannot say.


def test_a_cuda_variants_version_follows_from_its_name():
    assert [knowledge.cuda_of(n) for n in ("cu140", "cu118", "cu1210", "rocm6.4", "cpu")] == [
        "14.0",
        "11.8",
        "121.0",
        None,
        None,
    ]
    assert all(knowledge.is_variant_name(n) for n in ("cu140", "rocm6.4", "rocm6.4.1", "xpu", "cpu"))
    assert not any(knowledge.is_variant_name(n) for n in ("cu12.4", "CU130", "cu130/../x", "mysite", ""))


def test_an_unknown_variant_takes_its_cuda_majors_driver_floor_or_none():
    cu136 = knowledge.inferred_variant("cu136", M)
    newest13 = max((i for i in M.variants.values() if i.cuda.startswith("13.")), key=lambda i: i.cuda)
    assert (cu136.cuda, cu136.family_min_driver, cu136.inferred) == ("13.6", newest13.family_min_driver, True)
    cu140 = knowledge.inferred_variant("cu140", M)
    assert (cu140.cuda, cu140.family_min_driver) == ("14.0", None)
    assert not knowledge.inferred_variant("rocm6.4", M).is_cuda


def test_a_named_variant_reads_its_own_page_and_auto_reads_the_variants_not_yet_stable():
    assert knowledge.upstreams(TorchRequest("latest", "cu140"), M) == [W + "cu140", mirror.PYPI]
    assert knowledge.upstreams(TorchRequest("2.15.0", "rocm6.4"), M) == [W + "rocm6.4", mirror.PYPI]
    auto = knowledge.upstreams(TorchRequest("latest", "auto"), M)
    nightly_only = [v for v, i in M.variants.items() if i.nightly_only]
    assert nightly_only and all(W + v in auto for v in nightly_only)
    # Every variant a release `latest` may fall back to offers is read, not taken from the table.
    for release in M.stable_releases():
        for variant in release.variants["x86_64"]:
            assert W + variant in auto


def test_an_unknown_variant_is_refused_for_what_its_page_said_or_that_it_was_not_read():
    request = TorchRequest("2.15.0", "cu140", packages=("torch",))
    empty = errors(request, H100, pages(cu130=[whl("2.15.0+cu130")], cu140=[]))
    assert "lists no torch build for it" in empty["unknown-variant"]
    url = W + "cu140"
    broken = IndexFacts({url: PageRead(url, ("http://mirror.test/cu140",), error="HTTP 502 Bad Gateway")})
    assert "could not be read (HTTP 502 Bad Gateway)" in errors(request, H100, broken)["unknown-variant"]


def test_a_build_planned_without_its_page_says_not_checked():
    url = W + "cu130"
    index = IndexFacts(
        {
            url: PageRead(url, ("http://mirror.test/cu130",), error="HTTP 503 Service Unavailable"),
            **pages(cpu=[whl("2.15.0+cpu", "cp312")]).pages,
        }
    )
    r = resolve(TorchRequest("2.15.0", "cu130", packages=("torch",)), H100, index=index)
    said = [w for w in r.warnings if w.startswith("not checked:")]
    assert said and "torch 2.15.0 cu130" in said[0] and "HTTP 503" in said[0], r.warnings


def test_a_nightly_stream_the_table_calls_removed_is_planned_where_its_page_lists_builds():
    url = W + "nightly/cu126"
    dated = "2.16.0.dev20261120"
    files = tuple(f for f in [parse_wheel_filename(whl(f"{dated}+cu126", "cp312"))] if f is not None)
    index = IndexFacts({url: PageRead(url, ("http://mirror.test/nightly/cu126",), files, read_at=1.8e9)})
    request = TorchRequest(dated, "cu126", channel="nightly", packages=("torch",))
    assert resolve(request, H100, index=index).requirements == (f"torch=={dated}+cu126",)
    assert "nightly-stream-removed" in errors(request, H100, IndexFacts())
