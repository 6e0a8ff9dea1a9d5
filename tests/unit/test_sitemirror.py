"""The site mirror's plan (pure): the files a set of locks names, each once; conda packages and two files of one
name refused; the PEP 503 pages; the indexes the locks read and the ENVBUILDER_INDEX_MIRROR value for them, which
the mirror rules send where the mirror lies."""

from __future__ import annotations

from dataclasses import replace

import pytest

from envbuilder.core.errors import LockError, UsageError
from envbuilder.lockfile import Lock, LockedFile, LockedPackage, PlatformLock
from envbuilder.resolver import mirror, sitemirror

A = "a" * 64
B = "b" * 64
TORCH = "https://download.pytorch.org/whl/cu124"


def pkg(name: str, *urls: str, sha: str = A, source: str = "wheel") -> LockedPackage:
    return LockedPackage(name, "1.0", source, tuple(LockedFile(u, sha) for u in urls))


def lock(path: str, *platforms: tuple[str, tuple[LockedPackage, ...], list[str]]) -> Lock:
    return Lock(
        recipe="r", recipe_version="", recipe_sha256="", kind="venv", engine="uv", created="", created_by="",
        platforms=tuple(PlatformLock(a, a, {"index_flags": flags}, pkgs) for a, pkgs, flags in platforms),
        path=path,
    )  # fmt: skip


def test_every_platform_of_every_lock_once_each():
    shared = pkg("Foo_Bar", "https://files.example/p/foo_bar-1.0-py3-none-any.whl")
    x86 = pkg("torch", f"{TORCH}/torch-2.5.0%2Bcu124-cp311-cp311-linux_x86_64.whl")
    arm = pkg("torch", f"{TORCH}/torch-2.5.0%2Bcu124-cp311-cp311-linux_aarch64.whl")
    one = lock("/l/one.lock.toml", ("x86_64", (shared, x86), []), ("aarch64", (shared, arm), []))
    two = lock("/l/two.lock.toml", ("x86_64", (shared,), []))
    files = sitemirror.collect([one, two])
    assert [(f.project, f.filename) for f in files] == [
        ("foo-bar", "foo_bar-1.0-py3-none-any.whl"),
        ("torch", "torch-2.5.0+cu124-cp311-cp311-linux_aarch64.whl"),
        ("torch", "torch-2.5.0+cu124-cp311-cp311-linux_x86_64.whl"),
    ]
    assert files[0].locks == ("/l/one.lock.toml", "/l/two.lock.toml")
    assert files[1].relpath("simple") == "files/torch-2.5.0+cu124-cp311-cp311-linux_aarch64.whl"
    assert files[1].relpath("wheelhouse") == "torch-2.5.0+cu124-cp311-cp311-linux_aarch64.whl"


def test_conda_packages_go_to_one_channel_by_subdir_and_get_no_pages():
    url = "https://conda.anaconda.org/conda-forge/{}/python-3.11.0-h0.tar.bz2"
    x86 = pkg("python", url.format("linux-64"), source="conda")
    arm = pkg("python", url.format("linux-aarch64"), sha=B, source="conda")  # the same name, other bytes
    files = sitemirror.collect([lock("/l/c.lock.toml", ("x86_64", (x86,), []), ("aarch64", (arm,), []))])
    assert [f.relpath("simple") for f in files] == [
        "conda/linux-64/python-3.11.0-h0.tar.bz2",
        "conda/linux-aarch64/python-3.11.0-h0.tar.bz2",
    ]
    assert sitemirror.pages(files) == {"simple/index.html": sitemirror.pages([])["simple/index.html"]}
    bad = pkg("python", "https://conda.example/python-3.11.0-h0.tar.bz2", source="conda")
    with pytest.raises(LockError, match="does not name its platform subdir"):
        sitemirror.collect([lock("/l/c.lock.toml", ("x86_64", (bad,), []))])


def test_two_files_of_one_name_with_other_hashes_are_refused():
    one = lock("/l/one.lock.toml", ("x86_64", (pkg("x", "https://a.example/x-1.0-py3-none-any.whl"),), []))
    two = lock(
        "/l/two.lock.toml", ("x86_64", (pkg("x", "https://b.example/x-1.0-py3-none-any.whl", sha=B),), [])
    )
    with pytest.raises(LockError, match=r"/l/two.lock.toml: x-1.0-py3-none-any.whl .* in /l/one.lock.toml"):
        sitemirror.collect([one, two])


@pytest.mark.parametrize("url", ["https://a.example/", "https://a.example/x/..", "https://a.example/.hidden"])
def test_a_url_without_a_plain_file_name_is_refused(url):
    with pytest.raises(LockError, match="does not end in a file name"):
        sitemirror.collect([lock("/l/one.lock.toml", ("x86_64", (pkg("x", url),), []))])


def test_pages_link_each_file_with_its_hash():
    files = sitemirror.collect(
        [lock("/l", ("x86_64", (pkg("A.b", "https://a.example/a.b-1.0-py3-none-any.whl"),), []))]
    )
    pages = sitemirror.pages(files)
    assert set(pages) == {"simple/index.html", "simple/a-b/index.html"}
    assert f'href="../../files/a.b-1.0-py3-none-any.whl#sha256={A}"' in pages["simple/a-b/index.html"]
    assert 'href="a-b/"' in pages["simple/index.html"]


def test_the_value_sends_every_locked_index_to_the_mirror():
    flags = ["--index-url", TORCH, "--extra-index-url", mirror.PYPI]
    locks = [lock("/l", ("x86_64", (), flags), ("aarch64", (), []))]
    indexes = sitemirror.upstreams(locks)
    assert indexes == [TORCH, mirror.PYPI]
    value = sitemirror.env_value(indexes, "/srv/site mirror", "simple")
    assert value == f"{TORCH}=file:///srv/site%20mirror/simple/ pypi=file:///srv/site%20mirror/simple/"
    rules = mirror.parse(value)
    assert mirror.sources_for(TORCH, rules) == (["file:///srv/site%20mirror/simple/"], [])
    house = mirror.parse(sitemirror.env_value(indexes, "/srv/wheels", "wheelhouse"))
    assert mirror.sources_for(mirror.PYPI, house) == ([], ["/srv/wheels"])
    with pytest.raises(UsageError, match="a wheelhouse or conda channel path with a space"):
        sitemirror.env_value(indexes, "/srv/site mirror", "wheelhouse")


def test_the_value_sends_every_locked_conda_channel_to_the_mirrors_channel():
    inputs = {"index_flags": [], "conda_channels": ["conda-forge", "/srv/own"]}
    locks = [replace(lock("/l"), platforms=(PlatformLock("x86_64", "linux-64", inputs, ()),))]
    conda = sitemirror.channels(locks)
    assert conda == ["https://conda.anaconda.org/conda-forge", "file:///srv/own"]
    value = sitemirror.env_value([mirror.PYPI], "/srv/m", "simple", conda)
    assert value == (
        "pypi=file:///srv/m/simple/ https://conda.anaconda.org/conda-forge=/srv/m/conda file:///srv/own=/srv/m/conda"
    )
    assert mirror.remap_channels(["conda-forge", "/srv/own"], mirror.parse(value))[0] == [
        "file:///srv/m/conda"
    ]


def test_a_later_run_keeps_what_the_mirror_holds_and_refuses_other_bytes_under_a_held_name():
    one = sitemirror.collect(
        [lock("/l/one", ("x86_64", (pkg("x", "https://a.example/x-1.0-py3-none-any.whl"),), []))]
    )
    text = sitemirror.manifest(one, "simple")
    recorded = sitemirror.read_manifest(text, "/m/.envbuilder-mirror.json", "simple")
    assert recorded == one
    two = sitemirror.collect(
        [lock("/l/two", ("x86_64", (pkg("y", "https://a.example/y-1.0-py3-none-any.whl"),), []))]
    )
    assert [f.filename for f in sitemirror.merged(recorded, two)] == [
        "x-1.0-py3-none-any.whl",
        "y-1.0-py3-none-any.whl",
    ]
    other = sitemirror.collect(
        [lock("/l/3", ("x86_64", (pkg("x", "https://b.example/x-1.0-py3-none-any.whl", sha=B),), []))]
    )
    with pytest.raises(LockError, match="has another hash than the file of that name in /l/one"):
        sitemirror.merged(recorded, other)
    with pytest.raises(UsageError, match="has the 'simple' layout, not 'wheelhouse'"):
        sitemirror.read_manifest(text, "/m/.envbuilder-mirror.json", "wheelhouse")
    with pytest.raises(UsageError, match=r"/m/\.envbuilder-mirror\.json: not a mirror manifest"):
        sitemirror.read_manifest("{}", "/m/.envbuilder-mirror.json", "simple")
