"""create of a container env with packages on top (container.packages), with the container world's real parts
(tests/containers.py): the CPU tag pulled from Debian's registry on 127.0.0.1 by the Apptainer stand-in over
Charliecloud, wheels served by a PEP 503 index on 127.0.0.1 (tests/wheelindex.py), and the image's own python and
pip making and filling the overlay venv inside the image, where the build directory is bound at the env's final
path. The overlay's package is imported inside the image through the overlay after the rename (its console
script's header names the final path); a package that requires another torch (its wheels read through the
site's mirror of PyPI, a wheel directory bound into the container) is refused and the old env stays.

Each create pulls the image (the stand-in unpacks and compresses the 1.2 GB root): 20-150 s on this loaded
machine; the test takes 5-6 minutes here."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import containers
import pytest
from wheelindex import Index, build_wheel, serve

from tests.helpers import PLAN_ENV, run_cli

# The rootfs lane, as tests/integration/test_container_world.py: each create pulls and packs the image's root.
pytestmark = [pytest.mark.integration, pytest.mark.rootfs]

CPU = containers.TAGS[0].name
DEMO = "overlaydemo = 'from the overlay'\ndef main():\n    print(__file__)\n"
#: A torch of another release on the index, and a package that requires it (as a package pinned to an older
#: torch does): pip installs it into the overlay, where it would win over the image's.
OLD_TORCH = {
    "torch/__init__.py": "__version__ = '2.5.0'\nfrom . import version\n",
    "torch/version.py": "cuda = None\n",
}


@pytest.fixture
def wheels(tmp_path: Path) -> Iterator[Index]:
    files = tmp_path / "files"
    build_wheel(
        files,
        "overlaydemo",
        "1.0",
        {"overlaydemo.py": DEMO},
        scripts={"overlaydemo-where": "overlaydemo:main"},
    )
    build_wheel(files, "torch", "2.5.0", OLD_TORCH)
    build_wheel(files, "needsoldtorch", "1.0", {"needsoldtorch.py": ""}, requires=["torch==2.5.0"])
    with serve(files) as index:
        yield index


def _world(
    tmp_path: Path, apptainer, oci_registry, wheels: Index, packages: list[str], *, index: str = ""
) -> tuple[dict[str, str], Path]:
    if not str(tmp_path).startswith("/tmp/"):
        pytest.skip(
            f"the stand-in binds the overlay's build directory under /tmp only, and {tmp_path} is not"
        )
    recipes = tmp_path / "recipes"
    recipes.mkdir(exist_ok=True)
    prefix = tmp_path / "envs" / "box"
    (recipes / "box.toml").write_text(
        f'schema_version = 1\n[recipe]\nname = "box"\n[env]\nkind = "container"\nprefix = "{prefix}"\n'
        f'[container]\nimage = "{oci_registry.ref(CPU)}"\nbinds = ["/tmp"]\n'
        f'packages = {json.dumps(packages)}\nindex = "{index or wheels.url + "/simple"}"\n'
    )
    env = {
        **PLAN_ENV,
        "HOME": str(tmp_path / "home"),
        "ENVBUILDER_HOME": str(tmp_path / "home" / ".envbuilder"),
        "ENVBUILDER_OFFLINE": "0",
        "ENVBUILDER_RECIPE_PATH": str(recipes),
        "PATH": apptainer.env["PATH"],
        "APPTAINER_NOHTTPS": "1",
    }
    return env, prefix


def _create(env: dict[str, str], *more: str) -> subprocess.CompletedProcess[str]:
    # --no-validate: create validates a container env by default, and this world's $SCRATCH is the planning
    # environment's, not a file system here (validation inside the image: tests/integration/test_container_launch.py).
    argv = ("create", "box", "--json", "--no-validate", "--facts", "tests/data/facts/cpu-only.json", *more)
    return run_cli(*argv, env=env, timeout=900)


def _inside(apptainer, prefix: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    """``argv`` run in the env's image (the stand-in sees the prefix through /tmp, as a bind of it would)."""
    cmd = [str(apptainer.exe), "-q", "exec", "--cleanenv", str(prefix / "image.sif"), *argv]
    return subprocess.run(cmd, env=apptainer.env, cwd=prefix, capture_output=True, text=True, timeout=300)


def _log(env: dict[str, str]) -> str:
    """The newest build log of the env."""
    logs = sorted(Path(env["ENVBUILDER_HOME"], "logs").glob("box-*.log"), key=lambda p: p.stat().st_mtime)
    return logs[-1].read_text()


PROBE = (
    "import json, sys, overlaydemo, torch; print(json.dumps({'prefix': sys.prefix, 'demo': overlaydemo.overlaydemo, "
    "'torch': torch.__version__, 'torch_file': torch.__file__}))"
)


def test_packages_go_into_an_overlay_on_the_images_python_and_another_torch_is_refused(
    tmp_path: Path, apptainer, oci_registry, wheels: Index
) -> None:
    env, prefix = _world(tmp_path, apptainer, oci_registry, wheels, ["overlaydemo==1.0"])
    res = _create(env)
    assert res.returncode == 0, res.stderr
    venv = prefix / "venv"
    record = json.loads((prefix / "envbuilder" / "record.json").read_text())
    assert record["plan"]["container"]["python"] == f"{venv}/bin/python"
    assert [(p["name"], p["version"], p["installer"]) for p in record["packages"]] == [
        ("torch", containers.TORCH_BUILD, "image"),
        ("overlaydemo", "1.0", "pip (overlay)"),
    ]
    # Through the overlay, inside the image, after the rename: the overlay's package and the image's torch.
    seen = _inside(apptainer, prefix, f"{venv}/bin/python", "-c", PROBE)
    assert seen.returncode == 0, seen.stderr
    found = json.loads(seen.stdout.splitlines()[-1])
    assert (found["prefix"], found["demo"], found["torch"]) == (
        str(venv),
        "from the overlay",
        containers.TORCH_BUILD,
    )
    assert found["torch_file"].startswith(f"{containers.VENV}/lib/")  # the image's own torch
    # The script pip wrote names the final path in its header, not the build directory's.
    script = _inside(apptainer, prefix, f"{venv}/bin/overlaydemo-where")
    assert (script.returncode, script.stdout.strip()) == (
        0,
        str(next(venv.glob("lib/python*/site-packages/overlaydemo.py"))),
    ), script.stderr
    assert (venv / "bin" / "overlaydemo-where").read_text().startswith(f"#!{venv}/bin/python")
    before = (prefix / "envbuilder" / "record.json").read_bytes()

    # A package that requires another torch: refused, and the env that was there stays as it was. Its wheels come
    # from the site's mirror of PyPI, a wheel directory bound into the container.
    env, _ = _world(
        tmp_path, apptainer, oci_registry, wheels, ["overlaydemo==1.0", "needsoldtorch"], index="pypi"
    )
    env["ENVBUILDER_INDEX_MIRROR"] = f"pypi={wheels.files}"
    res = _create(env, "--force")
    assert res.returncode != 0
    assert f"--no-index --find-links {wheels.files} -- overlaydemo==1.0 needsoldtorch" in _log(env)
    assert "container.packages brought in another torch: torch 2.5.0 installed into the overlay" in res.stderr
    assert f"not the image's torch {containers.TORCH_BUILD}" in res.stderr
    assert (prefix / "envbuilder" / "record.json").read_bytes() == before
    assert sorted(p.name for p in prefix.parent.iterdir()) == [".envbuilder-apptainer", "box"]
    assert not list(venv.glob("lib/python*/site-packages/torch"))
    again = _inside(apptainer, prefix, f"{venv}/bin/python", "-c", PROBE)
    assert json.loads(again.stdout.splitlines()[-1])["torch"] == containers.TORCH_BUILD, again.stderr


ENTERED = "import overlaydemo, sys; print(overlaydemo.overlaydemo, sys.prefix)"


def _entered(env: dict[str, str], name: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """``envbuilder activate NAME``'s function, sourced in bash, running ``python`` and the overlay's script."""
    line = run_cli("activate", name, "--shell", "bash", env=env)
    assert line.returncode == 0, line.stderr
    script = tmp_path / f"enter-{name}.sh"
    script.write_text(f"{line.stdout}\n{name} python -c '{ENTERED}'\n{name} overlaydemo-where\n")
    return subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=300)


def _summary_says_what_it_is(said: str, oci_registry, prefix: Path) -> None:
    """create's summary of a container env: its image, digest and size, the overlay, how to enter it."""
    assert f"created box: the image {oci_registry.ref(CPU)} at {prefix}" in said, said
    assert oci_registry.digests[CPU] in said, said
    assert f"packages on top: 1 in {prefix / 'venv'} (" in said and "): overlaydemo 1.0" in said, said
    assert 'enter: eval "$(envbuilder activate box)"; box COMMAND...' in said, said
    assert "bin/activate" not in said and "activate extension" not in said, said


def test_an_overlay_env_is_entered_with_its_packages_and_backed_up_and_restored_with_them(
    tmp_path: Path, apptainer, oci_registry, wheels: Index
) -> None:
    env, prefix = _world(tmp_path, apptainer, oci_registry, wheels, ["overlaydemo==1.0"])
    venv = prefix / "venv"
    res = run_cli(
        "create", "box", "--no-validate", "--facts", "tests/data/facts/cpu-only.json", env=env, timeout=900
    )
    assert res.returncode == 0, res.stderr
    _summary_says_what_it_is(res.stdout + res.stderr, oci_registry, prefix)

    # Entered through activate's function: the overlay's python first, its package and script found.
    entered = _entered(env, "box", tmp_path)
    assert entered.returncode == 0, entered.stderr
    demo = next(venv.glob("lib/python*/site-packages/overlaydemo.py"))
    assert entered.stdout.splitlines()[-2:] == [f"from the overlay {venv}", str(demo)], entered.stdout

    # Backed up with its overlay, restored over itself with --force and at another prefix; both entered again.
    backups = tmp_path / "backups"
    made = run_cli("backup", "box", "--to", str(backups), "--json", env=env, timeout=600)
    assert made.returncode == 0, made.stderr
    (stored,) = backups.glob("envs/box/2*")
    assert sorted(p.name for p in stored.iterdir()) == [
        "backup.json",
        "image.sif",
        "overlay-manifest.json",
        "overlay.tar.zst",
    ]
    (demo.parent / "overlaydemo.py").write_text(
        "overlaydemo = 'changed'\n"
    )  # restore puts back the backed-up one
    back = run_cli("restore", "box", "--from", str(backups), "--force", env=env, timeout=600)
    assert back.returncode == 0, back.stderr
    again = _entered(env, "box", tmp_path)
    assert again.stdout.splitlines()[-2:] == [f"from the overlay {venv}", str(demo)], again.stderr
    other = tmp_path / "envs" / "copy"
    moved = run_cli(
        "restore",
        "box",
        "--from",
        str(backups),
        "--name",
        "copy",
        "--prefix",
        str(other),
        env=env,
        timeout=600,
    )
    assert moved.returncode == 0, moved.stderr
    copied = json.loads((other / "envbuilder" / "record.json").read_text())
    assert (
        copied["plan"]["container"]["python"]
        == copied["tools"]["overlay_python"]
        == f"{other}/venv/bin/python"
    )
    there = _entered(env, "copy", tmp_path)
    assert there.returncode == 0, there.stderr
    assert there.stdout.splitlines()[-2:] == [
        f"from the overlay {other / 'venv'}",
        str(other / demo.relative_to(prefix)),
    ], there.stdout
    # A damaged byte in the overlay's archive: named, and nothing restored.
    with (stored / "overlay.tar.zst").open("r+b") as f:
        f.seek(40)
        byte = f.read(1)
        f.seek(40)
        f.write(bytes([byte[0] ^ 0xFF]))
    broken = run_cli(
        "restore", "box", "--from", str(backups), "--name", "third", "--prefix", str(tmp_path / "envs" / "third"),
        env=env, timeout=600,
    )  # fmt: skip
    assert broken.returncode != 0
    assert "overlay" in broken.stderr and "sha256" in broken.stderr, broken.stderr
    assert not (tmp_path / "envs" / "third").exists()
    # remove: the runtime's cache create made beside the envs stays while a container env there uses it, and goes
    # with the last one.
    cache = prefix.parent / ".envbuilder-apptainer"
    gone = run_cli("remove", "copy", "--yes", env=env)
    assert gone.returncode == 0, gone.stderr
    assert f"kept apptainer's cache {cache}: box beside it uses it" in gone.stdout, gone.stdout
    assert cache.is_dir()
    last = run_cli("remove", "box", "--yes", env=env)
    assert last.returncode == 0, last.stderr
    assert f"removed apptainer's cache {cache}" in last.stdout, last.stdout
    assert list(prefix.parent.iterdir()) == []
