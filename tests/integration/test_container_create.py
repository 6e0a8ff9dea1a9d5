"""create of a container env, end to end through the CLI: the image pulled from a registry on 127.0.0.1 into one
file under the prefix, the torch inside read back and checked against the plan, the file's sha256 recorded;
``--force`` replaces; an image whose torch is not what its labels say is refused and the old env stays.

Apptainer cannot be installed here, and the test world's runtime (Charliecloud behind an Apptainer stand-in) and
registry come in phase 2. Until then the runtime is STANDIN below: a stand-in for ``apptainer`` of about thirty
lines, named as one, that does what the two commands create runs ask of it (``pull -- DEST docker://REF``: the
registry's one layer, a squashfs, written to DEST; ``exec --cleanenv -- IMAGE python3 -c CODE``: the squashfs
unpacked by the real ``unsquashfs`` and the host's python3 run on its ``site`` directory, so that the torch the
probe reads is the one inside the image file). The image is a real squashfs (``mksquashfs``) of a tiny root.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Optional

import pytest

from tests.helpers import PLAN_ENV, run_cli
from tests.imageregistry import Registry, serve

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        not shutil.which("mksquashfs"), reason="needs squashfs-tools (mksquashfs, unsquashfs)"
    ),
]

STANDIN = """#!{python}
# STAND-IN for apptainer (tests/integration/test_container_create.py): `pull` and `exec` only, as create uses them.
import json, os, subprocess, sys, tempfile, urllib.request
args = sys.argv[1:]
verb, rest = args[0], args[args.index("--") + 1:]
if verb == "pull":
    dest, uri = rest
    with open(os.path.join(os.path.dirname(__file__), "pulled-with"), "w") as f:
        json.dump({{k: os.environ.get(k) for k in ("APPTAINER_CACHEDIR", "APPTAINER_TMPDIR")}}, f)
    host, _, ref = uri.removeprefix("docker://").partition("/")
    repo, _, tag = ref.rpartition(":")
    get = lambda path: urllib.request.urlopen(f"http://{{host}}/v2/{{repo}}/{{path}}").read()
    manifest = json.loads(get(f"manifests/{{tag}}"))
    open(dest, "wb").write(get("blobs/" + manifest["layers"][0]["digest"]))
elif verb == "exec":
    image, argv = rest[0], rest[1:]
    root = tempfile.mkdtemp()
    subprocess.run(["unsquashfs", "-q", "-f", "-d", root, image], check=True, stdout=subprocess.DEVNULL)
    env = {{"PATH": "/usr/bin:/bin", "PYTHONPATH": os.path.join(root, "site")}}
    sys.exit(subprocess.run(argv, env=env).returncode)
elif verb == "inspect":  # apptainer's JSON, from the labels file a SIF keeps
    cat = subprocess.run(["unsquashfs", "-cat", rest[0], ".singularity.d/labels.json"], capture_output=True)
    labels = json.loads(cat.stdout) if cat.returncode == 0 and cat.stdout else {{}}
    print(json.dumps({{"data": {{"attributes": {{"labels": labels}}}}, "type": "container"}}))
else:
    sys.exit(f"apptainer stand-in: {{verb}} is not stood in for")
"""

#: A torch package as small as the probe needs: its version, and no CUDA.
TORCH_INIT = "__version__ = {version!r}\nfrom . import version\n"
TORCH_VERSION = "cuda = None\n"


def _squashfs(tmp_path: Path, torch: str, name: str = "", labels: Optional[dict[str, str]] = None) -> bytes:
    """A squashfs of a root whose site directory holds torch ``torch``, with ``labels`` where a SIF keeps them;
    ``name`` tells two such apart."""
    root = tmp_path / f"root-{torch}{name}"
    (root / "site" / "torch").mkdir(parents=True)
    (root / "site" / "torch" / "__init__.py").write_text(TORCH_INIT.format(version=torch))
    (root / "site" / "torch" / "version.py").write_text(TORCH_VERSION)
    (root / "site" / "name").write_text(name)
    if labels is not None:
        (root / ".singularity.d").mkdir()
        (root / ".singularity.d" / "labels.json").write_text(json.dumps(labels))
    out = tmp_path / f"{torch}{name}.sqfs"
    subprocess.run(["mksquashfs", str(root), str(out), "-quiet", "-no-progress", "-noappend"], check=True)
    return out.read_bytes()


@pytest.fixture
def registry() -> Iterator[Registry]:
    with serve() as reg:
        yield reg


@pytest.fixture
def world(tmp_path: Path, registry: Registry) -> tuple[dict[str, str], Path]:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    standin = bindir / "apptainer"
    standin.write_text(STANDIN.format(python=sys.executable))
    standin.chmod(0o755)
    recipes = tmp_path / "recipes"
    recipes.mkdir()
    prefix = tmp_path / "envs" / "box"
    (recipes / "box.toml").write_text(
        f'schema_version = 1\n[recipe]\nname = "box"\n[env]\nkind = "container"\nprefix = "{prefix}"\n'
        f'[container]\nimage = "{registry.url}/torch/cpu:2.5.1"\nbinds = ["/tmp"]\n'
    )
    env = {
        **PLAN_ENV,
        "HOME": str(tmp_path / "home"),
        "ENVBUILDER_HOME": str(tmp_path / "home" / ".envbuilder"),
        "ENVBUILDER_OFFLINE": "0",
        "ENVBUILDER_RECIPE_PATH": str(recipes),
        "PATH": f"{bindir}:/usr/bin:/bin",
    }
    return env, prefix


#: What the image says of itself; the stand-in runs the host's python, so the image's Python is this one's.
LABELS = {
    "org.envbuilder.torch": "2.5.1",
    "org.envbuilder.cuda": "none",
    "org.envbuilder.python": "{}.{}".format(*sys.version_info[:2]),
}


def _create(env: dict[str, str], *more: str) -> subprocess.CompletedProcess[str]:
    # --no-validate: the image here holds a stub torch that no rank can run (create validates a container env
    # by default; tests/integration/test_container_launch.py validates a real image).
    return run_cli(
        "create",
        "box",
        "--json",
        "--no-validate",
        "--facts",
        "tests/data/facts/cpu-only.json",
        *more,
        env=env,
    )


def test_create_pulls_one_image_file_checks_its_torch_and_records_its_digest(
    tmp_path: Path, registry: Registry, world: tuple[dict[str, str], Path]
) -> None:
    env, prefix = world
    layer = _squashfs(tmp_path, "2.5.1")
    digest = registry.image("torch/cpu", "2.5.1", LABELS, layer=layer)
    res = _create(env)
    assert res.returncode == 0, res.stderr
    image = prefix / "image.sif"
    assert image.read_bytes() == layer
    record = json.loads((prefix / "envbuilder" / "record.json").read_text())
    assert record["tools"]["image_sha256"] == hashlib.sha256(layer).hexdigest()
    assert record["tools"]["runtime"] == "apptainer"
    assert record["tools"]["image_digest"] == record["plan"]["container"]["registry_digest"] == digest
    assert record["packages"] == [{"name": "torch", "version": "2.5.1", "installer": "image"}]
    assert record["plan"]["container"]["facts"]["torch"] == "2.5.1"
    # Nothing left beside it but the runtime's cache, which the pull used in place of $HOME's and /tmp.
    work = prefix.parent / ".envbuilder-apptainer"
    assert sorted(p.name for p in prefix.parent.iterdir()) == [".envbuilder-apptainer", "box"]
    pulled = json.loads((tmp_path / "bin" / "pulled-with").read_text())
    assert pulled == {"APPTAINER_CACHEDIR": str(work / "cache"), "APPTAINER_TMPDIR": str(work / "tmp")}
    # Whole while its image file is there (a container env has no bin/python).
    listed = json.loads(run_cli("list", "--json", env=env).stdout)["data"]
    assert [(e["name"], e["health"]["status"]) for e in listed] == [("box", "ok")]
    # --force replaces it with the image the tag names now.
    newer = _squashfs(tmp_path, "2.5.1", name="newer")
    registry.image("torch/cpu", "2.5.1", LABELS, layer=newer)
    assert _create(env).returncode == 0  # exists: left alone
    assert image.read_bytes() == layer
    res = _create(env, "--force")
    assert res.returncode == 0, res.stderr
    assert image.read_bytes() == newer != layer
    assert json.loads(res.stdout)["data"]["status"] == "replaced"


def test_an_image_whose_torch_is_not_what_its_labels_say_is_refused_and_the_old_env_stays(
    tmp_path: Path, registry: Registry, world: tuple[dict[str, str], Path]
) -> None:
    env, prefix = world
    good = _squashfs(tmp_path, "2.5.1")
    registry.image("torch/cpu", "2.5.1", LABELS, layer=good)
    assert _create(env).returncode == 0
    registry.image("torch/cpu", "2.5.1", LABELS, layer=_squashfs(tmp_path, "2.4.0"))
    res = _create(env, "--force")
    assert res.returncode != 0
    assert "holds torch 2.4.0, not 2.5.1 (as its labels said): the env was not put in place" in res.stderr
    assert (prefix / "image.sif").read_bytes() == good
    assert sorted(p.name for p in prefix.parent.iterdir()) == [".envbuilder-apptainer", "box"]


def test_a_registry_the_fetch_cannot_reach_is_named_with_the_way_round_it(
    world: tuple[dict[str, str], Path],
) -> None:
    env, prefix = world
    recipe = Path(env["ENVBUILDER_RECIPE_PATH"]) / "box.toml"
    # Nothing listens on port 9 (discard); planned offline, so only the pull meets it.
    recipe.write_text(re.sub(r'image = "[^"]*"', 'image = "127.0.0.1:9/torch/cpu:2.5.1"', recipe.read_text()))
    res = _create({**env, "ENVBUILDER_OFFLINE": "1"})
    assert res.returncode == 11, res.stderr
    assert "apptainer could not reach the registry 127.0.0.1:9: the connection was refused" in res.stderr
    assert "copy the file here and name its path in container.image" in res.stderr
    assert "ENVBUILDER_INDEX_MIRROR" not in res.stderr
    assert not prefix.exists()


def test_a_local_image_in_the_runtimes_format_is_copied_in_and_a_missing_one_is_named(
    tmp_path: Path, world: tuple[dict[str, str], Path]
) -> None:
    env, prefix = world
    local = tmp_path / "images" / "torch.sif"
    local.parent.mkdir()
    local.write_bytes(_squashfs(tmp_path, "2.5.1"))
    recipe = Path(env["ENVBUILDER_RECIPE_PATH"]) / "box.toml"
    text = re.sub(r'image = "[^"]*"', f'image = "{tmp_path}/images/gone.sif"', recipe.read_text())
    recipe.write_text(text)
    res = _create(env)
    assert res.returncode == 7, res.stderr
    assert f"container.image {tmp_path}/images/gone.sif is not a file here" in res.stderr
    assert "Traceback" not in res.stderr
    assert not prefix.exists()
    recipe.write_text(text.replace("gone.sif", "torch.sif"))
    res = _create(env)
    assert res.returncode == 0, res.stderr
    assert (prefix / "image.sif").read_bytes() == local.read_bytes()
    record = json.loads((prefix / "envbuilder" / "record.json").read_text())
    assert record["packages"][0]["version"] == "2.5.1"  # unknown to plan: what is inside is recorded
    assert record["tools"]["image_digest"] == ""


def test_a_local_image_whose_torch_is_not_what_its_own_labels_say_is_refused(
    tmp_path: Path, world: tuple[dict[str, str], Path]
) -> None:
    env, prefix = world
    (tmp_path / "images").mkdir()
    lying = tmp_path / "images" / "torch.sif"
    lying.write_bytes(_squashfs(tmp_path, "2.4.0", labels={**LABELS, "org.envbuilder.torch": "2.5.1"}))
    recipe = Path(env["ENVBUILDER_RECIPE_PATH"]) / "box.toml"
    recipe.write_text(re.sub(r'image = "[^"]*"', f'image = "{lying}"', recipe.read_text()))
    res = _create(env)
    assert res.returncode == 7, res.stderr
    assert "holds torch 2.4.0, not 2.5.1 (as its labels said): the env was not put in place" in res.stderr
    assert not prefix.exists()
    lying.write_bytes(_squashfs(tmp_path, "2.5.1", name="true", labels=LABELS))
    assert _create(env).returncode == 0
