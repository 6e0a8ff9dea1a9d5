"""Progress on long work, always on stderr: how long each step took, and bytes and rate while a step moves data.

On a terminal the running step is a live rich row (spinner, the step, bytes and rate, time so far) that a
``✓ step  12.4 s`` line replaces when it ends. Anywhere else (a log, a batch job's output file) the lines are plain
and written once: ``→ step`` when it starts, ``step: 48.2 MB written, 3.1 MB/s, 15 s`` every ``every`` seconds while
bytes move, ``✓ step  12.4 s`` when it ends (``✗`` when it failed). Nothing here ever writes to stdout.

:class:`Growth` measures the bytes: what the directories an installer writes (the partial env, its cache) gained
since measuring began: downloads and what was unpacked from them, hence "written". An installer step is measured
from ``MEASURE_AFTER_S`` into it (a warm install is over by then, and is never walked), so its figures leave out
what it wrote in its first seconds; backup and restore steps are measured from their start. :class:`Downloads` adds what the
installer announces it downloads (``; downloads 1 of 3 done (0.8 GB of 2.6 GB)``), a total to read those against.
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Callable, Optional

from rich import filesize
from rich.console import Console
from rich.text import Text

if TYPE_CHECKING:
    from rich.progress import Progress, TaskID

#: Seconds a walk of the measured directories may take before Growth walks the first one only.
SLOW_WALK_S = 2.0
#: Seconds an installer step runs before its bytes are first measured. A warm install links its files in well
#: under a second, and one walk of the env and the installer's cache costs about as much, so a quick step is never
#: walked; a long one is measured from then on (what it wrote before is left out of its figures).
MEASURE_AFTER_S = 2.0
#: Seconds between plain progress lines where stderr is not a terminal (ENVBUILDER_PROGRESS_EVERY sets it).
EVERY_S = 10.0


def every_from_env(env: Mapping[str, str]) -> float:
    """ENVBUILDER_PROGRESS_EVERY (seconds between plain progress lines in logs), or the default."""
    try:
        return max(float(env.get("ENVBUILDER_PROGRESS_EVERY", EVERY_S)), 0.1)
    except ValueError:
        return EVERY_S


def amount(done: int, seconds: float) -> str:
    """``48.2 MB written, 3.1 MB/s``: bytes on disk (downloaded and unpacked), never to be read as downloaded."""
    rate = f", {filesize.decimal(int(done / seconds))}/s" if seconds > 0 else ""
    return f"{filesize.decimal(done)} written{rate}"


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
        #: What the running step's installer announced it downloads (Downloads.summary), or "".
        self.fetching = ""
        self.live: Optional[Progress] = None
        self.task: Optional[TaskID] = None
        # start/end run in the command, moving also in watching()'s thread.
        self.lock = threading.RLock()
        #: What watching() measures, and the running step's measure of it.
        self.roots: Sequence[Path] = ()
        self.growth: Optional[Growth] = None
        #: The size of ``roots`` the last step's end measured: the next step starts from it, walking no tree twice
        #: at one boundary (a restore walked the whole new env at the end of its install and again at once).
        self.carried: Optional[int] = None
        #: What the running step's roots measured in a walk its caller made (sized): its end walks them no more.
        self.given: Optional[int] = None

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

        self.roots, self.carried = roots, None
        thread = threading.Thread(target=sample, daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()
            self.roots, self.carried = (), None

    def start(self, text: str) -> None:
        with self.lock:
            self._start(text)

    def _start(self, text: str) -> None:
        self._end()
        self.text, self.began, self.moved, self.fetching, self.given = text, self.clock(), 0, "", None
        self.said = self.began
        if self.roots and not self.quiet:
            self.growth = Growth(self.roots, self._moving)
            if self.carried is None:
                self.growth.sample()  # where the step starts from
            else:
                self.growth.base = self.carried  # where the last one ended
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
        fetching = f"; {self.fetching}" if self.fetching else ""
        if self.live is not None and self.task is not None:
            self.live.update(self.task, what=what + fetching, refresh=True)
        elif not self.console.is_terminal and now - self.said >= self.every:
            self.said = now
            line = f"    {self.text}: {what}, {now - self.began:.0f} s{fetching}"
            self.console.print(Text(line, style="dim"))

    def sized(self, size: int) -> None:
        """The watched roots measure ``size`` now, as :func:`sum_sizes` counts (a walk the caller made for its own
        use, once the step has written what it writes): the running step ends with it, without a walk of its own
        (a restore walks its new env once, not once for its record and again for this line)."""
        with self.lock:
            if self.growth is not None and list(self.growth.roots) == list(self.roots):
                self.growth.take(size)
                self.given = size

    def downloading(self, summary: str) -> None:
        """What the running step's installer announced it downloads (:class:`Downloads`), shown beside the
        bytes from the next measure on."""
        with self.lock:
            if self.text:
                self.fetching = summary

    def end(self, failed: bool = False) -> None:
        """End the running step, if one is: its line, with how long it took."""
        with self.lock:
            self._end(failed)

    def _end(self, failed: bool = False) -> None:
        if not self.text:
            return
        if self.growth is not None:
            if self.given is None:
                self.growth.sample()  # all the step wrote
            narrowed = list(self.growth.roots) != list(self.roots)
            self.carried = None if narrowed else self.growth.size
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
            # rich's live display only on a terminal: a batch job's or a pipe's create never imports it.
            from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn  # noqa: PLC0415

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


#: uv's lines for a download over 1 MiB where its stderr is no terminal: ``Downloading torch (2.4GiB)`` when it
#: starts, `` Downloaded torch`` when it ends (sizes in binary units, from the index or the response's length).
_ANNOUNCED = re.compile(r"^\s*Downloading (\S+) \(([\d.]+)(B|KiB|MiB|GiB|TiB)\)\s*$")
_FINISHED = re.compile(r"^\s*Downloaded (\S+)\s*$")
_UNITS = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}
_COLOUR = re.compile(r"\x1b\[[0-9;]*m")


class Downloads:
    """The downloads an installer announces in its output, with their sizes: a total that the bytes written can
    be read against, and how much of it is done. Only finished downloads count as done (the installer names no
    bytes in between), so the share moves a file at a time and never claims more than arrived. Output without
    such lines (pip, conda, a warm cache) leaves this silent."""

    def __init__(self, report: Callable[[str], None]) -> None:
        self.report = report
        self.sizes: dict[str, int] = {}
        self.done: set[str] = set()
        # Lines come from two reader threads (proc.Stop.on_line).
        self.lock = threading.Lock()

    def line(self, stream: str, text: str) -> None:
        """For ``proc.Stop.on_line``: one line of the installer's output."""
        text = _COLOUR.sub("", text)
        with self.lock:
            started, ended = _ANNOUNCED.match(text), _FINISHED.match(text)
            if started:
                self.sizes[started[1]] = int(float(started[2]) * _UNITS[started[3]])
            elif ended and ended[1] in self.sizes:
                self.done.add(ended[1])
            else:
                return
            summary = self.summary()
        self.report(summary)

    def summary(self) -> str:
        """``downloads 1 of 3 done (0.8 GB of 2.6 GB)``."""
        got = sum(self.sizes[name] for name in self.done)
        total = sum(self.sizes.values())
        return (
            f"downloads {len(self.done)} of {len(self.sizes)} done "
            f"({filesize.decimal(got)} of {filesize.decimal(total)})"
        )


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
        after: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.roots = roots
        self.report = report
        self.least = least
        self.clock = clock
        self.base: Optional[int] = None
        #: What the last walk found.
        self.size: Optional[int] = None
        #: What was reported before the walk was narrowed to the first root.
        self.before = 0
        #: The first walk (the base the growth is measured from) waits ``after`` seconds.
        self.due = clock() + after

    def watch(self) -> Optional[str]:
        """For ``proc.Stop(watch=...)``: sample when due, report the growth; never stops the run."""
        if self.clock() >= self.due:
            self.sample()
        return None

    def last(self) -> None:
        """Once the step is over: what it wrote in all, where measuring had begun (a quick step is not walked)."""
        if self.base is not None:
            self.sample()

    def sample(self) -> None:
        """Measure now and report the growth."""
        now = self.clock()
        size = sum_sizes(self.roots)
        self.take(size, self.clock() - now)

    def take(self, size: int, took: float = 0.0) -> None:
        """Report the growth to ``size``, what the roots measure now (a walk that ``took`` seconds)."""
        self.size = size
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
