"""The smoke check: right after a build (or a restore), import torch in the new env, see its GPUs and arch list,
and record the result before the full validation."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Optional

from envbuilder import payloads
from envbuilder.backends.buildlog import BuildLog, build_umask
from envbuilder.core import checks
from envbuilder.plan.activation import Activation
from envbuilder.system import proc, state
from envbuilder.system.modules import EnvDelta

#: Imported by the smoke check after its checks, for their bytecode: what the suite's DDP check (and any DDP
#: program) loads beyond ``import torch``, some seconds of compiling per rank per run otherwise.
WARM = ("torch._dynamo",)


def activated_env(base_env: Mapping[str, str], delta: EnvDelta, act: Activation) -> dict[str, str]:
    """What a process in the activated env sees: ``base_env`` with the modules' ``delta``, then activate's
    variables set and unset and its list entries added."""
    return act.apply(delta.apply(base_env))


def smoke(
    record: state.EnvRecord,
    final: Path,
    run_env: Mapping[str, str],
    *,
    site_python: Optional[str],
    log: BuildLog,
    home: Path,
    gpus: int,
) -> state.EnvRecord:
    """A quick check in the new env (import torch, GPUs visible, arch list) before the full validation, in
    ``run_env`` (see :func:`activated_env`).

    The check's ``import torch`` (and, after the checks, of :data:`WARM`) also writes the bytecode of every module
    it loads into an env that holds its own packages (as pip's install does, even where PYTHONDONTWRITEBYTECODE is
    set): the validation's ranks, and every job after, then load torch's compiled modules instead of each compiling
    them again. Overlays and user
    prefixes are left as they are: their torch may be the site's, whose tree is not the env's to write."""
    run_env = dict(run_env)
    python = str(final / "bin" / "python")
    if site_python:  # user-prefix: the site python, with the env as its user base
        python = site_python
        run_env["PYTHONUSERBASE"] = str(final)
    warm = writes_bytecode(record, site_python)
    if warm:
        run_env.pop("PYTHONDONTWRITEBYTECODE", None)
    argv = [python, str(payloads.DIR / "validate.py"), "--checks", ",".join(checks.SMOKE)]
    if gpus:  # the probe saw GPUs on this host: torch must see as many
        argv += ["--expect-gpus", str(gpus)]
    else:
        argv += ["--device", "cpu"]
    for module in WARM if warm else ():
        argv += ["--warm", module]
    began = time.monotonic()
    res = proc.run(argv, env=run_env, check=False, timeout=600, umask=build_umask())
    log.command(argv, {}, res, seconds=time.monotonic() - began)
    try:
        result = json.loads(res.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        result = {"checks": {checks.FIRST: {"status": "fail", "error": res.stderr.strip()[-500:]}}}
    result["kind"] = "smoke"
    result["exit"] = res.returncode
    updated = dataclasses.replace(record, validation=result)
    state.save(home, updated)
    return updated


def writes_bytecode(record: state.EnvRecord, site_python: Optional[str]) -> bool:
    """Whether the smoke check may write bytecode: only where every package it imports lies inside the env."""
    return site_python is None and not (record.plan or {}).get("system_site_packages")


@contextlib.contextmanager
def warming(record: state.EnvRecord, run_env: Mapping[str, str]) -> Iterator[None]:
    """While the block runs (the validation that follows a create, whose ranks import torch in place of the smoke
    check and write the bytecode of what they import): the bytecode of :data:`WARM`, compiled in the background
    by the env's python with the build's umask. Joined when the block ends; an error or an interrupt ends it
    (and all it started). Only for an env that holds its own packages (:func:`writes_bytecode`)."""
    prefix = Path(record.prefix)
    dirs = [
        str(d)
        for module in WARM
        for d in sorted(prefix.glob("lib*/python*/site-packages/" + module.replace(".", "/")))
        if d.is_dir() and not d.is_symlink()
    ]
    if not dirs or not writes_bytecode(record, None):
        yield
        return
    env = {k: v for k, v in run_env.items() if k != "PYTHONDONTWRITEBYTECODE"}
    argv = [
        str(prefix / "bin" / "python"),
        "-m",
        "compileall",
        "-q",
        "--invalidation-mode",
        "timestamp",
        *dirs,
    ]
    with proc.background(argv, env=env, umask=build_umask()) as job:
        yield
        job.result(check=False)
