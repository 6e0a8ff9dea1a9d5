"""A recipe's `conda activate` step (``activate.conda_env``, ALCF's `module load conda; conda activate`): the key's
schema, its record, and what each renderer makes of it (activate script, modulefiles, batch script, plan); the
payload's MPI-before-torch order and the Horovod GPU operations handed to it."""

from __future__ import annotations

import importlib
from dataclasses import replace

import pytest
from helpers import PLAN_ENV, REPO, load_facts

from envbuilder import plan
from envbuilder.core import formats, values
from envbuilder.core.errors import RecipeError
from envbuilder.plan import batch, suite
from envbuilder.plan.activation import Activation, activation_for
from envbuilder.recipe import loader
from envbuilder.recipe.catalog import Catalog
from envbuilder.render import activate_scripts, modulefile

CATALOG = Catalog.from_env({})
ACT = Activation(modules=("conda/2026-10-01",), conda_env="base", recipe="demo")


@pytest.mark.parametrize(
    "name", ["base", "pytorch-2.14", "torch_2.14+cu130", "/soft/conda/envs/torch", "/a/b/"]
)
def test_names_and_absolute_prefixes_are_conda_envs(name):
    assert values.conda_env_problem(name) is None
    assert Activation(conda_env=name).conda_env == name


@pytest.mark.parametrize(
    "name",
    [
        "",
        "-n",
        "--help",
        "base; id",
        "$(id)",
        "`id`",
        "two words",
        "envs/torch",
        "base\nid",
        "/a b",
        "/a:b",
        "'q'",
    ],
)
def test_hostile_or_ambiguous_names_are_refused_wherever_they_come_from(name):
    assert values.conda_env_problem(name) is not None
    # A record read back (a hand-edited state file) is refused by the Activation itself, naming the key.
    with pytest.raises(RecipeError) as err:
        Activation.from_json({"conda_env": name})
    assert err.value.key == "activate.conda_env"


def test_the_record_keeps_it_and_old_records_load_without_it():
    assert Activation.from_json(ACT.to_json()).conda_env == "base"
    assert Activation.from_json({"modules": ["conda/2026-10-01"]}).conda_env is None


def test_activate_script_enters_after_the_modules_and_leaves_before_they_unload():
    text = activate_scripts.render_script(ACT)
    load, enter = text.index("module load conda/2026-10-01"), text.index("conda activate base")
    undo = text.index("_envbuilder_undo() {")
    leave, unload = (
        text.index("conda deactivate", undo),
        text.index('module unload "$_envbuilder_item"', undo),
    )
    assert load < enter < undo < leave < unload
    # conda's own bookkeeping comes back exactly (conda deactivate leaves CONDA_SHLVL=0 behind).
    assert 'if [ -n "${CONDA_SHLVL+x}" ]; then _ENVBUILDER_OLD_CONDA_SHLVL=' in text
    # No conda, or a failed activate: what was done is undone and sourcing says so with a non-zero status.
    assert "return 1" in text
    assert "conda activate" not in activate_scripts.render_script(Activation(modules=("conda/2026-10-01",)))


@pytest.mark.parametrize("fmt", formats.MODULEFILE_FORMATS)
def test_modulefiles_cannot_run_conda_and_say_so_on_load(fmt):
    text = modulefile.render(name="e", prefix="/p", recipe="demo", activate=ACT, fmt=fmt)
    note = modulefile.conda_step_note(ACT)
    assert note is not None and "conda activate base" in note
    said = [line for line in text.splitlines() if "conda" in line and "conda/2026-10-01" not in line]
    expected = (
        f'if (mode() == "load") then LmodMessage({modulefile.lua_string(note)}) end'
        if fmt == "lua"
        else f"if {{[module-info mode load]}} {{ puts stderr {modulefile.tcl_string(note)} }}"
    )
    assert said == [expected]
    assert modulefile.conda_step_note(Activation()) is None


def test_batch_script_activates_after_the_modules_with_nounset_off_around_conda():
    lines = batch.script(
        scheduler="pbs",
        directives=["-l select=1"],
        activate=ACT,
        launch=["python", "x.py"],
        workdir="/w",
    ).splitlines()
    at = lines.index("module load conda/2026-10-01")
    assert lines[at + 1].startswith("type conda >/dev/null 2>&1 || { echo ")
    assert lines[at + 2 : at + 5] == [
        "set +u",
        "conda activate base || { echo 'envbuilder: conda activate base failed' >&2; exit 1; }",
        "set -u",
    ]
    assert batch.conda_lines(Activation()) == []


def test_polaris_plans_the_conda_step_but_a_clone_of_the_site_env_needs_none():
    p = plan.build(
        loader.load("polaris-overlay-conda", CATALOG),
        load_facts("a100-sxm4-x4"),
        PLAN_ENV,
        plan.Options(),
    )
    assert p.activate.conda_env == "base"
    assert "conda activate base || {" in p.batch_script
    assert any(
        s.startswith("activate extension: module load conda/2026-10-01, conda activate base") for s in p.steps
    )
    recipe = loader.load("polaris-overlay-conda", CATALOG)
    clone = replace(recipe, data={**recipe.data, "env": {**recipe.data["env"], "overlay": "clone"}})
    assert activation_for(clone).conda_env is None  # activating the clone takes the place of base


def test_cirrus_hands_its_horovod_gpu_operations_to_the_payload():
    recipe = loader.load("cirrus-venv-cu121-horovod", CATALOG)
    assert suite.horovod_gpu_ops(recipe) == "NCCL"
    assert suite.horovod_gpu_ops(loader.load("polaris-overlay-conda", CATALOG)) is None
    p = suite.Payload(("import", "horovod"), "cuda", horovod_gpu_ops="NCCL")
    assert p.args()[-2:] == ["--horovod-gpu-ops", "NCCL"]
    # Only where the horovod check runs.
    assert "--horovod-gpu-ops" not in suite.Payload(("import",), "cuda", horovod_gpu_ops="NCCL").args()


def test_mpi_starts_before_torch_only_under_an_mpi_launcher_with_the_mpi_check(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "envbuilder" / "payloads"))
    checks = importlib.import_module("envbuilder_checks")
    assert checks.mpi_first(True, ["import", "mpi"], mpi4py_found=True)
    assert not checks.mpi_first(False, ["import", "mpi"], mpi4py_found=True)  # torchrun's ranks
    assert not checks.mpi_first(True, ["import", "nccl"], mpi4py_found=True)
    assert not checks.mpi_first(True, ["import", "mpi"], mpi4py_found=False)
    assert checks.import_order(["os", "mpi4py", "mpi4py.MPI", "torch", "torch.cuda"]) == ["mpi4py", "torch"]
