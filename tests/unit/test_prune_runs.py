"""Which validation run directories are removed after a run: finished ones beyond the newest few, never another
validation's run still at work, and a killed run's once it is old."""

from __future__ import annotations

import os
import time

from envbuilder.validate import runner


def _run(root, name, *, finished, age_s=0.0):
    d = root / name
    d.mkdir(parents=True)
    if finished:
        (d / "report.json").write_text("{}")
    if age_s:
        then = time.time() - age_s
        os.utime(d, (then, then))
    return d


def test_a_run_still_at_work_survives_and_old_finished_runs_go(tmp_path):
    finished = [_run(tmp_path, f"run-2026112{i}-000000-1", finished=True) for i in range(7)]
    oldest_busy = _run(
        tmp_path, "run-20261101-000000-2", finished=False
    )  # sorts first: another validation's run
    killed = _run(tmp_path, "run-20261102-000000-3", finished=False, age_s=2 * runner.STALE_RUN_S)
    runner._prune(tmp_path)
    kept = sorted(p.name for p in tmp_path.iterdir())
    assert kept == sorted([oldest_busy.name, *(p.name for p in finished[-runner.KEEP_RUNS :])])
    assert not killed.exists()
