"""Progress lines: each step's duration when it ends, bytes and rate every so often in a log, nothing but plain
text off a terminal; directory growth as an installer's bytes; validation checks shown as the ranks finish them."""

from __future__ import annotations

import io
import json
import os
import re
from pathlib import Path

from rich.console import Console

from envbuilder.system import progress
from envbuilder.validate import runner


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _log_console() -> tuple[Console, io.StringIO]:
    """A console as a batch job's stderr is: a file, not a terminal."""
    sink = io.StringIO()
    return Console(file=sink, force_terminal=False, width=200), sink


def test_off_a_terminal_each_step_has_a_start_line_and_an_end_line_with_its_duration():
    console, sink = _log_console()
    clock = Clock()
    with progress.Steps(console, every=10, clock=clock) as steps:
        steps.start("creating the env")
        clock.now += 0.3
        steps.start("installing torch==2.13.0")
        clock.now += 4
        steps.moving(8_000_000)  # too soon for a line (every 10 s)
        clock.now += 8
        steps.moving(24_000_000)
        clock.now += 0.4
    assert sink.getvalue().splitlines() == [
        "  → creating the env",
        "  ✓ creating the env  0.3 s",
        "  → installing torch==2.13.0",
        "    installing torch==2.13.0: 24.0 MB written, 2.0 MB/s, 12 s",
        "  ✓ installing torch==2.13.0  12.4 s  24.0 MB",
    ]


def test_the_downloads_uv_announces_give_a_total_and_count_only_when_finished():
    console, sink = _log_console()
    clock = Clock()
    with progress.Steps(console, every=1, clock=clock) as steps:
        steps.start("installing torch==2.13.0")
        fetched = progress.Downloads(steps.downloading)
        for line in (
            "Resolved 3 packages in 0.4s\n",
            "Downloading torch (2.0GiB)\n",
            "\x1b[1m\x1b[36mDownloading\x1b[0m numpy \x1b[2m(16.0MiB)\x1b[0m\n",  # coloured (FORCE_COLOR)
            "Downloading cryptic\n",  # no size known: no part of the total
            "   Downloading torch-2.5.1-cp311-cp311-manylinux1_x86_64.whl (906.4 MB)\n",  # pip's: not uv's
        ):
            fetched.line("stderr", line)
        clock.now += 2
        steps.moving(40_000_000)
        fetched.line("stderr", " Downloaded numpy\n")
        fetched.line("stderr", " Downloaded cryptic\n")
        clock.now += 2
        steps.moving(80_000_000)
        steps.start("smoke check")
        clock.now += 2
        steps.moving(1_000_000)  # a new step starts with nothing announced
    assert sink.getvalue().splitlines()[1:5] == [
        "    installing torch==2.13.0: 40.0 MB written, 20.0 MB/s, 2 s; downloads 0 of 2 done (0 bytes of 2.2 GB)",
        "    installing torch==2.13.0: 80.0 MB written, 20.0 MB/s, 4 s; downloads 1 of 2 done (16.8 MB of 2.2 GB)",
        "  ✓ installing torch==2.13.0  4.0 s  80.0 MB",
        "  → smoke check",
    ]
    assert "downloads" not in sink.getvalue().splitlines()[5]


def test_a_failed_step_ends_with_a_cross_and_quiet_says_nothing():
    console, sink = _log_console()
    clock = Clock()
    try:
        with progress.Steps(console, clock=clock) as steps:
            steps.start("installing packages")
            clock.now += 2
            raise RuntimeError("boom")
    except RuntimeError:
        pass
    assert sink.getvalue().splitlines()[-1] == "  ✗ installing packages  2.0 s"
    console, sink = _log_console()
    with progress.Steps(console, quiet=True) as steps:
        steps.start("installing packages")
        steps.moving(10)
    assert sink.getvalue() == ""


def test_on_a_terminal_the_step_ends_on_one_line_with_its_duration(monkeypatch):
    monkeypatch.delenv("NO_COLOR", raising=False)
    sink = io.StringIO()
    console = Console(file=sink, force_terminal=True, width=100, no_color=True)
    clock = Clock()
    with progress.Steps(console, clock=clock) as steps:
        steps.start("installing ebbig")
        steps.moving(3_000_000)
        clock.now += 1.5
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", sink.getvalue())
    assert "✓ installing ebbig  1.5 s  3.0 MB\n" in text
    assert "3.0 MB" in text.split("✓")[0]  # the live row showed the bytes while the step ran
    assert "→" not in text  # the live row takes the start line's place


def test_the_growth_of_a_directory_is_reported_and_hard_links_count_once(tmp_path):
    seen: list[int] = []
    clock = Clock()
    growth = progress.Growth([tmp_path / "env", tmp_path / "cache"], seen.append, clock=clock)
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "old").write_bytes(b"x" * 100)
    growth.watch()  # the baseline
    (tmp_path / "env").mkdir()
    (tmp_path / "cache" / "new").write_bytes(b"y" * 1000)
    os.link(tmp_path / "cache" / "new", tmp_path / "env" / "linked")
    assert growth.watch() is None  # not due yet: nothing measured
    clock.now += 5
    growth.watch()
    assert seen == [0, 1000]


def test_a_quick_step_is_never_walked_and_a_long_one_is_measured_from_then_on(tmp_path, monkeypatch):
    walks: list[int] = []
    real = progress.sum_sizes
    monkeypatch.setattr(progress, "sum_sizes", lambda roots: walks.append(1) or real(roots))
    clock = Clock()
    seen: list[int] = []
    quick = progress.Growth([tmp_path], seen.append, after=progress.MEASURE_AFTER_S, clock=clock)
    quick.watch()
    clock.now += progress.MEASURE_AFTER_S / 2
    quick.watch()
    quick.last()
    assert (walks, seen) == ([], [])  # a warm install is over before any walk of the env and the cache
    slow = progress.Growth([tmp_path], seen.append, after=progress.MEASURE_AFTER_S, clock=clock)
    clock.now += progress.MEASURE_AFTER_S
    slow.watch()  # the base
    (tmp_path / "wheel").write_bytes(b"z" * 500)
    slow.last()
    assert (len(walks), seen) == (2, [0, 500])


def _counted_walks(tmp_path: Path, monkeypatch) -> tuple[list[int], Console, io.StringIO, Path]:
    """A list that grows by one at each walk progress makes, a log console and its text, and an empty env."""
    walks: list[int] = []
    real = progress.sum_sizes
    monkeypatch.setattr(progress, "sum_sizes", lambda roots: walks.append(1) or real(roots))
    console, sink = _log_console()
    env = tmp_path / "env"
    env.mkdir()
    return walks, console, sink, env


def test_watched_steps_walk_each_boundary_once_and_each_shows_what_it_wrote(tmp_path, monkeypatch):
    walks, console, sink, env = _counted_walks(tmp_path, monkeypatch)
    with progress.Steps(console, every=3600) as steps, steps.watching([env], every=3600):
        steps.start("installing")
        (env / "torch").write_bytes(b"t" * 3000)
        steps.start("writing the activate extension")  # starts where installing ended: no second walk
        (env / "activate").write_bytes(b"a" * 500)
        steps.start("moving the env into place")
        steps.end()
    # A walk when the first step starts, then one at each step's end (two at each boundary before).
    assert len(walks) == 4, sink.getvalue()
    assert [line.split("  ")[-1] for line in sink.getvalue().splitlines() if "✓" in line] == [
        "3.0 kB",
        "500 bytes",
        "0.0 s",
    ]


def test_a_step_given_its_size_ends_without_a_walk(tmp_path, monkeypatch):
    """Restore walks its new env once (envwalk) and hands the size to the running step: the step's line shows
    what it wrote from that walk, and its end walks nothing more."""
    walks, console, sink, env = _counted_walks(tmp_path, monkeypatch)
    with progress.Steps(console, every=3600) as steps, steps.watching([env], every=3600):
        steps.start("installing")
        (env / "torch").write_bytes(b"t" * 3000)
        steps.sized(3000)
        steps.start("moving the env into place")
        (env / "record.json").write_bytes(b"r" * 200)
        steps.end()
    assert len(walks) == 2, sink.getvalue()  # where installing starts, and the end of the last step
    assert [line.split("  ")[-1] for line in sink.getvalue().splitlines() if "✓" in line] == [
        "3.0 kB",
        "200 bytes",
    ]


def _rank_file(ranks: Path, rank: int, *events: dict) -> None:
    with (ranks / f"rank-{rank}.jsonl").open("a", encoding="utf-8") as fh:
        for e in events:
            fh.write(json.dumps(e) + "\n")


def test_a_check_is_shown_once_every_rank_has_finished_it(tmp_path):
    notes: list[str] = []
    statuses: list[str] = []
    live = runner.Status(status=statuses.append, note=notes.append)
    finished = runner.Finished(tmp_path, 2, live, "cpu")
    finished()  # no rank has written anything yet
    _rank_file(tmp_path, 0, {"event": "hello"}, {"event": "start", "check": "import"})
    finished()
    assert statuses == ["import (0 s)"]
    _rank_file(tmp_path, 0, {"event": "result", "check": "import", "status": "pass", "seconds": 1.25})
    finished()
    assert notes == []  # rank 1 is still at it
    _rank_file(tmp_path, 1, {"event": "result", "check": "import", "status": "pass", "seconds": 2.5})
    with (tmp_path / "rank-1.jsonl").open("a") as fh:
        fh.write('{"event": "result", "check": "nccl"')  # torn: read once it is whole
    finished()
    assert notes == ["  ✓ import: pass  2.5 s"]
    with (tmp_path / "rank-1.jsonl").open("a") as fh:
        fh.write(', "status": "fail", "seconds": 0.5}\n')
    _rank_file(tmp_path, 0, {"event": "result", "check": "nccl", "status": "pass", "seconds": 0.25})
    finished()
    finished()
    assert notes == ["  ✓ import: pass  2.5 s", "  ✗ gloo: fail  0.5 s"]  # nccl's check, on CPU ranks


def test_after_a_slow_walk_only_the_env_is_walked_and_the_count_goes_on(tmp_path, monkeypatch):
    seen: list[int] = []
    clock = Clock()
    walked: list[int] = []

    def sizes(roots):
        roots = list(roots)
        walked.append(len(roots))
        clock.now += 3 if len(roots) > 1 else 0  # the cache is huge
        return {2: 500, 1: 100}[len(roots)] + len(walked)

    monkeypatch.setattr(progress, "sum_sizes", sizes)
    growth = progress.Growth([tmp_path / "env", tmp_path / "cache"], seen.append, clock=clock)
    growth.sample()  # the baseline, slow
    growth.sample()
    growth.sample()
    assert walked == [2, 1, 1]
    assert seen == [0, 0, 1]
