"""container.packages in the plan: the overlay venv beside the image file, the runtime's commands that make and
fill it inside the image (the build directory bound at its final path, a /tmp of its own), the python a command
inside the env runs, and the checks on the recipe's values. (tests/integration/test_container_overlay.py builds
one through the real runtime.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from envbuilder import plan
from envbuilder.backends.container import _at, overlay_guard
from envbuilder.core.errors import BackendError, RecipeError
from envbuilder.plan.container import OVERLAY_CREATE, OVERLAY_PROBE, PIP_OPTIONS
from envbuilder.recipe.catalog import Catalog, Layer
from envbuilder.recipe.loader import load
from tests.helpers import PLAN_ENV, load_facts, run_cli

NGC = "nvcr.io/nvidia/pytorch:24.05-py3"
INDEX = "https://example.org/simple"


def _recipe(tmp_path: Path, container: str, prefix: str = "") -> Path:
    prefix = prefix or f"{tmp_path}/envs/box"
    (tmp_path / "box.toml").write_text(
        f'schema_version = 1\n[recipe]\nname = "box"\n[env]\nkind = "container"\nprefix = "{prefix}"\n'
        f'[filesystems.scratch]\npath = "$SCRATCH"\n[container]\nimage = "{NGC}"\n{container}'
    )
    return tmp_path


def _plan(tmp_path: Path, container: str, prefix: str = "") -> plan.ContainerPlan:
    recipe = load("box", Catalog([Layer("t", _recipe(tmp_path, container, prefix))]))
    box = plan.build(recipe, load_facts("a100-pcie-x3"), PLAN_ENV).container
    assert box is not None
    return box


def test_packages_make_an_overlay_venv_built_inside_the_image_at_its_final_path(tmp_path: Path) -> None:
    box = _plan(tmp_path, f'packages = ["numpy>=1.26", "einops"]\nindex = "{INDEX}"\n')
    venv = f"{tmp_path}/envs/box/venv"
    layer = box.overlay
    assert layer is not None
    assert (layer.path, layer.packages, layer.index) == (venv, ("numpy>=1.26", "einops"), INDEX)
    inside = ["apptainer", "exec", "--cleanenv", "--bind", f"{{build}}:{venv}", "--env", "PYTHONNOUSERSITE=1",
              "--contain", "--", "{dest}"]  # fmt: skip
    assert list(layer.create) == [*inside, "python3", "-c", OVERLAY_CREATE, venv]
    assert list(layer.install) == [
        *inside, f"{venv}/bin/python", "-m", "pip", "install", *PIP_OPTIONS, "--index-url", INDEX, "--",
        "numpy>=1.26", "einops",
    ]  # fmt: skip
    assert list(layer.probe) == [*inside, f"{venv}/bin/python", "-c", OVERLAY_PROBE]
    # What runs inside the env later: the overlay's python, its directory bound at its own path.
    assert box.python == box.to_json()["python"] == f"{venv}/bin/python"
    assert box.binds == ("/scratch/u1", venv)
    assert box.to_json()["overlay"]["packages"] == ["numpy>=1.26", "einops"]


def test_no_packages_no_overlay_and_the_images_own_python(tmp_path: Path) -> None:
    box = _plan(tmp_path, "")
    assert (box.overlay, box.python, box.to_json()["overlay"]) == (None, "python3", None)
    assert box.binds == ("/scratch/u1",)


def test_an_overlay_under_a_bind_is_seen_through_it_and_pypi_is_the_default_index(tmp_path: Path) -> None:
    box = _plan(tmp_path, 'packages = ["einops"]\n', prefix="${SCRATCH}/envs/box")
    assert box.overlay is not None and box.overlay.index == "https://pypi.org/simple"
    assert box.binds == ("/scratch/u1",)  # /scratch/u1/envs/box/venv is under it


def test_charliecloud_builds_the_overlay_with_a_private_tmp(tmp_path: Path) -> None:
    box = _plan(tmp_path, 'runtime = "charliecloud"\npackages = ["einops"]\n')
    venv = f"{tmp_path}/envs/box/venv"
    assert box.overlay is not None
    assert list(box.overlay.create[:6]) == [
        "ch-run", "--unset-env=*", "--private-tmp", f"--bind={{build}}:{venv}", "--set-env=PYTHONNOUSERSITE=1",
        "{dest}",
    ]  # fmt: skip


def test_charliecloud_cannot_bind_an_overlay_outside_tmp_and_the_plan_says_so(tmp_path: Path) -> None:
    def warnings(prefix: str) -> list[str]:
        recipe = _recipe(tmp_path, 'runtime = "charliecloud"\npackages = ["einops"]\n', prefix=prefix)
        return list(
            plan.build(load("box", Catalog([Layer("t", recipe)])), load_facts("cpu-only"), PLAN_ENV).warnings
        )

    said = "ch-run makes no mount point in a read-only image: the overlay venv /srv/envs/box/venv is bound"
    assert any(w.startswith(said) for w in warnings("/srv/envs/box"))
    assert not any("ch-run makes no mount point" in w for w in warnings("/tmp/envs/box"))


def test_a_prefix_a_runtime_cannot_bind_is_refused_for_an_overlay(tmp_path: Path) -> None:
    with pytest.raises(RecipeError) as info:
        _plan(tmp_path, 'packages = ["einops"]\n', prefix=f"{tmp_path}/a,b/box")
    assert info.value.key == "env.prefix"
    assert "which a runtime cannot bind" in info.value.message
    _plan(tmp_path, "", prefix=f"{tmp_path}/a,b/box")  # without packages nothing is bound by the prefix


def test_plan_shows_the_packages_step_and_the_overlay(tmp_path: Path) -> None:
    env = {**PLAN_ENV, "ENVBUILDER_RECIPE_PATH": str(_recipe(tmp_path, 'packages = ["einops==0.8.0"]\n'))}
    res = run_cli("plan", "box", "--facts", "tests/data/facts/a100-pcie-x3.json", env=env)
    assert res.returncode == 0, res.stderr
    venv = f"{tmp_path}/envs/box/venv"
    assert (
        f"packages on top: einops==0.8.0 from https://pypi.org/simple, in the overlay venv {venv}"
        in res.stdout
    )
    assert "install einops==0.8.0 into it from https://pypi.org/simple with the image's pip" in res.stdout
    assert "--index-url https://pypi.org/simple -- einops==0.8.0" in res.stdout
    data = json.loads(
        run_cli("plan", "box", "--json", "--facts", "tests/data/facts/a100-pcie-x3.json", env=env).stdout
    )
    assert data["data"]["container"]["python"] == f"{venv}/bin/python"


def test_the_guard_refuses_a_torch_the_overlay_brought(tmp_path: Path) -> None:
    box = _plan(tmp_path, 'packages = ["einops"]\n')
    layer = box.overlay
    assert layer is not None
    image = {
        "torch": "2.3.0a0+40ec155e58",
        "file": "/usr/local/lib/python3.10/dist-packages/torch/__init__.py",
    }
    overlay_guard(box, layer, image, image)  # the image's own, seen through the overlay
    mine = {
        "torch": "2.3.0a0+40ec155e58",
        "file": f"{layer.path}/lib/python3.10/site-packages/torch/__init__.py",
    }
    with pytest.raises(BackendError, match="installed into the overlay"):
        overlay_guard(box, layer, image, mine)  # the same version, but not the image's build
    with pytest.raises(BackendError) as info:
        overlay_guard(box, layer, image, {"torch": "2.5.0", "file": "/x/torch/__init__.py"})
    assert "torch 2.5.0 from /x/torch/__init__.py is seen through the overlay" in info.value.message


def test_the_sites_index_mirror_serves_the_overlay_its_wheel_directory_bound_in(tmp_path: Path) -> None:
    recipe = load("box", Catalog([Layer("t", _recipe(tmp_path, 'packages = ["einops"]\n'))]))
    env = {**PLAN_ENV, "ENVBUILDER_INDEX_MIRROR": "pypi=https://mirror.site/pypi/simple,/srv/wheels"}
    the_plan = plan.build(recipe, load_facts("a100-pcie-x3"), env)
    layer = the_plan.container.overlay if the_plan.container else None
    assert layer is not None
    venv = f"{tmp_path}/envs/box/venv"
    assert layer.install[:6] == (
        "apptainer",
        "exec",
        "--cleanenv",
        "--bind",
        f"{{build}}:{venv},/srv/wheels",
        "--env",
    )
    assert layer.install[layer.install.index("install") + 1 :] == (
        *PIP_OPTIONS, "--index-url", "https://mirror.site/pypi/simple", "--find-links", "/srv/wheels", "--", "einops",
    )  # fmt: skip
    assert layer.sources == ("https://mirror.site/pypi/simple", "/srv/wheels")
    assert (
        "install einops into it from https://mirror.site/pypi/simple, /srv/wheels (mirror of "
        "https://pypi.org/simple, ENVBUILDER_INDEX_MIRROR) with the image's pip" in the_plan.steps
    )
    only = plan.build(
        recipe, load_facts("a100-pcie-x3"), {**PLAN_ENV, "ENVBUILDER_INDEX_MIRROR": "pypi=/srv/w"}
    )
    assert only.container is not None and only.container.overlay is not None
    assert "--no-index" in only.container.overlay.install


def test_create_puts_the_build_directory_in_the_runtimes_options_only_and_finds_podmans_image(
    tmp_path: Path,
) -> None:
    marker = 'demo; python_version != "{build}"'  # a requirement's text is the command's: never substituted
    for runtime in ("apptainer", "charliecloud", "podman"):
        box = _plan(tmp_path, f'runtime = "{runtime}"\npackages = [{json.dumps(marker)}]\n')
        assert box.overlay is not None
        argv = _at(box.overlay.install, Path("/e/.p/image"), runtime, Path("/e/.p/venv"))
        bound = [a for a in argv if "/e/.p/venv:" in a]
        assert len(bound) == 1 and bound[0].endswith(f":{tmp_path}/envs/box/venv"), argv
        assert argv[-1] == marker, argv
        assert any(a in ("/e/.p/image", "oci-archive:/e/.p/image") for a in argv), argv


def test_the_validation_ranks_run_the_overlays_python_inside_the_image(tmp_path: Path) -> None:
    """The launch puts the runtime's exec of the image before the overlay venv's python (not the image's own,
    which does not see the packages), the overlay bound in; without packages, the image's python3."""
    launch = plan.build(
        load("box", Catalog([Layer("t", _recipe(tmp_path, 'packages = ["einops"]\n'))])),
        load_facts("a100-pcie-x3"),
        PLAN_ENV,
    ).launch_command
    image = launch.index(f"{tmp_path}/envs/box/image.sif")
    assert launch[image + 1] == f"{tmp_path}/envs/box/venv/bin/python", launch
    (tmp_path / "bare").mkdir()
    bare = plan.build(
        load("box", Catalog([Layer("t", _recipe(tmp_path / "bare", ""))])),
        load_facts("a100-pcie-x3"),
        PLAN_ENV,
    ).launch_command
    assert bare[bare.index(f"{tmp_path}/bare/envs/box/image.sif") + 1] == "python3", bare


def test_a_container_plans_target_facts_are_its_images(tmp_path: Path) -> None:
    """os, glibc and python of a container env are the image's (its programs run on them, not on the node's):
    from the image table's row where it has one, else unknown until create reads them inside."""
    env = {**PLAN_ENV, "ENVBUILDER_RECIPE_PATH": str(_recipe(tmp_path, ""))}
    argv = ("plan", "box", "--json", "--facts", "tests/data/facts/a100-pcie-x3.json")
    facts = json.loads(run_cli(*argv, env=env).stdout)["data"]["target_facts"]
    row = "the image's (image table: NGC PyTorch 24.05, checked 2026-11-28)"
    assert facts == [
        {"name": "os", "value": "Ubuntu 22.04", "origin": "image", "detail": row},
        {"name": "glibc", "value": "2.35", "origin": "image", "detail": row},
        {"name": "python", "value": "3.10", "origin": "image", "detail": row},
    ]
    text = run_cli(*argv[:2], *argv[3:], env=env).stdout
    assert f"compute glibc: 2.35, {row}" in text.replace("  ", " "), text
    local = tmp_path / "other"
    local.mkdir()
    (local / "box.toml").write_text(
        (tmp_path / "box.toml").read_text().replace(NGC, "registry.example.org/lab/torch@sha256:" + "a" * 64)
    )
    unknown = json.loads(run_cli(*argv, env={**env, "ENVBUILDER_RECIPE_PATH": str(local)}).stdout)
    assert [(f["name"], f["value"], f["origin"]) for f in unknown["data"]["target_facts"]] == [
        ("os", None, "unknown"),
        ("glibc", None, "unknown"),
        ("python", None, "unknown"),
    ], unknown
