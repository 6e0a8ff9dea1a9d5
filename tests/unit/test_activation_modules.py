"""Which modules activation loads: the env's build modules (``[modules] load``) but those ``build_only`` marks,
then ``[activate] modules``, each once; what the plan, the modulefile and a record from before say about it."""

from __future__ import annotations

import pytest
from helpers import PLAN_ENV, load_facts
from test_shipped_recipes import CASES, make

from envbuilder import plan
from envbuilder.core import formats
from envbuilder.plan import suite
from envbuilder.plan.activation import Activation, build_loads
from envbuilder.recipe import loader
from envbuilder.recipe.catalog import Catalog
from envbuilder.render import activate_scripts, modulefile

#: A record's activation as envbuilder wrote it before activation loaded the build's modules (no from_build).
OLD_RECORD = {
    "modules": ["python/3.12.1-gpu"],
    "module_use": [],
    "env": {"HOROVOD_MPI": "1"},
    "unset": [],
    "prepend": {},
    "append": {},
    "profiles": ["horovod"],
    "conda_env": None,
}


@pytest.mark.parametrize(
    ("name", "facts_name", "modules"), [(*c[:2], c[3]) for c in CASES], ids=[c[0] for c in CASES]
)
def test_every_shipped_recipe_activates_its_build_modules_once(name, facts_name, modules):
    """Vista's gcc and python3 (its venv's python comes from them), and Cirrus's, Zurada's and Polaris's python or
    conda, which they also list under [activate] modules: loaded by activation once each."""
    p = make(name, facts_name)
    assert list(p.activate.from_build or ()) == modules
    assert list(p.activate.modules[: len(modules)]) == modules
    assert len(set(p.activate.modules)) == len(p.activate.modules)
    assert p.to_json()["activate"]["from_build"] == modules


def test_vista_activation_loads_gcc_then_python3_and_the_plan_says_so():
    p = make("vista-venv-cu124", "gh200-aarch64")
    assert p.activate.modules == ("gcc/15.1.0", "python3/3.11.8")
    said = (
        "activation loads gcc/15.1.0 python3/3.11.8 (the build's, [modules] load); deactivate unloads those of "
        "them (and what they loaded) that were not loaded before"
    )
    assert said in p.steps
    script = activate_scripts.render_script(p.activate)
    assert "module load gcc/15.1.0 python3/3.11.8 ||" in script


def test_the_mpi_recipe_activation_loads_its_mpi():
    p = make("vista-venv-mpi-cu126", "gh200-aarch64")
    assert p.activate.modules == ("gcc/13.2.0", "openmpi/5.0.5", "python3_mpi/3.11.8")


def _recipe(tmp_path, modules: str, activate: str = ""):
    (tmp_path / "r.toml").write_text(
        'schema_version = 1\n[recipe]\nname = "r"\n[env]\nkind = "venv"\n[torch]\ninstall = false\n'
        f'[modules]\nsystem = "lmod"\n{modules}\n{activate}'
    )
    return loader.load("r", Catalog.from_env({"ENVBUILDER_RECIPE_PATH": str(tmp_path)}))


def test_build_only_keeps_a_module_of_load_out_of_activation_and_the_build_loads_it_once(tmp_path):
    recipe = _recipe(
        tmp_path,
        'load = ["gcc/15.1.0", "cmake/3.25.2", "python3/3.11.8"]\nbuild_only = ["cmake/3.25.2", "ninja/1.11"]',
        '[activate]\nmodules = ["python3/3.11.8", "cuda/12.6"]',
    )
    p = plan.build(recipe, load_facts("cpu-only"), PLAN_ENV, plan.Options())
    assert p.activate.modules == ("gcc/15.1.0", "python3/3.11.8", "cuda/12.6")
    assert p.activate.from_build == ("gcc/15.1.0", "python3/3.11.8")
    assert build_loads(p.modules, p.build_modules) == [
        "gcc/15.1.0",
        "cmake/3.25.2",
        "python3/3.11.8",
        "ninja/1.11",
    ]
    assert suite.job_modules(recipe, p.activate) == list(p.activate.modules)
    assert (
        "activation loads gcc/15.1.0 python3/3.11.8 (the build's, [modules] load), then cuda/12.6 ([activate] "
        "modules); deactivate unloads those of them (and what they loaded) that were not loaded before; not "
        "loaded: cmake/3.25.2 ninja/1.11 (build only)"
    ) in p.steps
    assert "module load ninja/1.11  (build only)" in p.steps


def test_a_record_from_before_renders_as_it_did_and_says_what_it_leaves_out():
    act = Activation.from_json(OLD_RECORD)  # type: ignore[arg-type]
    assert act.from_build is None
    assert "from_build" not in act.to_json()
    # The script it gets is the one such a record always got: only what [activate] modules named.
    assert activate_scripts.render_script(act) == activate_scripts.render_script(
        Activation(modules=("python/3.12.1-gpu",), env={"HOROVOD_MPI": "1"}, profiles=("horovod",))
    )
    assert act.modules_said(["python/3.12.1-gpu", "gcc/15.1.0"], ["cmake/3.25.2"]) == (
        "loads python/3.12.1-gpu ([activate] modules); deactivate unloads those of them (and what they loaded) "
        "that were not loaded before; not loaded: cmake/3.25.2 (build only); not loaded: gcc/15.1.0, which the "
        "env was built with (recorded before activation loaded the build's modules; `envbuilder create NAME "
        "--force` rewrites it)"
    )


def test_a_recorded_from_build_outside_the_modules_is_refused():
    with pytest.raises(Exception, match="among the modules it loads"):
        Activation(modules=("a/1",), from_build=("b/2",))


@pytest.mark.parametrize("fmt", formats.MODULEFILE_FORMATS)
def test_the_modulefile_loads_the_build_modules_and_says_which(fmt):
    p = make("vista-venv-cu124", "gh200-aarch64")
    text = modulefile.render(name="e", prefix="/p", recipe=p.recipe, activate=p.activate, fmt=fmt)
    said = "Loads modules: gcc/15.1.0 python3/3.11.8 (unloaded again by `module unload`, where this loaded them)."
    assert said in text
    if fmt == "lua":
        assert 'depends_on("gcc/15.1.0")\ndepends_on("python3/3.11.8")' in text
    else:
        assert 'module load "gcc/15.1.0"\nmodule load "python3/3.11.8"' in text
