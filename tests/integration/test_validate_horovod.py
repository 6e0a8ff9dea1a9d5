"""The horovod check runs the env's ``horovodrun --check-build`` (the Cirrus seed's own check) and reads its report.

Horovod cannot be built here, so the env's bin holds a stand-in ``horovodrun`` that prints Horovod's report
format. The env is a venv of its own whose site-packages reach the session's CPU torch env (a ``.pth`` line), so
the shared env stays as it is; the payload runs there as a single rank, and the report merges its events.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from helpers import REPO

from envbuilder.validate import report

pytestmark = [pytest.mark.integration]

PAYLOAD = REPO / "envbuilder" / "payloads" / "validate.py"

# Horovod's report (horovod/runner/launch.py, check_build), the stand-in prints it with these marks.
STAND_IN = """#!/bin/sh
# stand-in for horovodrun (Horovod cannot be built here): the report of --check-build
[ "$1" = --check-build ] || exit 2
cat <<'EOF'
Horovod v0.28.1:

Available Frameworks:
    [ ] TensorFlow
    [{pytorch}] PyTorch
    [ ] MXNet

Available Controllers:
    [X] MPI
    [ ] Gloo

Available Tensor Operations:
    [{nccl}] NCCL
    [ ] DDL
    [ ] CCL
    [X] MPI
    [ ] Gloo
EOF
"""


@pytest.fixture(scope="module")
def horovod_env(cpu_torch_world, tmp_path_factory) -> Path:
    """A venv whose python sees the session env's torch, with a bin of its own for the stand-in."""
    env = tmp_path_factory.mktemp("hvd") / "env"
    python = cpu_torch_world.prefix / "bin" / "python"
    subprocess.run([str(python), "-m", "venv", "--without-pip", str(env)], check=True, timeout=120)
    (_purelib(env / "bin" / "python") / "vcpu.pth").write_text(f"{_purelib(python)}\n")
    return env


def _purelib(python: Path) -> Path:
    code = "import sysconfig; print(sysconfig.get_path('purelib'))"
    res = subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=True, timeout=60)
    return Path(res.stdout.strip())


def _stand_in(env: Path, text: str) -> None:
    runner = env / "bin" / "horovodrun"
    runner.write_text(text)
    runner.chmod(0o755)


def _run(env: Path, tmp_path: Path, *args: str) -> report.Row:
    """The payload's horovod check as one rank, merged into its report row."""
    out = tmp_path / "out"
    shutil.rmtree(out, ignore_errors=True)
    argv = [
        str(env / "bin" / "python"),
        str(PAYLOAD),
        "--checks",
        "horovod",
        "--device",
        "cpu",
        "--out",
        str(out),
    ]
    res = subprocess.run(
        [*argv, *args],
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    events = report.parse_events((out / "rank-0.jsonl").read_text())
    row = report.merge(["horovod"], {0: events}, 1, res.returncode)[1]
    assert row.check == "horovod"
    return row


def test_a_build_with_pytorch_passes_and_names_what_was_built(horovod_env, tmp_path):
    _stand_in(horovod_env, STAND_IN.format(pytorch="X", nccl="X"))
    row = _run(horovod_env, tmp_path)
    assert row.status == "pass", row
    rank = row.per_rank[0]
    assert rank["horovodrun"] == str(horovod_env / "bin" / "horovodrun")
    assert (rank["frameworks"], rank["controllers"], rank["tensor_ops"]) == (
        ["PyTorch"],
        ["MPI"],
        ["NCCL", "MPI"],
    )


def test_a_build_without_pytorch_fails(horovod_env, tmp_path):
    _stand_in(horovod_env, STAND_IN.format(pytorch=" ", nccl="X"))
    row = _run(horovod_env, tmp_path)
    assert (row.status, row.cause) == ("fail", "horovod was built without PyTorch")
    assert "HOROVOD_WITH_PYTORCH=1" in (row.hint or "")


def test_nccl_operations_the_recipe_asks_for_must_be_built(horovod_env, tmp_path):
    # A CPU run asks for no NCCL of itself; the recipe's HOROVOD_GPU_OPERATIONS=NCCL does.
    _stand_in(horovod_env, STAND_IN.format(pytorch="X", nccl=" "))
    assert _run(horovod_env, tmp_path).status == "pass"
    row = _run(horovod_env, tmp_path, "--horovod-gpu-ops", "NCCL")
    assert row.status == "fail"
    assert row.cause == (
        "horovod has no NCCL tensor operations, which the recipe builds it with HOROVOD_GPU_OPERATIONS=NCCL"
    )


def test_a_failing_horovodrun_is_a_fail_with_its_words(horovod_env, tmp_path):
    _stand_in(horovod_env, "#!/bin/sh\necho 'ImportError: libmpi.so.40' >&2\nexit 1\n")
    row = _run(horovod_env, tmp_path)
    assert row.status == "fail"
    assert row.cause.endswith("--check-build failed (exit status 1): ImportError: libmpi.so.40")
