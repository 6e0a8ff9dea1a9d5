"""validate's results table (the text on stdout after a validation) marks each figure that drifted from its
history, so that the table alone tells it: rendered by the verb's own renderer through a real pipe, where rich gives
80 columns, under NO_COLOR; the alarms come from ``historymodel.compare`` over records of earlier runs."""

from __future__ import annotations

import dataclasses
import os
import threading
from typing import Any

import pytest

from envbuilder.system.console import Out, make_console
from envbuilder.validate import historymodel, session
from envbuilder.validate.report import Report, Row


def _report(import_s: float, busbw: float) -> Report:
    rows = (
        Row("import", "pass", (0, 1), {"import_s": {"value": import_s, "unit": "s"}}),
        Row("nccl", "pass", (0, 1), {"busbw": {"value": busbw, "unit": "GB/s"}}),
        Row("matmul", "pass", (0, 1), {"bf16_tflops": {"value": 250.0, "unit": "TFLOP/s"}}),
    )
    return Report(
        env="site-torch",
        launcher="srun",
        device="cuda",
        world=2,
        nodes=1,
        command=(),
        rows=rows,
        seconds=12.0,
        exit_code=0,
        where="here",
        started="2026-11-28T10:00:00+00:00",
        partition="gpu-a100",
        hosts={0: "gpu001", 1: "gpu001"},
    )


def _record(result: Report, driver: str) -> dict[str, Any]:
    facts = {"driver": driver, "cuda": "12.4", "torch": "2.5.1", "glibc": "2.34", "modules": {}, "gpus": []}
    return historymodel.record_of(result, recipe="site-torch", recipe_version="3", facts=facts, at="x")


def _table(result: Report) -> str:
    """``session.render``'s stdout, written into a pipe and read back from its other end."""
    read_fd, write_fd = os.pipe()
    chunks: list[bytes] = []
    reader = threading.Thread(target=lambda: chunks.extend(iter(lambda: os.read(read_fd, 65536), b"")))
    reader.start()
    with os.fdopen(write_fd, "w", encoding="utf-8") as pipe:
        session.render(result, Out(results=make_console(pipe)))
    reader.join()
    os.close(read_fd)
    return b"".join(chunks).decode()


@pytest.fixture(autouse=True)
def _plain_pipe(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NO_COLOR", "1")
    for name in ("COLUMNS", "LINES", "FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE"):
        monkeypatch.delenv(name, raising=False)


def test_a_drifted_figure_is_marked_in_the_table_with_its_change_from_the_median() -> None:
    past = [_record(_report(t, b), "550.54") for t in (2.5, 2.6, 2.4) for b in (330.0, 332.0, 328.0)]
    now = _report(4.1, 211.0)
    alarms = historymodel.compare(_record(now, "570.86"), past, threshold=0.5)
    assert {a.figure for a in alarms} == {"import.import_s", "nccl.busbw"}
    text = _table(dataclasses.replace(now, drift=tuple(a.to_json() for a in alarms)))
    flat = " ".join(text.split())
    # 4.1 s against a median of 2.5 s: 64% slower, past the threshold of 50%; 211 GB/s against 330: 36% lower.
    assert "import time 4.1 s (+64% vs 9-run median, past drift_threshold)" in flat, text
    assert "bus bandwidth 211 GB/s (-36% vs 9-run median)" in flat, text
    assert "bf16 matmul 250 TFLOP/s" in flat and "bf16 matmul 250 TFLOP/s (" not in flat
    heading, *table = text.splitlines()
    assert heading.startswith("Validation of site-torch: 2 rank(s)")
    assert max(len(line) for line in table) <= 80, text
    assert "\x1b" not in text


def test_a_run_without_drift_has_no_mark() -> None:
    past = [_record(_report(2.5, 330.0), "550.54") for _ in range(5)]
    now = _report(2.6, 329.0)
    assert historymodel.compare(_record(now, "550.54"), past) == []
    text = _table(now)
    assert "import time 2.6 s" in text and "median" not in text, text
