"""Build helpers: uv cache placement and link mode, flock detection, argv rebasing, build variables."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from envbuilder.backends import base, buildlog, installers, uvcache, venv
from envbuilder.core.errors import BackendError, CommandFailed
from envbuilder.plan.steps import InstallStep
from envbuilder.system import envwalk


def test_flock_works_on_a_local_disk(tmp_path):
    assert uvcache.flock_works(tmp_path / "cache") is True


def test_cache_goes_beside_the_envs_on_scratch_and_hardlinks(tmp_path):
    env = {"SCRATCH": str(tmp_path / "scratch"), "HOME": str(tmp_path / "home")}
    s = uvcache.uv_settings(tmp_path / "scratch" / "envbuilder" / "envs" / "x", env)
    assert s.cache_dir == str(tmp_path / "scratch" / "envbuilder" / "uv-cache")
    assert s.link_mode == "hardlink"
    assert s.env()["UV_CACHE_DIR"] == s.cache_dir
    assert s.env()["UV_PYTHON_DOWNLOADS"] == "never"


def test_users_own_uv_settings_win(tmp_path):
    env = {"UV_CACHE_DIR": str(tmp_path / "mine"), "UV_LINK_MODE": "symlink", "SCRATCH": str(tmp_path)}
    s = uvcache.uv_settings(tmp_path / "env", env)
    assert (s.cache_dir, s.link_mode) == (str(tmp_path / "mine"), "symlink")
    assert "UV_LINK_MODE" in s.reasons[-1]


def test_no_flock_moves_the_cache_to_a_local_disk(tmp_path):
    env = {"SCRATCH": str(tmp_path / "lustre"), "TMPDIR": str(tmp_path / "local")}
    s = uvcache.uv_settings(tmp_path / "lustre" / "env", env, flock_probe=lambda d: False)
    assert s.cache_dir == str(tmp_path / "local" / f"envbuilder-uv-cache-{os.getuid()}")
    assert any("flock does not work" in r for r in s.reasons)
    assert oct(Path(s.cache_dir).stat().st_mode & 0o777) == "0o700"


def test_cache_on_another_file_system_means_copies(tmp_path):
    shm = Path("/dev/shm")
    if not shm.is_dir() or shm.stat().st_dev == tmp_path.stat().st_dev:
        pytest.skip("needs /dev/shm on a file system other than the temporary directory's")
    cache = shm / f"envbuilder-test-{os.getpid()}"
    try:
        s = uvcache.uv_settings(tmp_path / "env", {"ENVBUILDER_UV_CACHE": str(cache)})
        assert s.link_mode == "copy"
        assert "different file systems" in s.reasons[-1]
    finally:
        for p in sorted(cache.rglob("*"), reverse=True):
            p.unlink() if p.is_file() else p.rmdir()
        cache.rmdir()


def test_rebase_moves_only_the_prefix_and_paths_under_it():
    argv = [
        "uv",
        "pip",
        "install",
        "--python",
        "/s/env/bin/python",
        "--constraint",
        "/s/env/envbuilder/c.txt",
        "/s/envy",
    ]
    assert base.rebase(argv, "/s/env", "/s/.env.partial-1") == [
        "uv",
        "pip",
        "install",
        "--python",
        "/s/.env.partial-1/bin/python",
        "--constraint",
        "/s/.env.partial-1/envbuilder/c.txt",
        "/s/envy",
    ]


def test_step_variables_expand_from_the_module_environment():
    step = InstallStep(("pip",), env={"HOME_CUDA": "${NVHPC_ROOT}/cuda", "LIB": "${HOME_CUDA}/lib64"})
    full, own = base.step_env(step, {"NVHPC_ROOT": "/opt/nv", "PATH": "/bin"})
    assert own == {"HOME_CUDA": "/opt/nv/cuda", "LIB": "/opt/nv/cuda/lib64"}
    assert full["PATH"] == "/bin"


def test_step_list_entries_go_before_the_module_value_and_expand():
    step = InstallStep(
        ("pip",),
        env={"CUDA": "${NVHPC_ROOT}/cuda"},
        env_prepend={"LIBRARY_PATH": ("${CUDA}/lib64/stubs", "/opt/x"), "CPATH": ("/inc",)},
    )
    full, own = base.step_env(step, {"NVHPC_ROOT": "/opt/nv", "LIBRARY_PATH": "/opt/nv/math/lib64"})
    assert own["LIBRARY_PATH"] == "/opt/nv/cuda/lib64/stubs:/opt/x:/opt/nv/math/lib64"
    assert own["CPATH"] == "/inc"  # nothing before: no empty entry (the current directory)
    assert full["LIBRARY_PATH"] == own["LIBRARY_PATH"]
    assert step.display()[:4] == (
        "env",
        "CUDA=${NVHPC_ROOT}/cuda",
        "LIBRARY_PATH=${CUDA}/lib64/stubs:/opt/x:$LIBRARY_PATH",
        "CPATH=/inc:$CPATH",
    )
    with pytest.raises(BackendError, match=r"\$NVHPC_ROOT"):
        base.step_env(InstallStep(("pip",), env_prepend={"LIBRARY_PATH": ("${NVHPC_ROOT}/stubs",)}), {})


def test_step_variable_without_its_module_is_an_error():
    step = InstallStep(("pip",), env={"X": "${NVHPC_ROOT}/cuda"})
    with pytest.raises(BackendError, match=r"\$NVHPC_ROOT"):
        base.step_env(step, {})


@pytest.mark.parametrize("prefix", ["/s/a b", "/s/$(x)", "/s/'q'", "/s/`x`", '/s/"d"'])
def test_unquoting_installers_refuse_hostile_prefixes(prefix):
    with pytest.raises(BackendError, match="carry the path unquoted"):
        installers.choose("pip", prefix, "recipe")


def test_uv_takes_any_prefix():
    assert installers.choose("uv", "/s/a b $(x)", "recipe").name == "uv"


def test_relocate_rewrites_activate_and_script_headers(tmp_path):
    b = tmp_path / ".e.partial-1"
    (b / "bin").mkdir(parents=True)
    (b / "bin" / "activate").write_text(f"VIRTUAL_ENV='{b}'\n")
    (b / "bin" / "tool").write_text(f"#!{b}/bin/python\nimport x\n")
    (b / "bin" / "blob").write_bytes(b"\0\0ELF" + str(b).encode())
    (b / "pyvenv.cfg").write_text("home = /usr/bin\n")
    changed = venv.relocate_scripts(b, tmp_path / "e")
    assert sorted(changed) == ["activate", "tool"]
    assert (b / "bin" / "tool").read_text().startswith(f"#!{tmp_path / 'e'}/bin/python\n")
    assert str(b).encode() in (b / "bin" / "blob").read_bytes()  # binaries untouched


def _swept(root: Path) -> list[str]:
    with buildlog.world_write_swept(root) as swept:
        pass
    return swept.fixed


def test_world_write_is_swept(tmp_path):
    f = tmp_path / ".lock"
    f.write_text("")
    f.chmod(0o666)
    (tmp_path / "link").symlink_to(f)
    assert _swept(tmp_path) == [".lock"]
    assert oct(f.stat().st_mode & 0o777) == "0o664"
    tmp_path.chmod(0o777)  # the env's own directory too
    assert _swept(tmp_path) == ["."]
    assert oct(tmp_path.stat().st_mode & 0o777) == "0o775"
    # A walk that could not see everything fails the sweep (the measure alone takes what it saw).
    with pytest.raises(CommandFailed):
        _swept(tmp_path / "gone")
    assert envwalk.measure(tmp_path / "gone", purged=False)["count"] == 0
