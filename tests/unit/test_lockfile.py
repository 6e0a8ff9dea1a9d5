"""Lockfiles without a resolver: their format and its errors, platform tags, and how a lock changes a plan
(applies, stale, missing platform, --locked, nightly). The real resolutions are in tests/integration/test_lock.py."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from envbuilder import lockfile, plan
from envbuilder.build import lockers
from envbuilder.core.errors import LockError
from envbuilder.core.facts import Gpu, HostFacts
from envbuilder.lockfile import pylock, reader
from envbuilder.plan import lockfit
from envbuilder.recipe.catalog import Catalog, Layer, builtin_dir
from envbuilder.recipe.loader import load

SHA_A = "a" * 64
SHA_B = "b" * 64
CPU_HOST = HostFacts(arch="x86_64", python="3.11.7", glibc="2.34", gpus=())
GH200 = HostFacts(
    arch="aarch64", python="3.11.7", glibc="2.34", driver_version="560.35.03", max_cuda="12.6",
    gpus=(Gpu("NVIDIA GH200 480GB", "9.0"),),
)  # fmt: skip
ENV = {"SCRATCH": "/scratch/u", "HOME": "/home/u"}

RECIPE = """
schema_version = 1
[recipe]
name = "demo"
[env]
kind = "venv"
installer = "uv"
prefix = "${{SCRATCH}}/envs/{{name}}"
[python]
command = "python3"
version = "3.11"
[torch]
install = true
version = "{torch}"
variant = "cpu"
channel = "{channel}"
packages = ["torch"]
[[packages]]
name = "helper"
spec = "helper==2.0"
[[packages]]
name = "mpi4py"
no_binary = true
"""


def recipe(tmp_path: Path, torch: str = "2.7.1", channel: str = "stable"):
    (tmp_path / "demo.toml").write_text(RECIPE.format(torch=torch, channel=channel))
    return load("demo", Catalog([Layer("test", tmp_path)]))


def lock_for(inputs: dict, arch: str = "x86_64", path: str = "/locks/demo.lock.toml") -> lockfile.Lock:
    pkgs = (
        lockfile.LockedPackage(
            "torch", "2.7.1+cpu", "wheel", (lockfile.LockedFile("https://x/torch.whl", SHA_A),)
        ),
        lockfile.LockedPackage(
            "helper", "2.0", "wheel", (lockfile.LockedFile("https://x/helper.whl", SHA_B),)
        ),
    )
    return lockfile.Lock(
        "demo", "", "f" * 64, "venv", "uv", "now", "test",
        (lockfile.PlatformLock(arch, f"{arch}-manylinux_2_28", inputs, pkgs),),
        path=path, origin="--lock",
    )  # fmt: skip


# --- the file format ------------------------------------------------------------------------------------------


def test_dumps_and_parse_round_trip(tmp_path):
    lock = lock_for(
        {"kind": "venv", "python": "3.11", "requirements": ["x"], "index_flags": [], "channel": ""}
    )
    path = tmp_path / "demo.lock.toml"
    path.write_text(lock.dumps())
    again = lockfile.read(path, "yours")
    assert again.content() == lock.content()
    assert again.origin == "yours"
    assert again.for_arch("x86_64").requirements_txt() == (
        f"helper==2.0 --hash=sha256:{SHA_B}\ntorch==2.7.1+cpu --hash=sha256:{SHA_A}\n"
    )
    assert again.for_arch("aarch64") is None


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (
            lambda t: t.replace("lock_version = 1", "lock_version = 9"),
            "lock_version 9 is not one this envbuilder",
        ),
        (lambda t: t.replace('engine = "uv"', 'engine = "poetry"'), "engine 'poetry' is not one of"),
        (lambda t: t.replace('arch = "x86_64"', 'arch = "ppc64le"'), "platform[0].arch 'ppc64le'"),
        (
            lambda t: t.replace(SHA_A, "xyz"),
            "platform[0].package[0].files has an entry without a valid sha256",
        ),
        (lambda t: t.replace('kind = "venv"\nengine', 'knd = "venv"\nengine'), "unknown key 'knd'"),
        (lambda t: t.replace('recipe = "demo"\n', ""), "missing key 'recipe'"),
        (
            lambda t: t.replace('version = "2.0"', "version = 2"),
            "platform[0].package[1].version must be a str",
        ),
        (lambda t: t + "[oops", "not valid TOML"),
    ],
)
def test_a_broken_lock_names_the_file_and_the_key(tmp_path, edit, message):
    lock = lock_for({"kind": "venv", "python": "3.11", "requirements": [], "index_flags": [], "channel": ""})
    path = tmp_path / "demo.lock.toml"
    path.write_text(edit(lock.dumps()))
    with pytest.raises(LockError) as info:
        lockfile.read(path)
    assert str(path) in info.value.message
    assert message in info.value.message
    if "knd" in message:
        assert info.value.hint == "did you mean 'kind'?"


def test_every_locker_records_an_engine_the_format_reads():
    made = {locker.engine for locker in (lockers.UvLocker, lockers.RattlerLocker, lockers.CondaLockLocker)}
    assert made == set(lockfile.ENGINES)


def test_platform_names_and_tags():
    assert lockfile.arch_name("arm64") == "aarch64"
    assert lockfile.arch_name("X86_64") == "x86_64"
    with pytest.raises(LockError, match="unknown platform 'aarch46'") as info:
        lockfile.arch_name("aarch46")
    assert info.value.hint == "did you mean 'aarch64'?"
    assert lockfile.python_platform("aarch64", "2.34") == "aarch64-manylinux_2_34"
    assert lockfile.python_platform("x86_64", "2.30") == "x86_64-manylinux_2_28"
    assert lockfile.python_platform("x86_64", "2.17") == "x86_64-manylinux_2_17"
    assert lockfile.python_platform("x86_64", "2.41") == "x86_64-manylinux_2_40"
    assert lockfile.python_platform("x86_64", None) == "x86_64-manylinux_2_28"
    with pytest.raises(LockError, match="older than manylinux2014"):
        lockfile.python_platform("x86_64", "2.12")


def test_pylock_packages_and_a_package_without_a_hash():
    text = f"""
lock-version = "1.0"
[[packages]]
name = "fastmath"
version = "1.0"
wheels = [{{ url = "http://i/fastmath-1.0-cp311-cp311-manylinux_2_28_aarch64.whl", hashes = {{ sha256 = "{SHA_A}" }} }}]
[[packages]]
name = "srconly"
version = "3"
sdist = {{ url = "http://i/srconly-3.tar.gz", hashes = {{ sha256 = "{SHA_B}" }} }}
"""
    pkgs = reader.from_pylock(text, "aarch64")
    assert [(p.name, p.version, p.source, p.files[0].sha256) for p in pkgs] == [
        ("fastmath", "1.0", "wheel", SHA_A),
        ("srconly", "3", "sdist", SHA_B),
    ]
    with pytest.raises(LockError, match="local 1 has no file with a sha256"):
        reader.from_pylock('[[packages]]\nname = "local"\nversion = "1"\ndirectory = { path = "." }\n', "x")


def test_a_pylock_marker_is_kept_and_evaluated_for_the_target_not_this_host():
    """uv writes a marker on a package that belongs only where it holds: kept in the lock, and evaluated for the
    lock's platform (aarch64, python 3.11) whatever this host is."""
    text = f"""
lock-version = "1.0"
[[packages]]
name = "armonly"
version = "1.0"
marker = "platform_machine == 'aarch64' and python_version >= '3.10'"
wheels = [{{ url = "http://i/armonly-1.0-py3-none-any.whl", hashes = {{ sha256 = "{SHA_A}" }} }}]
[[packages]]
name = "colorama"
version = "0.4.6"
marker = "sys_platform == 'win32'"
wheels = [{{ url = "http://i/colorama-0.4.6-py3-none-any.whl", hashes = {{ sha256 = "{SHA_B}" }} }}]
"""
    pkgs = reader.from_pylock(text, "aarch64")
    assert [p.marker for p in pkgs] == [
        "platform_machine == 'aarch64' and python_version >= '3.10'",
        "sys_platform == 'win32'",
    ]
    platform = lockfile.PlatformLock("aarch64", "aarch64-manylinux_2_28", {"python": "3.11"}, pkgs)
    kept, left = lockfit.for_target(platform, "x.lock.toml")
    assert [p.name for p in kept.packages] == ["armonly"] and [p.name for p in left] == ["colorama"]
    # Round trip: the marker is written and read back.
    lock = lockfile.Lock("demo", "", "0" * 64, "venv", "uv", "", "", (platform,))
    assert lockfile.parse(lock.dumps(), "x").platforms[0].packages == pkgs
    # Without the target's python, a marker on the python version cannot be decided: an error naming it.
    full = [
        replace(pkgs[0], marker=m) for m in ("python_full_version >= '3.10'", "python_full_version >= '3.12'")
    ]
    kept, left = lockfit.for_target(replace(platform, packages=tuple(full)), "x.lock.toml")
    assert [p.marker for p in kept.packages] == ["python_full_version >= '3.10'"] and left == [full[1]]
    micro = replace(platform, packages=(replace(pkgs[0], marker="python_full_version == '3.11.4'"),))
    with pytest.raises(LockError, match="which reads the micro version of python"):
        lockfit.for_target(micro, "x.lock.toml")
    unknown = lockfile.PlatformLock("aarch64", "t", {"python": ""}, pkgs)
    with pytest.raises(LockError, match=r"armonly 1\.0 is locked for .* which reads python_version"):
        lockfit.for_target(unknown, "x.lock.toml")


def test_missing_names_each_locked_wheel_the_env_lacks_or_has_at_another_version():
    pkgs = tuple(
        lockfile.LockedPackage(n, v, "wheel", (lockfile.LockedFile("u", SHA_A),))
        for n, v in (("Fast_Math", "1.1"), ("helper", "2.0"), ("gone", "3"))
    )
    platform = lockfile.PlatformLock("x86_64", "t", {}, pkgs)
    installed = {"fast-math": "1.1", "helper": "2.0.1"}
    assert lockfit.missing(platform, installed) == ["gone==3", "helper==2.0 (found 2.0.1)"]
    assert lockfit.missing(platform, {**installed, "helper": "2.0", "gone": "3.0"}) == []


def test_recipe_digest_ignores_only_the_published_version():
    data = {"recipe": {"name": "demo"}, "torch": {"version": "2.7.1"}}
    published = {"recipe": {"name": "demo", "version": "4"}, "torch": {"version": "2.7.1"}}
    changed = {"recipe": {"name": "demo"}, "torch": {"version": "2.7.0"}}
    assert lockfile.recipe_sha256(data) == lockfile.recipe_sha256(published)
    assert lockfile.recipe_sha256(data) != lockfile.recipe_sha256(changed)


# --- a lock in a plan -----------------------------------------------------------------------------------------


def test_an_applying_lock_replaces_the_resolver_installs_with_one_hashed_install(tmp_path):
    r = recipe(tmp_path)
    unlocked = plan.build(r, CPU_HOST, ENV)
    locked = plan.build(r, CPU_HOST, ENV, lock=lock_for(unlocked.lock_inputs))
    assert unlocked.lock is None
    assert locked.to_json()["lock"]["status"] == "applies"
    installs = [s.argv for s in locked.install_steps if "install" in s.argv]
    assert installs[0][:5] == ("uv", "pip", "install", "--python", "/scratch/u/envs/demo/bin/python")
    assert installs[0][5:] == (
        "--no-deps",
        "--require-hashes",
        # uv searches extra indexes first: torch's index is the extra one, so PyPI's torch can never win.
        "--index-url",
        "https://pypi.org/simple",
        "--extra-index-url",
        "https://download.pytorch.org/whl/cpu",
        "--requirement",
        "/scratch/u/envs/demo/envbuilder/lock-requirements.txt",
    )
    # The source build still runs afterwards, held to the locked versions, built again (not from uv's cache).
    assert installs[1][-7:] == (
        "--no-binary",
        "mpi4py",
        "--no-cache",
        "--constraint",
        "/scratch/u/envs/demo/envbuilder/constraints.txt",
        "--",  # what follows is a requirement, never an option
        "mpi4py",
    )
    assert len(installs) == 2
    assert locked.lock_pins == "helper==2.0\ntorch==2.7.1+cpu\n"
    assert "helper==2.0" not in " ".join(" ".join(a) for a in installs)
    assert unlocked.lock_inputs["requirements"] == ["torch==2.7.1", "helper==2.0"]


def test_a_stale_lock_is_reported_and_ignored_or_refused_with_locked(tmp_path):
    r = recipe(tmp_path)
    old_inputs = plan.build(r, CPU_HOST, ENV).lock_inputs
    newer = recipe(tmp_path, torch="2.7.0")
    p = plan.build(newer, CPU_HOST, ENV, lock=lock_for(old_inputs))
    assert p.to_json()["lock"]["status"] == "ignored"
    assert any("is stale for demo on x86_64" in w and "torch==2.7.0" in w for w in p.warnings)
    assert not p.lock_requirements
    with pytest.raises(LockError, match="stale") as info:
        plan.build(newer, CPU_HOST, ENV, plan.Options(locked=True), lock=lock_for(old_inputs))
    assert info.value.hint == "regenerate it: envbuilder lock demo --platform x86_64"
    assert info.value.exit_code == 13


def test_locked_without_a_lock_or_without_this_platform(tmp_path):
    r = recipe(tmp_path)
    with pytest.raises(LockError, match="--locked, but demo has no lock"):
        plan.build(r, CPU_HOST, ENV, plan.Options(locked=True))
    inputs = plan.build(r, CPU_HOST, ENV).lock_inputs
    with pytest.raises(LockError, match=r"has no x86_64 platform \(it locks aarch64\)"):
        plan.build(r, CPU_HOST, ENV, plan.Options(locked=True), lock=lock_for(inputs, arch="aarch64"))


def test_a_lock_resolved_for_a_newer_glibc_than_the_targets_is_not_applied(tmp_path):
    """Locked where glibc is 2.36 (a login host), planned for a node with 2.31: its wheels may need 2.36."""
    r = recipe(tmp_path)
    inputs = plan.build(r, CPU_HOST, ENV).lock_inputs
    newer = replace(
        lock_for(inputs), platforms=(replace(lock_for(inputs).platforms[0], tag="x86_64-manylinux_2_36"),)
    )
    old_node = replace(CPU_HOST, glibc="2.31")
    p = plan.build(r, old_node, ENV, lock=newer)
    assert p.to_json()["lock"]["status"] == "ignored"
    assert any("resolved for x86_64-manylinux_2_36 (glibc 2.36), but the target has glibc 2.31" in w
               for w in p.warnings), p.warnings  # fmt: skip
    with pytest.raises(LockError, match=r"but the target has glibc 2\.31") as info:
        plan.build(r, old_node, ENV, plan.Options(locked=True), lock=newer)
    assert "or set compute.glibc in the site file" in (info.value.hint or "")
    # A lock for an older level, or a target whose glibc is not known, still applies.
    assert plan.build(r, old_node, ENV, lock=lock_for(inputs)).to_json()["lock"]["status"] == "applies"
    assert (
        plan.build(r, replace(CPU_HOST, glibc=None), ENV, lock=newer).to_json()["lock"]["status"] == "applies"
    )


def test_a_nightly_lock_warns_that_its_wheels_disappear(tmp_path):
    r = recipe(tmp_path, torch="2.11.0.dev20260301", channel="nightly")
    inputs = plan.build(r, CPU_HOST, ENV).lock_inputs
    assert inputs["channel"] == "nightly"
    assert "--pre" in inputs["index_flags"]
    p = plan.build(r, CPU_HOST, ENV, lock=lock_for(inputs))
    assert any("nightly wheels" in w and "envbuilder backup demo" in w for w in p.warnings)


def test_planning_for_another_architecture_resolves_for_it():
    catalog = Catalog([Layer("builtin", builtin_dir())])
    vista = load("vista-venv-cu124", catalog)
    arm = plan.build(vista, GH200, ENV)
    x86 = plan.build(vista, GH200, ENV, plan.Options(arch="x86_64"))
    assert arm.target.arch == "aarch64"
    assert x86.target.arch == "x86_64"
    assert any("planned for x86_64 nodes; the site's compute nodes are aarch64" in n for n in x86.notes)
    assert x86.lock_inputs["index_flags"] == arm.lock_inputs["index_flags"]
    assert x86.lock_inputs["requirements"][0].startswith("torch==")


def conda_lock_doc(*packages: dict) -> dict:
    """A conda-lock.yml (version 1) as yaml.safe_load returns it, with only the keys it always writes."""
    return {"version": 1, "metadata": {"platforms": ["linux-64", "linux-aarch64"]}, "package": list(packages)}


def conda_entry(name: str, version: str, platform: str, fn: str, sha: str = SHA_A) -> dict:
    return {
        "name": name, "version": version, "manager": "conda", "platform": platform, "dependencies": {},
        "url": f"https://conda.example/ch/{platform}/{fn}", "hash": {"md5": "0" * 32, "sha256": sha},
        "category": "main", "optional": False,
    }  # fmt: skip


def test_conda_lock_output_gives_each_platforms_packages_with_their_build():
    doc = conda_lock_doc(
        conda_entry("python", "3.12.8", "linux-64", "python-3.12.8-h9e4cc4f_1_cpython.conda"),
        conda_entry("python", "3.12.8", "linux-aarch64", "python-3.12.8-h1683364_1_cpython.conda", SHA_B),
        conda_entry("pip", "25.0", "linux-64", "pip-25.0-pyh8b19718_0.tar.bz2"),
        {**conda_entry("torch", "2.7.1", "linux-64", "torch-2.7.1-cp312-manylinux.whl"), "manager": "pip"},
    )
    x86 = reader.from_conda_lock(doc, "linux-64", "out")
    assert [(p.name, p.version, p.build, p.source) for p in x86] == [
        ("python", "3.12.8", "h9e4cc4f_1_cpython", "conda"), ("pip", "25.0", "pyh8b19718_0", "conda"),
    ]  # fmt: skip
    assert x86[0].conda_spec() == "python=3.12.8=h9e4cc4f_1_cpython"
    (arm,) = reader.from_conda_lock(doc, "linux-aarch64", "out")
    assert arm.files[0] == lockfile.LockedFile(
        "https://conda.example/ch/linux-aarch64/python-3.12.8-h1683364_1_cpython.conda", SHA_B
    )


@pytest.mark.parametrize(
    ("doc", "expected"),
    [
        ({"version": 2, "package": []}, "not a conda-lock.yml of version 1"),
        ([], "not a conda-lock.yml of version 1"),
        (conda_lock_doc(conda_entry("pip", "25.0", "linux-64", "pip-25.0-0.tar.bz2", "")), "pip 25.0 (linux-64) has no sha256"),
        (conda_lock_doc(conda_entry("pip", "25.0", "linux-64", "pip-24.0-0.tar.bz2")), "is not named pip-25.0-BUILD"),
        (conda_lock_doc(conda_entry("pip", "25.0", "linux-aarch64", "pip-25.0-0.tar.bz2")), "no packages for linux-64"),
    ],
)  # fmt: skip
def test_unusable_conda_lock_output_is_a_lock_error(doc, expected):
    with pytest.raises(LockError, match=expected.replace("(", r"\(").replace(")", r"\)")):
        reader.from_conda_lock(doc, "linux-64", "conda-lock's output")


def test_conda_locks_failure_is_what_conda_said_not_conda_locks_traceback():
    from envbuilder.build.lockers import conda_lock_failure

    stderr = (
        "INFO:conda_lock.conda_solver:linux-64 using specs ['hpc-cuda']\n"
        "Could not lock the environment for platform linux-64\n"
        "nothing provides __cuda >=11 needed by hpc-cuda-1.0-0\n"
        "    Command: ['/site/conda', 'create', '--dry-run']\n"
        "Traceback (most recent call last):\n  File ...\nsubprocess.CalledProcessError: ...\n"
    )
    assert conda_lock_failure(stderr) == (
        "Could not lock the environment for platform linux-64\nnothing provides __cuda >=11 needed by hpc-cuda-1.0-0"
    )
    assert conda_lock_failure("Traceback ...\nRuntimeError: no conda\n").endswith("RuntimeError: no conda")


@pytest.mark.parametrize(("installer", "fresh"), [("uv", "--no-cache"), ("pip", "--no-cache-dir")])
def test_a_source_build_is_never_taken_from_the_installers_cache(tmp_path, installer, fresh):
    """A no_binary package is built against the modules this build loads: the installer's cache, shared by the
    user's envs, may hold a wheel of it built for another env (against another MPI), so its step does without."""
    (tmp_path / "demo.toml").write_text(
        RECIPE.format(torch="2.7.1", channel="stable").replace(
            'installer = "uv"', f'installer = "{installer}"'
        )
    )
    built = plan.build(load("demo", Catalog([Layer("test", tmp_path)])), CPU_HOST, ENV)
    (own,) = [s.argv for s in built.install_steps if s.argv[-1] == "mpi4py"]
    assert own[own.index("--no-binary") :][:3] == ("--no-binary", "mpi4py", fresh)
    others = [s.argv for s in built.install_steps if s.argv[-1] != "mpi4py"]
    assert others and not any(fresh in argv for argv in others)  # the rest still comes from the cache


# ---------------------------------------------------------------------------------------------------------------
# PEP 751 pylock files


def _wheel_lock(*files: str) -> lockfile.Lock:
    pkgs = tuple(
        lockfile.LockedPackage(
            name.split("-")[0],
            name.split("-")[1],
            "wheel",
            (lockfile.LockedFile(f"https://i/{name}", SHA_A),),
        )
        for name in files
    )
    inputs = {
        "kind": "venv",
        "python": "3.11",
        "requirements": ["helper==2.0"],
        "index_flags": [],
        "channel": "",
    }
    return lockfile.Lock(
        "demo",
        "",
        "d" * 64,
        "venv",
        "uv",
        "",
        "envbuilder 1",
        (lockfile.PlatformLock("x86_64", "t", inputs, pkgs),),
    )


def test_a_pylock_rendered_without_uvs_text_reads_back_as_the_same_lock():
    lock = _wheel_lock("fastmath-1.1-cp311-cp311-manylinux_2_28_x86_64.whl", "helper-2.0-py3-none-any.whl")
    text = pylock.render(lock, lock.platforms[0])
    assert text.startswith('lock-version = "1.0"')
    back = reader.parse(text, "pylock.x86_64.toml")
    assert back.format == "pylock" and back.recipe == "demo"
    assert back.platforms == lock.platforms  # packages, files, hashes and inputs


def test_a_foreign_pylock_is_for_the_arches_its_wheels_are_built_for():
    arm = _wheel_lock("fastmath-1.0-cp311-cp311-manylinux_2_28_aarch64.whl", "helper-2.0-py3-none-any.whl")
    text = pylock.render(arm, arm.platforms[0])
    theirs = reader.parse(text[: text.index("[tool.envbuilder]")], "pylock.toml")
    assert theirs.arches() == ["aarch64"] and theirs.platforms[0].inputs == {}
    pure = _wheel_lock("helper-2.0-py3-none-any.whl")
    text = pylock.render(pure, pure.platforms[0])
    assert reader.parse(text[: text.index("[tool.envbuilder]")], "pylock.toml").arches() == [
        "x86_64",
        "aarch64",
    ]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('lock-version = "2.0"\n', "lock-version '2.0' is not one this envbuilder reads"),
        ('lock-version = "1.0"\n[[packages]]\nname = "a"\nversion = "1"\n', "a 1 has no file with a sha256"),
        (
            'lock-version = "1.0"\n[[packages]]\nname = "a"\ndirectory = { path = "." }\n',
            "every package needs a name",
        ),
        (
            'lock-version = "1.0"\n[tool.envbuilder]\nrecipe = "d"\narch = "x86_64"\ntag = "t"\n',
            "tool.envbuilder.inputs",
        ),
    ],
)
def test_a_bad_pylock_names_the_file_and_what_is_wrong(text, message):
    with pytest.raises(LockError) as err:
        reader.parse(text, "pylock.toml")
    assert err.value.message.startswith("pylock.toml: ") and message in err.value.message


def test_a_pylock_is_refused_for_a_conda_env_and_where_it_misses_a_pin():
    lock = replace(_wheel_lock("helper-2.0-py3-none-any.whl"), format="pylock", path="pylock.toml")
    conda = {**lock.platforms[0].inputs, "kind": "conda"}
    with pytest.raises(LockError, match="but the recipe builds a conda env"):
        lockfit.applicable_lock("demo", lock, conda, "x86_64", locked=False, warnings=[])
    # One from elsewhere records no inputs: it is held to the plan's pins.
    wanted = {**lock.platforms[0].inputs, "requirements": ["helper==2.0", "torch==2.13.0+cpu"]}
    lock = replace(lock, platforms=(replace(lock.platforms[0], inputs={}),))
    with pytest.raises(LockError, match=r"has no torch, but the plan installs torch==2\.13\.0\+cpu"):
        lockfit.applicable_lock("demo", lock, wanted, "x86_64", locked=False, warnings=[])
