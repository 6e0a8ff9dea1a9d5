"""The failure signature registry (envbuilder/doctor/signatures.py) and the explanation tied to an env
(doctor/explanation.py): the shipped files load and every pattern in them is safe to run on any output; a site
file's mistakes are refused with the file and the entry named; a match pulls its facts; the env's side of a match
says what the env's record and torch tell; the job's env is found in its variables or script; the schedulers'
records are read from what their tools print."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import pytest

from envbuilder.core._toml import loads
from envbuilder.core.errors import RecipeError
from envbuilder.core.schedulers.base import JobRecord
from envbuilder.core.schedulers.pbs import SCHEDULER as PBS
from envbuilder.core.schedulers.slurm import SCHEDULER as SLURM
from envbuilder.doctor import explanation, signatures
from envbuilder.doctor.explanation import EnvFacts, Explanation

SHIPPED = Path(signatures.__file__).resolve().parents[1] / "data" / "signatures"


def shipped() -> list[signatures.Signature]:
    out: list[signatures.Signature] = []
    for path in sorted(SHIPPED.glob("*.toml")):
        out += signatures.parse(loads(path.read_text(encoding="utf-8")), path.name)
    return out


def entry(**fields: object) -> str:
    base = {
        "id": "site-x",
        "contains": ["boom"],
        "means": "m",
        "fix": "f",
        "source": "https://example.org (2026)",
    }
    base.update(fields)
    lines = ["schema_version = 1", "[[signature]]"]
    for key, value in base.items():
        if isinstance(value, dict):
            continue
        lines.append(f"{key} = {_toml(value)}")
    for key, value in base.items():
        if isinstance(value, dict):
            lines.append(f"[signature.{key}]")
            lines += [f"{k} = {_toml(v)}" for k, v in value.items()]
    return "\n".join(lines) + "\n"


def _toml(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return "'" + str(value) + "'"


def parse(text: str) -> list[signatures.Signature]:
    return signatures.parse(loads(text), "site/extra.toml")


def test_shipped_registry_loads_with_the_required_signatures_and_their_sources() -> None:
    registry = shipped()
    ids = [s.id for s in registry]
    assert len(ids) == len(set(ids))
    for required in (
        "cuda-no-kernel-image",
        "nccl-ofi-plugin",
        "nccl-watchdog-timeout",
        "cray-gtl-not-linked",
        "cuda-library-missing",
        "slurm-oom-kill",
        "killed-by-sigkill",
        "cuda-out-of-memory",
        "python-module-missing",
        "cuda-driver-too-old",
        "torchrun-rank-killed",
        "gloo-timeout",
    ):
        assert required in ids
    for sig in registry:
        assert sig.source.startswith("https://"), sig.id
        assert "20" in sig.source, f"{sig.id}: its source carries no date"


@pytest.mark.parametrize(
    ("pattern", "problem"),
    [
        ("(a+)+b", "repetition of more than one"),
        ("(a|aa)*c", "repetition of more than one"),
        ("(x)\\1", "back reference"),
        ("(?=x)y", "look-around"),
        ("a+b+c+d+", "more than 3 repetitions"),
        ("x" * 400, "longer than"),
        ("(unclosed", "not a regular expression"),
    ],
)
def test_unsafe_patterns_are_refused(pattern: str, problem: str) -> None:
    found = signatures.pattern_problem(pattern)
    assert found is not None and problem in found
    with pytest.raises(RecipeError) as caught:
        parse(entry(regex=[pattern]))
    assert "site/extra.toml" in caught.value.message and "signature 'site-x'.regex" in caught.value.message


def test_every_shipped_pattern_stays_linear_on_hostile_lines() -> None:
    """Lines built to make a backtracking pattern explode (long runs of what the patterns' classes take, and of
    their literal parts): the whole registry over them takes a fraction of a second, not minutes."""
    registry = shipped()
    unit = "lib" + "cu" + "a_" * 10 + ".so.1" + " line 12:  " + "sm_90 " + "rank : "
    hostile = [
        "a" * signatures.MAX_LINE,
        " " * signatures.MAX_LINE,
        "0" * signatures.MAX_LINE,
        (unit * 200)[: signatures.MAX_LINE],
        ("gloo/" + "x" * 50) * 80,
    ]
    text = "\n".join(hostile * 20)
    began = time.monotonic()
    signatures.match(text, registry)
    assert time.monotonic() - began < 5


def test_a_site_file_mistake_names_the_file_the_entry_and_the_key() -> None:
    with pytest.raises(RecipeError, match=r"site/extra.toml: signature\[0\].contain: unknown key") as caught:
        parse(entry(contain=["x"]))
    assert caught.value.hint == "did you mean 'contains'?"
    with pytest.raises(RecipeError, match=r"signature\[0\].source: expected a non-empty string"):
        parse(entry(source=""))
    with pytest.raises(RecipeError, match=r"facts.sm: .*expected exactly one \(group\)"):
        parse(entry(facts={"sm": "(a)(b)"}))
    with pytest.raises(RecipeError, match="expected contains or regex"):
        parse(entry(contains=[]))
    with pytest.raises(RecipeError, match="schema_version"):
        signatures.parse(loads("schema_version = 2\n"), "x.toml")


def test_a_site_entry_replaces_the_shipped_one_of_its_id_and_a_duplicate_is_refused() -> None:
    site = parse(entry(id="python-module-missing", contains=["ImportError: site says"]))
    merged = signatures.merge(shipped(), site)
    mine = [s for s in merged if s.id == "python-module-missing"]
    assert [s.file for s in mine] == ["site/extra.toml"]
    with pytest.raises(RecipeError, match="defined twice"):
        signatures.merge(shipped(), [*site, *site])


def test_matches_in_the_order_of_their_first_line_with_their_facts() -> None:
    text = "\n".join(
        [
            "starting",
            "torch/cuda/__init__.py:230: UserWarning: Tesla V100-SXM2-16GB with CUDA capability sm_70 is not "
            "compatible with the current PyTorch installation.",
            "The current PyTorch install supports CUDA capabilities sm_80 sm_86 sm_90.",
            "RuntimeError: CUDA error: no kernel image is available for execution on the device",
        ]
    )
    found = signatures.match(text, shipped())
    assert [m.signature.id for m in found] == ["cuda-capability-not-supported", "cuda-no-kernel-image"]
    assert found[1].fact == {"gpu_sm": "sm_70", "wheel_sms": "sm_80 sm_86 sm_90"}
    assert found[1].lines == (
        (4, "RuntimeError: CUDA error: no kernel image is available for execution on the device"),
    )
    assert "than sm_70" in found[1].text("means")


#: The end of torchrun's output when rank 1 of two was killed with SIGKILL (torch 2.13.0, this machine's CPU env:
#: tests/integration/test_explain.py makes it for real): rank 0 was ended by torchrun, rank 1 is the root cause.
TORCHRUN_END = """\
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
train.py FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2026-11-28_13:34:04
  host      : localhost
  rank      : 0 (local_rank: 0)
  exitcode  : -15 (pid: 1846)  (SIGTERM)
  error_file: <N/A>
  traceback : Signal 15 (SIGTERM) received by PID 1846
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-28_13:34:04
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : -9 (pid: 1847)  (SIGKILL)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 1847
============================================================
"""


def test_a_fact_comes_from_the_lines_nearest_the_match() -> None:
    found = {m.signature.id: m for m in signatures.match(TORCHRUN_END, shipped())}
    assert found["torchrun-rank-killed"].fact == {"rank": "1"}
    assert found["torchrun-child-failed"].fact == {"rank": "1", "exitcode": "-9"}


def test_a_fact_the_output_does_not_tell_reads_as_its_words_or_a_question_mark() -> None:
    # The H200 log (CUDA_FORCE_PTX_JIT) names no arch: the sentence reads whole, with the words the template gives.
    (m,) = signatures.match(
        "RuntimeError: CUDA error: no kernel image is available for execution on the device", shipped()
    )
    assert m.text("means").endswith("built for other GPU architectures than the one it ran on"), m.text(
        "means"
    )
    (m,) = signatures.match("NCCL WARN Watchdog caught collective operation timeout", shipped())
    sig = m.signature
    plain = signatures.Match(
        replace(sig, means="ran {op} for {timeout_ms|a while} ({nope})"),
        m.lines,
        m.count,
        (("op", "ALLREDUCE"),),
    )
    assert plain.text("means") == "ran ALLREDUCE for a while ({nope})"
    assert signatures.Match(replace(sig, means="{op}"), m.lines, m.count, ()).text("means") == "?"


def gpu_env(**fields: object) -> EnvFacts:
    base: dict = {
        "name": "big",
        "named_by": "--env",
        "torch": "2.13.0",
        "variant": "cu130",
        "cuda": "13.0",
        "arch_flags": ("sm_75", "sm_80", "sm_90", "sm_100", "sm_120"),
        "packages": ("torch", "numpy", "PyYAML"),
        "recipe": "site-cu130",
    }
    base.update(fields)
    return EnvFacts(**base)


def note(text: str, env: EnvFacts) -> list[str]:
    (m,) = [m for m in signatures.match(text, shipped()) if m.signature.id != "cuda-capability-not-supported"]
    return Explanation(source="x", matches=(m,), env=env).notes(m)


def test_the_jobs_gpu_against_the_envs_arch_list() -> None:
    warn = "Tesla V100 with CUDA capability sm_70 is not compatible\nCUDA error: no kernel image is available for execution on the device"
    (line,) = note(warn, gpu_env())
    assert (
        "big's torch 2.13.0 (cu130) has sm_75 sm_80 sm_90 sm_100 sm_120; the job ran on sm_70: sm_70 is not in that list"
        in line
    )
    assert "envbuilder plan site-cu130 --facts NODE.json" in line
    (line,) = note(warn.replace("sm_70", "sm_90"), gpu_env())
    assert "sm_90 is in that list" in line and "did not run this env's torch" in line
    (line,) = note(warn, gpu_env(arch_flags=None, arch_unknown="no torch installed under /p"))
    assert "could not be read (no torch installed under /p)" in line


def test_a_missing_module_against_the_envs_packages() -> None:
    (line,) = note("ModuleNotFoundError: No module named 'yaml'", gpu_env())
    assert "yaml is installed in big: the job's python was not big's" in line
    (line,) = note("ModuleNotFoundError: No module named 'scipy.linalg'", gpu_env())
    assert "scipy is not among big's packages: add it to the recipe (site-cu130)" in line


def test_a_driver_too_old_against_the_cuda_the_envs_torch_was_built_for() -> None:
    (line,) = note(
        "RuntimeError: The NVIDIA driver on your system is too old (found version 11040).", gpu_env()
    )
    assert "big's torch 2.13.0 is built for CUDA 13.0 (cu130); the node's driver supports CUDA 11.4" in line


def test_nothing_matched_says_so_and_offers_doctor() -> None:
    result = Explanation(source="x", matches=(), env=gpu_env())
    assert (
        result.next_step()
        == "no known signature in this output; run `envbuilder doctor big` to check the env itself"
    )
    assert result.to_json()["known"] is False


@pytest.mark.parametrize(
    ("script", "variables", "found"),
    [
        (
            "#!/bin/bash\nexport ENVBUILDER_ENV=big\npython x.py\n",
            {},
            ("big", "the job script's ENVBUILDER_ENV"),
        ),
        ('eval "$(envbuilder activate big)"\n', {}, ("big", "the job script's envbuilder line")),
        ("envbuilder run big -- python x.py\n", {}, ("big", "the job script's envbuilder line")),
        ("envbuilder run --launcher srun unknown -- x\n", {}, None),  # no recorded env of that name
        (
            "envbuilder run --launcher local big python x.py\n",
            {},
            ("big", "the job script's envbuilder line"),
        ),
        ("source /scratch/envs/big/bin/activate\n", {}, ("big", "the job script's activate line")),
        (". '/scratch/envs/big/bin/activate'\n", {}, ("big", "the job script's activate line")),
        ("source /elsewhere/bin/activate\n", {}, None),
        ("", {"ENVBUILDER_ENV": "big"}, ("big", "the job's ENVBUILDER_ENV variable")),
    ],
)
def test_the_env_a_job_ran_from_its_script_or_variables(script: str, variables: dict, found: object) -> None:
    assert explanation.env_in_script(script, variables, {"/scratch/envs/big": "big"}) == found


def test_slurm_records_from_scontrol_and_sacct() -> None:
    scontrol = (
        "JobId=42 JobName=train UserId=u(1) JobState=FAILED Reason=NonZeroExitCode ExitCode=1:0 "
        "NodeList=n[1-2] Command=/home/u/my jobs/run.sh WorkDir=/home/u/my jobs "
        "StdErr=/home/u/my jobs/slurm-42.out StdIn=/dev/null StdOut=/home/u/my jobs/slurm-42.out Power=\n"
    )
    record = SLURM.job_record("42", ["scontrol", "-o", "show", "job", "42"], scontrol)
    assert record is not None
    assert (record.state, record.exit_code, record.nodes) == ("FAILED", "1:0", "n[1-2]")
    assert record.outputs == ("/home/u/my jobs/slurm-42.out",)
    assert record.script == "/home/u/my jobs/run.sh"
    sacct = "42|OUT_OF_MEMORY|0:125|n1|/w/out-%j.txt|/w/err-%j.txt|/w\n"
    record = SLURM.job_record("42", ["sacct"], sacct)
    assert record is not None
    assert record.state == "OUT_OF_MEMORY" and record.outputs == ("/w/out-42.txt", "/w/err-42.txt")
    assert SLURM.job_record("42", ["scontrol"], "") is None


def test_pbs_record_from_qstat_x_f() -> None:
    """The shape of PBS Pro's ``qstat -x -f`` (a job's attributes; long values go on after a tab), written here
    from PBS Pro's reference guide's attribute names: no PBS server runs on this machine."""
    text = (
        "Job Id: 7.pbs01\n"
        "    Job_Name = train\n"
        "    job_state = F\n"
        "    exec_host = x3006c0s19b1n0/0*64\n"
        "    Exit_status = 137\n"
        "    Join_Path = oe\n"
        "    Output_Path = polaris-login-01:/home/u/train.o7\n"
        "    Error_Path = polaris-login-01:/home/u/train.e7\n"
        "    Variable_List = PBS_O_HOME=/home/u,PBS_O_WORKDIR=/home/u,ENVBUILDER_E\n"
        "\tNV=big,PBS_O_QUEUE=debug\n"
    )
    record = PBS.job_record("7", ["qstat", "-x", "-f", "7"], text)
    assert record is not None
    assert (record.job, record.state, record.exit_code) == ("7.pbs01", "F", "137")
    assert record.outputs == ("/home/u/train.o7",)
    assert record.variables["ENVBUILDER_ENV"] == "big"
    assert record.workdir == "/home/u"


@pytest.mark.parametrize(
    ("state", "exit_code", "words"),
    [
        ("OUT_OF_MEMORY", "0:125", "OUT_OF_MEMORY: Slurm's memory limit"),
        ("TIMEOUT", "0:0", "TIMEOUT: its time limit"),
        ("CANCELLED by 0", "0:15", "CANCELLED: a cancel"),
        ("FAILED", "0:9", "exit code 0:9: signal 9 (SIGKILL: the out-of-memory killer"),
        ("FAILED", "1:0", None),
    ],
)
def test_how_a_slurm_job_ended(state: str, exit_code: str, words: object) -> None:
    found = SLURM.ending(JobRecord(job="1", source="scontrol show job", state=state, exit_code=exit_code))
    assert found == words if words is None else (found or "").startswith(str(words))


@pytest.mark.parametrize(
    ("status", "words"),
    [
        ("271", "Exit_status 271: signal 15 (SIGTERM"),
        ("137", "Exit_status 137: signal 9 (SIGKILL"),
        ("-11", "Exit_status -11: PBS itself could not start or run the job"),
        ("1", None),
    ],
)
def test_how_a_pbs_job_ended(status: str, words: object) -> None:
    found = PBS.ending(JobRecord(job="1", source="qstat -x -f", exit_code=status))
    assert found == words if words is None else (found or "").startswith(str(words))
