"""A container env's launch, exact argv (pure): the runtime's exec of the image between the launcher and the
program (plan.container.exec_prefix, LaunchSpec.wrap), a job script that enters nothing on the host, and the
line ``activate`` prints for each shell."""

from __future__ import annotations

import pytest

from envbuilder.core import launchers
from envbuilder.core.errors import RecipeError
from envbuilder.core.shells.csh import CSH
from envbuilder.core.shells.fish import FISH
from envbuilder.core.shells.posix import POSIX
from envbuilder.plan import batch, container
from envbuilder.render import modulefile
from envbuilder.render.activate_scripts import render_container_entry

IMAGE = "/scratch/u1/envs/box/image.sif"
BOX = {"runtime": "apptainer", "binds": ["/scratch/u1", "/work/u1"], "gpu": True}
APPTAINER = ("apptainer", "exec", "--nv", "--bind", "/scratch/u1,/work/u1")


def test_the_exec_prefix_names_the_image_binds_and_gpu_flag() -> None:
    assert container.exec_prefix(BOX, IMAGE) == (*APPTAINER, "--", IMAGE)
    assert container.exec_prefix(BOX, IMAGE, gpu=False) == (*APPTAINER[:2], *APPTAINER[3:], "--", IMAGE)
    run = "/scratch/u1/envs/box/envbuilder/validation/run-1"
    assert container.exec_prefix(BOX, IMAGE, binds=[f"{run}/ranks"], read_only=[f"{run}/payloads"]) == (
        *APPTAINER[:4],
        f"/scratch/u1,/work/u1,{run}/ranks,{run}/payloads:{run}/payloads:ro",
        "--",
        IMAGE,
    )


def test_charliecloud_binds_without_options_and_has_no_gpu_flag() -> None:
    box = {"runtime": "charliecloud", "binds": ["/scratch/u1"], "gpu": True}
    assert container.exec_prefix(box, "/p/image.sqfs", read_only=["/run/payloads"]) == (
        "ch-run",
        "--bind=/scratch/u1",
        "--bind=/run/payloads",
        "/p/image.sqfs",
        "--",
    )


def _spec(**more: object) -> launchers.LaunchSpec:
    wrap = container.exec_prefix(BOX, IMAGE)
    fields: dict[str, object] = {"nproc_per_node": 2, **more}
    return launchers.LaunchSpec(
        python="python3",
        script=("/run/validate.py", "--checks", "import"),
        torchrun=(*wrap, "python3", "-m", "torch.distributed.run"),
        wrap=wrap,
        **fields,  # type: ignore[arg-type]
    )


def test_srun_starts_torchrun_inside_the_image() -> None:
    argv = launchers.build("srun", _spec())
    assert argv[:4] == ["srun", "--nodes=1", "--ntasks-per-node=1", "--ntasks=1"]
    assert argv[4:] == [*APPTAINER, "--", IMAGE, "python3", "-m", "torch.distributed.run", "--standalone",
                        launchers.LOOPBACK, "--nnodes=1", "--nproc-per-node=2", "/run/validate.py", "--checks",
                        "import"]  # fmt: skip


def test_mpi_launchers_start_each_rank_inside_the_image_after_the_affinity_wrapper() -> None:
    spec = _spec(affinity_wrapper=("/run/gpu_affinity.sh", "round-robin"))
    argv = launchers.build("mpirun", spec)
    assert argv[argv.index("/run/gpu_affinity.sh") :] == [
        "/run/gpu_affinity.sh", "round-robin", *APPTAINER, "--", IMAGE, "python3", "/run/validate.py",
        "--checks", "import",
    ]  # fmt: skip
    assert launchers.own_options(argv, spec) == ["-n", "2", "--map-by", "ppr:2:node", "--bind-to", "none"]
    direct = launchers.build("local", _spec(direct=True, nproc_per_node=1))
    assert direct == [*APPTAINER, "--", IMAGE, "/run/validate.py", "--checks", "import"]


def test_a_container_job_enters_nothing_on_the_host() -> None:
    assert batch.JobEnv("/p/box", False, enter=False).lines() == []
    assert batch.JobEnv("/p/box", True).lines()[0] == "export VIRTUAL_ENV=/p/box"


ARGV = ("apptainer", "exec", "--bind", "/scratch/u 1", "--", "/p/image.sif")


def test_the_activate_line_is_a_function_named_after_the_env_in_each_shell() -> None:
    assert render_container_entry("box", ARGV, POSIX) == (
        "box() { apptainer exec --bind '/scratch/u 1' -- /p/image.sif \"$@\"; }"
    )
    assert render_container_entry("box", ARGV, FISH) == (
        "function box; 'apptainer' 'exec' '--bind' '/scratch/u 1' '--' '/p/image.sif' $argv; end"
    )
    assert render_container_entry("box", ARGV, CSH) == (
        'alias box \'"apptainer" "exec" "--bind" "/scratch/u 1" "--" "/p/image.sif" \\!*\''
    )


def test_a_word_csh_cannot_carry_or_a_line_break_is_refused() -> None:
    with pytest.raises(ValueError, match="csh cannot carry"):
        render_container_entry("box", ("apptainer", "exec", "--", "/p/$x/image.sif"), CSH)
    with pytest.raises(RecipeError):
        render_container_entry("box", ("apptainer", "exec", "--", "/p/a\nb/image.sif"), POSIX)


def test_a_container_modulefile_defines_the_function_and_no_venv() -> None:
    lua = modulefile.render(name="box", prefix="/p/box", recipe="box", entry=ARGV)
    assert (
        'set_shell_function("box", "apptainer exec --bind \'/scratch/u 1\' -- /p/image.sif \\"$@\\"", '
        '"\\"apptainer\\" \\"exec\\" \\"--bind\\" \\"/scratch/u 1\\" \\"--\\" \\"/p/image.sif\\" \\\\!*")'
    ) in lua
    assert "VIRTUAL_ENV" not in lua and 'pathJoin(prefix, "bin")' not in lua
    tcl = modulefile.render(name="box", prefix="/p/box", recipe="box", entry=ARGV, fmt="tcl")
    assert 'set-function "box" "apptainer exec --bind \'/scratch/u 1\' -- /p/image.sif \\"\\$@\\""' in tcl
    assert "VIRTUAL_ENV" not in tcl
    assert "VIRTUAL_ENV" in modulefile.render(name="v", prefix="/p/v", recipe="v")


def test_an_overlay_env_is_entered_with_the_overlays_bin_before_the_images_path() -> None:
    box = {**BOX, "overlay": {"path": "/scratch/u1/envs/box/venv"}}
    tools = {"image_file": "image.sif", "image_env_path": "/opt/venv/bin:/usr/bin:/bin"}
    argv = container.entry_argv(box, "/scratch/u1/envs/box", tools)
    assert argv == (
        *APPTAINER,
        "--",
        IMAGE,
        "env",
        "PATH=/scratch/u1/envs/box/venv/bin:/opt/venv/bin:/usr/bin:/bin",
        "VIRTUAL_ENV=/scratch/u1/envs/box/venv",
    )
    # An env whose record has no image PATH (made before create read it): the usual directories after the bin.
    older = container.entry_argv(box, "/scratch/u1/envs/box", {"image_file": "image.sif"})
    assert older[-2] == f"PATH=/scratch/u1/envs/box/venv/bin:{container.DEFAULT_PATH}"
    # Without an overlay, the image's exec alone; each shell carries the overlay's (no $ for csh to expand).
    assert container.entry_argv(BOX, "/scratch/u1/envs/box", tools) == (*APPTAINER, "--", IMAGE)
    assert render_container_entry("box", argv, CSH).endswith('"VIRTUAL_ENV=/scratch/u1/envs/box/venv" \\!*\'')
