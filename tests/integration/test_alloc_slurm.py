"""`envbuilder alloc` inside real allocations of the tests' Slurm cluster (tests/slurm.py: one node, its two
stand-in GPUs offered as GRES by gres.conf ``File=`` lines), and the same comparison made by ``validate`` and
``run`` before they start a rank: an ``salloc -c 1`` that holds one CPU for two ranks of two cores, a step that
holds none of the GPUs its GPU env needs, and one that holds them.

The envs are real venvs without torch (``python -m venv``) recorded as ``create`` records them: the comparison
refuses or warns before any rank would import torch, and ``run --dry-run`` prints the launch instead of starting
it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO, UserWorld, cli_argv, cli_env

from envbuilder.system import state

pytestmark = [pytest.mark.integration, pytest.mark.slurm]

#: Each CLI run inside an allocation: the CLI's start and one host probe, on two busy cores.
BOUND_S = 120

_SITE = """schema_version = 1
[recipe]
name = "{name}"
[scheduler]
type = "slurm"
partition = "debug"
time = "00:10:00"
gpu_request = "gres"
[scheduler.partitions.debug]
cores_per_node = 4
{gpus}
[env]
kind = "venv"
installer = "uv"
[python]
command = "python3"
[torch]
install = false
[launcher]
default = "srun"
[validation]
nproc_per_node = 2
"""


class AllocWorld(UserWorld):
    """A user's world with two recorded envs on the test cluster's site: ``cpu2`` (two ranks of two cores, no
    GPU) and ``gpu2`` (two ranks on the node's two GPUs, asked for as GRES)."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.write_recipe("cpu2", _SITE.format(name="cpu2", gpus=""))
        gpus = 'gpus_per_node = 2\n[compute]\ngpus_per_node = 2\ngpu = "NVIDIA H100 80GB HBM3"\n'
        self.write_recipe(
            "gpu2", _SITE.format(name="gpu2", gpus=gpus).replace("cores_per_node = 4", "cores_per_node = 2")
        )
        for name in ("cpu2", "gpu2"):
            self._record(name)

    def _record(self, name: str) -> None:
        prefix = self.scratch / "envbuilder" / "envs" / name
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(prefix)], check=True, timeout=60)
        record = state.EnvRecord(
            name=name,
            recipe=name,
            recipe_digest="sha256:00",
            prefix=str(prefix),
            created="2026-11-28T12:00:00+0000",
            plan={"kind": "venv", "partition": "debug"},
            tools={"python": f"{sys.version_info[0]}.{sys.version_info[1]}", "installer": "uv"},
        )
        state.save(self.home, record)

    def inside(self, cluster, allocation: list[str], *args: str) -> subprocess.CompletedProcess[str]:
        """The CLI run inside ``allocation`` (salloc or srun and its options) of ``cluster``."""
        return subprocess.run(
            [*allocation, *cli_argv(*args)],
            env=cli_env({**self.env, **cluster.env}),
            capture_output=True,
            text=True,
            timeout=BOUND_S,
            cwd=REPO,
        )


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> AllocWorld:
    return AllocWorld(tmp_path_factory.mktemp("alloc"))


def _data(res: subprocess.CompletedProcess[str]) -> dict:
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)["data"]


def test_an_allocation_with_one_cpu_for_two_ranks_of_two_cores(world, slurm_cluster):
    salloc = ["salloc", "--nodes=1", "--ntasks=1", "--cpus-per-task=1", "--time=1"]
    # run makes the same comparison before it starts a rank: the launch can start (torchrun's agent runs the
    # ranks on the one CPU), so it warns, naming what is missing.
    res = world.inside(
        slurm_cluster, salloc, "run", "cpu2", "--ranks-per-node", "2", "--dry-run", "--", "t.py"
    )
    assert res.returncode == 0, res.stderr
    assert "2 ranks x 2 cores need 4" in res.stderr and "--cpus-per-task=4" in res.stderr
    # alloc says what is missing, and which options ask for it.
    data = _data(world.inside(slurm_cluster, salloc, "alloc", "cpu2", "--json"))
    inside = data["inside"]
    assert inside["held"]["cpus_per_node"] == 1
    [cpus, time] = inside["missing"]
    # One minute asked for; the recipe's job asks for ten (squeue tells what is left).
    assert time["what"] == "time" and 0 < time["held"] <= 60 and time["needed"] == 600
    assert inside["held"]["seconds_left"] == time["held"]
    assert (cpus["what"], cpus["held"], cpus["needed"]) == ("cpus", 1, 4)
    assert "2 ranks x 2 cores need 4" in cpus["text"]
    # The option that fixes it is in the line alloc prints for a new allocation.
    assert set(cpus["ask"]) <= set(data["lines"]["interactive"])
    assert "--cpus-per-task=4" in cpus["ask"]


def test_a_step_without_the_gres_gpus_its_env_needs_is_refused(world, slurm_cluster):
    step = ["srun", "--nodes=1", "--ntasks=1", "--cpus-per-task=2"]
    # validate cannot run the checks here (exit 8, as on a login node: create then smoke-checks instead); run
    # refuses the program (exit 2).
    for code, args in ((8, ("validate", "gpu2")), (2, ("run", "gpu2", "--dry-run", "--", "t.py"))):
        res = world.inside(slurm_cluster, step, *args)
        assert res.returncode == code, res.stderr
        assert (
            "lacks what the launch needs: the job holds 0 GPUs on this node; the launch needs 2" in res.stderr
        )
        assert "hint: ask with --gres=gpu:2; a new allocation that holds it: salloc" in res.stderr
        assert "Traceback" not in res.stderr
    # alloc says the same, and which option asks for what is missing.
    data = _data(world.inside(slurm_cluster, step, "alloc", "gpu2", "--json"))
    [gpus] = data["inside"]["missing"]
    assert (gpus["what"], gpus["held"], gpus["needed"], gpus["refuse"]) == ("gpus", 0, 2, True)
    assert gpus["ask"] == ["--gres=gpu:2"]


def test_a_step_that_holds_the_gres_gpus_lacks_nothing(world, slurm_cluster):
    step = ["srun", "--nodes=1", "--ntasks=1", "--cpus-per-task=2", "--gres=gpu:2"]
    data = _data(world.inside(slurm_cluster, step, "alloc", "gpu2", "--json"))
    held = data["inside"]["held"]
    assert held["cpus_per_node"] == data["need"]["cpus_per_node"] == 2
    assert (held["gpus"], held["visible_gpus"]) == (2, 2)  # SLURM_GPUS_ON_NODE, CUDA_VISIBLE_DEVICES
    assert data["inside"]["missing"] == []
