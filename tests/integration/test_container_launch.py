"""A container env run and validated inside its image, with the container world's real parts (tests/containers.py):
the CPU tag's image file (``cpu_sif``, pulled from Debian's registry on 127.0.0.1 by the Apptainer stand-in over
Charliecloud) made into an env by ``create``, whose default validation then starts two gloo ranks through the
tests' real Slurm with the runtime in between (``srun ... apptainer exec ... IMAGE python3 -m
torch.distributed.run ...``); ``validate`` (here and ``--submit``), ``run`` and ``sbatch`` the same way;
``activate``'s line in bash, zsh, fish and tcsh and the modulefile under real Lmod entering the image; ``show``
naming the image. Times here: the module's create (a 1.2 GB image copied in, then validated) 60-150 s; each
Slurm launch 10-30 s (two ranks importing torch inside the image)."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from helpers import TRAIN, UserWorld, rank_lines, run_cli

pytestmark = [pytest.mark.integration, pytest.mark.rootfs, pytest.mark.slurm]

RECIPE = """\
schema_version = 1
[recipe]
name = "box"
[scheduler]
type = "slurm"
batch = "sbatch"
partition = "debug"
time = "00:10:00"
[env]
kind = "container"
prefix = "${{SCRATCH}}/envs/{{name}}"
[container]
image = "{image}"
[launcher]
default = "srun"
[validation]
checks = ["import", "ddp"]
nproc_per_node = 2
timeout = 120
"""
#: What the world's CPU image holds (tests/containers.py): its torch and where its python lives.
TORCH = "2.13.0+cpu"
SITE = "/opt/venv/lib/python3.11/site-packages"
BOUND_S = 300


@pytest.fixture(scope="module")
def boxed(tmp_path_factory, cpu_sif, apptainer, slurm_cluster) -> SimpleNamespace:
    """The container env ``box`` made from the world's CPU image, by a plain ``create`` (which validates it)."""
    root = tmp_path_factory.mktemp("boxed")
    world = UserWorld(
        root,
        **{
            **slurm_cluster.env,
            "PATH": apptainer.env["PATH"],
            "APPTAINER_NOHTTPS": "1",
            "GLOO_SOCKET_IFNAME": "lo",
        },
    )
    world.write_recipe("box", RECIPE.format(image=cpu_sif))
    created = world.cli("create", "box", "--json", "--facts", "tests/data/facts/cpu-only.json")
    prefix = world.scratch / "envs" / "box"
    return SimpleNamespace(world=world, created=created, prefix=prefix, root=root)


def test_create_validates_the_container_env_through_slurm_and_the_runtime(boxed):
    res = boxed.created
    assert res.returncode == 0, res.stderr
    validation = json.loads(res.stdout)["data"]["validation"]
    assert validation is not None, res.stderr
    assert validation["launcher"] == "srun" and validation["world"] == 2
    assert {k: v["status"] for k, v in validation["checks"].items()} == {"import": "pass", "ddp": "pass"}
    command = validation["command"]
    image = str(boxed.prefix / "image.sif")
    # srun, then the runtime's exec of the image, then the image's python running torchrun.
    assert command[0] == "srun" and "apptainer" in command
    at = command.index("apptainer")
    assert command[at : at + 2] == ["apptainer", "exec"]
    assert command[command.index("--", at) + 1 : command.index("--", at) + 3] == [image, "python3"]
    run_dir = Path(command[command.index("--out") + 1]).parent
    assert command[command.index("--bind", at) + 1].split(",") == [
        f"{run_dir}/ranks",
        f"{run_dir}/payloads:{run_dir}/payloads:ro",
    ]


def test_validate_runs_two_gloo_ranks_inside_the_image_under_slurm(boxed):
    assert boxed.created.returncode == 0, boxed.created.stderr
    res = boxed.world.cli("validate", "box", "--json")
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)["data"]
    assert {k: v["status"] for k, v in data["checks"].items()} == {"import": "pass", "ddp": "pass"}
    # The ranks imported the image's torch, not anything of the host's.
    ranks = data["checks"]["import"]["per_rank"]
    assert {(r["torch"], r["file"]) for r in ranks.values()} == {(TORCH, f"{SITE}/torch")}


def test_validate_submit_runs_the_suite_inside_the_image_as_a_slurm_job(boxed):
    assert boxed.created.returncode == 0, boxed.created.stderr
    res = boxed.world.cli("validate", "box", "--submit", "--json")
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)["data"]
    assert {k: v["status"] for k, v in data["checks"].items()} == {"import": "pass", "ddp": "pass"}
    assert data["where"] != "here" and "apptainer" in data["command"]
    ranks = data["checks"]["import"]["per_rank"]
    assert {r["torch"] for r in ranks.values()} == {TORCH}


def test_run_starts_the_program_inside_the_image(boxed):
    assert boxed.created.returncode == 0, boxed.created.stderr
    res = boxed.world.cli(
        "run", "box", "--launcher", "local", "--", "python", "-c",
        "import sys, torch; print('inside', torch.__version__, sys.executable)",
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines()[-1] == f"inside {TORCH} /opt/venv/bin/python"


def test_run_starts_two_ranks_under_srun_inside_the_image(boxed, tmp_path):
    assert boxed.created.returncode == 0, boxed.created.stderr
    train = boxed.root / "train.py"
    train.write_text(TRAIN)
    res = boxed.world.cli("run", "box", "--ranks-per-node", "2", "--", str(train))
    assert res.returncode == 0, res.stderr
    assert [line.split(" omp=")[0] for line in rank_lines(res.stdout)] == ["rank 0/2 sum=3", "rank 1/2 sum=3"]


def test_sbatch_submits_a_job_whose_ranks_run_inside_the_image(boxed):
    assert boxed.created.returncode == 0, boxed.created.stderr
    train = boxed.root / "train.py"
    train.write_text(TRAIN)
    # Run where the job's output may go (sbatch writes it in the directory it is run from), not the checkout.
    argv = ("sbatch", "box", "--ranks-per-node", "2", "--json", "--", str(train))
    res = run_cli(*argv, env=boxed.world.env, timeout=900, cwd=boxed.root)
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)["data"]
    script = Path(data["script_path"]).read_text()
    assert "VIRTUAL_ENV" not in script and "PYTHONUSERBASE" not in script
    assert f"apptainer exec -- {boxed.prefix}/image.sif python3" in script
    deadline = time.monotonic() + BOUND_S
    output = Path(data["output"])
    assert output.parent == boxed.root  # where sbatch ran (Slurm's convention), never the checkout
    while time.monotonic() < deadline:
        queued = subprocess.run(
            ["squeue", "-h", "-j", data["job"]], env=boxed.world.env, capture_output=True, text=True
        )
        if not queued.stdout.strip():
            break
        time.sleep(0.5)
    text = output.read_text()
    assert [line.split(" omp=")[0] for line in rank_lines(text)] == ["rank 0/2 sum=3", "rank 1/2 sum=3"], text


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish", "tcsh"])
def test_activate_sourced_enters_the_image(boxed, shell):
    assert boxed.created.returncode == 0, boxed.created.stderr
    if not shutil.which(shell):
        pytest.skip(f"{shell} is not installed")
    line = boxed.world.cli("activate", "box", "--shell", shell)
    assert line.returncode == 0, line.stderr
    # A script file: tcsh reads it line by line, so the alias exists when the next line is read.
    script = boxed.root / f"enter.{shell}"
    script.write_text(
        f"{line.stdout}\nbox python -c 'import torch, sys; print(torch.__version__, sys.executable)'\n"
    )
    argv = [shell, "-f", str(script)] if shell == "tcsh" else [shell, str(script)]
    res = subprocess.run(argv, env=boxed.world.env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines()[-1] == f"{TORCH} /opt/venv/bin/python"


def test_show_prints_the_image_its_digests_runtime_and_binds(boxed, cpu_sif):
    assert boxed.created.returncode == 0, boxed.created.stderr
    res = boxed.world.cli("show", "box")
    assert res.returncode == 0, res.stderr
    text = res.stdout + res.stderr
    assert f"image: {cpu_sif} ({boxed.prefix}/image.sif)" in text
    assert 'enter: eval "$(envbuilder activate box)"; box COMMAND...' in text
    record = json.loads((boxed.prefix / "envbuilder" / "record.json").read_text())
    assert record["tools"]["image_sha256"] in text
    assert "apptainer" in text and "bin/activate" not in text


LMOD_INIT = Path("/usr/share/lmod/lmod/init/bash")


@pytest.mark.skipif(not LMOD_INIT.is_file(), reason="needs Lmod (its bash init)")
def test_the_modulefile_loaded_by_real_lmod_enters_the_image(boxed):
    assert boxed.created.returncode == 0, boxed.created.stderr
    mdir = boxed.root / "modules"
    res = boxed.world.cli("modulefile", "box", "-o", f"{mdir}/")
    assert res.returncode == 0, res.stderr
    script = (
        f"source {LMOD_INIT}; module use {mdir}; module load box; "
        "box python -c 'import torch, sys; print(torch.__version__, sys.executable)'; "
        "module unload box; type box >/dev/null 2>&1 && echo still-there || echo gone"
    )
    res = subprocess.run(
        ["bash", "-c", script], env=boxed.world.env, capture_output=True, text=True, timeout=120
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines()[-2:] == [f"{TORCH} /opt/venv/bin/python", "gone"]
