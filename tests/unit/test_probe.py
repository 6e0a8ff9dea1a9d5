"""The host probe, run for real on this machine, against a fake /proc tree, and against an nvidia-smi shim."""

from __future__ import annotations

import json
import os
import platform
import time
from dataclasses import replace
from pathlib import Path

import pytest
from helpers import REPO

from envbuilder.cli import dispatch
from envbuilder.core.errors import HostProbeError, ResolverErrors
from envbuilder.core.facts import Gpu, facts_from_json
from envbuilder.system import host
from envbuilder.system.host import load_facts_file, probe

SHIMS = REPO / "tests" / "shims"


def test_probe_on_this_machine_is_real():
    facts = probe()
    assert facts.arch == platform.machine()
    assert facts.python == platform.python_version()
    assert facts.glibc == os.confstr("CS_GNU_LIBC_VERSION").split()[1]
    assert facts.hostname
    assert facts.filesystems.get("HOME") == os.environ["HOME"]
    # JSON round trip: what probe --json prints, plan --facts reads back unchanged.
    again = facts_from_json(json.loads(json.dumps(facts.to_json())), "probe")
    assert again.to_json() == facts.to_json()


def test_no_tools_and_no_proc_means_unknown_not_none(tmp_path):
    facts = probe(env={"PATH": str(tmp_path)}, root=str(tmp_path))
    assert facts.gpus is None
    assert facts.driver_version is None
    assert facts.module_system is None
    assert facts.scheduler is None


def test_proc_without_nvidia_driver_means_no_gpu(tmp_path):
    (tmp_path / "proc" / "driver").mkdir(parents=True)
    facts = probe(env={"PATH": str(tmp_path)}, root=str(tmp_path))
    assert facts.gpus == ()


def test_fake_proc_tree_gives_driver_and_gpu_names(tmp_path):
    nv = tmp_path / "proc" / "driver" / "nvidia"
    (nv / "gpus" / "0000:41:00.0").mkdir(parents=True)
    (nv / "gpus" / "0000:c1:00.0").mkdir(parents=True)
    (nv / "version").write_text(
        "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build  (dvs-builder@U16-I2-C05-3)\n"
        "GCC version:  gcc version 12.3.0\n"
    )
    for bus in ("0000:41:00.0", "0000:c1:00.0"):
        (nv / "gpus" / bus / "information").write_text(
            f"Model: \t\t NVIDIA H200\nIRQ:   \t\t 42\nBus Location: \t {bus}\n"
        )
    facts = probe(env={"PATH": str(tmp_path)}, root=str(tmp_path))
    assert facts.driver_version == "580.159.04"
    assert [g.name for g in facts.gpus] == ["NVIDIA H200", "NVIDIA H200"]
    assert facts.gpus[0].compute_capability is None  # /proc does not say; the resolver looks the name up


def test_proprietary_driver_version_line(tmp_path):
    nv = tmp_path / "proc" / "driver" / "nvidia"
    nv.mkdir(parents=True)
    (nv / "version").write_text(
        "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05  Sat Aug 19 01:15:15 UTC 2023\n"
    )
    assert probe(env={"PATH": str(tmp_path)}, root=str(tmp_path)).driver_version == "535.104.05"


# The lent 2xH200 node as nvidia-smi described it (tests/data/proc/h200-x2).
H200_NODE = {
    "driver": "580.159.04",
    "cuda": "13.0",
    "gpus": [{"name": "NVIDIA H200", "cc": "9.0", "mem": 143771}] * 2,
}


def _shim(tmp_path: Path, spec: dict) -> dict[str, str]:
    spec_file = tmp_path / "smi.json"
    spec_file.write_text(json.dumps(spec))
    return {"PATH": f"{SHIMS}:{os.environ['PATH']}", "NVIDIA_SMI_SHIM": str(spec_file)}


def test_nvidia_smi_shim_gives_gpus_driver_and_max_cuda(tmp_path):
    env = _shim(tmp_path, H200_NODE)
    facts = probe(env=env, root=str(tmp_path))
    assert facts.driver_version == "580.159.04"
    assert facts.max_cuda == "13.0"
    assert len(facts.gpus) == 2
    assert facts.gpus[0].compute_capability == "9.0"
    assert facts.gpus[0].memory_mib == 143771


def test_max_cuda_comes_from_the_version_line_without_the_full_table(tmp_path):
    """The full table queries every GPU (slow where they sleep between jobs): `nvidia-smi --version` gives the
    highest CUDA alone; a driver without --version still gets it from the table."""
    calls = tmp_path / "calls"
    env = {**_shim(tmp_path, H200_NODE), "NVIDIA_SMI_SHIM_LOG": str(calls)}
    assert probe(env=env, root=str(tmp_path)).max_cuda == "13.0"
    assert "--version" in calls.read_text().splitlines()  # asked while the GPUs are queried
    assert "" not in calls.read_text().splitlines()  # the table was never asked for
    calls.unlink()
    old = {**H200_NODE, "cuda": "12.2", "old_driver": True}
    env = {**_shim(tmp_path, old), "NVIDIA_SMI_SHIM_LOG": str(calls)}
    assert probe(env=env, root=str(tmp_path)).max_cuda == "12.2"
    asked = calls.read_text().splitlines()
    assert "--version" in asked and asked[-1] == "", asked  # the table only once --version said nothing


def test_old_driver_without_compute_cap_field_still_lists_gpus(tmp_path):
    env = _shim(
        tmp_path,
        {
            "driver": "470.82.01",
            "cuda": "11.4",
            "old_driver": True,
            "gpus": [{"name": "Tesla V100-SXM2-16GB", "cc": "7.0", "mem": 16160}],
        },
    )
    facts = probe(env=env, root=str(tmp_path))
    assert facts.driver_version == "470.82.01"
    assert facts.gpus[0].name == "Tesla V100-SXM2-16GB"
    assert facts.gpus[0].compute_capability is None


def test_scheduler_and_module_system_from_environment(tmp_path):
    env = {
        "PATH": str(tmp_path),
        "SLURM_JOB_ID": "42",
        "SLURM_JOB_NODELIST": "c[1-2]",
        "LMOD_CMD": "/x/lmod",
        "SCRATCH": "/scratch/u",
        "CUDA_VISIBLE_DEVICES": "0,1",
    }
    facts = probe(env=env, root=str(tmp_path))
    assert facts.scheduler == "slurm"
    assert facts.module_system == "lmod"
    assert facts.allocation["SLURM_JOB_NODELIST"] == "c[1-2]"
    assert facts.allocation["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert facts.filesystems["SCRATCH"] == "/scratch/u"


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "not valid JSON"),
        ("[]", "expected a JSON object"),
        ('{"arch": 64}', "arch: expected a string, found 64"),
        ('{"archh": "x86_64"}', "unknown key 'archh'"),
        ('{"gpus": [{"name": "A100", "compute_capability": 8}]}', 'expected a string like "9.0"'),
        ('{"gpus": "A100"}', "gpus: expected a list"),
    ],
)
def test_bad_facts_files_are_clear_errors(tmp_path, content, message):
    path = tmp_path / "facts.json"
    path.write_text(content)
    with pytest.raises(HostProbeError) as info:
        load_facts_file(str(path))
    assert message in info.value.message
    assert str(path) in info.value.message


def test_facts_file_did_you_mean(tmp_path):
    path = tmp_path / "facts.json"
    path.write_text('{"driver": "550.54.15"}')
    with pytest.raises(HostProbeError) as info:
        load_facts_file(str(path))
    assert info.value.hint == "did you mean 'driver_version'?"


def test_missing_keys_are_unknown(tmp_path):
    path = tmp_path / "facts.json"
    path.write_text('{"arch": "arm64"}')
    facts = load_facts_file(str(path))
    assert facts.arch == "aarch64"
    assert facts.gpus is None
    assert facts.python is None


REAL = REPO / "tests" / "data" / "proc" / "h200-x2"  # captured on the lent 2xH200 node, 2026-11-22


def test_real_driver_proc_text_from_the_gpu_node(tmp_path):
    nv = tmp_path / "proc" / "driver" / "nvidia"
    nv.mkdir(parents=True)
    (nv / "version").write_text((REAL / "version").read_text())
    # The node's two GPUs' information files, concatenated in the capture: split them back per GPU.
    blocks = (REAL / "gpus-information.txt").read_text().split("Model:")[1:]
    for i, block in enumerate(blocks):
        (nv / "gpus" / f"0000:00:0{6 + i}.0").mkdir(parents=True)
        (nv / "gpus" / f"0000:00:0{6 + i}.0" / "information").write_text("Model:" + block)
    facts = probe(env={"PATH": str(tmp_path)}, root=str(tmp_path))
    assert facts.driver_version == "580.159.04"
    assert [g.name for g in facts.gpus] == ["NVIDIA H200", "NVIDIA H200"]


def test_shim_speaks_like_the_real_nvidia_smi(tmp_path):
    env = _shim(tmp_path, H200_NODE)
    import subprocess

    query = subprocess.run(
        [
            "nvidia-smi",
            "--query-gpu=name,compute_cap,driver_version,memory.total",
            "--format=csv,noheader,nounits",
        ],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert query == (REAL / "nvidia-smi-query.txt").read_text()
    header = subprocess.run(["nvidia-smi"], env=env, capture_output=True, text=True, check=True).stdout
    assert "Driver Version: 580.159.04" in header
    assert "CUDA Version: 13.0" in header
    assert "CUDA Version: 13.0" in (REAL / "nvidia-smi-header.txt").read_text()


# --- AMD and Intel GPUs (issue 41): a stand-in amd-smi printing captured output, and sysfs trees -----------------

CAPTURED = REPO / "tests" / "data" / "probe"


def test_amd_smi_stand_in_gives_the_gfx_target_and_the_driver(tmp_path):
    env = {
        "PATH": f"{SHIMS / 'amd'}:{os.environ['PATH']}",
        "AMD_SMI_SHIM_OUTPUT": str(CAPTURED / "amd-smi-mi350x" / "static.txt"),
    }
    facts = probe(env=env, root=str(tmp_path))
    assert [(g.name, g.vendor, g.arch) for g in facts.gpus] == [("AMD Instinct MI350X", "amd", "gfx950")]
    assert facts.amdgpu_version == "6.18.3"
    assert facts.gpu_vendor == "amd"
    # probe --json / --facts carry them, and read them back unchanged.
    data = facts.to_json()
    assert data["gpus"][0]["arch"] == "gfx950" and data["amdgpu_version"] == "6.18.3"
    assert facts_from_json(json.loads(json.dumps(data)), "probe").to_json() == data


def _kfd_node(root: Path, number: int, properties: str) -> None:
    node = root / "sys" / "class" / "kfd" / "kfd" / "topology" / "nodes" / str(number)
    node.mkdir(parents=True)
    (node / "properties").write_text(properties)


def test_kfd_topology_names_each_amd_gpu_and_skips_the_cpu_nodes(tmp_path):
    _kfd_node(tmp_path, 0, "cpu_cores_count 64\nsimd_count 0\nvendor_id 0\ngfx_target_version 0\n")
    for n in (1, 2):
        _kfd_node(
            tmp_path, n, "cpu_cores_count 0\nsimd_count 440\nvendor_id 4098\ngfx_target_version 90010\n"
        )
    _kfd_node(tmp_path, 10, "cpu_cores_count 0\nsimd_count 912\nvendor_id 4098\ngfx_target_version 90402\n")
    (tmp_path / "sys" / "module" / "amdgpu").mkdir(parents=True)
    (tmp_path / "sys" / "module" / "amdgpu" / "version").write_text("6.10.5\n")
    facts = probe(env={"PATH": str(tmp_path)}, root=str(tmp_path))
    assert [g.arch for g in facts.gpus] == ["gfx90a", "gfx90a", "gfx942"]
    assert facts.amdgpu_version == "6.10.5"


def _pci(root: Path, bdf: str, vendor: str, device: str, klass: str) -> None:
    dev = root / "sys" / "bus" / "pci" / "devices" / bdf
    dev.mkdir(parents=True)
    for name, value in (("vendor", vendor), ("device", device), ("class", klass)):
        (dev / name).write_text(value + "\n")


def test_intel_gpus_from_pci_sysfs_and_level_zero_presence(tmp_path):
    _pci(tmp_path, "0000:00:00.0", "0x8086", "0x09a2", "0x060000")  # a host bridge: not a GPU
    for bdf in ("0000:18:00.0", "0000:42:00.0"):
        _pci(tmp_path, bdf, "0x8086", "0x0bd5", "0x038000")
    facts = probe(env={"PATH": str(tmp_path)}, root=str(tmp_path))
    assert [(g.name, g.vendor) for g in facts.gpus] == [("Intel GPU 0x0bd5", "intel")] * 2
    assert facts.level_zero == ""  # an Intel GPU and no loader: known absent
    lib = tmp_path / "usr" / "lib64"
    lib.mkdir(parents=True)
    (lib / "libze_loader.so.1.17.6").write_bytes(b"")
    assert probe(env={"PATH": str(tmp_path)}, root=str(tmp_path)).level_zero == "1.17.6"


def test_a_probed_pvc_node_plans_xpu_and_a_flex_one_is_refused(tmp_path):
    from envbuilder.resolver.wheels import TorchRequest, resolve

    _pci(tmp_path, "0000:18:00.0", "0x8086", "0x0bd5", "0x038000")
    (tmp_path / "usr" / "lib64").mkdir(parents=True)
    (tmp_path / "usr" / "lib64" / "libze_loader.so.1.17.6").write_bytes(b"")
    # The GPU is the question here, not the python running the tests (3.9 in CI's second run, which torch 2.13
    # no longer supports): the target's python is one it does.
    facts = replace(probe(env={"PATH": str(tmp_path)}, root=str(tmp_path)), python="3.12.3")
    r = resolve(TorchRequest("2.13.0"), facts)
    assert r.variant == "xpu"
    assert not [
        w for w in r.warnings if "family" in w or "Level Zero" in w
    ]  # 0x0bd5 is pvc; the loader is there
    flex = replace(facts, gpus=(Gpu("Intel GPU 0x56c0", vendor="intel"),))  # a Flex 170 by its PCI id
    with pytest.raises(ResolverErrors):
        resolve(TorchRequest("2.13.0", "xpu"), flex)


# A command that probes asks nvidia-smi at its start (host.asked_early, from cli.dispatch), while its modules load.


def _asked(calls: Path) -> list[str]:
    return calls.read_text().splitlines() if calls.exists() else []


def _until_asked(calls: Path, n: int) -> None:
    deadline = time.monotonic() + 60
    while len(_asked(calls)) < n:
        assert time.monotonic() < deadline, _asked(calls)
        time.sleep(0.01)


def test_the_first_probe_takes_the_answers_asked_at_the_start_and_a_later_one_asks_again(tmp_path):
    calls = tmp_path / "calls"
    env = {**_shim(tmp_path, H200_NODE), "NVIDIA_SMI_SHIM_LOG": str(calls)}
    with host.asked_early(env):
        _until_asked(calls, 2)  # both questions were asked before any probe
        facts = probe(env=env, root=str(tmp_path))
        assert len(_asked(calls)) == 2, _asked(calls)
        again = probe(env=env, root=str(tmp_path))
        assert len(_asked(calls)) == 4, _asked(calls)
    assert sorted(_asked(calls)[:2]) == sorted(_asked(calls)[2:])  # the same two questions
    assert facts == again
    assert facts.driver_version == "580.159.04" and facts.max_cuda == "13.0" and len(facts.gpus) == 2
    assert facts.gpus[0].compute_capability == "9.0"


def test_answers_asked_for_another_environment_are_not_taken(tmp_path):
    calls = tmp_path / "calls"
    env = {**_shim(tmp_path, H200_NODE), "NVIDIA_SMI_SHIM_LOG": str(calls)}
    with host.asked_early(env):
        _until_asked(calls, 2)
        other = {**env, "CUDA_VISIBLE_DEVICES": "1"}
        facts = probe(env=other, root=str(tmp_path))
        assert len(_asked(calls)) == 4  # asked afresh in the probe's own environment
    assert len(facts.gpus) == 2


def test_an_old_driver_answers_the_early_question_as_the_probe_expects(tmp_path):
    """The early query asks for compute_cap, which a driver before 510 refuses: the probe then asks without it."""
    spec = {
        "driver": "470.82.01",
        "cuda": "11.4",
        "old_driver": True,
        "gpus": [{"name": "Tesla V100-SXM2-16GB", "cc": "7.0", "mem": 16160}],
    }
    env = _shim(tmp_path, spec)
    with host.asked_early(env):
        facts = probe(env=env, root=str(tmp_path))
    assert facts.gpus[0].name == "Tesla V100-SXM2-16GB" and facts.gpus[0].compute_capability is None
    assert facts.driver_version == "470.82.01" and facts.max_cuda == "11.4"


def test_questions_nobody_took_end_with_the_block(tmp_path):
    env = {**_shim(tmp_path, H200_NODE), "NVIDIA_SMI_SHIM_DELAY": "600"}
    with host.asked_early(env):
        children = [host._early[0].query.child, host._early[0].version.child]
    assert not host._early
    for child in children:
        assert child.returncode is not None  # ended and reaped, not left to answer nobody
        with pytest.raises(ProcessLookupError):
            os.kill(child.pid, 0)


def test_no_nvidia_smi_means_nothing_asked(tmp_path):
    with host.asked_early({"PATH": str(tmp_path)}):
        assert not host._early


def test_an_nvidia_smi_that_does_not_start_leaves_the_probe_to_find_out(tmp_path):
    """An executable that is no program (a broken install, a file of another machine): starting it fails at once;
    the command goes on, and its probe says what it can without it."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_bytes(b"\x00\x01 not a program")
    (bin_dir / "nvidia-smi").chmod(0o755)
    env = {"PATH": str(bin_dir)}
    with host.asked_early(env):
        assert not host._early
        facts = probe(env=env, root=str(tmp_path))
    assert facts.gpus is None and facts.driver_version is None


def test_probing_commands_ask_nvidia_smi_once_and_a_facts_file_asks_nothing(tmp_path, monkeypatch, capsys):
    calls = tmp_path / "calls"
    for name, value in {**_shim(tmp_path, H200_NODE), "NVIDIA_SMI_SHIM_LOG": str(calls)}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("ENVBUILDER_INDEX_MIRROR", raising=False)  # plan from the shipped table (--offline)
    assert dispatch.main(["probe", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)["data"]
    assert data["driver_version"] == "580.159.04" and len(data["gpus"]) == 2
    assert len(_asked(calls)) == 2, _asked(calls)  # the early questions' answers, not asked twice
    facts = tmp_path / "facts.json"
    facts.write_text(json.dumps(data))
    calls.unlink()
    assert dispatch.main(["plan", "local", "--offline", "--facts", str(facts)]) == 0
    capsys.readouterr()
    assert _asked(calls) == []
