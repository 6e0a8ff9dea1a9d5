"""A validation submitted as a batch job (``validate --submit``): its script written into the run's directory,
submitted with the scheduler's own tool, its state polled until it ends (or the wait runs out) and its exit code
read; Ctrl-C or SIGTERM while it waits cancels the job."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Callable, Optional

from envbuilder.core import schedulers
from envbuilder.core.errors import CommandFailed, UsageError, ValidationFailed
from envbuilder.plan import suite
from envbuilder.system import proc
from envbuilder.validate.report import Status

#: Between two state queries of a submitted job.
POLL_S = 0.5


def submit(
    the_launch: suite.Launch,
    run_dir: Path,
    env: Mapping[str, str],
    wait: Optional[float],
    *,
    live: Status,
    finished: Callable[[], object],
) -> tuple[Optional[int], bool, str, str]:
    """Write the launch's batch script into ``run_dir``, submit it, and wait for the job (at most ``wait``
    seconds), calling ``finished`` on each poll: its exit code (None where the scheduler keeps none), whether the
    wait ran out, the job's id and the tail of its output. Interrupted, the job is cancelled."""
    adapter = schedulers.get(the_launch.scheduler)
    if not the_launch.script or adapter is None:
        raise UsageError(
            "this recipe names no scheduler, so there is nothing to submit to",
            hint="run `envbuilder validate ENV` on the node itself",
        )
    script = run_dir / "job.sh"
    script.write_text(the_launch.script, encoding="utf-8")
    script.chmod(0o755)
    out_file = run_dir / "job.out"
    sub_env = proc.scrubbed_env(env)
    argv = adapter.submit(str(script), str(out_file))
    try:
        res = proc.run(argv, env=sub_env, cwd=str(run_dir))
    except FileNotFoundError:
        raise UsageError(f"{argv[0]} is not on PATH: is this a login node of the site?") from None
    job = adapter.job_id(res.stdout)
    live.note(f"submitted job {job}: {script}")
    try:
        code, timed_out = _wait(adapter, job, sub_env, wait, live=live, finished=finished)
    except BaseException:  # Ctrl-C or SIGTERM: the job this run submitted goes too
        _cancel(adapter, job, sub_env)
        raise
    tail = proc.tail(out_file.read_text(encoding="utf-8", errors="replace")) if out_file.exists() else ""
    return code, timed_out, job, tail


def _wait(
    adapter: schedulers.Scheduler,
    job: str,
    env: Mapping[str, str],
    limit: Optional[float],
    *,
    live: Status,
    finished: Callable[[], object],
) -> tuple[Optional[int], bool]:
    t0 = time.monotonic()
    while True:
        res = proc.run(adapter.state_query(job), env=dict(env), check=False)
        state_ = adapter.state(res.returncode, res.stdout)
        finished()  # the checks the job's ranks finished since the last poll (a shared file system)
        if state_ is None:
            break
        never = adapter.never_starts(res.stdout)
        if never:
            _cancel(adapter, job, env)
            raise ValidationFailed(
                f"job {job} will not start ({never}); it was cancelled and nothing was validated",
                hint="change what the reason names (the recipe's partition, account or time; --partition, --account) "
                "and submit again",
            )
        live.status(f"job {job}: {state_.lower()} ({time.monotonic() - t0:.0f} s)")
        if limit is not None and time.monotonic() - t0 > limit:
            return None, True
        time.sleep(POLL_S)
    return _job_exit(adapter, job, env), False


def _cancel(adapter: schedulers.Scheduler, job: str, env: Mapping[str, str]) -> None:
    with contextlib.suppress(OSError, CommandFailed):
        proc.run(adapter.cancel(job), env=dict(env), check=False, timeout=60)


def _job_exit(adapter: schedulers.Scheduler, job: str, env: Mapping[str, str]) -> Optional[int]:
    argv = adapter.exit_query(job)
    if argv is None:
        return None
    return adapter.exit_code(proc.run(argv, env=dict(env), check=False).stdout)
