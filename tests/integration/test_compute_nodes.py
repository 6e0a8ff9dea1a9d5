"""The login host is not a compute node: plans made on this machine (Debian bookworm, glibc 2.36, its own Python,
no GPU, no nvidia-smi) for compute nodes that run Debian bullseye (glibc 2.31, CPython 3.9, two H100s each), the
nodes of tests/computetwin.py's ComputeCluster, where envbuilder runs on the node's own python through a batch
job. What is checked: ``plan`` on the login host takes the nodes' glibc and Python from the site and decides the
manylinux gate on them (a torch whose wheels need glibc 2.34 is refused for 2.31 nodes although this host has
2.36); where the site does not state them, the plan says the glibc is this host's and the gate warns, while the
same plan on a node decides on the node's own; what a node reports (``probe``) is what the site states and not
what the login host reports; an env created on a node runs there on the node's python and validates from the
login host through a batch job; a lock the login host made for its own glibc is not applied on an older node;
an env built on the login host, whose python the nodes lack, is refused by ``run`` and ``validate`` there with
the reason, and ``doctor`` there names what does not fit.

Jobs go in with sbatch: Slurm 22.05's srun on the login host cannot read the I/O message of the nodes' 20.11
slurmstepd, and inside a job the node's own srun is used (computetwin's docstring). Times on this 2-core
machine: the cluster starts in ~2 s, each node job ~3-10 s, the file ~50 s."""

from __future__ import annotations

import json
import os
import platform
import shlex
from collections.abc import Iterator
from pathlib import Path

import computetwin
import pytest
from computetwin import ComputeCluster
from helpers import REPO, ok, run_cli, user_env
from torchindex import TorchIndex, build_torch_wheel, serve, torch_mirror
from wheelindex import build_wheel

pytestmark = [pytest.mark.integration, pytest.mark.rootfs, pytest.mark.slurm, pytest.mark.multinode]

#: A torch newer than envbuilder's table, whose only Linux wheels need glibc 2.34 (manylinux_2_34): read from
#: the index, so its floor comes from the files.
NEW_TORCH = "2.16.0"
#: The last torch for Python 3.9 (the nodes' python), built on manylinux_2_28: what a 2.31 node can install.
OLD_TORCH = "2.8.0"
NODE_PATH = "/usr/local/bin:/usr/bin:/bin"
#: envbuilder's exit status for a lock that cannot be used.
LOCK_ERROR = 13
#: ... for an env that cannot run here, and for doctor findings that need action.
STATE_ERROR = 9
DOCTOR_FINDINGS = 14
NODE_PYTHON = f"{computetwin.DEPS}/bin/python"
SOURCES = "".join(
    f'[compute.sources.{fact}]\nsource = "the twin'
    "'"
    's bullseye root (tests/computetwin.py)"\nchecked = "2026-11-28"\n'
    'note = "where unknown: not looked up, for the test"\n'
    for fact in ("os", "glibc", "python")
)
LOGIN_GLIBC = os.confstr("CS_GNU_LIBC_VERSION").split()[1]  # type: ignore[union-attr]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ComputeCluster]:
    why = computetwin.missing()
    if why:
        pytest.skip(f"no compute nodes of another Debian release: {why}")
    if LOGIN_GLIBC == computetwin.GLIBC:
        pytest.skip(
            f"this machine has the nodes' glibc {LOGIN_GLIBC}: it cannot play a login host of another"
        )
    base = tmp_path_factory.getbasetemp()
    with ComputeCluster(tmp_path_factory.mktemp("nodes"), binds=[base]) as nodes:
        yield nodes


@pytest.fixture(scope="module")
def mirror(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """download.pytorch.org's whl/cpu and PyPI on loopback (the nodes share this machine's loopback)."""
    out = tmp_path_factory.mktemp("wheels")
    index = TorchIndex()
    for py in ("cp39", "cp311"):
        new = build_torch_wheel(out, NEW_TORCH, "cpu", None, "", tag=f"{py}-{py}-manylinux_2_34_x86_64")
        index.add("whl/cpu", new)
    old = build_torch_wheel(out, OLD_TORCH, "cpu", None, "", tag="cp39-cp39-manylinux_2_28_x86_64")
    index.add("whl/cpu", old)
    # A dependency whose only Linux wheel needs glibc 2.34.
    native = build_wheel(out, "ebnative", "1.0", {"ebnative.py": ""}, tag="cp39-cp39-manylinux_2_34_x86_64")
    index.add("simple", native)
    with serve(index) as served:
        yield torch_mirror(served)


def site(root: Path, *, glibc: str, python: str) -> dict[str, str]:
    """A site whose compute nodes are the twin's (its GPUs; ``glibc`` and ``python`` as given, maybe "unknown"),
    with a recipe for each torch; ENVBUILDER_RECIPE_PATH for it."""
    d = root / "recipes"
    d.mkdir(parents=True)
    gpu = computetwin.GPUS["gpus"][0]
    (d / "site.toml").write_text(
        'schema_version = 1\n[site]\nname = "twin"\n'
        '[compute]\narch = "x86_64"\n'
        f'gpus_per_node = {len(computetwin.GPUS["gpus"])}\ngpu = "{gpu["name"]}"\ncompute_capability = "{gpu["cc"]}"\n'
        f'os = "Debian 11 (bullseye)"\nglibc = "{glibc}"\npython = "{python}"\n{SOURCES}'
        '[scheduler]\ntype = "slurm"\nbatch = "sbatch"\npartition = "debug"\n'
    )
    for name, version in (("twin-new", NEW_TORCH), ("twin-old", OLD_TORCH), ("twin-dep", OLD_TORCH)):
        extra = '[[packages]]\nname = "ebnative"\n' if name == "twin-dep" else ""
        (d / f"{name}.toml").write_text(
            f'schema_version = 1\nextends = "site.toml"\n[recipe]\nname = "{name}"\ndescription = "twin"\n'
            '[env]\nkind = "venv"\ninstaller = "uv"\nprefix = "${SCRATCH}/envs/{name}"\n'
            '[python]\ncommand = "python3"\n'
            f'[torch]\nversion = "{version}"\nvariant = "cpu"\npackages = ["torch"]\n{extra}'
        )
    return {"ENVBUILDER_RECIPE_PATH": str(d)}


def on_node(cluster: ComputeCluster, node: str, env: dict[str, str], *argv: str) -> tuple[int, str]:
    """``argv`` run on ``node`` by a batch job, with ``env`` there but the node's PATH, envbuilder's source from
    the checkout and this cluster's Slurm: its exit status and its output."""
    job = cluster.root / f"job-{len(list(cluster.root.glob('job-*.sh')))}"
    node_env = {**env, "PATH": NODE_PATH, "PYTHONPATH": str(REPO), "SLURM_CONF": str(cluster.conf)}
    exports = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in node_env.items())
    script = job.with_suffix(".sh")
    script.write_text(f"#!/bin/sh\n{exports}exec {shlex.join(argv)} 2>&1\n")
    res = cluster.client(
        "sbatch", "--wait", "--quiet", f"--nodelist={node}", "--export=NONE", f"--output={job}.out", str(script),
        timeout=300,
    )  # fmt: skip
    out = Path(f"{job}.out")
    return res.returncode, (out.read_text() if out.exists() else res.stderr)


def envbuilder_on(cluster: ComputeCluster, node: str, env: dict[str, str], *args: str) -> tuple[int, str]:
    return on_node(cluster, node, env, NODE_PYTHON, "-m", "envbuilder", *args)


def data(text: str) -> dict:
    try:
        return json.loads(text)["data"]
    except ValueError:
        pytest.fail(f"no JSON: {text[-3000:]}")


def origins(plan: dict) -> dict[str, dict]:
    return {f["name"]: f for f in plan["target_facts"]}


def test_the_login_host_plans_with_the_nodes_glibc_and_python_from_the_site(mirror, tmp_path) -> None:
    env = user_env(tmp_path, mirror, **site(tmp_path, glibc=computetwin.GLIBC, python=computetwin.PYTHON))
    plan = data(ok(run_cli("plan", "twin-old", "--json", env=env)).stdout)
    assert (plan["target"]["glibc"], plan["target"]["python"]) == (computetwin.GLIBC, computetwin.PYTHON)
    facts = origins(plan)
    assert facts["glibc"]["origin"] == facts["python"]["origin"] == facts["os"]["origin"] == "site", facts
    assert not [w for w in plan["warnings"] if "decided on this host's" in w], plan["warnings"]
    # The manylinux gate is decided on the nodes' 2.31: wheels that need 2.34 do not install there.
    res = run_cli("plan", "twin-new", env=env)
    assert res.returncode != 0, res.stdout
    assert f"need glibc ≥ 2.34 (manylinux), the target has glibc {computetwin.GLIBC}" in res.stderr, (
        res.stderr
    )


def test_where_the_site_is_silent_the_login_plan_says_the_glibc_is_its_own_and_a_node_decides_on_its_own(
    cluster, mirror, tmp_path
) -> None:
    env = user_env(tmp_path, mirror, **site(tmp_path, glibc="unknown", python="unknown"))
    plan = data(ok(run_cli("plan", "twin-new", "--json", env=env)).stdout)
    glibc = origins(plan)["glibc"]
    assert (glibc["value"], glibc["origin"]) == (LOGIN_GLIBC, "host"), glibc
    assert "from this host, which may not be a compute node" in glibc["detail"]
    assert any(f"the glibc gate (manylinux wheels) was decided on this host's glibc {LOGIN_GLIBC}" in w
               for w in plan["warnings"]), plan["warnings"]  # fmt: skip
    # The same plan on a compute node: its own glibc, said to be the node's, and the gate refuses there.
    code, out = envbuilder_on(cluster, "n1", env, "plan", "twin-old", "--json")
    assert code == 0, out
    node = origins(data(out))
    assert (node["glibc"]["value"], node["glibc"]["origin"]) == (computetwin.GLIBC, "node"), node
    assert node["python"]["value"].startswith(computetwin.PYTHON + "."), node
    code, out = envbuilder_on(cluster, "n1", env, "plan", "twin-new")
    assert code != 0, out
    assert f"need glibc ≥ 2.34 (manylinux), the target has glibc {computetwin.GLIBC}" in out, out


def test_on_a_node_its_own_glibc_wins_over_a_site_file_that_says_otherwise(cluster, mirror, tmp_path) -> None:
    """The site file is out of date (it says 2.36; the nodes have 2.31): a plan on the login host can only trust
    it, but a plan inside a job on a node measures the node, plans for what it has and says the file is wrong."""
    env = user_env(tmp_path, mirror, **site(tmp_path, glibc=LOGIN_GLIBC, python=computetwin.PYTHON))
    code, out = envbuilder_on(cluster, "n1", env, "plan", "twin-old", "--json")
    assert code == 0, out
    plan = data(out)
    glibc = origins(plan)["glibc"]
    assert (plan["target"]["glibc"], glibc["value"], glibc["origin"]) == (computetwin.GLIBC,) * 2 + (
        "node",
    ), glibc
    assert f"the site states {LOGIN_GLIBC}" in glibc["detail"], glibc
    assert any(f"compute.glibc {LOGIN_GLIBC}" in w and f"this node (n1) has glibc {computetwin.GLIBC}" in w
               for w in plan["warnings"]), plan["warnings"]  # fmt: skip
    code, out = envbuilder_on(cluster, "n1", env, "plan", "twin-new")
    assert code != 0, out
    assert f"need glibc ≥ 2.34 (manylinux), the target has glibc {computetwin.GLIBC}" in out, out


def test_a_node_reports_the_facts_the_site_states_and_the_login_host_does_not(
    cluster, mirror, tmp_path
) -> None:
    env = user_env(tmp_path, mirror, **site(tmp_path, glibc=computetwin.GLIBC, python=computetwin.PYTHON))
    code, out = envbuilder_on(cluster, "n2", env, "probe", "--json")
    assert code == 0, out
    node = data(out)
    login = data(ok(run_cli("probe", "--json", env=env)).stdout)
    target = data(ok(run_cli("plan", "twin-old", "--json", env=env)).stdout)["target"]
    assert node["hostname"] == "n2" and node["allocation"]["SLURM_JOB_ID"]
    # What the login host plans with is what the node has: its glibc, Python and GPUs.
    assert node["glibc"] == target["glibc"] == computetwin.GLIBC
    assert node["python"].rsplit(".", 1)[0] == target["python"] == computetwin.PYTHON
    gpus = [(g["name"], g["compute_capability"]) for g in node["gpus"]]
    assert gpus == [(g["name"], g["compute_capability"]) for g in target["gpus"]]
    assert gpus == [(g["name"], g["cc"]) for g in computetwin.GPUS["gpus"]]
    # ...and not what the login host has.
    assert login["glibc"] == LOGIN_GLIBC != node["glibc"]
    assert not login["python"].startswith(computetwin.PYTHON + ".")
    assert login["gpus"] == [] and login["driver_version"] is None


def test_an_env_created_on_a_node_runs_there_on_the_nodes_python(cluster, mirror, tmp_path) -> None:
    env = user_env(tmp_path, mirror, **site(tmp_path, glibc=computetwin.GLIBC, python=computetwin.PYTHON))
    code, out = envbuilder_on(cluster, "n1", env, "create", "twin-old", "--no-validate")
    assert code == 0, out
    prefix = Path(env["SCRATCH"]) / "envs" / "twin-old"
    code, out = on_node(cluster, "n2", env, str(prefix / "bin" / "python"), "-c",
                        "import platform, sys, torch; print(torch.__version__, sys.version.split()[0], platform.libc_ver()[1])")  # fmt: skip
    assert code == 0, out
    version, python, glibc = out.split()
    assert (
        version == f"{OLD_TORCH}+cpu"
        and python.startswith(computetwin.PYTHON + ".")
        and glibc == computetwin.GLIBC
    )
    # Validated from the login host: the batch job runs the payload on a node, on the env's python 3.9.
    args = (
        "validate",
        "twin-old",
        "--submit",
        "--checks",
        "import",
        "--cpu",
        "--launcher",
        "local",
        "--json",
    )
    report = data(ok(run_cli(*args, env={**env, **cluster.env}, timeout=300)).stdout)
    rank = report["checks"]["import"]["per_rank"]["0"]
    assert report["hosts"]["0"] in ("n1", "n2") and rank["torch"] == f"{OLD_TORCH}+cpu", report
    assert rank["python"].startswith(computetwin.PYTHON + "."), rank


def test_a_lock_made_for_the_login_hosts_glibc_is_not_applied_on_an_older_node(
    cluster, mirror, tmp_path
) -> None:
    """The site does not state the nodes' glibc: the login host locks for its own 2.36 (and says so), and picks
    a dependency whose only wheel needs 2.34. On a 2.31 node that lock does not apply: create says why."""
    env = user_env(tmp_path, mirror, **site(tmp_path, glibc="unknown", python=computetwin.PYTHON))
    lock = tmp_path / "twin-dep.lock.toml"
    res = ok(run_cli("lock", "twin-dep", "-o", str(lock), env=env))
    assert f"x86_64-manylinux_2_{LOGIN_GLIBC.split('.')[1]}" in res.stdout, res.stdout
    assert f"the glibc gate (manylinux wheels) was decided on this host's glibc {LOGIN_GLIBC}" in res.stderr
    code, out = envbuilder_on(cluster, "n1", env, "create", "twin-dep", "--locked", "--lock", str(lock))
    tag = f"x86_64-manylinux_2_{LOGIN_GLIBC.split('.')[1]}"
    assert code == LOCK_ERROR, out
    assert (
        f"was resolved for {tag} (glibc {LOGIN_GLIBC}), but the target has glibc {computetwin.GLIBC}" in out
    )
    assert "run `envbuilder lock twin-dep --platform x86_64` on one of them, or set compute.glibc" in out
    assert "Traceback" not in out and "No solution found" not in out
    assert not (Path(env["SCRATCH"]) / "envs" / "twin-dep").exists()


def test_an_env_built_on_the_login_host_is_refused_on_a_node_that_lacks_its_python(
    cluster, mirror, tmp_path
) -> None:
    """Where the site states nothing, an env created on the login host is built on the login host's Python,
    which the nodes do not have: ``run`` and ``validate`` there say so and how to build it for the nodes,
    instead of blaming a launcher missing from PATH; ``doctor`` there names the gates the node fails."""
    env = user_env(tmp_path, mirror, **site(tmp_path, glibc="unknown", python="unknown"))
    ok(run_cli("create", "twin-new", "--no-validate", env=env))
    python = Path(env["SCRATCH"]) / "envs" / "twin-new" / "bin" / "python"
    login = os.uname().nodename
    for args in (
        ("run", "twin-new", "--", "python", "-c", "pass"),
        ("validate", "twin-new", "--checks", "import"),
    ):
        code, out = envbuilder_on(cluster, "n1", env, *args)
        assert code == STATE_ERROR, (args, out)
        assert f"twin-new's python {python} does not run on this host (n1)" in out, out
        assert f"which is not here; it was built on {login} with Python {platform.python_version()}" in out, (
            out
        )
        assert "envbuilder create twin-new --force on a compute node" in out
        assert "not on PATH" not in out and "MPI module" not in out
    code, out = envbuilder_on(cluster, "n1", env, "doctor", "twin-new")
    assert code == DOCTOR_FINDINGS, out
    assert (
        f"the target has glibc {computetwin.GLIBC}" in out and "the Python it was built from is gone" in out
    ), out
    # Its python is not missing from the env: it leads to the login host's, which the node does not have.
    said = " ".join(out.split())
    assert "the env is damaged: bin/python leads to /" in said and "which is not on this host" in said, out
