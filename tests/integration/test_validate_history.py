"""The validation history written by real validations (torchrun, two gloo ranks of the CPU torch env) and the
drift alarm a planted regression raises: a real Lmod modulefile the env loads gets a new default version, and that
version puts a directory on PYTHONPATH whose sitecustomize makes the first ``import torch`` of every python wait
(a sleep, so the regression survives a busy machine: the wait is at least twice the slowest fast run's import time,
where an import without bytecode was only about 1.2x slower, the alarm's own margin); the alarm names that module
change, and the recipe's drift_threshold turns it into a failed run."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import stat
import statistics
from pathlib import Path
from typing import Any, Optional

import pytest

from envbuilder.system import state
from envbuilder.validate import history

pytestmark = [pytest.mark.integration]


# Waits once, when a python first imports torch: the import time the check measures grows by this much.
_SLOW_SITECUSTOMIZE = """\
import sys, time

class _Slow:
    def find_spec(self, name, path=None, target=None):
        if name == "torch":
            sys.meta_path.remove(self)
            time.sleep({seconds})
        return None

sys.meta_path.insert(0, _Slow())
"""
SLOWER_BY_S = 3


def _modulefile(root: Path, version: str, slow: Optional[Path] = None, seconds: float = SLOWER_BY_S) -> None:
    (root / "drifty").mkdir(parents=True, exist_ok=True)
    text = f'setenv("DRIFTY_VERSION", "{version}")\n'
    if slow is not None:
        slow.mkdir(exist_ok=True)
        (slow / "sitecustomize.py").write_text(_SLOW_SITECUSTOMIZE.format(seconds=seconds))
        text += f'prepend_path("PYTHONPATH", "{slow}")\n'
    (root / "drifty" / f"{version}.lua").write_text(text)


def _variant(world: Any, name: str, modulefiles: Path) -> dict[str, str]:
    """The vcpu env recorded again as ``name``, activated with the module ``drifty`` from ``modulefiles``: the
    variables that find its recipe."""
    path = world.variant(name, lambda text: text)
    home = Path(world.env["ENVBUILDER_HOME"])
    record = state.load(home, name)
    activate = {
        **(record.plan.get("activate") or {}),
        "module_use": [str(modulefiles)],
        "modules": ["drifty"],
    }
    state.save(home, dataclasses.replace(record, plan={**record.plan, "activate": activate}))
    return {"ENVBUILDER_RECIPE_PATH": path}


def _validate(world: Any, extra: dict[str, str], *args: str) -> tuple[int, dict[str, Any], str]:
    res = world.cli(
        "validate", args[0] if args else "vdrift", "--json", "--checks", "import", *args[1:], extra=extra
    )
    try:
        envelope = json.loads(res.stdout)
    except ValueError:
        pytest.fail(f"no JSON (rc {res.returncode}): {res.stderr[-2000:]}")
    return res.returncode, envelope, res.stderr


def test_real_runs_fill_the_history_and_a_slower_import_raises_the_alarm_naming_the_module(
    validate_world, tmp_path
):
    modulefiles = tmp_path / "modulefiles"
    _modulefile(modulefiles, "1.0")
    extra = _variant(validate_world, "vdrift", modulefiles)
    home = Path(validate_world.env["ENVBUILDER_HOME"])

    for _ in range(3):
        code, envelope, stderr = _validate(validate_world, extra)
        assert code == 0, stderr
        assert envelope["data"]["drift"] == [] and "drift:" not in stderr
    store = home / "history" / "vdrift"
    files = sorted(store.iterdir())
    assert len(files) == 3
    assert stat.S_IMODE(store.stat().st_mode) == 0o700
    assert all(stat.S_IMODE(f.stat().st_mode) == 0o600 for f in files)
    runs = [json.loads(f.read_text()) for f in files]
    for run in runs:
        assert run["env"] == "vdrift" and run["recipe"] == "vdrift" and run["launcher"] == "torchrun"
        assert run["ranks"] == 2 and run["status"] == "pass" and len(run["nodes"]) == 1
        assert run["facts"]["modules"] == {"drifty": "1.0"} and run["facts"]["torch"].startswith("2.13.0")
        imp = next(c for c in run["checks"] if c["name"] == "import")
        assert (
            imp["status"] == "pass" and imp["units"] == {"import_s": "s"} and imp["figures"]["import_s"] > 0
        )
    # The baseline is the fast runs' median (their slowest can be slow too on a loaded machine: 4.9 s once, in CI).
    figures = [next(c for c in r["checks"] if c["name"] == "import")["figures"]["import_s"] for r in runs]
    fast = statistics.median(figures)

    # The regression: the site's module got a new default version, which slows every rank's import of torch. The
    # wait is at least twice the slowest fast run (once, in CI, the fast runs took 4.5 s and a 3 s wait put the slow
    # run only 18% above their median), so the slow run is past the 20% margin whatever the machine's load.
    slower = max(SLOWER_BY_S, 2 * max(figures))
    _modulefile(modulefiles, "2.0", slow=tmp_path / "slow-site", seconds=slower)
    code, envelope, stderr = _validate(validate_world, extra)
    assert code == 0, stderr  # no threshold in the recipe: reported, the exit status unchanged
    (alarm,) = envelope["data"]["drift"]
    assert alarm["figure"] == "import.import_s" and alarm["median"] == pytest.approx(fast, abs=1e-3), (
        alarm,
        fast,
    )
    assert alarm["value"] >= slower, (alarm, fast)  # the wait is inside the figure the check measures
    assert alarm["changes"] == ["module drifty 1.0 -> 2.0"] and alarm["runs"] == 3 and not alarm["fails"]
    assert "drift: import time" in stderr and "since module drifty 1.0 -> 2.0" in stderr, stderr
    assert len(list(store.iterdir())) == 4

    # The recipe sets a threshold: the same drift now fails the run with the report's exit code. The drifted run
    # leaves the store first so that the median is the three fast runs' again (with it, the median moves halfway
    # to the slow figure and how far the next slow run sits above it depends on the machine's load).
    sorted(store.iterdir())[-1].unlink()
    recipe = validate_world.root / "vdrift-recipes" / "vdrift.toml"
    recipe.write_text(
        recipe.read_text().replace("timeout = 60\n", "timeout = 60\ndrift_threshold = 0.2\n", 1)
    )
    # One run shows both what the exit status says and the results table people read (stdout through a pipe,
    # NO_COLOR, 80 columns), which marks the drifted figure against the three fast runs' median.
    res = validate_world.cli("validate", "vdrift", "--checks", "import", extra={**extra, "COLUMNS": "80"})
    assert res.returncode == 8, res.stderr
    assert "drifted past the recipe's drift_threshold" in res.stderr, res.stderr
    assert "since module drifty 1.0 -> 2.0" in res.stderr, res.stderr
    last = json.loads(sorted(store.iterdir())[-1].read_text())
    assert last["status"] == "fail" and last["facts"]["modules"] == {"drifty": "2.0"} and last["ranks"] == 2
    heading, *table = res.stdout.splitlines()
    assert heading.startswith("Validation of vdrift: 2 rank(s)") and "\x1b" not in res.stdout
    assert max(len(line) for line in table) <= 80, res.stdout
    mark = r"import time [\d.]+ s \(\+\d+% vs 3-run median, past drift_threshold\)"
    assert re.search(mark, " ".join(res.stdout.split())), res.stdout


@pytest.mark.slurm
def test_a_submitted_job_adds_its_run_with_the_modules_the_job_loaded(
    validate_world, slurm_cluster, tmp_path
):
    modulefiles = tmp_path / "modulefiles"
    _modulefile(modulefiles, "1.0")
    extra = {**slurm_cluster.env, **_variant(validate_world, "vjob", modulefiles)}
    code, envelope, stderr = _validate(validate_world, extra, "vjob", "--submit")
    assert code == 0, stderr
    assert envelope["data"]["where"].isdigit() and envelope["data"]["modules"] == ["drifty/1.0"]
    (run,) = history.runs(Path(validate_world.env["ENVBUILDER_HOME"]), "vjob")
    assert run["partition"] == "debug" and run["status"] == "pass" and run["ranks"] == 2
    assert run["facts"]["modules"] == {"drifty": "1.0"}  # as the job loaded it, where the ranks ran
    assert run["facts"]["glibc"] == os.confstr("CS_GNU_LIBC_VERSION").split()[1]  # as the job's rank 0 saw it
    assert envelope["data"]["node"]["glibc"] == run["facts"]["glibc"]
