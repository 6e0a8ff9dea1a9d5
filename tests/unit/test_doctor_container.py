"""A container env's doctor checks (pure): the image file against its recorded sha256, the runtime on the PATH
its modules give, the python its programs run started inside the image; and no host python check, which a
container env (its python is the image's) cannot pass."""

from __future__ import annotations

import datetime
from dataclasses import replace

from envbuilder.core.facts import HostFacts
from envbuilder.doctor.container import ImageState, container_findings
from envbuilder.doctor.replan import PythonState
from envbuilder.doctor.report import Context, EnvInputs, check_env
from envbuilder.resolver.matrix import load_matrix
from envbuilder.system.state import EnvRecord, Health

SHA = "ab" * 32
IMAGE = "/scratch/u1/envs/box/image.sif"


def state(
    sha: str = SHA, runtime_path: str = "/opt/apptainer/bin/apptainer", problem: str = ""
) -> ImageState:
    return ImageState(IMAGE, SHA, sha, problem, "apptainer", runtime_path, "/usr/bin:/opt/apptainer/bin")


def test_the_image_that_was_recorded_and_its_runtime_are_ok():
    found = [(f.severity, f.check, f.message) for f in container_findings("box", state())]
    assert found == [
        ("info", "image", f"its image {IMAGE} is the one recorded (sha256 {SHA[:16]}…)"),
        ("info", "runtime", "apptainer runs its image: /opt/apptainer/bin/apptainer"),
    ]


def test_another_image_an_unreadable_one_and_a_missing_runtime_need_action():
    [changed, _] = container_findings("box", state(sha="cd" * 32))
    assert (changed.severity, changed.check) == ("action", "image")
    assert changed.message.startswith(f"its image {IMAGE} is not the one recorded: sha256 cdcdcdcdcdcdcdcd…")
    assert changed.fix == "envbuilder restore box --force (from a backup) or envbuilder create box --force"
    [unreadable, _] = container_findings("box", state(sha="", problem="Permission denied"))
    assert unreadable.message == f"its image {IMAGE} cannot be read: Permission denied"
    [_, runtime] = container_findings("box", state(runtime_path=""))
    assert (runtime.severity, runtime.check) == ("action", "runtime")
    assert runtime.message == (
        "apptainer, the runtime that runs its image, is not on the PATH its modules give "
        "(/usr/bin:/opt/apptainer/bin)"
    )


def test_a_container_env_gets_its_own_checks_and_no_python_check():
    record = EnvRecord(
        name="box",
        recipe="box",
        recipe_digest="",
        prefix="/scratch/u1/envs/box",
        created="2026-11-28",
        plan={"kind": "container"},
        tools={"runtime": "apptainer", "image_sha256": SHA},
    )
    inputs = EnvInputs(
        record=record,
        recipe=None,
        recipe_error=None,
        # What collect hands for a container env: its python was not run (there is no PREFIX/bin/python).
        python=PythonState("", False, "", runs=False, detail="No such file or directory"),
        health=Health("ok", "all files present"),
        purge=None,
        backups=(),
        lib_dirs=(),
        container=state(),
    )
    ctx = Context(facts=HostFacts(), env={}, today=datetime.date(2026, 11, 28), matrix=load_matrix())
    checks = {f.check for f in check_env(inputs, ctx, lambda _: [])}
    assert {"image", "runtime"} <= checks
    assert "python" not in checks


def test_the_python_inside_the_image_is_checked_through_the_runtime():
    venv = "/scratch/u1/envs/box/venv/bin/python"
    ran = replace(state(), python=venv, python_ok=True, python_said="3.11.2")
    assert [(f.severity, f.check, f.message) for f in container_findings("box", ran)][-1] == (
        "info",
        "python",
        f"{venv} starts inside its image: Python 3.11.2",
    )
    failed = replace(state(), python=venv, python_ok=False, python_said="No such file or directory")
    last = container_findings("box", failed)[-1]
    assert (last.severity, last.check, last.message) == (
        "action",
        "python",
        f"{venv} does not start inside its image through apptainer: No such file or directory",
    )
    assert last.fix == "envbuilder restore box --force (from a backup) or envbuilder create box --force"
