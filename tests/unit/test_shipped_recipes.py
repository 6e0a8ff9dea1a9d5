"""Every shipped recipe loads, validates against the JSON schema, and plans against its site's compute node with
the exact index URL, modules and launch command the corrected procedure calls for."""

from __future__ import annotations

import dataclasses
import functools
import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from helpers import PLAN_ENV, REPO, load_facts

from envbuilder import plan
from envbuilder.core._toml import loads
from envbuilder.core.errors import EnvbuilderError
from envbuilder.core.facts import Gpu
from envbuilder.recipe import loader, schemajson
from envbuilder.recipe.catalog import Catalog

CATALOG = Catalog.from_env({})
OPTS = plan.Options()
#: The payload in the env's own copy (PKG stands for PREFIX/envbuilder; the test puts each plan's prefix in).
PAYLOAD = "PKG/payloads/validate.py"
#: torchrun's agent, through the payload's wrapper that leaves without tearing torch down.
AGENT = "PKG/payloads/envbuilder_torchrun.py"
S = "/scratch/u1/envbuilder/envs"
CHECKS_FULL = "import,gpu,arch,cuda,libraries,affinity,nccl,ddp,filesystem"

# recipe, facts fixture, index URL (None: torch from the site), modules, module use, launch command
CASES = [
    (
        "vista-venv-cu124",
        "gh200-aarch64",
        "https://download.pytorch.org/whl/cu126",
        ["gcc/15.1.0", "python3/3.11.8"],
        [],
        f"{S}/vista-venv-cu124/bin/python {AGENT} --standalone --local-addr=127.0.0.1 --nnodes=1 --nproc-per-node=1 "
        f"{PAYLOAD} --checks import,gpu,arch,cuda,libraries,affinity,ddp,filesystem --device cuda --expect-gpus 1",
    ),
    (
        "vista-venv-mpi-cu126",
        "gh200-aarch64",
        "https://download.pytorch.org/whl/cu126",
        ["gcc/13.2.0", "openmpi/5.0.5", "python3_mpi/3.11.8"],
        [],
        f"ibrun -n 2 {S}/vista-venv-mpi-cu126/bin/python {PAYLOAD} "
        "--checks import,gpu,arch,cuda,libraries,affinity,mpi,nccl,ddp,filesystem --device cuda --expect-gpus 1",
    ),
    (
        "vista-overlay-system",
        "gh200-aarch64",
        None,
        ["gcc/15.1.0", "python3/3.11.8"],
        [],
        f"{S}/vista-overlay-system/bin/python {AGENT} --standalone --local-addr=127.0.0.1 --nnodes=1 --nproc-per-node=1 "
        f"{PAYLOAD} --checks import,gpu,arch,cuda,libraries,affinity,filesystem --device cuda --expect-gpus 1",
    ),
    (
        "frontera-venv-cu124",
        "rtx5000-sm75",
        "https://download.pytorch.org/whl/cu124",
        ["python3/3.9.2"],
        [],
        f"{S}/frontera-venv-cu124/bin/python {AGENT} --standalone --local-addr=127.0.0.1 --nnodes=1 --nproc-per-node=4 "
        f"{PAYLOAD} --checks {CHECKS_FULL} --device cuda --expect-gpus 4",
    ),
    (
        "frontera-venv-cu126",
        "rtx5000-sm75",
        "https://download.pytorch.org/whl/cu126",
        ["python3/3.9.2"],
        [],
        f"{S}/frontera-venv-cu126/bin/python {AGENT} --standalone --local-addr=127.0.0.1 --nnodes=1 --nproc-per-node=4 "
        f"{PAYLOAD} --checks {CHECKS_FULL} --device cuda --expect-gpus 4",
    ),
    (
        "stampede3-venv-cu126",
        "h100-sxm-x4",
        "https://download.pytorch.org/whl/cu126",
        ["python/3.9.18"],
        [],
        f"{S}/stampede3-venv-cu126/bin/python {AGENT} --standalone --local-addr=127.0.0.1 --nnodes=1 --nproc-per-node=4 "
        f"{PAYLOAD} --checks {CHECKS_FULL} --device cuda --expect-gpus 4",
    ),
    (
        "lonestar6-venv-cu128",
        "a100-pcie-x3",
        "https://download.pytorch.org/whl/cu128",
        ["python3/3.9.7"],
        [],
        f"{S}/lonestar6-venv-cu128/bin/python {AGENT} --standalone --local-addr=127.0.0.1 --nnodes=1 --nproc-per-node=3 "
        f"{PAYLOAD} --checks {CHECKS_FULL} --device cuda --expect-gpus 3",
    ),
    *[
        (
            f"zurada-conda-{v}",
            "h100",
            f"https://download.pytorch.org/whl/{v}",
            ["miniforge3/25.3.1-gcc-11.4.1"],
            [],
            # One srun task per node around one torchrun: never the seed's two agents on the same GPUs; and
            # every CPU the job holds on the node for it (a step gets one CPU per task unless told).
            f"srun --nodes=1 --ntasks-per-node=1 --ntasks=1 --cpus-per-task $SLURM_CPUS_ON_NODE /work/u1/envbuilder/envs/zurada-conda-{v}/bin/python "
            f"{AGENT} --standalone --local-addr=127.0.0.1 --nnodes=1 --nproc-per-node=2 {PAYLOAD} --checks {CHECKS_FULL} "
            "--device cuda --expect-gpus 2",
        )
        for v in ("cu118", "cu126", "cu128")
    ],
    (
        "cirrus-venv-cu121-horovod",
        "v100",
        "https://download.pytorch.org/whl/cu121",
        ["python/3.12.1-gpu"],
        [],
        "mpirun -n 4 --map-by ppr:4:node --bind-to none /work/p01/p01/u1/envbuilder/envs/cirrus-venv-cu121-horovod/bin/python "
        f"{PAYLOAD} --checks import,gpu,arch,cuda,libraries,affinity,mpi,nccl,horovod --device cuda --expect-gpus 4 "
        "--horovod-gpu-ops NCCL",
    ),
    (
        "polaris-overlay-conda",
        "a100-sxm4-x4",
        None,
        ["conda/2026-10-01"],
        ["/soft/modulefiles"],
        "mpiexec -n 4 --ppn 4 --depth 8 --cpu-bind depth PKG/payloads/gpu_affinity.sh reverse-local-rank "
        f"/home/u1/envbuilder/envs/polaris-overlay-conda/bin/python {PAYLOAD} "
        "--checks import,gpu,arch,cuda,libraries,affinity,mpi,nccl,ddp,filesystem --device cuda --expect-gpus 1",
    ),
    # Examples from public documentation (issue 41), planned on recorded-form facts of such nodes (no AMD or
    # Intel GPU exists here: the facts files are written from the sites' published hardware).
    (
        "stampede3-pvc-xpu",
        "pvc-max1550-x4",
        "https://download.pytorch.org/whl/xpu",
        ["python/3.9.18"],
        [],
        f"{S}/stampede3-pvc-xpu/bin/python {AGENT} --standalone --local-addr=127.0.0.1 --nnodes=1 --nproc-per-node=4 "
        f"{PAYLOAD} --checks {CHECKS_FULL} --device cuda --expect-gpus 4",
    ),
    (
        "lumi-venv-rocm",
        "mi250x-x8",
        "https://download.pytorch.org/whl/rocm6.2.4",
        ["cray-python", "aws-ofi-rccl"],
        ["/appl/local/containers/ai-modules"],
        f"{S}/lumi-venv-rocm/bin/python {AGENT} --standalone --local-addr=127.0.0.1 --nnodes=1 --nproc-per-node=8 "
        f"{PAYLOAD} --checks {CHECKS_FULL} --device cuda --expect-gpus 8",
    ),
    (
        "local",
        "cpu-only",
        "https://download.pytorch.org/whl/cpu",
        [],
        [],
        f"{S}/local/bin/python {AGENT} --standalone --local-addr=127.0.0.1 --nnodes=1 --nproc-per-node=2 "
        f"{PAYLOAD} --checks {CHECKS_FULL} --device cpu",
    ),
]


#: Container recipes: recipe, facts fixture, the image it plans, its modules (the runtime's), its binds.
CONTAINER_CASES = [
    (
        "vista-apptainer",
        "gh200-aarch64",
        "nvcr.io/nvidia/pytorch:24.10-py3",
        ["tacc-apptainer"],
        ("/scratch/u1", "/work/u1"),
    ),
]
#: The image TACC's container page pulls (Docker Hub's pytorch/pytorch: amd64 only).
SEED_IMAGE = "pytorch/pytorch:2.5.1-cuda12.4-cudnn9-devel"


def make(name, facts_name, **opts):
    return plan.build(loader.load(name, CATALOG), load_facts(facts_name), PLAN_ENV, plan.Options(**opts))


@pytest.mark.parametrize(
    ("name", "facts_name", "index", "modules", "use", "launch"), CASES, ids=[c[0] for c in CASES]
)
def test_recipe_plans_for_its_site(*, name, facts_name, index, modules, use, launch):
    p = make(name, facts_name)
    assert (p.resolution.index_url if p.resolution else None) == index
    assert list(p.modules) == modules
    assert list(p.module_use) == use
    assert " ".join(p.launch_command) == launch.replace("PKG/", f"{p.prefix}/envbuilder/")
    # --index-url, never --extra-index-url: PyPI's build cannot win silently.
    flat = [a for cmd in p.install_commands for a in cmd]
    assert "--extra-index-url" not in flat
    if index:
        assert flat.count("--index-url") >= 1


def test_every_shipped_recipe_has_a_case():
    assert sorted(CATALOG.names()) == sorted(c[0] for c in [*CASES, *CONTAINER_CASES])


@pytest.mark.parametrize(
    ("name", "facts_name", "image", "modules", "binds"), CONTAINER_CASES, ids=[c[0] for c in CONTAINER_CASES]
)
def test_container_recipe_plans_an_image_its_site_runs(*, name, facts_name, image, modules, binds):
    p = make(name, facts_name)
    box = p.container
    assert box is not None
    facts = load_facts(facts_name)
    assert box.pick.ref.text == image
    assert facts.arch in box.pick.facts.archs  # published for the node's CPU
    assert list(p.modules) == modules
    assert (box.runtime, box.gpu, box.binds) == ("apptainer", True, binds)
    # Pulled into one file under the env's prefix in $SCRATCH, where the site says containers live.
    assert p.prefix == f"{S}/{name}"
    assert box.fetch == (("apptainer", "pull", "--", "{dest}", f"docker://{image}"),)


def test_the_seeds_amd64_only_image_is_refused_on_vista(tmp_path):
    """The container page's image, in place of the recipe's: Docker Hub publishes it for amd64 only, and the
    plan for a GH200 node refuses it, saying which image to take instead."""
    shipped = REPO / "recipes" / "tacc" / "vista" / "vista-apptainer.toml"
    (tmp_path / "seed-image.toml").write_text(
        f'schema_version = 1\nextends = "{shipped}"\n[recipe]\nname = "seed-image"\n'
        f'[container]\nimage = "{SEED_IMAGE}"\n'
    )
    catalog = Catalog.from_env({"ENVBUILDER_RECIPE_PATH": str(tmp_path)})
    with pytest.raises(EnvbuilderError) as caught:
        plan.build(loader.load("seed-image", catalog), load_facts("gh200-aarch64"), PLAN_ENV, OPTS)
    assert caught.value.message == f"{SEED_IMAGE} is published for x86_64 only; the target is aarch64"
    assert "nvcr.io/nvidia/pytorch" in (caught.value.hint or "")
    corrections = loader.load("vista-apptainer", CATALOG).get("corrections")
    assert any(SEED_IMAGE in c["seed"] and "amd64" in c["fix"] for c in corrections)
    assert any("--standalone" in c["fix"] for c in corrections)


def test_seven_seed_systems_are_covered():
    sites = {loader.load(n, CATALOG).get("site.name") for n in CATALOG.names()}
    assert {"frontera", "stampede3", "vista", "lonestar6", "zurada", "cirrus", "polaris"} <= sites


@pytest.mark.parametrize(
    "path", sorted((REPO / "recipes").rglob("*.toml")), ids=lambda p: str(p.relative_to(REPO))
)
def test_recipe_files_match_the_json_schema(path):
    _schema_validator().validate(loads(path.read_text()))


@functools.cache
def _schema_validator() -> Any:
    """The schema checked against its metaschema once, then one validator for every file (``jsonschema.validate``
    checks and compiles the schema again on each call: 0.18 s a file, 4.5 s of the fast lane)."""
    schema = schemajson.json_schema()
    validator = jsonschema.validators.validator_for(schema)
    validator.check_schema(schema)
    return validator(schema)


def test_site_recipes_carry_corrections_with_sources():
    for name in CATALOG.names():
        if name == "local":
            continue
        corrections = loader.load(name, CATALOG).get("corrections")
        assert corrections, f"{name} records no corrections of its source document"


def test_vista_cu124_resolves_cuda_wheel_not_cpu_on_aarch64():
    p = make("vista-venv-cu124", "gh200-aarch64")
    assert p.target.arch == "aarch64"
    assert p.resolution.cuda == "12.6"
    assert any("cu124" in c.seed for c in p.corrections)
    assert (
        "vista-venv-cu124 installs cu126, not the cu124 its name says; its corrections explain why"
        in p.warnings
    )


def test_no_name_warning_when_name_and_variant_agree():
    assert not any("its name says" in w for w in make("zurada-conda-cu128", "h100").warnings)


def test_login_node_without_gpu_still_resolves_for_compute_partition():
    # A CPU-only login node must not turn a GPU recipe into a CPU wheel.
    p = plan.build(loader.load("zurada-conda-cu128", CATALOG), load_facts("cpu-only"), PLAN_ENV, OPTS)
    assert p.resolution.variant == "cu128"
    assert p.target.gpus and p.target.gpus[0].compute_capability == "9.0"
    assert any("not this host" in n for n in p.notes)


def test_stampede3_plans_the_python_of_taccs_module_not_the_planning_hosts():
    login = dataclasses.replace(load_facts("cpu-only"), python="3.13.0")
    p = plan.build(loader.load("stampede3-venv-cu126", CATALOG), login, PLAN_ENV, OPTS)
    assert p.modules == ("python/3.9.18",)
    assert p.python == {
        "command": "python3",
        "version": "3.9",
        "source": "the recipe's [python] version",
        "origin": "module",
        "where": "python3 on the PATH after loading python/3.9.18",
    }
    assert p.target.python == "3.9"


def test_wrong_arch_host_warns():
    p = plan.build(loader.load("vista-venv-cu124", CATALOG), load_facts("cpu-only"), PLAN_ENV, OPTS)
    assert any("must run on an aarch64 node" in w for w in p.warnings)


#: Every shipped recipe with a scheduler (the local recipe has none, so no job script).
SCHEDULED = [c[:2] for c in CASES if c[0] != "local"]


@pytest.mark.parametrize(("name", "facts_name"), SCHEDULED, ids=[c[0] for c in SCHEDULED])
def test_job_scripts_name_only_paths_inside_the_env(name, facts_name):
    # Compute nodes see the env's file system, not necessarily where envbuilder is installed.
    p = make(name, facts_name)
    package = str(Path(loader.__file__).resolve().parent.parent)
    assert package not in p.batch_script
    assert f"{p.prefix}/envbuilder/payloads/validate.py" in p.batch_script


def test_zurada_batch_script_has_one_agent_per_node():
    script = make("zurada-conda-cu128", "h100").batch_script
    assert "#SBATCH --ntasks-per-node=1\n" in script
    assert "#SBATCH --cpus-per-task=32\n" in script
    assert "#SBATCH --gpus-per-node=2\n" in script
    assert "#SBATCH --partition=gpu2h100\n" in script
    assert "--ntasks-per-node=2" not in script


def _omp_threads(script: str, **env: str) -> str:
    """OMP_NUM_THREADS as the job script's own lines compute it in bash, inside a job with ``env``."""
    lines = [ln for ln in script.splitlines() if ln.startswith(("cpus=", "export OMP_NUM_THREADS="))]
    assert lines, script
    res = subprocess.run(
        ["bash", "-c", "\n".join([*lines, 'echo "$OMP_NUM_THREADS"'])],
        env={"PATH": "/usr/bin:/bin", **env},
        capture_output=True,
        text=True,
        check=True,
    )
    return res.stdout.strip()


@pytest.mark.parametrize(
    ("partition", "job_cpus", "threads", "ranks"),
    [
        ("gpu2h100", "32", "16", "2"),
        ("gpu2h100", "", "16", "2"),
        ("gpu1h100", "32", "32", "1"),
        (None, "8", "4", "2"),
    ],
)
def test_zurada_threads_come_from_the_job_and_the_partition(partition, job_cpus, threads, ranks):
    # The seed exported OMP_NUM_THREADS=16 everywhere; now the job script divides the job's CPUs on the node
    # (the recipe's 32 cores where the job does not say) among the node's ranks.
    p = make("zurada-conda-cu128", "cpu-only", partition=partition)
    env = {"SLURM_CPUS_ON_NODE": job_cpus} if job_cpus else {}
    assert _omp_threads(p.batch_script, **env) == threads
    assert f"--nproc-per-node={ranks} " in " ".join(p.launch_command) + " "
    if partition == "gpu1h100":
        assert "#SBATCH --gpus-per-node=1\n" in p.batch_script and p.partition == "gpu1h100"
        assert len(p.target.gpus) == 1


def test_zurada_activation_exports_no_thread_count():
    # Login nodes and the 1-GPU partition would get 16 threads per process from an activation-time export.
    p = make("zurada-conda-cu128", "cpu-only")
    assert "OMP_NUM_THREADS" not in p.activate.env
    assert p.activate.env["OMP_PLACES"] == "cores"


def test_an_unknown_partition_is_a_warning_and_the_site_facts_stay():
    p = make("zurada-conda-cu128", "cpu-only", partition="gpu9x")
    assert any("partition gpu9x is not one the recipe describes" in w for w in p.warnings)
    assert len(p.target.gpus) == 2


def test_vista_batch_script_avoids_forbidden_flags():
    script = make("vista-venv-mpi-cu126", "gh200-aarch64").batch_script
    for flag in ("--gres", "--gpus-per-task", "--mem"):
        assert flag not in script
    assert "#SBATCH --nodes=2\n" in script
    assert 'MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)' in script


@pytest.mark.parametrize(("name", "facts_name"), [c[:2] for c in CASES], ids=[c[0] for c in CASES])
def test_the_interactive_step_asks_for_the_cpus_its_launch_uses(name, facts_name):
    # A Slurm step gets one CPU unless it asks for more: Zurada's `srun --pty` asked for none, so the two ranks
    # that validate and run start inside it (and their 16 OpenMP threads each) shared one core.
    p = make(name, facts_name)
    per_task = re.search(r"^#SBATCH --cpus-per-task=(\d+)$", p.batch_script or "", re.M)
    if p.interactive_command is None or per_task is None or int(per_task.group(1)) < 2:
        return  # no interactive template, or whole nodes (the site hands the job every CPU)
    argv = list(p.interactive_command)
    asked = [w.split("=", 1)[1] for w in argv if w.startswith("--cpus-per-task=")]
    asked += [argv[i + 1] for i, w in enumerate(argv[:-1]) if w in ("-c", "--cpus-per-task")]
    assert asked == [per_task.group(1)], argv
    assert not [w for w in p.warnings if "asks for no CPUs" in w]


def test_zurada_interactive_step_holds_the_node_for_its_agent():
    p = make("zurada-conda-cu126", "h100")
    assert "--cpus-per-task=32" in p.interactive_command and "--ntasks-per-node=1" in p.interactive_command


def test_vista_interactive_uses_idev():
    p = make("vista-venv-mpi-cu126", "gh200-aarch64")
    assert list(p.interactive_command) == ["idev", "-p", "gh-dev", "-N", "2", "-n", "2", "-t", "00:30:00"]


def test_cirrus_is_retired_but_plans_with_gres_and_qos():
    p = make("cirrus-venv-cu121-horovod", "v100")
    assert p.status == "retired"
    assert any("retired" in w for w in p.warnings)
    assert "#SBATCH --gres=gpu:4\n" in p.batch_script
    assert "#SBATCH --qos=gpu\n" in p.batch_script
    horovod = next(c for c in p.install_commands if c[-1].startswith("horovod @"))
    assert horovod[0] == "env"
    assert "HOROVOD_GPU_OPERATIONS=NCCL" in horovod
    assert "--no-build-isolation" in horovod
    assert horovod[-1].endswith("@3a31d933a13c7c885b8a673f4172b17914ad334d")
    # The CUDA stubs go before the module's LIBRARY_PATH, not in its place.
    assert "LIBRARY_PATH=${NVHPC_ROOT}/cuda/lib64/stubs:$LIBRARY_PATH" in horovod


def test_polaris_pbs_script_and_account():
    p = make("polaris-overlay-conda", "a100-sxm4-x4")
    assert "#PBS -l filesystems=home:eagle\n" in p.batch_script
    assert "#PBS -q debug\n" in p.batch_script
    assert "module use /soft/modulefiles\n" in p.batch_script
    assert "export NCCL_NET='AWS Libfabric'\n" in p.batch_script
    ofi = "/soft/libraries/aws-ofi-nccl/v1.9.1-aws/lib:/soft/libraries/hwloc/lib/"
    assert f'export LD_LIBRARY_PATH={ofi}"${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}"\n' in p.batch_script
    assert any(
        step.startswith("activate extension:") and f"LD_LIBRARY_PATH={ofi}:$LD_LIBRARY_PATH" in step
        for step in p.steps
    )
    assert any("--account" in w for w in p.warnings)
    assert "-A" not in p.interactive_command
    with_account = make("polaris-overlay-conda", "a100-sxm4-x4", account="MyProj")
    assert "#PBS -A MyProj\n" in with_account.batch_script
    assert with_account.interactive_command[-2:] == ("-A", "MyProj")


def test_zurada_conda_env_gets_python_and_pip():
    create = make("zurada-conda-cu126", "h100").install_commands[0]
    assert create[:5] == (
        "conda",
        "create",
        "--yes",
        "--prefix",
        "/work/u1/envbuilder/envs/zurada-conda-cu126",
    )
    assert "python=3.12" in create
    assert "pip" in create


def test_extra_packages_are_constrained_by_torch_pins():
    cmds = make("local", "cpu-only").install_commands
    numpy = next(c for c in cmds if c[-1] == "numpy")
    assert "--constraint" in numpy


@pytest.mark.skipif(shutil.which("bash") is None, reason="bash is needed to syntax-check batch scripts")
@pytest.mark.parametrize(
    "case", [c for c in CASES if c[0] != "local"], ids=[c[0] for c in CASES if c[0] != "local"]
)
def test_batch_scripts_are_valid_bash(case, tmp_path):
    script = make(case[0], case[1]).batch_script
    path = tmp_path / "job.sh"
    path.write_text(script)
    subprocess.run(["bash", "-n", str(path)], check=True)


def test_plan_json_has_the_contract_keys():
    data = make("vista-venv-cu124", "gh200-aarch64").to_json()
    for key in (
        "recipe",
        "site",
        "kind",
        "prefix",
        "python",
        "modules",
        "module_use",
        "index_url",
        "extra_index_urls",
        "requirements",
        "install_commands",
        "activate",
        "launcher",
        "launch_command",
        "batch_script",
        "warnings",
    ):
        assert key in data, key
    assert set(data["activate"]) >= {"modules", "env"}
    json.dumps(data)


def test_local_on_the_real_h200_node_picks_the_build_its_driver_runs_natively():
    # Facts probed on the lent 2xH200 node (driver 580.159.04, CUDA 13.0). The newest torch, 2.15.0, ships cu132 as
    # its PyPI default, which a CUDA-13.0 driver runs only under minor-version compatibility (no JIT of newer PTX):
    # auto prefers cu130, which the driver runs natively.
    p = make("local", "h200-x2-device")
    assert p.resolution.torch == "2.15.0"
    assert p.resolution.variant == "cu130"
    assert p.resolution.index_url == "https://download.pytorch.org/whl/cu130"
    assert not any("minor-version compatibility" in w for w in p.warnings)
    assert any("variant auto: cu130" in n for n in p.notes)
    assert "--nproc-per-node=2" in p.launch_command


# --- ROCm and XPU example recipes (issue 41) --------------------------------------------------------------------


def _plan_errors(name: str, facts) -> dict[str, str]:
    with pytest.raises(EnvbuilderError) as info:
        plan.build(loader.load(name, CATALOG), facts, PLAN_ENV, plan.Options())
    return {e.gate: e.message for e in getattr(info.value, "errors", [info.value])}


def test_the_examples_say_they_are_examples_and_new():
    for name, facts_name in (("stampede3-pvc-xpu", "pvc-max1550-x4"), ("lumi-venv-rocm", "mi250x-x8")):
        warnings = make(name, facts_name).warnings
        assert any(w.startswith("example recipe: written from") for w in warnings)
        assert any("support for ROCm/XPU is new and has not run on such hardware here" in w for w in warnings)


def test_the_pvc_partition_plans_xpu_from_the_site_facts_alone():
    """A login node without a GPU: the pvc partition's site facts (Intel Max 1550, pvc) are the target."""
    p = make("stampede3-pvc-xpu", "cpu-only")
    assert p.resolution is not None and p.resolution.variant == "xpu"
    assert any("Level Zero runtime unknown" in w for w in p.warnings)


def test_the_pvc_recipe_is_refused_on_a_node_without_level_zero_or_with_a_flex_gpu():
    pvc = load_facts("pvc-max1550-x4")
    assert (
        "no Level Zero runtime"
        in _plan_errors("stampede3-pvc-xpu", dataclasses.replace(pvc, level_zero=""))["driver"]
    )
    flex = dataclasses.replace(pvc, gpus=(Gpu("Intel GPU 0x56c0", vendor="intel"),))
    assert "which torch 2.8.0 xpu does not support" in _plan_errors("stampede3-pvc-xpu", flex)["gpu-arch"]


def test_the_h100_recipe_is_refused_for_the_pvc_partition():
    with pytest.raises(EnvbuilderError) as info:
        plan.build(
            loader.load("stampede3-venv-cu126", CATALOG),
            load_facts("cpu-only"),
            PLAN_ENV,
            plan.Options(partition="pvc"),
        )
    found = {e.gate: e.message for e in getattr(info.value, "errors", [info.value])}
    assert found["gpu-arch"].startswith("cu126 wheels run on NVIDIA GPUs; the target's GPUs are Intel")


def test_the_lumi_recipe_is_refused_for_a_gfx_target_its_build_lacks():
    mi300a = dataclasses.replace(
        load_facts("mi250x-x8"), gpus=(Gpu("AMD Instinct MI355X", vendor="amd", arch="gfx950"),)
    )
    found = _plan_errors("lumi-venv-rocm", mi300a)
    assert found["gpu-arch"].startswith(
        "AMD Instinct MI355X is gfx950, which torch 2.7.1 rocm6.2.4 does not carry"
    )


def test_the_lumi_recipe_plans_on_the_oldest_driver_that_runs_rocm_6_2():
    """amdgpu 6.3.x is ROCm 6.0's kernel driver, which runs ROCm 5.6-6.2 user space (AMD's support matrix): the
    recipe's rocm6.2.4 still plans there. A driver too old for the wheel's ROCm is refused (test_vendors)."""
    oldest = dataclasses.replace(load_facts("mi250x-x8"), amdgpu_version="6.3.6")
    p = plan.build(loader.load("lumi-venv-rocm", CATALOG), oldest, PLAN_ENV, plan.Options())
    assert p.resolution is not None and p.resolution.variant == "rocm6.2.4"


def test_an_nvidia_host_plans_the_pvc_recipe_for_the_sites_intel_nodes():
    """An H100 node is not one of the pvc nodes: its GPUs do not replace the site's Intel ones (impact runs every
    recipe against one node's facts)."""
    p = make("stampede3-pvc-xpu", "h100-sxm-x4")
    assert p.resolution is not None and p.resolution.variant == "xpu"
    assert any("this host's GPUs are nvidia's" in w and "resolving for the site's" in w for w in p.warnings)


def test_recipes_list_marks_the_examples():
    from envbuilder.commands.recipes import list_recipes

    rows = {r["name"]: r for r in list_recipes(CATALOG)}
    assert {n for n, r in rows.items() if r.get("example")} == {"stampede3-pvc-xpu", "lumi-venv-rocm"}
