"""Progress on long work, always on stderr: how long each step took, and bytes and rate while a step moves data.

On a terminal the running step is a live rich row (spinner, the step, bytes and rate, time so far) that a
``✓ step  12.4 s`` line replaces when it ends. Anywhere else (a log, a batch job's output file) the lines are plain
and written once: ``→ step`` when it starts, ``step: 48.2 MB, 3.1 MB/s, 15 s`` every ``every`` seconds while bytes
move, ``✓ step  12.4 s`` when it ends (``✗`` when it failed). Nothing here ever writes to stdout.

:class:`Growth` measures the bytes: what the directories an installer writes (the partial env, its cache) gained
since the step began.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Callable, Optional

from rich import filesize
from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TaskID, TextColumn, TimeElapsedColumn
from rich.text import Text

#: Seconds a walk of the measured directories may take before Growth walks the first one only.
SLOW_WALK_S = 2.0
#: Seconds between plain progress lines where stderr is not a terminal (ENVBUILDER_PROGRESS_EVERY sets it).
EVERY_S = 10.0


def every_from_env(env: Mapping[str, str]) -> float:
    """ENVBUILDER_PROGRESS_EVERY (seconds between plain progress lines in logs), or the default."""
    try:
        return max(float(env.get("ENVBUILDER_PROGRESS_EVERY", EVERY_S)), 0.1)
    except ValueError:
        return EVERY_S


def amount(done: int, seconds: float) -> str:
    """``48.2 MB, 3.1 MB/s``."""
    rate = f", {filesize.decimal(int(done / seconds))}/s" if seconds > 0 else ""
    return filesize.decimal(done) + rate


class Steps:
    """The steps of one command, each line saying how long its step took. ``start`` ends the running step;
    leaving the ``with`` block ends the last one (failed, when the block raised)."""

    def __init__(
        self,
        console: Console,
        *,
        quiet: bool = False,
        every: float = EVERY_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.console = console
        self.quiet = quiet
        self.every = every
        self.clock = clock
        self.text = ""
        self.began = 0.0
        self.moved = 0
        self.said = 0.0
        self.live: Optional[Progress] = None
        self.task: Optional[TaskID] = None
        # start/end run in the command, moving also in watching()'s thread.
        self.lock = threading.RLock()
        #: What watching() measures, and the running step's measure of it.
        self.roots: Sequence[Path] = ()
        self.growth: Optional[Growth] = None

    def __enter__(self) -> Steps:
        return self

    def __exit__(
        self,
        kind: Optional[type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        self.stop(failed=exc is not None)

    def stop(self, failed: bool = False) -> None:
        """End the running step and take the live row away (before a command prints its result)."""
        with self.lock:
            self._end(failed)
            if self.live is not None:
                self.live.stop()
                self.live = None
                self.task = None

    @contextlib.contextmanager
    def watching(self, roots: Sequence[Path], every: float = 0.5) -> Iterator[None]:
        """While the block runs, each step's bytes are what ``roots`` gained since it started: measured when it
        starts, every ``every`` seconds in a thread, and when it ends. For work that writes files itself rather
        than through a watched command (backup, restore)."""
        stop = threading.Event()

        def sample() -> None:
            while not stop.wait(every):
                with self.lock:
                    if self.growth is not None:
                        self.growth.watch()

        self.roots = roots
        thread = threading.Thread(target=sample, daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()
            self.roots = ()

    def start(self, text: str) -> None:
        with self.lock:
            self._start(text)

    def _start(self, text: str) -> None:
        self._end()
        self.text, self.began, self.moved = text, self.clock(), 0
        self.said = self.began
        if self.roots and not self.quiet:
            self.growth = Growth(self.roots, self._moving)
            self.growth.sample()  # where the step starts from
        if self.quiet:
            return
        if self.console.is_terminal:
            self._show(text)
        else:
            self._print("→", "cyan", text)

    def moving(self, done: int) -> None:
        """The running step has moved ``done`` bytes."""
        with self.lock:
            self._moving(done)

    def _moving(self, done: int) -> None:
        if self.quiet or not self.text or not done:
            return
        self.moved = done
        now = self.clock()
        what = amount(done, now - self.began)
        if self.live is not None and self.task is not None:
            self.live.update(self.task, what=what, refresh=True)
        elif not self.console.is_terminal and now - self.said >= self.every:
            self.said = now
            self.console.print(Text(f"    {self.text}: {what}, {now - self.began:.0f} s", style="dim"))

    def end(self, failed: bool = False) -> None:
        """End the running step, if one is: its line, with how long it took."""
        with self.lock:
            self._end(failed)

    def _end(self, failed: bool = False) -> None:
        if not self.text:
            return
        if self.growth is not None:
            self.growth.sample()  # all the step wrote
            self.growth = None
        took = self.clock() - self.began
        if not self.quiet:
            if self.live is not None and self.task is not None:
                self.live.update(self.task, visible=False, what="")
            extra = f"  {filesize.decimal(self.moved)}" if self.moved else ""
            mark, style = ("✗", "red") if failed else ("✓", "green")
            self._print(mark, style, self.text, f"  {took:.1f} s{extra}")
        self.text = ""

    def _print(self, mark: str, style: str, text: str, detail: str = "") -> None:
        line = Text.assemble("  ", (mark, style), " ", text)
        if detail:
            line.append(detail, style="dim")
        self.console.print(line)

    def _live(self) -> Progress:
        if self.live is None:
            # Started with the first step, not before: the heading printed first stays above it.
            self.live = Progress(
                TextColumn("  "),
                SpinnerColumn(),
                TextColumn("{task.description}", markup=False),
                TextColumn("{task.fields[what]}", markup=False, style="dim"),
                TimeElapsedColumn(),
                console=self.console,
                transient=True,
            )
            self.live.start()
        return self.live

    def _show(self, text: str) -> None:
        """The live row for the step ``text``, its clock from zero."""
        live = self._live()
        if self.task is None:
            self.task = live.add_task(text, total=None, what="")
        else:
            live.reset(self.task, description=text, visible=True, what="")


class Growth:
    """The bytes that some directories gained since the first sample: what an installer has downloaded and
    unpacked so far (each file counted once, hard links included). A walk of a large cache is not free, so the
    next one waits ten times as long as the last one took (and at least ``least`` seconds); after a walk slower
    than ``SLOW_WALK_S`` only the first root (the env being built) is walked again."""

    def __init__(
        self,
        roots: Sequence[Path],
        report: Callable[[int], None],
        *,
        least: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.roots = roots
        self.report = report
        self.least = least
        self.clock = clock
        self.base: Optional[int] = None
        #: What was reported before the walk was narrowed to the first root.
        self.before = 0
        self.due = 0.0

    def watch(self) -> Optional[str]:
        """For ``proc.Stop(watch=...)``: sample when due, report the growth; never stops the run."""
        if self.clock() >= self.due:
            self.sample()
        return None

    def sample(self) -> None:
        """Measure now and report the growth (the last sample, once the step is over: what it wrote in all)."""
        now = self.clock()
        size = sum_sizes(self.roots)
        took = self.clock() - now
        self.due = self.clock() + max(self.least, 10 * took)
        if self.base is None:
            self.base = size
        grown = self.before + max(size - self.base, 0)
        self.report(grown)
        if took > SLOW_WALK_S and len(self.roots) > 1:
            # A cache of millions of files on a parallel file system: the env alone from now on.
            self.roots, self.before, self.base = self.roots[:1], grown, None


def sum_sizes(roots: Iterable[Path]) -> int:
    """Bytes of the regular files under ``roots``, each file once (by device and inode); missing roots are 0."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for entry in _files(roots):
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError:  # gone while we looked: the installer moves its temporary files
            continue
        if (st.st_dev, st.st_ino) not in seen:
            seen.add((st.st_dev, st.st_ino))
            total += st.st_size
    return total


def _files(roots: Iterable[Path]) -> Iterator[os.DirEntry[str]]:
    todo = [str(r) for r in roots]
    while todo:
        try:
            with os.scandir(todo.pop()) as it:
                for entry in it:
                    if entry.is_dir(follow_symlinks=False):
                        todo.append(entry.path)
                    elif entry.is_file(follow_symlinks=False):
                        yield entry
        except OSError:
            continue
