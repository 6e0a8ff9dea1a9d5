"""Hostile recipe values against the real tools they would reach: Lmod, uv, pip, bash, rich, Slurm.

Each case first shows the hazard with the tool itself (a marker file the injected command creates, a file
written outside the env), then shows that envbuilder refuses the value at plan time (exit 3, naming file and key)
and that create leaves nothing behind. The renderers and the module adapter refuse such values on their own as
well (defence in depth: a state record or a caller may hand them one without the loader in between)."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from helpers import DATA, PLAN_ENV, REPO, UserWorld, bash, lmod_vars, ok, refused, run_cli
from slurm import ENDED, job_record, sbatch_wait
from wheelindex import build_wheel, mirror_env, serve

from envbuilder.core import modulelines
from envbuilder.core.errors import EnvbuilderError, ModuleSystemError, RecipeError
from envbuilder.plan import batch, steps
from envbuilder.plan.activation import Activation
from envbuilder.recipe import loader
from envbuilder.recipe.catalog import Catalog, Layer
from envbuilder.recipe.sections import Package
from envbuilder.render import activate_scripts, modulefile
from envbuilder.system import modules

pytestmark = pytest.mark.integration

LMOD_INIT = "/usr/share/lmod/lmod/init/bash"
needs_lmod = pytest.mark.skipif(
    not Path(LMOD_INIT).is_file(), reason="Lmod not installed (.ci/run installs it)"
)
SITE_MODULES = DATA / "modules" / "site"

RECIPE = """\
schema_version = 1

[recipe]
name = "demo"

[env]
installer = "{installer}"

[torch]
install = false
{extra}
[[packages]]
name = "{name}"
spec = "{spec}"
"""


@pytest.fixture(scope="module")
def index(tmp_path_factory):
    files = tmp_path_factory.mktemp("files")
    build_wheel(files, "ebdemo", "1.0", {"ebdemo/__init__.py": "VERSION = '1.0'\n"})
    with serve(files) as idx:
        yield idx


class World(UserWorld):
    """A user with a recipe directory, an envbuilder home, $SCRATCH and uv's cache, all under ``root``."""

    def __init__(self, root: Path, index, recipes: str = "recipes") -> None:
        super().__init__(root, mirror_env(index), recipes, COLUMNS="400", **lmod_vars())
        self.envs = root / "envs"
        self.index = index
        index.requested.clear()

    def recipe(
        self, extra: str = "", name: str = "ebdemo", spec: str = "ebdemo==1.0", installer: str = "uv"
    ) -> Path:
        path = self.recipes / "demo.toml"
        path.write_text(
            RECIPE.format(extra=extra, name=name, spec=spec, installer=installer), encoding="utf-8"
        )
        return path

    def create(self, prefix: Path) -> subprocess.CompletedProcess[str]:
        return self.cli("create", "demo", "--prefix", str(prefix))

    def written(self) -> list[str]:
        """Everything under $SCRATCH and the envs directory: a refused create writes nothing there."""
        found: list[str] = []
        for top in (self.root / "scratch", self.envs):
            if top.exists():
                found += [str(p) for p in top.rglob("*")]
        return found


@pytest.fixture
def world(tmp_path, index):
    return World(tmp_path, index)


def lmod_env() -> dict[str, str]:
    return {"HOME": os.environ["HOME"], "PATH": "/usr/bin:/bin", "MODULEPATH": str(SITE_MODULES)}


def no_marker(marker: Path) -> None:
    assert not marker.exists(), f"the injected command ran: {marker} exists"
    assert not (REPO / "pwned").exists()


# ---------------------------------------------------------------------------------------------------------------
# Module names


def hostile_module(marker: Path) -> str:
    return f"x'; touch {marker}; echo '"


@pytest.fixture
def marker():
    """Where an injected command leaves its mark. Not under pytest's tmp_path: Lmod runs the injected text only
    while the name holds no '-' (it reads the name as a Lua pattern first), and that path holds several."""
    where = Path(tempfile.mkdtemp(prefix="ebmark_", dir="/tmp"))
    yield where / "marker"
    shutil.rmtree(where)


@needs_lmod
def test_lmod_itself_runs_code_hidden_in_a_quoted_module_name(marker):
    # The hazard: quoting the name for the shell is not enough, Lmod evaluates what it is handed.
    bash(f"source {LMOD_INIT}; module load {shlex.quote(hostile_module(marker))}", lmod_env())
    assert marker.exists()


@needs_lmod
@pytest.mark.parametrize("key", ["modules.load", "activate.modules"])
def test_module_name_lmod_would_run_is_refused_at_plan_and_create(world, key, marker):
    name = json.dumps(hostile_module(marker))
    table = key.split(".")[0]
    extra = f'\n[modules]\nsystem = "lmod"\nuse = ["{SITE_MODULES}"]\n'
    if table == "modules":
        extra += f'load = ["gcc/13.2.0", {name}]\n'
        index = 1
    else:
        extra += f'load = ["gcc/13.2.0"]\n\n[activate]\nmodules = [{name}]\n'
        index = 0
    path = world.recipe(extra)
    res = world.cli("plan", "demo")
    refused(res, 3, f"{path}: {key}[{index}]: not a module name")
    assert "hint: a module name holds letters, digits" in res.stderr
    refused(world.create(world.envs / "demo"), 3, f"{key}[{index}]: not a module name")
    no_marker(marker)
    assert world.written() == []


@needs_lmod
def test_module_adapter_refuses_a_hostile_name_before_lmod_sees_it(marker):
    lmod = modules.ModuleSystem("lmod", LMOD_INIT)
    with pytest.raises(ModuleSystemError) as info:
        lmod.apply([], ["gcc/13.2.0", hostile_module(marker)], lmod_env())
    assert info.value.exit_code == 6
    assert "not a module name" in info.value.message
    with pytest.raises(ModuleSystemError):
        lmod.apply(["/opt/mods\n/tmp/evil"], [], lmod_env())
    with pytest.raises(ModuleSystemError):
        lmod.load_lines([], ["--force"])
    with pytest.raises(ModuleSystemError):
        lmod.unload_lines([hostile_module(marker)])
    no_marker(marker)
    # The control: a good name still loads through the same call.
    assert lmod.apply([], ["gcc/13.2.0"], lmod_env()).set["GCC_VERSION"] == "13.2.0"


def test_renderers_refuse_a_hostile_module_name(tmp_path):
    name = hostile_module(tmp_path / "marker")
    with pytest.raises(RecipeError, match="not a module name"):
        activate_scripts.render_script(Activation(modules=(name,)))
    with pytest.raises(RecipeError, match="not a module name"):
        modulefile.render(name="demo", prefix="/p", recipe="demo", activate=Activation(modules=(name,)))
    with pytest.raises(EnvbuilderError, match="not a module name"):
        modulelines.module_lines([], [name])
    # The controls: the same calls with a real module name render it.
    assert "module load gcc/13.2.0" in activate_scripts.render_script(Activation(modules=("gcc/13.2.0",)))
    assert 'depends_on("gcc/13.2.0")' in modulefile.render(
        name="demo", prefix="/p", recipe="demo", activate=Activation(modules=("gcc/13.2.0",))
    )


# ---------------------------------------------------------------------------------------------------------------
# Package entries


@pytest.mark.parametrize(
    ("name", "spec", "key", "says"),
    [
        ("--target={elsewhere}", "ebdemo==1.0", "packages[0].name", "not a distribution name"),
        ("ebdemo", "--target={elsewhere}", "packages[0].spec", "a requirement cannot start with '-'"),
        ("ebdemo", "--index-url={other}", "packages[0].spec", "a requirement cannot start with '-'"),
        ("ebdemo", "ebdemo==1.0 --target={elsewhere}", "packages[0].spec", "not a PEP 508 requirement"),
    ],
    ids=["name-as-option", "spec-as-target", "spec-swaps-index", "option-after-spec"],
)
def test_package_entry_never_becomes_an_installer_option(world, name, spec, key, says):
    elsewhere = world.root / "elsewhere"
    with serve(world.root) as other:  # an index the hostile entry would switch to
        fill = {"elsewhere": elsewhere, "other": other.url}
        path = world.recipe(name=name.format(**fill), spec=spec.format(**fill))
        refused(world.cli("plan", "demo"), 3, f"{path}: {key}: {says}")
        prefix = world.envs / "demo"
        refused(world.create(prefix), 3, f"{key}: {says}")
        assert other.requested == []
    assert not elsewhere.exists()
    assert not prefix.exists()
    assert world.written() == []
    assert world.index.requested == []


def test_plan_passes_package_specs_after_double_dash(world):
    world.recipe()
    data = json.loads(ok(world.cli("plan", "demo", "--json")).stdout)["data"]
    install = data["install_commands"][-1]
    assert install[-2:] == ["--", "ebdemo==1.0"], install


@pytest.mark.parametrize("installer", ["uv", "pip"])
def test_installers_read_what_follows_double_dash_as_requirements(world, tmp_path, installer):
    """The defence behind the schema: the argv install_steps builds, run by the real installer with a hostile
    spec that bypassed the loader. Without ``--`` (the control) the installer writes outside the env."""
    world.recipe(installer=installer)
    recipe = loader.load("demo", Catalog([Layer("test", world.recipes)]))
    elsewhere = tmp_path / "elsewhere"
    prefix = tmp_path / "env"
    packages = [Package("ebdemo", spec="ebdemo==1.0"), Package("x", spec=f"--target={elsewhere}")]
    warnings: list[str] = []
    built, _ = steps.install_steps(
        steps.NewEnv("venv", installer, sys.executable, str(prefix)), recipe, None, packages, warnings
    )
    install = list(built[-1].argv)
    assert install[-3:] == ["--", "ebdemo==1.0", f"--target={elsewhere}"]
    if installer == "uv":
        subprocess.run(["uv", "venv", "--quiet", str(prefix)], check=True, env=world.env, timeout=120)
        install[0] = "uv"
    else:
        subprocess.run([sys.executable, "-m", "venv", str(prefix)], check=True, timeout=120)
    at = install.index("install") + 1
    install[at:at] = ["--index-url", f"{world.index.url}/simple"]
    env = {**world.env, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    res = subprocess.run(install, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode != 0, res.stdout + res.stderr
    assert not elsewhere.exists()
    control = [a for a in install if a != "--"]
    res = subprocess.run(control, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    assert (elsewhere / "ebdemo" / "__init__.py").is_file()


# ---------------------------------------------------------------------------------------------------------------
# Line breaks and NUL in values that reach scripts


@needs_lmod
def test_lmod_runs_a_line_break_in_a_modulefile_value(tmp_path):
    # The hazard: a Lua string may hold a line break, and Lmod writes it unescaped into the shell code that
    # `module load` evaluates; the next line runs as a command.
    marker = tmp_path / "marker"
    script = tmp_path / "evil.sh"
    script.write_text(f"#!/bin/sh\ntouch {marker}\n")
    script.chmod(0o755)
    mods = tmp_path / "mods"
    mods.mkdir()
    (mods / "evil.lua").write_text(f'pushenv("EB_X", {modulefile.lua_string("1" + chr(10) + str(script))})\n')
    bash(f"source {LMOD_INIT}; module use {mods}; module load evil", lmod_env())
    assert marker.exists()


@pytest.mark.parametrize(
    ("extra", "key"),
    [
        ('\n[activate]\nenv = {{ OMP_NUM_THREADS = "8\\n{script}" }}\n', "activate.env.OMP_NUM_THREADS"),
        (
            '\n[env_profiles.omp]\nset = {{ OMP_PLACES = "cores\\n{script}" }}\n\n[activate]\nprofiles = ["omp"]\n',
            "env_profiles.omp.set.OMP_PLACES",
        ),
        ('\n[modules]\nuse = ["/opt/mods\\n{script}"]\n', "modules.use[0]"),
    ],
    ids=["activate-env", "profile", "module-use"],
)
def test_line_break_in_an_activate_value_is_refused_at_plan_time(world, extra, key):
    marker = world.root / "marker"
    script = world.root / "evil.sh"
    script.write_text(f"#!/bin/sh\ntouch {marker}\n")
    script.chmod(0o755)
    path = world.recipe(extra.format(script=script))
    res = world.cli("plan", "demo")
    refused(res, 3, f"{path}: {key}: a line break is not allowed in this value")
    refused(world.create(world.envs / "demo"), 3, f"{key}: a line break is not allowed")
    no_marker(marker)
    assert world.written() == []


@pytest.mark.parametrize("bad", ["1\n/tmp/evil.sh", "1\r/tmp/evil.sh", "a\x00b"], ids=["LF", "CR", "NUL"])
def test_renderers_refuse_what_they_cannot_carry(bad):
    with pytest.raises(RecipeError, match="OMP_NUM_THREADS"):
        modulefile.render(
            name="demo", prefix="/p", recipe="demo", activate=Activation(env={"OMP_NUM_THREADS": bad})
        )
    with pytest.raises(RecipeError):
        modulefile.render(name="demo", prefix="/p" + bad, recipe="demo")
    with pytest.raises(RecipeError):
        modulefile.render(
            name="demo", prefix="/p", recipe="demo", activate=Activation(module_use=("/m" + bad,))
        )
    with pytest.raises(RecipeError, match="OMP_NUM_THREADS"):
        activate_scripts.render_script(Activation(env={"OMP_NUM_THREADS": bad}))
    with pytest.raises(RecipeError):
        activate_scripts.render_script(Activation(module_use=("/m" + bad,), modules=("gcc/13.2.0",)))
    with pytest.raises(RecipeError):
        activate_scripts.render_user_prefix_activate("/p" + bad)
    with pytest.raises(RecipeError):
        activate_scripts.render_conda_activate("/p" + bad)
    job = {
        "scheduler": "slurm",
        "directives": ["--job-name=demo"],
        "activate": Activation(),
        "launch": ["python", "x.py"],
        "workdir": "/w",
    }
    with pytest.raises(RecipeError, match="OMP_NUM_THREADS"):
        batch.script(**{**job, "activate": Activation(env={"OMP_NUM_THREADS": bad})})
    with pytest.raises(EnvbuilderError):
        batch.script(**{**job, "directives": ["--account=" + bad]})
    with pytest.raises(EnvbuilderError):
        batch.script(**{**job, "workdir": "/w" + bad})
    # The controls: the same renderers with a plain value.
    assert 'pushenv("OMP_NUM_THREADS", "8")' in modulefile.render(
        name="demo", prefix="/p", recipe="demo", activate=Activation(env={"OMP_NUM_THREADS": "8"})
    )
    assert "export OMP_NUM_THREADS=8" in batch.script(
        **{**job, "activate": Activation(env={"OMP_NUM_THREADS": "8"})}
    )


def test_renderers_refuse_unset_names_that_are_not_variables():
    job = {"scheduler": "slurm", "directives": [], "launch": ["python"], "workdir": "/w"}
    with pytest.raises(RecipeError, match="not a variable name"):
        batch.script(**job, activate=Activation(unset=("X; touch pwned",)))
    with pytest.raises(RecipeError, match="not a variable name"):
        activate_scripts.render_script(Activation(unset=("X; touch pwned",)))
    with pytest.raises(RecipeError, match="not a variable name"):
        modulefile.render(
            name="demo", prefix="/p", recipe="demo", activate=Activation(unset=("X; touch pwned",))
        )


def test_account_with_a_line_break_never_reaches_a_batch_script(tmp_path):
    (tmp_path / "demo.toml").write_text(
        'schema_version = 1\n[recipe]\nname = "demo"\n[scheduler]\ntype = "slurm"\n[torch]\ninstall = false\n'
    )
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "ENVBUILDER_RECIPE_PATH": str(tmp_path)}
    env["ENVBUILDER_OFFLINE"] = "1"
    res = run_cli("plan", "demo", "--account", "p01\ntouch pwned", "--json", env=env)
    assert res.returncode == 2, res.stdout + res.stderr
    assert "--account" in res.stderr and "Traceback" not in res.stderr
    ok(run_cli("plan", "demo", "--account", "p01", env=env))


def test_nul_byte_is_refused_with_exit_3(world):
    path = world.recipe('\n[activate]\nenv = { EB_X = "a\\u0000b" }\n')
    refused(
        world.cli("plan", "demo"), 3, f"{path}: activate.env.EB_X: a NUL byte is not allowed in this value"
    )
    refused(world.create(world.envs / "demo"), 3, "activate.env.EB_X: a NUL byte")
    assert world.written() == []


# ---------------------------------------------------------------------------------------------------------------
# Rich markup in user values


def test_prefix_and_recipe_path_with_rich_markup_create_list_and_show(tmp_path, index):
    world = World(tmp_path, index, recipes="rec[red]ipes[/y]z")
    world.recipe()
    # An unmatched closing tag made rich raise once the env was built (create exited 1 and discarded it); an
    # opening one was swallowed from the output; :thumbs_up: was an emoji.
    prefix = world.envs / "a[x]b[/y]c [bold]:thumbs_up:"
    res = ok(world.create(prefix))
    assert (prefix / "bin" / "python").exists()
    assert str(prefix) in res.stderr
    listed = ok(world.cli("list"))
    assert str(prefix) in listed.stdout + listed.stderr
    shown = ok(world.cli("show", "demo"))
    assert str(prefix) in shown.stdout + shown.stderr
    assert json.loads(ok(world.cli("list", "--json")).stdout)["data"][0]["prefix"] == str(prefix)
    recipes = ok(world.cli("recipes", "list"))
    assert str(world.recipes) in recipes.stdout + recipes.stderr


@needs_lmod
def test_modulefile_from_a_tampered_record_is_refused_not_written(world):
    """A state record is not read through the loader: the activation read from it refuses on its own."""
    world.recipe()
    ok(world.create(world.envs / "demo"))
    record_file = Path(world.env["ENVBUILDER_HOME"]) / "envs" / "demo.json"
    record = json.loads(record_file.read_text())
    mods = world.root / "modulefiles"
    mods.mkdir()
    ok(world.cli("modulefile", "demo", "-o", str(mods)))  # the control: the clean record renders
    (mods / "demo.lua").unlink()
    script = world.root / "evil.sh"
    record["plan"]["activate"]["env"] = {"EB_X": f"1\n{script}"}
    record_file.write_text(json.dumps(record))
    res = world.cli("modulefile", "demo", "-o", str(mods))
    refused(res, 3, "activate.env.EB_X: a line break is not allowed in this value")
    assert list(mods.iterdir()) == []


def test_a_prefix_with_a_line_break_is_refused_before_anything_is_built(tmp_path):
    scratch = tmp_path / "scratch"
    env = {**PLAN_ENV, "SCRATCH": str(scratch), "ENVBUILDER_HOME": str(tmp_path / "home")}
    refused(
        run_cli("create", "local", "--prefix", f"{tmp_path}/a\nb", env=env), 2, "holds the control character"
    )
    env["SCRATCH"] = f"{scratch}\ntouch {tmp_path}/pwned"
    refused(run_cli("plan", "local", env=env), 2, "env.prefix (expanded)")
    assert not (tmp_path / "pwned").exists()
    assert not scratch.exists()


# ---------------------------------------------------------------------------------------------------------------
# Scheduler values, with the tests' real Slurm

SLURM_SITE = '\n[scheduler]\ntype = "slurm"\n{scheduler}\n[launcher]\ndefault = "local"\n'
#: What the job runs: a line on its stderr, which would go wherever a smuggled --error sends it.
JOB_PROGRAM = ("--", "/bin/sh", "-c", "echo from-the-job >&2")


def job_ended(cluster, job_id: str, limit: float = 120) -> dict[str, str]:
    deadline = time.monotonic() + limit
    while (record := job_record(job_id, cluster.environ())).get("JobState") not in ENDED:
        assert time.monotonic() < deadline, f"job {job_id} has not ended: {record}\n{cluster.log_tails()}"
        time.sleep(0.2)
    return record


def nothing_submitted(world, cluster) -> None:
    """No job script was written for the env and no job of it is in the queue."""
    assert not (world.envs / "demo" / "envbuilder" / "jobs").exists()
    queue = cluster.client("squeue", "-h", "--name", "envbuilder-demo", "-o", "%i")
    assert queue.returncode == 0 and queue.stdout.strip() == "", queue.stdout + queue.stderr


@pytest.mark.slurm
def test_sbatch_itself_reads_a_second_option_inside_a_directive(slurm_cluster, tmp_path):
    # The hazard: sbatch splits a directive line at whitespace, so a value can carry an option of its own.
    stolen = tmp_path / "stolen.err"
    script = tmp_path / "job.sh"
    script.write_text(
        f"#!/bin/bash\n#SBATCH --partition={slurm_cluster.partition} --error={stolen}\necho from-the-job >&2\n"
    )
    res = sbatch_wait(
        [f"--output={tmp_path / 'job.out'}", str(script)],
        env=slurm_cluster.environ(),
        timeout=120,
        cwd=tmp_path,
    )
    assert res.returncode == 0, res.stderr
    assert stolen.read_text() == "from-the-job\n"


@pytest.mark.slurm
def test_a_partition_that_holds_an_option_is_refused_before_anything_is_submitted(
    world, slurm_cluster, tmp_path
):
    stolen = tmp_path / "stolen.err"
    world.recipe(SLURM_SITE.format(scheduler=""))
    ok(world.create(world.envs / "demo"))
    hostile = f'partition = "{slurm_cluster.partition} --error={stolen}"\nforbidden_flags = ["--error"]\n'
    path = world.recipe(SLURM_SITE.format(scheduler=hostile))
    says = f"{path}: scheduler.partition: a partition name cannot hold whitespace"
    refused(world.cli("plan", "demo"), 3, says)
    refused(world.cli("sbatch", "demo", *JOB_PROGRAM, **slurm_cluster.env), 3, says)
    nothing_submitted(world, slurm_cluster)
    assert not stolen.exists()


@pytest.mark.slurm
def test_a_tampered_records_partition_never_reaches_a_job(world, slurm_cluster, tmp_path):
    """A state record is not read through the loader: the job script's renderer refuses its partition itself."""
    stolen = tmp_path / "stolen.err"
    world.recipe(SLURM_SITE.format(scheduler=""))
    ok(
        world.cli(
            "create", "demo", "--prefix", str(world.envs / "demo"), "--partition", slurm_cluster.partition
        )
    )
    record_file = world.home / "envs" / "demo.json"
    clean = record_file.read_text()
    record = json.loads(clean)
    assert record["plan"]["partition"] == slurm_cluster.partition
    record["plan"]["partition"] = f"{slurm_cluster.partition} --error={stolen}"
    record_file.write_text(json.dumps(record))
    res = world.cli("sbatch", "demo", *JOB_PROGRAM, **slurm_cluster.env)
    refused(res, 3, "partition: a partition name cannot hold whitespace")
    assert "scheduler.partition" not in res.stderr  # the value is the record's, not the recipe's
    nothing_submitted(world, slurm_cluster)
    # The control: the clean record's job runs on the real Slurm, its stderr in its own output file.
    record_file.write_text(clean)
    # Its output where the test can read it (by default it goes where sbatch runs: this process's directory).
    submitted = world.cli(
        "sbatch", "demo", "--json", "--output", str(tmp_path), *JOB_PROGRAM, **slurm_cluster.env
    )
    data = json.loads(ok(submitted).stdout)["data"]
    assert job_ended(slurm_cluster, data["job"])["JobState"] == "COMPLETED"
    assert "from-the-job" in Path(data["output"]).read_text()
    assert not stolen.exists()
