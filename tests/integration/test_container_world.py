"""The container tests' world (tests/containers.py) proved with its real parts: Debian's OCI registry on 127.0.0.1
serving the tags made from Debian's packages with the CPU torch inside, each with its labels and platform list;
the Apptainer stand-in (tests/shims/apptainer/apptainer) pulling a tag into an image file, building on it from a
definition file, refusing what Apptainer refuses, and running the image's torch through Charliecloud's ch-run
with Apptainer's environment and bind rules, as root and as the second user; and gloo ranks started by the
tests' real Slurm inside the image, as a container env's validation will start them (one task per rank, or one
task whose torchrun starts them).

Times on this 2-core machine, shared (the spread is the machine's load): the registry starts in about a second
(its storage a linked copy of the prepared one); the session's one pull (``cpu_sif``: skopeo, umoci unpack,
mksquashfs of the 1.2 GB root) 17-135 s; the definition-file build 40-60 s; the second user's run, through a
sandbox, 15-22 s; an ``exec`` importing torch 2-7 s; each Slurm test 3-7 s."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import urllib.request
from pathlib import Path
from typing import Optional

import containers
import pytest
from sharedfs import give_to, other_user
from slurm import which
from wheelindex import build_wheel

# Runs in the lane of the tests on roots of their own (`-m rootfs`): each image is a root made by tests/prepare.py,
# and a pull through the stand-in unpacks and compresses it (tens of seconds on a loaded machine).
pytestmark = [pytest.mark.integration, pytest.mark.rootfs]

CPU, CUDA12, CUDA13, MULTI = (tag.name for tag in containers.TAGS)
INDEX = "application/vnd.oci.image.index.v1+json"


def apptainer_run(apptainer, *args: str, env: Optional[dict[str, str]] = None, cwd: Optional[Path] = None):
    return subprocess.run(
        [str(apptainer.exe), *args],
        env=env or apptainer.env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_registry_serves_every_tag_with_its_labels_and_one_shared_layer(oci_registry):
    layers = set()
    for tag in containers.TAGS:
        facts = oci_registry.inspect(tag.name)
        assert facts["Labels"] == containers.labels(tag), tag.name
        assert facts["Architecture"] == "amd64", tag.name  # skopeo's pick for this host, from an index too
        config = oci_registry.inspect(tag.name, config=True)
        assert config["config"]["Env"] == containers.environment(tag), tag.name
        layers.update(facts["Layers"])
    assert len(layers) == 1  # the tags differ in their configs only
    assert oci_registry.inspect(CUDA13)["Labels"]["com.nvidia.cuda.version"] == "13.0.1"
    assert "NVIDIA_REQUIRE_CUDA=cuda>=13.0" in oci_registry.inspect(CUDA13, config=True)["config"]["Env"]
    assert "com.nvidia.cuda.version" not in oci_registry.inspect(CPU)["Labels"]


def test_the_platform_lists_amd64_only_and_multi_arch(oci_registry):
    index = oci_registry.inspect(MULTI, raw=True)
    assert index["mediaType"] == INDEX
    assert [m["platform"] for m in index["manifests"]] == [
        {"architecture": "amd64", "os": "linux"},
        {"architecture": "arm64", "os": "linux"},
    ]
    single = oci_registry.inspect(CPU, raw=True)
    assert "manifests" not in single and len(single["layers"]) == 1  # one image, no platform list
    assert oci_registry.inspect(CPU, config=True)["architecture"] == "amd64"


def test_the_distribution_api_answers_over_plain_http(oci_registry):
    """What a resolver reads without skopeo: the tag list, and each manifest with its digest in the header."""
    base = f"{oci_registry.url}/v2/{containers.REPOSITORY}"
    with urllib.request.urlopen(f"{base}/tags/list", timeout=10) as res:  # noqa: S310 (loopback)
        assert sorted(json.load(res)["tags"]) == sorted(t.name for t in containers.TAGS)
    for tag in (CPU, MULTI):
        accept = "application/vnd.oci.image.manifest.v1+json, " + INDEX
        req = urllib.request.Request(f"{base}/manifests/{tag}", method="HEAD", headers={"Accept": accept})  # noqa: S310
        with urllib.request.urlopen(req, timeout=10) as res:  # noqa: S310 (loopback)
            assert res.headers["Docker-Content-Digest"] == oci_registry.digests[tag]


def test_the_stand_in_answers_its_version_and_refuses_what_it_does_not_know(apptainer):
    assert apptainer_run(apptainer, "--version").stdout == "apptainer version 1.3.6\n"
    singularity = subprocess.run(
        [str(apptainer.bin / "singularity"), "--version"], capture_output=True, text=True
    )
    assert singularity.stdout == "singularity-ce version 4.1.5\n"
    res = apptainer_run(apptainer, "exec", "--writable", "x.sif", "true")
    assert (res.returncode, res.stderr.splitlines()[0]) == (255, "Error: unknown flag: --writable")
    res = apptainer_run(apptainer, "exec", "/nonexistent.sif", "true")
    assert res.returncode == 255 and res.stderr.startswith("FATAL:   could not open image /nonexistent.sif")


def test_the_stand_in_pulls_a_tag_into_an_image_file_with_its_labels(cpu_sif, apptainer):
    with open(cpu_sif, "rb") as f:
        assert f.read(4) == b"hsqs"  # a SquashFS file system, as Apptainer also runs
    res = apptainer_run(apptainer, "inspect", "--json", str(cpu_sif))
    assert res.returncode == 0, res.stderr
    labels = json.loads(res.stdout)["data"]["attributes"]["labels"]
    assert labels.items() >= containers.labels(containers.TAGS[0]).items()
    assert labels["org.label-schema.build-arch"] == "amd64"
    text = apptainer_run(apptainer, "inspect", str(cpu_sif)).stdout
    assert "org.envbuilder.torch.build: 2.13.0+cpu\n" in text


def test_the_stand_in_refuses_what_apptainer_refuses(cpu_sif, apptainer, oci_registry, tmp_path):
    before = cpu_sif.stat()
    res = apptainer_run(apptainer, "pull", str(cpu_sif), oci_registry.docker(CPU))
    assert (res.returncode, res.stderr) == (
        255,
        f'FATAL:   Image file already exists: "{cpu_sif}" - will not overwrite\n',
    )
    assert cpu_sif.stat().st_mtime_ns == before.st_mtime_ns
    https = {k: v for k, v in apptainer.env.items() if k != "APPTAINER_NOHTTPS"}
    res = apptainer_run(apptainer, "pull", str(tmp_path / "a.sif"), oci_registry.docker(CPU), env=https)
    assert res.returncode == 255 and "server gave HTTP response to HTTPS client" in res.stderr
    res = apptainer_run(
        apptainer, "pull", "--arch", "arm64", str(tmp_path / "b.sif"), oci_registry.docker(CPU)
    )
    assert (
        res.returncode == 255
        and "image (amd64) does not satisfy required platform (linux/arm64)" in res.stderr
    )
    assert list(tmp_path.iterdir()) == []  # nothing half made


def test_exec_runs_the_image_python_and_its_cpu_torch(cpu_sif, apptainer, tmp_path):
    probe = "import sys, torch; print(sys.executable, torch.__version__, open('/etc/debian_version').read().strip())"
    res = apptainer_run(apptainer, "exec", str(cpu_sif), "python", "-c", probe, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    exe, version, debian = res.stdout.split()
    assert (exe, version, debian.split(".")[0]) == ("/opt/venv/bin/python", "2.13.0+cpu", "12")


def test_exec_follows_apptainer_environment_bind_and_exit_rules(cpu_sif, apptainer, tmp_path):
    shown = tmp_path / "shown"
    shown.mkdir()
    (shown / "data.txt").write_text("from the host\n")
    env = {
        **apptainer.env,
        "HOSTVAR": "host",
        "APPTAINERENV_FROM_PREFIX": "prefixed",
        "PATH": apptainer.env["PATH"],
    }
    script = 'echo "$HOSTVAR|$FROM_PREFIX|$SET|$PATH|$(pwd)"; cat /mnt/0/data.txt; exit 7'
    argv = ["exec", "--env", "SET=given", "--bind", f"{shown}:/mnt/0", str(cpu_sif), "/bin/sh", "-c", script]
    res = apptainer_run(apptainer, *argv, env=env, cwd=tmp_path)
    assert res.returncode == 7, res.stderr  # the command's own status
    line, data = res.stdout.splitlines()
    assert (
        line == f"host|prefixed|given|{containers.PATH}|{tmp_path}"
    )  # the image's PATH wins over the host's
    assert data == "from the host"
    res = apptainer_run(
        apptainer, "exec", "--cleanenv", str(cpu_sif), "/bin/sh", "-c", script, env=env, cwd=tmp_path
    )
    assert res.stdout.splitlines()[0] == f"|||{containers.PATH}|{tmp_path}"
    res = apptainer_run(apptainer, "exec", "--bind", "/proc/driver:/nowhere", str(cpu_sif), "true")
    assert res.returncode == 255 and "/nowhere is not in the image" in res.stderr


@pytest.mark.skipif(
    os.path.exists("/dev/nvidiactl"), reason="this machine has NVIDIA's driver: --nv binds it"
)
def test_nv_without_a_gpu_warns_and_goes_on(cpu_sif, apptainer, tmp_path):
    res = apptainer_run(apptainer, "exec", "--nv", str(cpu_sif), "python", "-c", "print('ran')", cwd=tmp_path)
    assert (res.returncode, res.stdout) == (0, "ran\n")
    assert "WARNING: Could not find any nv files on this host!" in res.stderr


RANK = """
import json, os, torch, torch.distributed as dist
rank, world = int(os.environ["SLURM_PROCID"]), int(os.environ["SLURM_NTASKS"])
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:" + os.environ["RDZV_PORT"], rank=rank, world_size=world)
total = torch.tensor([rank + 1.0])
dist.all_reduce(total)
line = json.dumps({"rank": rank, "world": world, "sum": total.item(), "torch": torch.__version__,
                   "python": __import__("sys").executable})
os.write(1, (line + "\\n").encode())  # one write: srun merges the ranks' output
dist.destroy_process_group()
"""


@pytest.mark.slurm
def test_two_gloo_ranks_run_inside_the_image_under_slurm(cpu_sif, apptainer, slurm_cluster, tmp_path):
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    env = {**slurm_cluster.environ(), "PATH": apptainer.env["PATH"], "APPTAINER_NOHTTPS": "1",
           "RDZV_PORT": str(containers.free_port()), "GLOO_SOCKET_IFNAME": "lo"}  # fmt: skip
    argv = [which("srun") or "srun", "-n2", "--kill-on-bad-exit=1", "apptainer", "exec", str(cpu_sif),
            "python", str(script)]  # fmt: skip
    res = subprocess.run(argv, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr + slurm_cluster.log_tails()
    ranks = sorted((json.loads(line) for line in res.stdout.splitlines()), key=lambda r: r["rank"])
    assert [(r["rank"], r["world"], r["sum"]) for r in ranks] == [(0, 2, 3.0), (1, 2, 3.0)]
    assert {(r["torch"], r["python"]) for r in ranks} == {("2.13.0+cpu", "/opt/venv/bin/python")}


def test_build_from_a_definition_file_adds_packages_labels_and_environment(cpu_sif, apptainer, tmp_path):
    """A definition file on the pulled image: %post pip-installs a wheel from a directory into the image's venv,
    %environment and %labels add to the image's own."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    build_wheel(wheels, "containerdemo", "1.0", {"containerdemo.py": "WHERE = 'in the image'\n"})
    definition = tmp_path / "on-top.def"
    definition.write_text(
        f"Bootstrap: localimage\nFrom: {cpu_sif}\n\n%post\n"
        f"    pip install --quiet --no-index --find-links {wheels} containerdemo\n\n"
        "%environment\n    export GREETING=hello\n\n%labels\n    org.example.added yes\n"
    )
    image = tmp_path / "on-top.sif"
    res = apptainer_run(apptainer, "build", str(image), str(definition), cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    probe = "import containerdemo, os, torch; print(containerdemo.WHERE, os.environ['GREETING'], torch.__version__)"
    res = apptainer_run(apptainer, "exec", str(image), "python", "-c", probe, cwd=tmp_path)
    assert (res.returncode, res.stdout) == (0, "in the image hello 2.13.0+cpu\n"), res.stderr
    labels = json.loads(apptainer_run(apptainer, "inspect", "--json", str(image)).stdout)["data"][
        "attributes"
    ]
    assert labels["labels"]["org.example.added"] == "yes"
    assert labels["labels"]["org.envbuilder.torch.build"] == "2.13.0+cpu"  # the base image's, kept
    failing = tmp_path / "failing.def"
    failing.write_text(f"Bootstrap: localimage\nFrom: {cpu_sif}\n\n%post\n    false\n    touch /never\n")
    res = apptainer_run(apptainer, "build", str(tmp_path / "failing.sif"), str(failing), cwd=tmp_path)
    assert res.returncode == 255 and "while running engine: exit status 1" in res.stderr
    assert not (tmp_path / "failing.sif").exists()


def test_a_user_who_is_not_root_runs_the_image_in_a_user_namespace(cpu_sif, apptainer):
    """The second user runs the image unprivileged (ch-run's user namespace); where /dev/fuse is closed to them
    (0600 on this machine), through a temporary sandbox as Apptainer does."""
    user = other_user()
    shared = Path(
        tempfile.mkdtemp(prefix="envbuilder-container-", dir="/tmp")
    )  # pytest's tree is root's alone
    try:
        give_to(shared, user, 0o755)
        image = shared / "cpu.sif"
        os.link(cpu_sif, image)
        probe = "import os, torch; print(os.getuid(), torch.__version__)"
        argv = ["setpriv", f"--reuid={user.uid}", f"--regid={user.gid}", "--clear-groups", "env", "-i",
                "PATH=/usr/bin:/bin", str(apptainer.exe), "exec", str(image), "python", "-c", probe]  # fmt: skip
        res = subprocess.run(argv, cwd=shared, capture_output=True, text=True, timeout=600)
        assert (res.returncode, res.stdout) == (0, f"{user.uid} 2.13.0+cpu\n"), res.stderr
        # ebother is neither /dev/fuse's owner nor in its group: the bits for others decide.
        closed = not os.path.exists("/dev/fuse") or os.stat("/dev/fuse").st_mode & 0o006 != 0o006
        assert ("Converting SIF file to temporary sandbox" in res.stderr) == closed
    finally:
        shutil.rmtree(shared)


TORCHRUN_RANK = """
import json, os, torch, torch.distributed as dist
dist.init_process_group("gloo")
total = torch.tensor([dist.get_rank() + 1.0])
dist.all_reduce(total)
line = json.dumps({"rank": dist.get_rank(), "local": int(os.environ["LOCAL_RANK"]), "sum": total.item()})
os.write(1, (line + "\\n").encode())  # one write: the two ranks share torchrun's stdout
dist.destroy_process_group()
"""


@pytest.mark.slurm
def test_torchrun_inside_the_image_in_one_slurm_step(cpu_sif, apptainer, slurm_cluster, tmp_path):
    """The TACC seed's form: one task whose torchrun, inside the image, starts the ranks."""
    script = tmp_path / "rank.py"
    script.write_text(TORCHRUN_RANK)
    env = {**slurm_cluster.environ(), "PATH": apptainer.env["PATH"], "GLOO_SOCKET_IFNAME": "lo"}
    argv = [which("srun") or "srun", "-n1", "-c2", "apptainer", "exec", str(cpu_sif), "python", "-m",
            "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(script)]  # fmt: skip
    res = subprocess.run(argv, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr + slurm_cluster.log_tails()
    ranks = sorted((json.loads(line) for line in res.stdout.splitlines()), key=lambda r: r["rank"])
    assert [(r["rank"], r["local"], r["sum"]) for r in ranks] == [(0, 0, 3.0), (1, 1, 3.0)]
