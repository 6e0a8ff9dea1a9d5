"""`envbuilder report` through the real CLI, from a history store laid out as ``validate`` keeps it
(tests/historyfiles.py writes the records by hand: one JSON file per run), and the HTML page opened in a real
headless Chromium (Debian's chromium-headless-shell, or chromium): its DOM read back (the page's text, the SVG plots
with one circle per data point, the status cells) and its screenshot decoded with zlib (tests/pngread.py: the
size, more than one colour, the series' and the status cells' colours drawn; no pixel comparison). Every host name
the browser resolves is sent to a loopback listener that counts connections: the page makes none, and a control
page with one outside image makes one, so the count is real. Markdown for tickets, and the refusals."""

from __future__ import annotations

import contextlib
import datetime
import html.parser
import json
import os
import re
import shutil
import socket
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Optional

import pngread
import pytest
from helpers import ok, refused, run_cli
from historyfiles import START, two_weeks, write_run

pytestmark = pytest.mark.integration

#: The store holds only env names of letters, digits and . _ + -; what a record says (its recipe, partition,
#: modules) is anyone's text.
HOSTILE_ENV = "hostile"
HOSTILE_RECIPE = "<img src=x onerror=alert(1)>&lt;b&gt;"
HOSTILE_MODULE = '</svg><script>document.title="owned"</script>'


def browser() -> Optional[str]:
    return shutil.which("chromium-headless-shell") or shutil.which("chromium")


needs_browser = pytest.mark.skipif(
    browser() is None, reason="no headless Chromium (Debian's chromium-headless-shell; .ci/run installs it)"
)


class Counter:
    """A TCP listener on 127.0.0.1 that counts the connections made to it and closes each."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.count = 0
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.count += 1
            conn.close()


@contextlib.contextmanager
def counter() -> Iterator[Counter]:
    one = Counter()
    try:
        yield one
    finally:
        one.sock.close()


def chromium(page: Path, tmp: Path, port: int, *flags: str) -> subprocess.CompletedProcess[str]:
    """The browser, headless, without a sandbox (root) or GPU, its profile in ``tmp``, every name it would resolve
    mapped to the counting listener, on a file:// URL."""
    argv = [
        str(browser()),
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        f"--user-data-dir={tmp / 'profile'}",
        f"--host-resolver-rules=MAP * 127.0.0.1:{port}",
        *flags,
        page.as_uri(),
    ]
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp), "LANG": "C.UTF-8"}
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env, check=True)


class Dom(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, Optional[str]]]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, Optional[str]]]) -> None:
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data: str) -> None:
        self.text.append(data)

    def count(self, tag: str, css: str = "") -> int:
        return sum(t == tag and (not css or css in (a.get("class") or "").split()) for t, a in self.tags)


def dom_of(text: str) -> Dom:
    dom = Dom()
    dom.feed(text)
    dom.close()
    return dom


def history(home: Path) -> None:
    """Two envs: site-torch's two weeks on two partitions, and one whose recipe and module are hostile markup."""
    two_weeks(home)
    for day in range(3):
        write_run(
            home,
            HOSTILE_ENV,
            START + datetime.timedelta(days=day),
            recipe=HOSTILE_RECIPE,
            facts={"driver": "550.54", "modules": {HOSTILE_MODULE: str(day)}},
            checks=[{"name": "nccl", "status": "pass", "figures": {"busbw": 100.0 + day}}],
        )


@needs_browser
def test_html_report_renders_in_headless_chromium(tmp_path: Path) -> None:
    home = tmp_path / "home"
    history(home)
    page = tmp_path / "report.html"
    res = ok(
        run_cli("report", "--all", "-o", str(page), env={"ENVBUILDER_HOME": str(home), "HOME": str(tmp_path)})
    )
    assert f"wrote the report on 2 env(s) to {page}" in res.stderr

    shot = tmp_path / "shot.png"
    with counter() as listener:
        dumped = chromium(page, tmp_path, listener.port, "--dump-dom").stdout
        chromium(
            page,
            tmp_path,
            listener.port,
            "--hide-scrollbars",
            "--window-size=1280,1600",
            f"--screenshot={shot}",
        )
        # The page asked for nothing: no font, style, script or image from anywhere.
        assert listener.count == 0

    dom = dom_of(dumped)
    text = " ".join(" ".join(dom.text).split())
    assert "envbuilder validation history" in text
    assert "28 run(s) from 2026-11-01 08:00 UTC to 2026-11-14 08:05 UTC" in text
    upgrade = "driver 550.54 -> 570.86, cuda 12.4 -> 12.8, +cuda/12.8 (on gpu-a100, gpu-h100)"
    assert f"2026-11-08 08:00 UTC: {upgrade}" in text
    # site-torch: the check grid, the sweep, import time per rank, four figures over time; the hostile env: its
    # grid and one figure.
    assert dom.count("svg") == 7 + 2
    # One circle per point: the sweep's 10 sizes and 4 ranks on 2 partitions, 4 figures x 14 days x 2
    # partitions; then the hostile env's 3 runs.
    assert dom.count("circle", "point") == 2 * 10 + 2 * 4 + 4 * 14 * 2 + 3
    assert dom.count("rect", "cell") == 6 * 14 + 3
    # The upgrade on each of site-torch's four figures over time; the hostile env's two module changes.
    assert dom.count("line", "marker") == 4 + 2
    assert dom.count("path", "series") == 2 + 2 + 4 * 2 + 1
    assert "nccl busbw (GB/s)" in text  # the unit the record gives
    # Per rank too (the axis of import time per rank): the unit of the import check's figure of that name.
    assert "import_s (s)" in [t.strip() for t in dom.text]
    # The hostile names are text on the page: no element came from them, and nothing ran.
    assert not [t for t, _ in dom.tags if t in ("img", "script")]
    assert HOSTILE_RECIPE in text
    assert f"{HOSTILE_MODULE}/0 -> 1" in text
    assert "owned" not in dumped.split("<title>")[1].split("</title>")[0]

    png = pngread.read(shot)
    assert (png.width, png.height) == (1280, 1600)
    white = b"\xff" * png.channels
    assert len(png.colours(step=8)) > 50  # text and antialiased lines, not one colour
    assert png.share_of(white) < 0.99
    drawn = png.colours(step=1)
    opaque = b"\xff" if png.channels == 4 else b""
    assert bytes.fromhex("2e9e4f") + opaque in drawn  # the passing cells of the check grid
    assert bytes.fromhex("d1242f") + opaque in drawn  # the failed import on day 5
    assert bytes.fromhex("0072b2") + opaque in drawn  # the first series' points and line


@needs_browser
def test_the_request_counter_sees_a_page_that_reaches_out(tmp_path: Path) -> None:
    """The control for the count of zero above: the same browser and flags, on a page with one outside image."""
    page = tmp_path / "outside.html"
    page.write_text('<html><body><img src="http://cdn.example.org/x.png"></body></html>')
    with counter() as listener:
        chromium(page, tmp_path, listener.port, "--dump-dom")
        assert listener.count >= 1


def test_markdown_report_for_tickets(tmp_path: Path) -> None:
    home = tmp_path / "home"
    history(home)
    env = {"ENVBUILDER_HOME": str(home), "HOME": str(tmp_path)}
    res = ok(run_cli("report", "site-torch", HOSTILE_ENV, "--format", "md", env=env))
    text = res.stdout
    assert text.startswith("# envbuilder validation history\n")
    upgrade = "driver 550.54 -> 570.86, cuda 12.4 -> 12.8, +cuda/12.8 (on gpu-a100, gpu-h100)"
    assert f"| 2026-11-08 08:00 UTC | {upgrade} |" in text
    assert "| import on gpu-a100 | pass | 13/14 |" in text
    assert "| nccl busbw | GB/s | gpu-a100 | 212 | 271.5 | 211 | 332 | 14 |" in text
    assert "<img" not in text and "<script" not in text and "&lt;img src=x" in text
    out = tmp_path / "r.md"
    ok(run_cli("report", "site-torch", "--format", "md", "-o", str(out), env=env))
    assert out.read_text().startswith("# envbuilder validation history\n")


def test_records_that_are_not_runs_are_left_out_and_named(tmp_path: Path) -> None:
    home = tmp_path / "home"
    good = write_run(home, "e", START, checks=[{"name": "nccl", "status": "pass", "figures": {"busbw": 5.0}}])
    (good.parent / "20261101T090000.000000Z-x-1.json").write_text("{not json")
    (good.parent / "20261101T100000.000000Z-x-2.json").write_text("[1, 2]")
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_text(json.dumps({"time": "2026-11-02T00:00:00Z", "status": "planted"}))
    (good.parent / "20261102T000000.000000Z-x-3.json").symlink_to(elsewhere)
    (good.parent / "20261103T000000.000000Z-x-4.json").mkdir()
    res = ok(
        run_cli("report", "e", "--format", "md", env={"ENVBUILDER_HOME": str(home), "HOME": str(tmp_path)})
    )
    assert "1 run(s)" in res.stdout and "planted" not in res.stdout
    bad = (
        "20261101T090000.000000Z-x-1.json",
        "20261101T100000.000000Z-x-2.json",
        "20261102T000000.000000Z-x-3.json",
        "20261103T000000.000000Z-x-4.json",
    )
    for name in bad:
        assert f"left out {good.parent / name}: not a history record" in res.stderr


def test_refusals_name_the_store_and_the_way_out(tmp_path: Path) -> None:
    home = tmp_path / "home"
    env = {"ENVBUILDER_HOME": str(home), "HOME": str(tmp_path)}
    refused(run_cli("report", env=env), 2, "name the envs to report on, or give --all")
    refused(run_cli("report", "--all", env=env), 9, f"no validation history in {home / 'history'}")
    write_run(home, "e", START)
    refused(
        run_cli("report", "nothere", env=env), 9, f"no validation history for nothere in {home / 'history'}"
    )
    refused(run_cli("report", "../e", env=env), 2, "'../e' is not an env name")
    refused(run_cli("report", "e", "--all", env=env), 2, "name envs or give --all, not both")
    refused(run_cli("report", "e", "-o", str(tmp_path), env=env), 2, f"-o {tmp_path} is a directory")
    refused(run_cli("report", "e", "--format", "pdf", env=env), 2, "invalid choice: 'pdf'")


def site_history(site: Path) -> None:
    """The site's store: site-torch's two weeks (tests/historyfiles.py) as alice's env e1, and bob's env e2 of the
    same recipe on gpu-a100 whose newest run's bandwidth halves after a module appeared; a link among the users."""
    two_weeks(site / "staging")
    (site / "alice" / "site-torch").mkdir(parents=True)
    (site / "staging" / "history" / "site-torch").rename(site / "alice" / "site-torch" / "e1")
    shutil.rmtree(site / "staging")
    for day in range(5):
        write_run(
            site,
            "e2",
            START + datetime.timedelta(days=day, hours=2),
            host="gpu007",
            directory=site / "bob" / "site-torch" / "e2",
            facts={"driver": "550.54", "modules": {"nccl": "2.21"} if day == 4 else {}},
            checks=[
                {
                    "name": "nccl",
                    "status": "pass",
                    "figures": {"busbw": 150.0 if day == 4 else 300.0},
                    "units": {"busbw": "GB/s"},
                }
            ],
        )
    (site / "mallory").symlink_to(site / "bob")


@needs_browser
def test_site_html_report_renders_in_headless_chromium(tmp_path: Path) -> None:
    site = tmp_path / "site"
    site_history(site)
    page = tmp_path / "site.html"
    env = {
        "ENVBUILDER_HOME": str(tmp_path / "home"),
        "HOME": str(tmp_path),
        "ENVBUILDER_HISTORY_DIR": str(site),
    }
    res = ok(run_cli("report", "--site", "-o", str(page), env=env))
    assert f"wrote the site report on 1 recipe(s), 2 env(s) to {page}" in res.stderr
    assert f"left out {site / 'mallory'}: a link (not followed)" in res.stderr

    shot = tmp_path / "shot.png"
    with counter() as listener:
        dumped = chromium(page, tmp_path, listener.port, "--dump-dom").stdout
        chromium(
            page,
            tmp_path,
            listener.port,
            "--hide-scrollbars",
            "--window-size=1280,1600",
            f"--screenshot={shot}",
        )
        assert listener.count == 0

    dom = dom_of(dumped)
    text = " ".join(" ".join(dom.text).split())
    assert "envbuilder site validation history" in text
    assert "1 recipe(s), 2 env(s) of 2 user(s)" in text
    assert "recipe site-torch" in text and "Where it passes" in text
    assert "33 run(s) from 2026-11-01 08:00 UTC to 2026-11-14 08:05 UTC" in text
    # Where: gpu-a100 holds both envs (both pass now), 18 of its 19 runs passed; gpu-h100 only alice's.
    cells = [" ".join(t.split()) for t in dom.text if t.strip()]
    at = cells.index("gpu-a100")
    assert cells[at : at + 5] == ["gpu-a100", "2/2", "18/19", "3", "2026-11-14 08:00 UTC"]
    assert (
        "bob/e2 on gpu-a100: nccl bus bandwidth 150 GB/s, 50% below its median of 300 GB/s over the last 4 runs "
        "on gpu-a100 since module nccl/2.21 appeared (fact change: 2026-11-05 10:00 UTC" in text
    )
    # That time is a link to the change, in the list of fact changes.
    assert [a.get("href") for t, a in dom.tags if t == "a"] == ["#recipe0-change-0"]
    assert ("li", {"id": "recipe0-change-0"}) in dom.tags
    upgrade = "driver 550.54 -> 570.86, cuda 12.4 -> 12.8, +cuda/12.8 (on gpu-a100, gpu-h100) (alice/e1)"
    assert f"2026-11-08 08:00 UTC: {upgrade}" in text
    assert "2026-11-05 10:00 UTC: +nccl/2.21 (bob/e2)" in text
    assert f"Not read (1) {site / 'mallory'}: a link (not followed)" in text
    # The check grid; four figures over time; the sweep; import time per rank.
    assert dom.count("svg") == 7
    # Four figures x 14 days x 2 partitions, and bob's 5 runs on busbw; the sweep's 10 sizes and 4 ranks on each
    # partition (alice's newest runs).
    assert dom.count("circle", "point") == 4 * 14 * 2 + 5 + 2 * 10 + 2 * 4
    assert dom.count("rect", "cell") == 6 * 14 + 5
    assert dom.count("line", "marker") == 4 * 2  # alice's upgrade and bob's module on each figure over time
    assert "nccl busbw (GB/s)" in text

    png = pngread.read(shot)
    assert (png.width, png.height) == (1280, 1600)
    assert len(png.colours(step=8)) > 50
    drawn = png.colours(step=1)
    opaque = b"\xff" if png.channels == 4 else b""
    assert bytes.fromhex("2e9e4f") + opaque in drawn  # passing cells
    assert bytes.fromhex("d1242f") + opaque in drawn  # alice's failed import on day 5


def test_a_drift_on_the_page_links_to_the_change_it_names(tmp_path: Path) -> None:
    """An env whose driver changed on day 2 (its bandwidth unchanged) and whose newest run, after a module
    appeared, halved its bandwidth: the page shows the drift of the newest run and links it to the module's
    change only (the driver's came before the last run near the median); Markdown names that change's time."""
    home = tmp_path / "home"
    for day in range(5):
        write_run(
            home,
            "e",
            START + datetime.timedelta(days=day),
            facts={
                "driver": "550.54" if day == 0 else "560.35",
                "modules": {"nccl": "2.21"} if day == 4 else {},
            },
            checks=[
                {
                    "name": "nccl",
                    "status": "pass",
                    "figures": {"busbw": 150.0 if day == 4 else 300.0},
                    "units": {"busbw": "GB/s"},
                }
            ],
        )
    env = {"ENVBUILDER_HOME": str(home), "HOME": str(tmp_path)}
    alarm = (
        "nccl bus bandwidth 150 GB/s, 50% below its median of 300 GB/s over the last 4 runs on gpu-a100 since "
        "module nccl/2.21 appeared"
    )
    page = ok(run_cli("report", "e", env=env)).stdout
    (drift,) = re.findall(r'<li class="drift">(.*?)</li>', page)
    assert drift.startswith(f"on gpu-a100: {alarm} (fact change: <a href=")
    (target,) = re.findall(r'href="#([^"]+)"', drift)
    assert re.findall(rf'<li id="{target}">([^<]*)</li>', page) == ["2026-11-05 08:00 UTC: +nccl/2.21"]
    assert "2026-11-02 08:00 UTC: driver 550.54 -&gt; 560.35" in page  # listed, not linked
    text = ok(run_cli("report", "e", "--format", "md", env=env)).stdout
    assert f"| gpu-a100 | {alarm} | 2026-11-05 08:00 UTC |" in text
