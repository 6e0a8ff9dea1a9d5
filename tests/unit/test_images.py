"""The right image, like the right wheel: the image table, what a registry says of an image (read over HTTP from
a registry on 127.0.0.1), the gates, and what ``plan`` shows of a container env."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Optional

import pytest

from envbuilder import plan
from envbuilder.backends.container import ContainerBackend
from envbuilder.core.containers import parse_image
from envbuilder.core.errors import RecipeError, ResolverErrors
from envbuilder.core.facts import HostFacts
from envbuilder.recipe.catalog import Catalog, Layer
from envbuilder.recipe.loader import load
from envbuilder.resolver import imagefetch, images
from envbuilder.resolver.matrix import load_matrix
from tests.helpers import PLAN_ENV, load_facts, run_cli
from tests.imageregistry import Registry, serve

NGC = "nvcr.io/nvidia/pytorch:24.05-py3"
HUB = "docker://pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime"
INDEX = "application/vnd.oci.image.index.v1+json"
MANIFEST = "application/vnd.oci.image.manifest.v1+json"


@pytest.fixture
def registry() -> Iterator[Registry]:
    with serve() as reg:
        yield reg


CPU_LABELS = {"org.envbuilder.torch": "2.5.1", "org.envbuilder.cuda": "none", "org.envbuilder.python": "3.11"}
CU13_LABELS = {"com.nvidia.pytorch.version": "2.9.0a0+abc", "com.nvidia.cuda.version": "13.0.1.012"}
ONLINE = {**PLAN_ENV, "ENVBUILDER_OFFLINE": "0"}


def _pick(text: str, facts: images.ImageFacts, host: str) -> images.ImagePick:
    return images.pick(parse_image(text), facts, load_facts(host), load_matrix())


def _gates(info: pytest.ExceptionInfo[ResolverErrors]) -> list[str]:
    return [e.gate for e in info.value.errors]


# ---------------------------------------------------------------------------------------------------------------
# The table and the gates


def test_the_table_knows_ngc_releases_and_reads_torch_and_cuda_from_a_hub_tag() -> None:
    table = images.load_table()
    ngc = images.table_facts(parse_image(NGC), table)
    assert (ngc.torch, ngc.cuda, ngc.python, ngc.archs) == (
        "2.4.0a0",
        "12.4.1",
        "3.10",
        ("x86_64", "aarch64"),
    )
    assert ngc.origins["cuda"].startswith("image table: NGC PyTorch 24.05, checked ")
    hub = images.table_facts(parse_image(HUB), table)
    assert (hub.torch, hub.cuda, hub.python, hub.archs) == ("2.5.1", "12.4", None, ("x86_64",))
    unknown = images.table_facts(parse_image("nvcr.io/nvidia/pytorch:19.01-py3"), table)
    assert unknown == images.ImageFacts()


def test_an_amd64_only_image_for_an_aarch64_target_is_refused() -> None:
    facts = images.table_facts(parse_image(HUB), images.load_table())
    with pytest.raises(ResolverErrors) as info:
        _pick(HUB, facts, "gh200-aarch64")
    assert _gates(info) == ["platform"]
    assert "published for x86_64 only; the target is aarch64" in info.value.errors[0].message
    assert "nvcr.io/nvidia/pytorch" in (info.value.errors[0].hint or "")
    assert _pick(NGC, images.table_facts(parse_image(NGC), images.load_table()), "gh200-aarch64").fits


def test_a_cuda_13_image_on_a_driver_12_node_is_refused() -> None:
    facts = images.label_facts({"Labels": CU13_LABELS}, ("linux/amd64",))
    with pytest.raises(ResolverErrors) as info:
        _pick("nvcr.io/nvidia/pytorch:25.09-py3", facts, "a100-pcie-x3")  # driver 560: CUDA 12.6 at most
    assert _gates(info) == ["driver"]
    assert "CUDA 13.0.1.012 (image: com.nvidia.cuda.version) needs a newer NVIDIA driver" in str(info.value)


def test_a_cuda_12_image_fits_a_driver_12_node_and_says_why() -> None:
    pick = _pick(NGC, images.table_facts(parse_image(NGC), images.load_table()), "a100-pcie-x3")
    assert any(f.startswith("published for x86_64") for f in pick.fits)
    assert "CUDA 12.4.1 runs on driver 560.35.05" in pick.fits
    older = HostFacts(
        arch="x86_64", driver_version="535.54.03", max_cuda="12.2", gpus=load_facts("v100").gpus
    )
    with pytest.raises(ResolverErrors) as info:  # 24.05 states driver 545 as its floor
        images.pick(
            parse_image(NGC), images.table_facts(parse_image(NGC), images.load_table()), older, load_matrix()
        )
    assert "below the 545 it needs" in str(info.value)


@pytest.mark.parametrize("text", ["pytorch/pytorch", "pytorch/pytorch:latest"])
def test_a_moving_tag_is_refused_unless_a_digest_pins_it(text: str) -> None:
    with pytest.raises(ResolverErrors) as info:
        _pick(text, images.ImageFacts(), "cpu-only")
    assert _gates(info) == ["image-tag"]
    pinned = f"{text}@sha256:{'0' * 64}"
    assert _pick(pinned, images.ImageFacts(), "cpu-only").warnings  # unknown facts: said, not refused


def test_the_images_labels_take_the_place_of_the_tables_row() -> None:
    table = images.table_facts(parse_image(NGC), images.load_table())
    labels = images.label_facts(
        {"Labels": {"com.nvidia.pytorch.version": "2.4.0a0+07cecf4"}}, ("linux/amd64",)
    )
    both = images.merged(table, labels)
    assert (both.torch, both.cuda, both.archs) == ("2.4.0a0+07cecf4", "12.4.1", ("x86_64",))
    assert both.origins["torch"] == "image: com.nvidia.pytorch.version"
    assert both.origins["archs"] == "registry: the manifest's platforms"
    assert both.origins["cuda"].startswith("image table")
    with pytest.raises(ResolverErrors):  # the registry's platform list, not the table's, decides now
        images.pick(parse_image(NGC), both, load_facts("gh200-aarch64"), load_matrix())


# ---------------------------------------------------------------------------------------------------------------
# The registry read (resolver.imagefetch) against a registry on 127.0.0.1


def test_the_registry_gives_labels_platforms_and_digest(registry: Registry) -> None:
    digest = registry.image("torch/cpu", "2.5.1", CPU_LABELS, archs=("amd64", "arm64"))
    got, why = imagefetch.read_image(parse_image(f"{registry.url}/torch/cpu:2.5.1"), ONLINE, arch="aarch64")
    assert why == ""
    assert got is not None
    assert (got.digest, got.platforms) == (digest, ("linux/amd64", "linux/arm64"))
    assert (got.facts.torch, got.facts.cuda, got.facts.python) == ("2.5.1", "", "3.11")
    assert got.facts.archs == ("x86_64", "aarch64")
    registry.digest_header = False  # the digest is the sha256 of the manifest's bytes all the same
    again, _ = imagefetch.read_image(parse_image(f"{registry.url}/torch/cpu:2.5.1"), ONLINE, arch="aarch64")
    assert again is not None
    assert again.digest == digest


def test_an_unreachable_or_offline_registry_leaves_the_table_and_says_why(registry: Registry) -> None:
    ref = parse_image(f"{registry.url}/torch/none:1")
    assert imagefetch.read_image(ref, PLAN_ENV, arch="x86_64") == (
        None,
        "offline (ENVBUILDER_OFFLINE=1): the image table alone",
    )
    got, why = imagefetch.read_image(ref, ONLINE, arch="x86_64")
    assert got is None
    assert why.startswith(f"{registry.url}: HTTP 404")


# ---------------------------------------------------------------------------------------------------------------
# plan


def _recipe(tmp_path: Path, image: str, extra: str = "") -> Path:
    (tmp_path / "box.toml").write_text(
        f'schema_version = 1\n[recipe]\nname = "box"\n[env]\nkind = "container"\nprefix = "{tmp_path}/envs/box"\n'
        f'[filesystems.scratch]\npath = "$SCRATCH"\n[filesystems.home]\npath = "$HOME"\nvisible_on_compute = false\n'
        f'[container]\nimage = "{image}"\n{extra}'
    )
    return tmp_path


def test_plan_json_shows_the_image_its_facts_and_how_it_runs(tmp_path: Path, registry: Registry) -> None:
    digest = registry.image("torch/cpu", "2.5.1", CPU_LABELS)
    ref = f"{registry.url}/torch/cpu:2.5.1"
    env = {**ONLINE, "ENVBUILDER_RECIPE_PATH": str(_recipe(tmp_path, ref))}
    res = run_cli("plan", "box", "--json", "--facts", "tests/data/facts/cpu-only.json", env=env)
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)["data"]
    box = data["container"]
    assert data["kind"] == "container"
    assert (box["facts"]["torch"], box["facts"]["cuda"], box["facts"]["archs"]) == ("2.5.1", "", ["x86_64"])
    assert box["facts"]["origins"]["torch"] == "image: org.envbuilder.torch"
    assert box["fits"] == [
        "published for x86_64 (registry: the manifest's platforms)",
        "a CPU-only image: no driver needed",
    ]
    assert box["fetch"] == [["apptainer", "pull", "--no-https", "--", "{dest}", f"docker://{ref}"]]
    assert box["binds"] == ["/scratch/u1"]  # $HOME is not seen on compute nodes
    assert (box["file"], box["gpu"], box["mpi"]) == (f"{tmp_path}/envs/box/image.sif", False, "host")
    assert f"registry: {ref} is {digest} now" in data["notes"]
    human = run_cli("plan", "box", "--facts", "tests/data/facts/cpu-only.json", env=env)
    assert "image holds: torch 2.5.1, CUDA none (CPU only), Python 3.11; for x86_64" in human.stdout
    assert "runs with: binds /scratch/u1; GPU off; MPI from the host" in human.stdout
    # The validation's ranks run inside the image, the env's copy of the payload bound in read-only.
    payloads = f"{tmp_path}/envs/box/envbuilder/payloads"
    assert data["launch_command"][:6] == [
        "apptainer", "exec", "--bind", f"/scratch/u1,{payloads}:{payloads}:ro", "--", box["file"],
    ]  # fmt: skip
    assert data["launch_command"][6:8] == ["python3", f"{payloads}/envbuilder_torchrun.py"]


def test_plan_refuses_a_cuda_13_tag_on_a_driver_12_node(tmp_path: Path, registry: Registry) -> None:
    registry.image("torch/cu13", "25.09", CU13_LABELS)
    env = {**ONLINE, "ENVBUILDER_RECIPE_PATH": str(_recipe(tmp_path, f"{registry.url}/torch/cu13:25.09"))}
    res = run_cli("plan", "box", "--facts", "tests/data/facts/a100-pcie-x3.json", env=env)
    assert res.returncode == 4, res.stderr
    assert (
        "the image's CUDA 13.0.1.012 (image: com.nvidia.cuda.version) needs a newer NVIDIA driver"
        in res.stderr
    )
    assert "hint: choose an image tag of an older CUDA" in res.stderr


def test_container_allow_turns_a_gate_into_a_warning(tmp_path: Path) -> None:
    recipe = load("box", Catalog([Layer("t", _recipe(tmp_path, HUB[9:], 'allow = ["platform"]\n'))]))
    the_plan = plan.build(recipe, load_facts("gh200-aarch64"), PLAN_ENV)
    assert the_plan.container is not None
    assert any(w.endswith("(allowed: container.allow has platform)") for w in the_plan.warnings)
    (tmp_path / "box.toml").write_text(
        (tmp_path / "box.toml").read_text().replace('"platform"', '"platfrom"')
    )
    with pytest.raises(RecipeError) as info:
        load("box", Catalog([Layer("t", tmp_path)]))
    assert (info.value.key, info.value.hint) == ("container.allow[0]", "did you mean 'platform'?")


def test_every_row_of_the_image_table_says_where_it_comes_from_and_when() -> None:
    table = images.load_table()
    rows = [*table.ngc.values(), table.dockerhub]
    assert len(rows) >= 2
    for row in rows:
        assert row["source"] and row["confidence"] in ("P", "S", "U"), row
        assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", row["checked"]), row
        assert set(row["archs"]) <= {"x86_64", "aarch64"}, row
    assert table.as_of == max(row["checked"] for row in rows)
    for release, row in table.ngc.items():
        assert re.fullmatch(r"\d{2}\.\d{2}", release)
        assert {"torch", "cuda", "python", "driver"} <= set(row), release


def test_the_runtimes_cache_goes_beside_the_env_unless_the_user_names_one(tmp_path: Path) -> None:
    recipe = load("box", Catalog([Layer("t", _recipe(tmp_path, NGC))]))
    box = plan.build(recipe, load_facts("cpu-only"), PLAN_ENV).container
    backend = ContainerBackend(box=box)
    partial = tmp_path / "envs" / ".box.partial-1"
    work = tmp_path / "envs" / ".envbuilder-apptainer"
    assert backend.own_env(partial, {}) == {
        "APPTAINER_CACHEDIR": str(work / "cache"),
        "APPTAINER_TMPDIR": str(work / "tmp"),
    }
    assert backend.own_env(partial, {"APPTAINER_CACHEDIR": "/mine"}) == {
        "APPTAINER_TMPDIR": str(work / "tmp")
    }


def test_a_gpu_the_images_torch_carries_no_code_for_is_refused() -> None:
    config = {
        "Labels": {"com.nvidia.cuda.version": "12.4.1"},
        "Env": ["TORCH_CUDA_ARCH_LIST=7.0 7.5 8.0+PTX"],
    }
    facts = images.label_facts(config, ("linux/amd64", "linux/arm64"))
    assert facts.cuda_archs == ("7.0", "7.5", "8.0+PTX")
    with pytest.raises(ResolverErrors) as info:  # no PTX: nothing of it runs on a GH200 (sm_90)
        _pick(NGC, replace(facts, cuda_archs=("7.0", "8.0")), "gh200-aarch64")
    assert _gates(info) == ["gpu-arch"]
    assert (
        "sm_90, which the image's torch carries no code for (it has 7.0 8.0, image: TORCH_CUDA_ARCH_LIST)"
        in str(info.value)
    )
    jit = _pick(NGC, facts, "gh200-aarch64")  # 8.0's PTX runs on sm_90 through the JIT
    assert "sm_90 is in its torch's arch list (as PTX: JIT)" in jit.fits
    assert "sm_80 is in its torch's arch list" in _pick(NGC, facts, "a100-pcie-x3").fits


def test_plan_reads_and_fetches_through_the_sites_registry_mirror(tmp_path: Path, registry: Registry) -> None:
    labels = {"org.envbuilder.torch": "2.5.1", "org.envbuilder.cuda": "12.4", "org.envbuilder.python": "3.11"}
    registry.image("hub/pytorch/pytorch", "2.5.1-cuda12.4-cudnn9-runtime", labels)
    env = {
        **ONLINE,
        "ENVBUILDER_RECIPE_PATH": str(_recipe(tmp_path, HUB)),
        "ENVBUILDER_REGISTRY_MIRROR": f"docker.io={registry.url}/hub",
    }
    res = run_cli("plan", "box", "--json", "--facts", "tests/data/facts/a100-pcie-x3.json", env=env)
    assert res.returncode == 0, res.stderr
    box = json.loads(res.stdout)["data"]["container"]
    mirror = f"{registry.url}/hub/pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime"
    assert (box["image"], box["mirror"]) == (HUB, mirror)
    assert box["facts"]["python"] == "3.11"  # the mirror's labels: the table does not know the tag's Python
    assert box["facts"]["origins"]["python"] == "image: org.envbuilder.python"
    assert box["fetch"] == [["apptainer", "pull", "--no-https", "--", "{dest}", f"docker://{mirror}"]]


@pytest.mark.parametrize(("mpi", "site", "plugin"), [("image", "", "--mpi=pmix"), ("image", 'mpi = "pmi2"\n',
                         "--mpi=pmi2"), ("host", "", None)])  # fmt: skip
def test_an_image_mpi_gets_the_launchers_pmi_and_the_host_mpi_none(
    tmp_path: Path, mpi: str, site: str, plugin: Optional[str]
) -> None:
    extra = f'mpi = "{mpi}"\n[scheduler]\ntype = "slurm"\n[launcher]\ndefault = "srun"\n{site}'
    recipe = load("box", Catalog([Layer("t", _recipe(tmp_path, HUB[9:], extra))]))
    the_plan = plan.build(recipe, load_facts("a100-pcie-x3"), PLAN_ENV)
    launch = list(the_plan.launch_command)
    own = launch[: launch.index("apptainer")]
    assert own[0] == "srun" and [a for a in own if a.startswith("--mpi")] == ([plugin] if plugin else [])
    # A GPU env: the GPU flag, the image's python running torchrun.
    at = launch.index("apptainer")
    assert launch[at : at + 3] == ["apptainer", "exec", "--nv"]
    image = launch.index("--", at) + 1
    payloads = f"{tmp_path}/envs/box/envbuilder/payloads"
    assert launch[image : image + 3] == [
        the_plan.container.file,
        "python3",
        f"{payloads}/envbuilder_torchrun.py",
    ]
