"""The torch build guard's pure half: planned vs installed build, arch coverage, the indexes an install read,
locked file names; and the reader on env directories laid out by hand (no python run)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from envbuilder.backends import torchbuild
from envbuilder.backends.torchbuild import Build, Expected, compare
from envbuilder.core.errors import LockError
from envbuilder.core.facts import Gpu, HostFacts
from envbuilder.lockfile import LockedFile, LockedPackage, PlatformLock
from envbuilder.resolver.mirror import PYPI

CU126 = Expected("2.13.0", "cu126", "12.6", "cu126", (), "https://download.pytorch.org/whl/cu126")
CPU = Expected("2.13.0", "cpu", None, "cpu", (), "https://download.pytorch.org/whl/cpu")
#: A plan from before the resolver knew labels: "" = unknown, the variant is the label to expect.
CPU_NO_LOCAL = Expected("2.13.0", "cpu", None, "", (), "https://download.pytorch.org/whl/cpu")
CU126_ARCH = ["sm_50", "sm_60", "sm_70", "sm_75", "sm_80", "sm_86", "sm_90"]


def with_sms(e: Expected, *sms: str) -> Expected:
    return Expected(e.version, e.variant, e.cuda, e.local, sms, e.index_url)


# ---------------------------------------------------------------------------------------------------------------
# compare


@pytest.mark.parametrize(
    ("expected", "build"),
    [
        (CU126, Build("2.13.0+cu126", "12.6")),
        (CPU, Build("2.13.0+cpu", None)),
        (CPU_NO_LOCAL, Build("2.13.0+cpu", None)),
        # Old CPU wheels were labelled cpu.cxx11.abi: still a CPU build.
        (CPU, Build("2.13.0+cpu.cxx11.abi", None)),
        # An unlabeled build whose CUDA is the plan's (PyPI re-hosting the variant's build) passes in an env.
        (Expected("2.13.0", "cu130", "13.0", "cu130", (), "u"), Build("2.13.0", "13.0")),
        # The aarch64 2.4.0 CUDA wheel was published without a label (local "" in the plan).
        (Expected("2.4.0", "cu124", "12.4", "", (), "u"), Build("2.4.0", "12.4")),
        # Nightlies: the public part compares, dev number included.
        (
            Expected("2.16.0.dev20261120", "cu130", "13.0", "cu130", (), "u"),
            Build("2.16.0.dev20261120+cu130", "13.0"),
        ),
        # The patch digit of the toolkit is not part of the variant.
        (CU126, Build("2.13.0+cu126", "12.6.3")),
        # Arch list covering the target GPU.
        (with_sms(CU126, "9.0", "8.0"), Build("2.13.0+cu126", "12.6", arch_flags=tuple(CU126_ARCH))),
        # Arch list not read (no GPU known, or unreadable): nothing to say about it.
        (with_sms(CU126, "9.0"), Build("2.13.0+cu126", "12.6", arch_flags=None)),
    ],
)
def test_the_planned_build_passes(expected, build):
    assert compare(expected, build) == []


def test_planned_cu126_got_cpu():
    problems = compare(CU126, Build("2.13.0+cpu", None))
    assert problems == ["local label +cpu, planned +cu126", "built without CUDA, planned CUDA 12.6"]


def test_planned_cpu_got_a_cuda_label():
    problems = compare(CPU, Build("2.13.0+cu130", "13.0"))
    assert problems == ["local label +cu130, planned +cpu", "built for CUDA 13.0, planned a CPU build (cpu)"]


def test_planned_cpu_got_pypis_unlabeled_cuda_build():
    # PyPI's 2.13.0 has no label and torch.version.cuda = '13.0'.
    assert compare(CPU, Build("2.13.0", "13.0")) == ["built for CUDA 13.0, planned a CPU build (cpu)"]
    assert compare(CPU_NO_LOCAL, Build("2.13.0", "13.0")) == [
        "built for CUDA 13.0, planned a CPU build (cpu)"
    ]


def test_cuda_minor_differs():
    # A cu128 build labelled as the plan asked (a mirror re-labelling files) is still the wrong toolkit.
    assert compare(CU126, Build("2.13.0+cu126", "12.8")) == ["built for CUDA 12.8, planned CUDA 12.6"]
    assert compare(CU126, Build("2.13.0+cu130", "13.0")) == [
        "local label +cu130, planned +cu126",
        "built for CUDA 13.0, planned CUDA 12.6",
    ]


def test_unlabeled_cpu_build_for_a_cuda_plan():
    assert compare(CU126, Build("2.13.0", None)) == ["built without CUDA, planned CUDA 12.6"]


def test_version_differs():
    assert compare(CU126, Build("2.14.0+cu126", "12.6")) == ["version 2.14.0, planned 2.13.0"]
    assert compare(CU126, Build("2.13.1+cu126", "12.6")) == ["version 2.13.1, planned 2.13.0"]
    nightly = Expected("2.16.0.dev20261120", "cu130", "13.0", "cu130", (), "u")
    assert compare(nightly, Build("2.16.0.dev20261121+cu130", "13.0")) == [
        "version 2.16.0.dev20261121, planned 2.16.0.dev20261120"
    ]


def test_target_gpu_missing_from_the_arch_list():
    no_90 = ("sm_50", "sm_60", "sm_70", "sm_75", "sm_80", "sm_86")
    problems = compare(with_sms(CU126, "9.0"), Build("2.13.0+cu126", "12.6", arch_flags=no_90))
    assert len(problems) == 1
    assert "sm_90 (compute capability 9.0)" in problems[0]
    assert "sm_50 sm_60 sm_70 sm_75 sm_80 sm_86" in problems[0]
    # Only the uncovered one of two targets is named.
    both = compare(with_sms(CU126, "8.0", "9.0"), Build("2.13.0+cu126", "12.6", arch_flags=no_90))
    assert both[0].startswith("no code for the target GPU's sm_90 (compute capability 9.0); its arch list")


def test_an_empty_arch_list_covers_nothing():
    problems = compare(with_sms(CU126, "8.0"), Build("2.13.0+cu126", "12.6", arch_flags=()))
    assert problems == ["no code for the target GPU's sm_80 (compute capability 8.0); its arch list: (empty)"]


def test_no_arch_check_for_a_cpu_plan():
    assert compare(with_sms(CPU, "9.0"), Build("2.13.0+cpu", None, arch_flags=())) == []


def test_several_problems_at_once():
    problems = compare(with_sms(CU126, "9.0"), Build("2.12.0+cpu", None, arch_flags=()))
    assert problems == [
        "version 2.12.0, planned 2.13.0",
        "local label +cpu, planned +cu126",
        "built without CUDA, planned CUDA 12.6",
    ]


# ---------------------------------------------------------------------------------------------------------------
# arch coverage


@pytest.mark.parametrize(
    ("flags", "cc", "runs"),
    [
        (["sm_80"], "8.0", True),
        (["sm_80"], "8.6", True),  # SASS runs on a higher minor of its major
        (["sm_86"], "8.0", False),
        (["sm_80"], "9.0", False),  # not on another major
        (["sm_90a"], "9.0", True),  # arch-specific code runs on exactly its own capability
        (["sm_90a"], "9.1", False),
        (["sm_100"], "10.0", True),
        (["sm_120"], "12.0", True),
        (["sm_100"], "12.0", False),
        (["compute_90"], "10.0", True),  # PTX JITs upwards
        (["compute_90"], "8.0", False),
        (["sm_50", "compute_50"], "7.0", True),
        ([], "8.0", False),
        (["garbage", "sm_"], "8.0", False),
    ],
)
def test_runs_on(flags, cc, runs):
    assert torchbuild.runs_on(flags, cc) is runs


# ---------------------------------------------------------------------------------------------------------------
# expected_from, target_sms


def test_expected_from_a_resolution():
    res = SimpleNamespace(
        torch="2.13.0", variant="cu126", cuda="12.6", index_url="https://download.pytorch.org/whl/cu126"
    )
    e = torchbuild.expected_from(res, ["9.0", "9.0", "8.0"])
    assert e == Expected(
        "2.13.0", "cu126", "12.6", "", ("9.0", "8.0"), "https://download.pytorch.org/whl/cu126"
    )
    res.local = "cu126"
    assert torchbuild.expected_from(res).local == "cu126"
    assert e.describe() == "torch 2.13.0 cu126 (CUDA 12.6)"
    cpu = torchbuild.expected_from(SimpleNamespace(torch="2.13.0", variant="cpu", cuda=None, index_url="x"))
    assert cpu.cuda is None and not cpu.is_cuda and cpu.describe() == "torch 2.13.0 cpu (no CUDA)"


def test_expected_from_a_recorded_plan():
    e = torchbuild.expected_from_json({"torch": "2.13.0", "variant": "cpu", "cuda": None, "index_url": "u"})
    assert e == Expected("2.13.0", "cpu", None, "", (), "u")


def test_target_sms_from_reported_and_named_gpus():
    target = HostFacts(
        gpus=(Gpu("NVIDIA H100 NVL", "9.0"), Gpu("NVIDIA H100 NVL", "9.0"), Gpu("NVIDIA A100-SXM4-80GB"))
    )
    assert torchbuild.target_sms(target) == ("9.0", "8.0")
    assert torchbuild.target_sms(HostFacts(gpus=())) == ()
    assert torchbuild.target_sms(HostFacts()) == ()
    assert torchbuild.target_sms(None) == ()


# ---------------------------------------------------------------------------------------------------------------
# which index served it


def test_install_indexes_of_the_steps_that_bring_torch():
    steps = [
        ("uv", "venv", "--relocatable", "/p"),
        ("uv", "pip", "install", "--python", "/p/bin/python", "--index-url", "http://m/whl/cpu",
         "--extra-index-url", PYPI, "torch==2.13.0"),
        ("uv", "pip", "install", "--python", "/p/bin/python", "--constraint", "/p/c.txt", "numpy"),
    ]  # fmt: skip
    assert torchbuild.install_indexes(steps) == ["http://m/whl/cpu", PYPI]
    # A step naming no index reads PyPI; --find-links directories count; --no-index reads none.
    assert torchbuild.install_indexes([("pip", "install", "torch==2.13.0")]) == [PYPI]
    assert torchbuild.install_indexes(
        [("pip", "install", "--no-index", "--find-links", "/w", "torch==2.13.0")]
    ) == ["/w"]
    # A lock's hashed requirements bring torch too.
    locked = (
        "uv",
        "pip",
        "install",
        "--index-url",
        "http://m/",
        "--requirement",
        "/p/envbuilder/lock-requirements.txt",
    )
    assert torchbuild.install_indexes([locked]) == ["http://m/"]
    # torchvision alone is not torch.
    assert (
        torchbuild.install_indexes([("pip", "install", "--index-url", "http://x", "torchvision==0.28.0")])
        == []
    )


def test_served_by():
    cpu = Build("2.13.0+cpu", None)
    unlabeled = Build("2.13.0", "13.0")
    assert torchbuild.served_by(cpu, ["http://m/whl/cu126"]) == "http://m/whl/cu126"
    assert torchbuild.served_by(unlabeled, ["http://m/whl/cpu", PYPI]).startswith(f"{PYPI}, most likely")
    assert torchbuild.served_by(cpu, ["http://a", "http://b"]) == "one of http://a, http://b"


def test_mismatch_message_names_plan_arrival_and_index():
    text = torchbuild.mismatch_message(CU126, Build("2.13.0+cpu", None), "http://m/whl/cu126", ["x"])
    assert text == (
        "torch build mismatch: planned torch 2.13.0 cu126 (CUDA 12.6) from https://download.pytorch.org/whl/cu126, "
        "the installer brought 2.13.0+cpu (no CUDA), served by http://m/whl/cu126\n  - x"
    )
    hint = torchbuild.mismatch_hint("demo")
    assert "ENVBUILDER_INDEX_MIRROR" in hint and "envbuilder plan demo" in hint


# ---------------------------------------------------------------------------------------------------------------
# locked file names


def test_build_from_a_locked_file_name():
    b = torchbuild.build_from_filename(
        "http://m/whl/cpu/torch-2.13.0%2Bcpu-cp311-cp311-manylinux_2_28_x86_64.whl#sha256=00"
    )
    assert b == Build(
        "2.13.0+cpu", None, cuda_known=False, where="torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"
    )
    assert (
        torchbuild.build_from_filename("http://m/numpy-2.0.0-cp311-cp311-manylinux_2_28_x86_64.whl") is None
    )
    assert torchbuild.build_from_filename("http://m/torch-2.13.0.tar.gz") is None


def _platform(*names: str) -> PlatformLock:
    torch = LockedPackage(
        "torch", "2.13.0", "wheel", tuple(LockedFile(f"http://m/{n}", "0" * 64) for n in names)
    )
    other = LockedPackage(
        "numpy", "2.0.0", "wheel", (LockedFile("http://m/numpy-2.0.0-py3-none-any.whl", "1" * 64),)
    )
    return PlatformLock("x86_64", "x86_64-manylinux_2_28", {}, (torch, other))


def test_lock_file_names_against_the_plan():
    good = _platform("torch-2.13.0%2Bcu126-cp311-cp311-manylinux_2_28_x86_64.whl")
    assert torchbuild.lock_problems(CU126, good) == []
    bad = torchbuild.lock_problems(
        CU126, _platform("torch-2.13.0%2Bcpu-cp311-cp311-manylinux_2_28_x86_64.whl")
    )
    assert [p for _, _, p in bad] == [
        ["local label +cpu, planned +cu126"]
    ]  # a name does not tell the CUDA version
    # An unlabeled file where the planned index labels its files: not the planned index's.
    unlabeled = torchbuild.lock_problems(CPU, _platform("torch-2.13.0-cp311-cp311-manylinux_2_28_x86_64.whl"))
    assert "no local label, planned +cpu" in unlabeled[0][2][0]
    # ...unless the plan does not know the label.
    assert (
        torchbuild.lock_problems(
            CPU_NO_LOCAL, _platform("torch-2.13.0-cp311-cp311-manylinux_2_28_x86_64.whl")
        )
        == []
    )


def test_check_lock_raises_a_lock_error():
    res = SimpleNamespace(
        torch="2.13.0", variant="cu126", cuda="12.6", index_url="https://download.pytorch.org/whl/cu126"
    )
    platform = _platform("torch-2.13.0%2Bcpu-cp311-cp311-manylinux_2_28_x86_64.whl")
    with pytest.raises(LockError) as info:
        torchbuild.check_lock(res, None, platform, "demo")
    assert info.value.exit_code == 13
    assert "planned torch 2.13.0 cu126 (CUDA 12.6)" in info.value.message
    assert (
        "the resolver picked torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl from http://m"
        in info.value.message
    )
    assert "No lock was written" in (info.value.hint or "")
    torchbuild.check_lock(None, None, platform, "demo")  # the plan installs no torch: nothing to check


# ---------------------------------------------------------------------------------------------------------------
# reading files (an env laid out by hand; no python is run when torch sits in the env and no arch list is asked)


VERSION_PY = """from typing import Optional

__all__ = ['__version__', 'debug', 'cuda', 'git_version', 'hip']
__version__ = '2.13.0+cu126'
debug = False
cuda: Optional[str] = '12.6'
git_version = 'abc'
hip: Optional[str] = None
"""


def lay_out(root: Path, version: str, version_py: str, site: str = "lib/python3.11/site-packages") -> Path:
    sp = root / site
    (sp / f"torch-{version}.dist-info").mkdir(parents=True)
    (sp / f"torch-{version}.dist-info" / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: torch\nVersion: {version}\n\nVersion: 9.9.9 in the description\n"
    )
    (sp / "torch").mkdir()
    (sp / "torch" / "version.py").write_text(version_py)
    return sp


def test_read_version_py_never_runs_it(tmp_path):
    path = tmp_path / "version.py"
    path.write_text(VERSION_PY + "import os\nos.system('touch /nonexistent/x')\nweird = some_call()\n")
    info = torchbuild.read_version_py(path)
    assert info["cuda"] == "12.6" and info["__version__"] == "2.13.0+cu126" and info["hip"] is None
    assert "weird" not in info
    assert torchbuild.read_version_py(tmp_path / "missing.py") == {}
    (tmp_path / "bad.py").write_text("cuda = (")
    assert torchbuild.read_version_py(tmp_path / "bad.py") == {}


@pytest.mark.parametrize("site", ["lib/python3.11/site-packages", "lib64/python3.12/site-packages"])
def test_read_build_from_env_files(tmp_path, site):
    lay_out(tmp_path, "2.13.0+cu126", VERSION_PY, site)
    b = torchbuild.read_build(tmp_path)
    assert b is not None
    assert (b.version, b.cuda, b.arch_flags) == ("2.13.0+cu126", "12.6", None)
    assert b.where.endswith("torch-2.13.0+cu126.dist-info")


def test_read_build_of_a_cpu_build(tmp_path):
    lay_out(tmp_path, "2.13.0+cpu", VERSION_PY.replace("'12.6'", "None"))
    b = torchbuild.read_build(tmp_path)
    assert b is not None and b.cuda is None and b.describe() == "2.13.0+cpu (no CUDA)"


def test_a_torch_named_neighbour_is_not_torch(tmp_path):
    sp = tmp_path / "lib/python3.11/site-packages"
    (sp / "torch_geometric-2.6.0.dist-info").mkdir(parents=True)
    (sp / "torch_geometric-2.6.0.dist-info" / "METADATA").write_text(
        "Name: torch_geometric\nVersion: 2.6.0\n"
    )
    lay_out(tmp_path, "2.13.0+cu126", VERSION_PY)
    b = torchbuild.read_build(tmp_path)
    assert b is not None and b.version == "2.13.0+cu126"


def test_the_hint_for_a_missing_gpu_arch_is_not_about_the_mirror_alone():
    arch = torchbuild.mismatch_hint("demo", [f"{torchbuild.ARCH_PROBLEM} sm_90 (compute capability 9.0); x"])
    assert arch.startswith("the build is the planned variant but lacks the target's GPU code")
    other = torchbuild.mismatch_hint("demo", ["local label +cpu, planned +cu126"])
    assert other.startswith("the index the install read does not serve the planned build")
