"""The smoke check: right after a build (or a restore), import torch in the new env, see its GPUs and arch list,
and record the result before the full validation."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Optional

from envbuilder import activation, payloads, proc, state
from envbuilder.backends.buildlog import BuildLog
from envbuilder.modules import EnvDelta


def smoke(
    record: state.EnvRecord,
    final: Path,
    site_python: Optional[str],
    act: activation.Activation,
    delta: EnvDelta,
    base_env: Mapping[str, str],
    log: BuildLog,
    home: Path,
    gpus: int,
) -> state.EnvRecord:
    """A quick check in the new env (import torch, GPUs visible, arch list) before the full validation."""
    run_env = {**delta.apply(base_env), **dict(act.env)}
    for var in act.unset:
        run_env.pop(var, None)
    python = str(final / "bin" / "python")
    if site_python:  # user-prefix: the site python, with the env as its user base
        python = site_python
        run_env["PYTHONUSERBASE"] = str(final)
    argv = [python, str(payloads.DIR / "validate.py"), "--checks", "import,gpu,arch"]
    if gpus:  # the probe saw GPUs on this host: torch must see as many
        argv += ["--expect-gpus", str(gpus)]
    else:
        argv += ["--device", "cpu"]
    res = proc.run(argv, env=run_env, check=False, timeout=600)
    log.command(argv, {}, res)
    try:
        result = json.loads(res.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        result = {"checks": {"import": {"status": "fail", "error": res.stderr.strip()[-500:]}}}
    result["kind"] = "smoke"
    result["exit"] = res.returncode
    updated = dataclasses.replace(record, validation=result)
    state.save(home, updated)
    return updated
