"""Reading torch's index pages through the mirrors, for real, from the fixture server on 127.0.0.1
(tests/torchindex.py): parallel reads, JSON and HTML, the cache, offline plans and failures."""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import socket
import stat
import time

import pytest
from torchindex import NEWEST, NIGHTLIES, NIGHTLY_PRUNED, pytorch_like, serve, torch_mirror

from envbuilder.resolver import indexread, mirror
from envbuilder.resolver.indexfacts import parse_wheel_filename
from envbuilder.resolver.matrix import load_matrix

pytestmark = pytest.mark.integration

WHL = "https://download.pytorch.org/whl/"
CPU, CU126, CU130, CU132 = (WHL + v for v in ("cpu", "cu126", "cu130", "cu132"))
NIGHTLY = WHL + "nightly/cu130"
PYPI = mirror.PYPI
ALL = [CPU, CU126, CU130, CU132, NIGHTLY, PYPI]


@pytest.fixture(scope="module")
def layout(tmp_path_factory):
    return pytorch_like(tmp_path_factory.mktemp("torchindex"), "cp311")


@pytest.fixture
def server(layout):
    layout.requested.clear()
    layout.html_only.clear()
    layout.fail.clear()
    layout.delay.clear()
    layout.broken.clear()
    with serve(layout) as index:
        yield index


def env_for(server, **extra):
    return {"ENVBUILDER_INDEX_MIRROR": torch_mirror(server), **extra}


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_every_index_read_once_in_parallel(server, tmp_path):
    for root in ("whl/cpu", "whl/cu126", "whl/cu130", "whl/cu132", "whl/nightly/cu130", "simple"):
        server.delay[root] = 0.5
    started = time.monotonic()
    facts = indexread.read([*ALL, CU130], env_for(server), home=tmp_path)
    elapsed = time.monotonic() - started
    assert sorted(server.pages()) == sorted(
        f"GET /{root}/torch/ json"
        for root in ("whl/cpu", "whl/cu126", "whl/cu130", "whl/cu132", "whl/nightly/cu130", "simple")
    )
    assert elapsed < 2.0, f"six pages of 0.5 s each took {elapsed:.2f} s: not read in parallel"
    assert facts.fallback is None
    assert all(facts.page(u) is not None for u in ALL)
    cu130 = facts.page(CU130)
    assert cu130 is not None and cu130.sources == (f"{server.url}/whl/cu130",) and not cu130.cached


def test_what_the_pages_say(server, tmp_path):
    facts = indexread.read(ALL, env_for(server), home=tmp_path)
    assert facts.versions(CU130) == ["2.13.0", "2.14.1", "2.15.0", NEWEST]
    assert facts.versions(CU126) == ["2.13.0", "2.14.1"]  # cu126 left with 2.15
    assert facts.versions(CU126, arch="aarch64") == []  # cu126 has x86_64 files only
    assert facts.versions(CU132, arch="aarch64", python="3.11") == ["2.14.1", "2.15.0", NEWEST]
    assert facts.versions(CU130, python="3.10") == ["2.13.0", "2.14.1"]  # requires-python >= 3.11 from 2.15
    assert facts.locals(CU130, "2.15.0") == ["cu130"]
    assert facts.locals(PYPI, "2.15.0", arch="x86_64") == [""]  # PyPI's files carry no label
    assert facts.versions(NIGHTLY) == list(NIGHTLIES)
    assert facts.files_for(NIGHTLY, NIGHTLY_PRUNED) == []
    [wheel] = facts.files_for(CU130, "2.15.0", arch="x86_64", python="3.14t")
    assert (wheel.glibc, wheel.abi_tag) == ("2.28", "cp314t")
    assert {f.arch for f in facts.files_for(PYPI, "2.15.0", python="3.11")} == {"x86_64", "aarch64", None}


def test_html_only_root_gives_the_same_facts(server, tmp_path):
    json_facts = indexread.read([CPU], env_for(server), home=tmp_path / "a")
    server.html_only.add("whl/cpu")
    html_facts = indexread.read([CPU], env_for(server), home=tmp_path / "b")
    assert server.pages() == ["GET /whl/cpu/torch/ json", "GET /whl/cpu/torch/ html"]
    json_page, html_page = json_facts.page(CPU), html_facts.page(CPU)
    assert json_page is not None and html_page is not None
    assert len(html_page.files) == 52
    assert sorted(html_page.files, key=repr) == sorted(json_page.files, key=repr)


def test_yanked_files_from_either_format(server, tmp_path, layout):
    [name] = [
        n
        for n in layout.roots["whl/cu132"]
        if n.startswith("torch-2.16.0+cu132-cp311-cp311-manylinux_2_28_x86")
    ]
    entry = layout.roots["whl/cu132"][name]
    layout.add("whl/cu132", entry.path, requires_python="<4,>=3.11", yanked='a "bad" build')
    try:
        for html_only, home in ((False, "a"), (True, "b")):
            if html_only:
                server.html_only.add("whl/cu132")
            facts = indexread.read([CU132], env_for(server), home=tmp_path / home)
            [wheel] = facts.files_for(CU132, "2.16.0", arch="x86_64", python="3.11")
            assert (wheel.yanked, wheel.requires_python) == (True, "<4,>=3.11")
            assert facts.versions(CU132, arch="x86_64", python="3.11") == ["2.14.1", "2.15.0"]
    finally:
        layout.add("whl/cu132", entry.path, requires_python=entry.requires_python)


def test_second_read_comes_from_the_cache(server, tmp_path):
    first = indexread.read([CU130, PYPI], env_for(server), home=tmp_path)
    assert len(server.pages()) == 2
    second = indexread.read([CU130, PYPI], env_for(server), home=tmp_path)
    assert len(server.pages()) == 2, "the second read asked the server again"
    page, again = first.page(CU130), second.page(CU130)
    assert page is not None and again is not None
    assert again.cached and not page.cached
    assert again.read_at == page.read_at and again.files == page.files
    assert again.line().endswith("(cached)")
    cache = tmp_path / "cache" / "index"
    entry = cache / (hashlib.sha256(f"{server.url}/whl/cu130/torch/".encode()).hexdigest() + ".json")
    assert stat.S_IMODE(entry.stat().st_mode) == 0o600
    assert stat.S_IMODE(cache.stat().st_mode) == 0o700
    assert sorted(p.name for p in cache.iterdir()) == sorted(
        hashlib.sha256(f"{server.url}/{r}/torch/".encode()).hexdigest() + ".json"
        for r in ("whl/cu130", "simple")
    )


def test_ttl_and_refresh_read_again(server, tmp_path):
    indexread.read([CU130], env_for(server), home=tmp_path)
    expired = indexread.read([CU130], env_for(server), home=tmp_path, ttl=0)
    refreshed = indexread.read([CU130], env_for(server), home=tmp_path, refresh=True)
    assert server.pages() == ["GET /whl/cu130/torch/ json"] * 3
    assert [f.pages[CU130].cached for f in (expired, refreshed)] == [False, False]


def test_offline_reads_no_url_but_lists_a_wheel_directory(server, tmp_path, layout):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    for name, entry in layout.roots["whl/cu130"].items():
        if name.startswith("torch-2.15.0"):
            (wheels / name).write_bytes(entry.path.read_bytes())
    (wheels / "numpy-2.3.0-cp311-cp311-manylinux_2_28_x86_64.whl").write_bytes(b"")
    rules = f"{CU130}={wheels},pypi {WHL}={server.url}/whl/ pypi={server.url}/simple/"
    facts = indexread.read(
        [CU130, CU132, PYPI], {"ENVBUILDER_INDEX_MIRROR": rules}, home=tmp_path, offline=True
    )
    assert server.requested == []
    assert facts.fallback is None  # the directory still answers
    page = facts.page(CU130)
    assert page is not None and page.sources == (str(wheels),)  # pypi beside it serves dependencies only
    assert facts.versions(CU130) == ["2.15.0"]
    assert len(page.files) == 14
    cu132 = facts.pages[CU132]
    assert not cu132.ok and cu132.error is not None and "not read (--offline)" in cu132.error


def test_offline_everywhere_says_why_and_uses_a_fresh_cache(server, tmp_path):
    none = indexread.read([CU130], env_for(server, ENVBUILDER_OFFLINE="true"), home=tmp_path)
    assert none.fallback == "ENVBUILDER_OFFLINE=true"
    assert indexread.read([CU130], env_for(server), home=tmp_path, offline=True).fallback == "--offline"
    assert server.requested == []
    indexread.read([CU130], env_for(server), home=tmp_path)
    cached = indexread.read([CU130], env_for(server), home=tmp_path, offline=True, refresh=True)
    assert len(server.requested) == 1
    assert cached.fallback is None and cached.versions(CU130)[-1] == NEWEST


def test_unreachable_index_is_an_error_page_and_fallback(tmp_path):
    port = closed_port()
    env = {
        "ENVBUILDER_INDEX_MIRROR": f"{WHL}=http://127.0.0.1:{port}/whl/ pypi=http://127.0.0.1:{port}/simple/"
    }
    facts = indexread.read([CU130, PYPI], env, home=tmp_path)
    assert facts.page(CU130) is None and facts.versions(CU130) == []
    error = facts.pages[CU130].error
    assert error is not None and error.startswith(f"http://127.0.0.1:{port}/whl/cu130/torch/: cannot connect")
    assert facts.fallback is not None
    assert facts.fallback.startswith("every index read failed: http://127.0.0.1:")
    assert facts.fallback.endswith("(and 1 more)")
    assert not (tmp_path / "cache" / "index").exists()  # failures are not cached


def test_http_errors_timeouts_and_bad_bodies(server, tmp_path):
    server.fail["whl/cu126"] = 503
    server.broken.add("whl/cu132")
    server.delay["whl/cpu"] = 3
    env = env_for(server, ENVBUILDER_INDEX_TIMEOUT="0.5")
    facts = indexread.read([CPU, CU126, CU130, CU132, WHL + "cu999"], env, home=tmp_path)
    errors = {u: p.error for u, p in facts.pages.items()}
    assert errors[CU126] == f"{server.url}/whl/cu126/torch/: HTTP 503 Service Unavailable"
    assert errors[CU132] is not None and "not an index page" in errors[CU132]
    assert errors[CPU] == f"{server.url}/whl/cpu/torch/: no answer within 0.5 s (ENVBUILDER_INDEX_TIMEOUT)"
    assert errors[CU130] is None and facts.fallback is None
    # An index without the project (a variant never built) is an answer: nothing there.
    assert errors[WHL + "cu999"] is None and facts.pages[WHL + "cu999"].files == ()


def test_a_bad_timeout_is_a_usage_error(server, tmp_path):
    from envbuilder.core.errors import UsageError

    with pytest.raises(UsageError, match="ENVBUILDER_INDEX_TIMEOUT"):
        indexread.read([CU130], env_for(server, ENVBUILDER_INDEX_TIMEOUT="soon"), home=tmp_path)


def test_pypi_beside_a_mirror_is_not_read_for_torch(server, tmp_path):
    rules = f"{WHL}={server.url}/whl/,pypi pypi={server.url}/simple/"
    # Should pypi.org be asked after all, the request meets a closed port on 127.0.0.1, never the internet.
    trap = {"https_proxy": f"http://127.0.0.1:{closed_port()}", "no_proxy": "127.0.0.1"}
    facts = indexread.read([CU130], {"ENVBUILDER_INDEX_MIRROR": rules, **trap}, home=tmp_path)
    assert server.pages() == ["GET /whl/cu130/torch/ json"]
    page = facts.page(CU130)
    assert page is not None and page.sources == (f"{server.url}/whl/cu130",)
    assert facts.locals(CU130, "2.15.0") == ["cu130"]
    # PyPI as the only target is where torch comes from.
    only = indexread.read([CU130], {"ENVBUILDER_INDEX_MIRROR": f"{WHL}=pypi"}, home=tmp_path, offline=True)
    assert only.pages[CU130].sources == (PYPI,)


def test_proxies_come_from_the_plan_environment(server, tmp_path):
    proxy = {"http_proxy": f"http://127.0.0.1:{closed_port()}"}
    if not any(k.lower() == "no_proxy" for k in os.environ):  # urllib also honours the process's no_proxy
        through = indexread.read([CU130], env_for(server, **proxy), home=tmp_path / "a")
        assert "cannot connect" in (through.pages[CU130].error or "")
        assert server.requested == []
    direct = indexread.read([CU130], env_for(server, **proxy, NO_PROXY="localhost,.127.0.0.1"), home=tmp_path)
    assert direct.page(CU130) is not None


def test_a_file_index_is_read_like_a_served_one(server, tmp_path, layout):
    simple = tmp_path / "simple"
    (simple / "torch").mkdir(parents=True)
    (simple / "torch" / "index.html").write_bytes(layout.page_html("whl/cu130", "torch") or b"")
    facts = indexread.read([CU130], {"ENVBUILDER_INDEX_MIRROR": f"{CU130}=file://{simple}"}, home=tmp_path)
    assert facts.versions(CU130) == ["2.13.0", "2.14.1", "2.15.0", NEWEST]
    missing = indexread.read([CU130], {"ENVBUILDER_INDEX_MIRROR": f"{CU130}={tmp_path}/nope"}, home=tmp_path)
    assert missing.fallback is not None and "cannot list" in missing.fallback


def _pypi_reason() -> str | None:
    if os.environ.get("ENVBUILDER_TEST_NETWORK") != "1":
        return "reads https://pypi.org: set ENVBUILDER_TEST_NETWORK=1 to run it (CI talks to 127.0.0.1 only)"
    try:
        socket.create_connection(("pypi.org", 443), timeout=3).close()
    except OSError as e:
        return f"pypi.org:443 is unreachable from here ({e})"
    return None


@pytest.mark.network
def test_real_pypi_torch_page(tmp_path):
    reason = _pypi_reason()
    if reason is not None:
        pytest.skip(reason)
    env = {k: v for k, v in os.environ.items() if k != "ENVBUILDER_INDEX_MIRROR"}
    facts = indexread.read([PYPI], env, home=tmp_path, ttl=0)
    page = facts.pages[PYPI]
    assert page.ok, page.error
    assert "2.15.0" in facts.versions(PYPI)
    files = facts.files_for(PYPI, "2.15.0", arch="x86_64", python="3.11")
    assert files, [f.filename for f in page.files if f.version == "2.15.0"]
    wheel = parse_wheel_filename(files[0].filename)
    assert wheel is not None and wheel.platforms[0].startswith("manylinux") and wheel.pythons == ("3.11",)


def test_a_failed_read_falls_back_on_the_copy_read_before_if_newer_than_the_table(server, tmp_path):
    indexread.read([CU130], env_for(server), home=tmp_path)
    server.fail["whl/cu130"] = 503
    kept = indexread.read([CU130], env_for(server), home=tmp_path, refresh=True)
    page = kept.page(CU130)
    assert page is not None and page.cached and kept.versions(CU130)[-1] == NEWEST and kept.fallback is None
    failed = f"{server.url}/whl/cu130/torch/: HTTP 503 Service Unavailable"
    assert page.failed == failed and page.line().endswith(f"(cached); read again now, it failed: {failed}")
    # Read before the shipped table's date, the copy knows less than the table: the table stands in for it.
    table = datetime.datetime.fromisoformat(load_matrix().as_of).replace(tzinfo=datetime.timezone.utc)
    for entry in (tmp_path / "cache" / "index").iterdir():
        data = json.loads(entry.read_text())
        data["read_at"] = table.timestamp() - 1
        entry.write_text(json.dumps(data))
    older = indexread.read([CU130], env_for(server), home=tmp_path, ttl=0)  # read again whatever today is
    assert older.page(CU130) is None and older.pages[CU130].error == failed
    assert older.fallback == f"every index read failed: {failed}"
