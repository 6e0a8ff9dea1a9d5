"""`envbuilder validate` end to end on a real env (torch 2.13.0 CPU, mpi4py, MPICH from PyPI): real torchrun with
gloo, real mpiexec (MPICH's Hydra), the ibrun stand-in over it, and faults injected into real ranks."""

from __future__ import annotations

import json
import shutil
import time
import xml.etree.ElementTree as ET  # parses the report this test had written
from pathlib import Path

import pytest
from helpers import FACTS, REPO

from envbuilder.system import state

pytestmark = [pytest.mark.integration, pytest.mark.mpi]

SHIMS = REPO / "tests" / "shims"


def _checks(envelope):
    return envelope["data"]["checks"]


def test_torchrun_gloo_cpu_suite_passes(validate_world, tmp_path):
    junit = tmp_path / "report.xml"
    res, env = validate_world.validate("--junit", str(junit))
    assert res.returncode == 0, res.stderr
    data = env["data"]
    assert data["launcher"] == "torchrun" and data["device"] == "cpu" and data["world"] == 2
    checks = _checks(env)
    for name in ("import", "libraries", "nccl", "ddp", "filesystem"):
        assert checks[name]["status"] == "pass", (name, checks[name])
        assert checks[name]["ranks"] == [0, 1]
    for name in ("gpu", "arch", "cuda"):
        assert checks[name]["status"] == "skip" and "CPU run" in checks[name]["reason"]
    assert "not launched by an MPI launcher" in checks["mpi"]["reason"]
    assert "horovod is not installed" in checks["horovod"]["reason"]
    # Correctness and the figures: the sweep reaches 16 MiB, busbw follows nccl-tests' definition for 2 ranks.
    sweep = checks["nccl"]["per_rank"]["0"]["sweep"]
    assert sweep[-1]["bytes"] == 16 << 20
    # --json keeps the figures' keys, which the human report puts in words: they are an interface.
    assert {"busbw", "busbw_peak", "latency_small_us"} <= set(checks["nccl"]["figures"])
    for row in sweep:
        assert row["busbw"] == pytest.approx(row["algbw"] * 2 * (2 - 1) / 2)
        assert row["algbw"] == pytest.approx(row["bytes"] / (row["us"] / 1e6) / 1e9)
    losses = checks["ddp"]["per_rank"]["0"]["losses"]
    assert losses[-1] < losses[0] and checks["ddp"]["per_rank"]["1"]["param_spread"] == 0.0
    # The file system check wrote under $SCRATCH and left nothing behind.
    assert checks["filesystem"]["per_rank"]["0"]["dirs"][0]["dir"] == validate_world.env["SCRATCH"]
    assert not list(Path(validate_world.env["SCRATCH"]).glob(".envbuilder-fscheck*"))
    # The any-partition reference was evaluated (and held); the refcheck one did not apply here.
    refs = checks["import"]["references"]
    assert [r["verdict"] for r in refs] == ["ok"]
    assert checks["nccl"]["references"] == []
    # JUnit for dashboards: one testcase per check, skips marked, and one for drift where a figure drifted from
    # this env's history (the worker's earlier runs of it: on a loaded machine the import time can jump).
    suite = ET.parse(junit).getroot()  # noqa: S314 - our own output
    cases = {c.get("name"): c for c in suite.iter("testcase")}
    assert sorted(cases) == sorted([*checks, *(["drift"] if data["drift"] else [])])
    assert suite.get("tests") == str(len(cases)) and suite.get("failures") == "0"
    assert cases["gpu"].find("skipped") is not None
    assert "busbw" in cases["nccl"].find("system-out").text
    # The report is kept in the env's record, and `show` prints it.
    record = state.load(Path(validate_world.env["ENVBUILDER_HOME"]), "vcpu")
    assert record.validation["kind"] == "suite" and record.validation["ok"] is True
    shown = validate_world.cli("show", "vcpu")
    assert "ddp: pass" in shown.stdout


def test_torchrun_agent_runs_through_the_payload_wrapper_and_ranks_say_when_they_started(validate_world):
    # The agent is the payload's wrapper around torchrun (it leaves without tearing torch down); torchrun's exit
    # status comes through it: 0 here, 1 (a failed worker) in the fault below.
    res, env = validate_world.validate("--checks", "import")
    assert res.returncode == 0, res.stderr
    data = env["data"]
    assert data["command"][1].endswith("/payloads/envbuilder_torchrun.py"), data["command"]
    assert data["exit_code"] == 0
    # Each rank's hello says when it and its agent started (scripts/bench_validate.py splits a run's wall time
    # with them): the agent first, then the rank, then its hello; all within this run.
    run = max(
        (validate_world.prefix / "envbuilder" / "validation").glob("run-*"), key=lambda p: p.stat().st_mtime
    )
    for rank in (0, 1):
        lines = (run / "ranks" / f"rank-{rank}.jsonl").read_text().splitlines()
        hello = json.loads(lines[0])
        assert hello["event"] == "hello", hello
        tick = 0.05  # /proc counts start times and uptime in clock ticks (10 ms), read at two moments
        assert hello["agent_started"] <= hello["started"] + tick and hello["started"] <= hello["t"] + tick, (
            hello
        )
        assert hello["t"] - hello["agent_started"] < 600, hello
    failed, env = validate_world.validate(
        "--checks", "import", extra={"ENVBUILDER_VALIDATE_FAULT": "1:import:exit"}
    )
    assert failed.returncode == 8, failed.stderr
    assert env["data"]["exit_code"] == 1, env["data"]
    tail = env["data"]["stderr_tail"]  # torchrun's own account of the failed worker, through the wrapper
    assert "Root Cause" in tail and "exitcode  : 17" in tail, tail


def test_mpiexec_runs_the_mpi_check(validate_world):
    res, env = validate_world.validate("--launcher", "mpiexec", "--checks", "import,mpi,nccl,filesystem")
    # A failed check's cause is in the report, not on stderr (it failed once, 2026-11-29, in a full run only).
    checks = _checks(env)
    assert res.returncode == 0, (res.stderr, {k: c for k, c in checks.items() if c.get("status") != "pass"})
    mpi = checks["mpi"]
    assert mpi["status"] == "pass", mpi
    assert mpi["per_rank"]["0"]["library"].startswith("MPICH")
    # MPI started before torch was imported (Cray MPICH's GPU support needs that order), on every rank.
    assert [mpi["per_rank"][r]["import_order"] for r in ("0", "1")] == [["mpi4py", "torch"]] * 2
    assert [m["rank"] for m in mpi["per_rank"]["0"]["mapping"]] == [0, 1]
    assert checks["nccl"]["status"] == "pass"
    assert env["data"]["command"][:4] == ["mpiexec", "-n", "2", "--ppn"]


def test_ibrun_stand_in_runs_the_ranks(validate_world):
    path = f"{SHIMS / 'tacc'}:{validate_world.env['PATH']}"
    res, env = validate_world.validate("--launcher", "ibrun", "--checks", "import,mpi", extra={"PATH": path})
    assert res.returncode == 0, res.stderr
    assert env["data"]["command"][:3] == ["ibrun", "-n", "2"]
    assert _checks(env)["mpi"]["status"] == "pass"


def test_a_rank_that_exits_fails_its_check_and_names_it(validate_world):
    t0 = time.monotonic()
    res, env = validate_world.validate(
        "--checks", "import,nccl,ddp", extra={"ENVBUILDER_VALIDATE_FAULT": "1:nccl:exit"}
    )
    assert res.returncode == 8, res.stderr
    nccl = _checks(env)["nccl"]
    assert nccl["status"] == "fail"
    assert "rank 1 died during this check" in nccl["cause"]
    # Rank 0, terminated by torchrun after rank 1 died, is not blamed for whatever it was doing.
    assert _checks(env)["import"]["status"] != "fail"
    assert _checks(env)["ddp"]["status"] == "skip"
    assert time.monotonic() - t0 < 300  # bounded by the per-check timeout, not a hang


def test_a_hung_rank_is_a_fail_within_the_timeout(validate_world):
    res, env = validate_world.validate(
        "--checks",
        "import,ddp",
        "--timeout",
        "15",
        extra={"ENVBUILDER_VALIDATE_FAULT": "1:ddp:hang"},
        timeout=300,
    )
    assert res.returncode == 8, res.stderr
    ddp = _checks(env)["ddp"]
    assert ddp["status"] == "fail"
    # Whether rank 1 timed out too or torchrun terminated it first, the report singles it out: it got least far.
    assert "rank 1: hung" in ddp["cause"]
    # Rank 0 timed out waiting, or (rank 1's watchdog first) torchrun stopped it, and then it is not blamed.
    assert "rank 0" not in ddp["cause"] or "rank 0: waited for rank 1 until it timed out" in ddp["cause"]


def test_ld_library_path_shadowing_a_wheel_library_is_caught(validate_world, tmp_path):
    other = tmp_path / "othercopy"
    other.mkdir()
    site = next(validate_world.prefix.glob("lib/python*/site-packages"))
    shutil.copy(site / "torch" / "lib" / "libgomp.so.1", other / "libgomp.so.1")
    res, env = validate_world.validate("--checks", "import,libraries", extra={"LD_LIBRARY_PATH": str(other)})
    assert res.returncode == 8, res.stderr
    lib = _checks(env)["libraries"]
    assert lib["status"] == "fail"
    assert f"libgomp from {other}/libgomp.so.1 (through LD_LIBRARY_PATH)" in lib["cause"]


def test_wrong_gpu_count_names_the_cause(validate_world):
    # This host, described as a 1x H100 node: the env's torch is the CPU build, so torch sees no GPU.
    res, env = validate_world.validate("--checks", "import,gpu,arch", "--facts", str(FACTS / "h100.json"))
    assert res.returncode == 8, res.stderr
    gpu = _checks(env)["gpu"]
    assert gpu["status"] == "fail"
    assert "promises 2 GPU(s)" in gpu["cause"] and "CPU build" in gpu["cause"]


def test_a_reference_out_of_bounds_fails_and_shows_the_reference(validate_world):
    # As inside a job on the partition "refcheck" (a job sets both variables).
    job = {"SLURM_JOB_ID": "4242", "SLURM_JOB_PARTITION": "refcheck"}
    res, env = validate_world.validate("--checks", "import,nccl", extra=job)
    assert res.returncode == 8, res.stderr
    nccl = _checks(env)["nccl"]
    assert nccl["status"] == "fail"
    assert "below the reference 1000000.0 GB/s -10%" in nccl["cause"]
    assert "partition refcheck" in nccl["cause"]
    assert nccl["references"][0]["verdict"] == "out"


def test_gpu_env_on_a_host_without_gpus_says_where_to_run(validate_world):
    # The same env described as one for GPUs (a recipe whose compute partition has them).
    path = validate_world.variant(
        "vgpu",
        lambda t: t + '\n[compute]\ngpus_per_node = 2\ngpu = "NVIDIA H100"\ncompute_capability = "9.0"\n',
    )
    res = validate_world.cli(
        "validate", "vgpu", "--facts", str(FACTS / "cpu-only.json"), extra={"ENVBUILDER_RECIPE_PATH": path}
    )
    assert res.returncode == 8, res.stderr
    assert "has no GPU; the env is for 2× NVIDIA H100" in res.stderr
    assert "srun --partition=debug --nodes=1 --ntasks-per-node=1" in res.stderr
    assert "envbuilder validate vgpu --submit" in res.stderr
    assert "Traceback" not in res.stderr


def test_unknown_check_is_a_usage_error(validate_world):
    res = validate_world.cli("validate", "vcpu", "--checks", "import,ncl")
    assert res.returncode == 2
    assert "unknown check(s): ncl" in res.stderr


def test_human_report_names_gloo_and_its_figures_in_words(validate_world):
    res = validate_world.cli("validate", "vcpu", "--cpu", "--checks", "import,nccl")
    assert res.returncode == 0, res.stderr
    said = res.stdout + res.stderr
    row = next(line for line in said.splitlines() if line.startswith("gloo "))
    assert "bus bandwidth" in row and "GB/s" in row and "small-message latency" in row and "µs" in row
    assert "busbw" not in said and "latency_small_us" not in said
    assert not any(line.startswith("nccl ") for line in said.splitlines())
    # --json keeps those keys (test_torchrun_gloo_cpu_suite_passes checks them on its run).


def test_a_second_create_reports_the_torch_the_env_holds(validate_world):
    res = validate_world.cli("create", "vcpu")
    assert res.returncode == 0, res.stderr
    said = res.stdout + res.stderr
    assert "nothing to do" in said
    assert "torch: 2.13.0" in said and "None" not in said
