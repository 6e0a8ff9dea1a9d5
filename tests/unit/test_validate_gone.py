"""`validate` of an env whose prefix is gone stops before anything is launched, and says how to get it back."""

from __future__ import annotations

from pathlib import Path

from helpers import run_cli, user_env

from envbuilder.system import state


def test_validate_refuses_an_env_whose_prefix_is_gone(tmp_path: Path) -> None:
    env = user_env(tmp_path, "")
    prefix = tmp_path / "scratch" / "envs" / "gone"
    record = state.EnvRecord("gone", "vcpu", "", str(prefix), "now", plan={"kind": "venv"})
    state.save(Path(env["ENVBUILDER_HOME"]), record)
    res = run_cli("validate", "gone", "--cpu", env=env)
    assert res.returncode == 9, res.stderr
    assert f"gone is gone from {prefix}" in res.stderr
    assert "envbuilder create vcpu" in res.stderr
