"""A container env kept like an env, through the CLI and the container test world's real parts (tests/containers.py:
Debian's OCI registry on 127.0.0.1, the Apptainer stand-in over Charliecloud): ``list`` and ``show`` say what the
image is (its file, sha256 and registry digest, the runtime, the binds, the torch inside and the system it runs
on, as create read them inside) and no bin/activate;
``doctor`` checks the image file against its recorded sha256 and the runtime on the PATH, and starts the image's
python inside it through the runtime (none on the host); ``backup`` copies the image file to the backup root, verified, ``restore`` puts it back at a prefix,
verified, atomically (``--force`` replaces); ``remove`` deletes the env and never what a link in it leads to.

The env is created once for the module (one pull of the CPU tag, tens of seconds); a test that changes it puts it
back as it was, or works on a copy restored from a backup."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import containers
import pytest
from helpers import UserWorld, cli_argv, cli_env, ok, refused
from sharedfs import give_to, other_user
from slurm import MultiNodeCluster

from envbuilder.scale import image
from envbuilder.system import transaction

pytestmark = [pytest.mark.integration, pytest.mark.rootfs]

CPU = containers.TAGS[0].name


class BoxWorld(UserWorld):
    """A user's world whose recipe ``box`` is a container env of the world's CPU tag, created in it."""

    def __init__(self, root: Path, registry: containers.Registry, apptainer: SimpleNamespace) -> None:
        super().__init__(
            root,
            USER="u1",
            ENVBUILDER_OFFLINE="0",
            APPTAINER_NOHTTPS="1",
            PATH=f"{apptainer.bin}:{os.environ['PATH']}",
            WORK=str(root / "work"),
        )
        self.prefix = self.scratch / "envs" / "box"
        self.write_recipe(
            "box",
            'schema_version = 1\n[recipe]\nname = "box"\n[env]\nkind = "container"\n'
            f'prefix = "{self.prefix}"\n[container]\nimage = "{registry.ref(CPU)}"\nbinds = ["/tmp"]\n',
        )
        self.image = self.prefix / "image.sif"

    def record(self, name: str = "box") -> dict:
        return json.loads((self.home / "envs" / f"{name}.json").read_text())


@pytest.fixture(scope="module")
def box(tmp_path_factory: pytest.TempPathFactory, oci_registry, apptainer) -> Iterator[BoxWorld]:
    world = BoxWorld(tmp_path_factory.mktemp("box"), oci_registry, apptainer)
    ok(world.cli("create", "box", "--no-validate", "--facts", "tests/data/facts/cpu-only.json"))
    yield world


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_show_and_list_say_what_the_image_is_and_print_no_activate_script(box, oci_registry):
    data = box.data("show", "box")
    inside = data["container"]
    assert inside["image"] == oci_registry.ref(CPU)
    assert inside["file"] == str(box.image)
    assert inside["sha256"] == sha256(box.image)
    assert inside["digest"] == oci_registry.digests[CPU]
    assert (inside["runtime"], inside["binds"], inside["torch"]) == (
        "apptainer",
        ["/tmp"],
        containers.TORCH_BUILD,
    )
    # The system the image's python runs on, as create read it inside (the world's image is a bookworm root).
    assert (inside["os"], inside["glibc"]) == ("Debian GNU/Linux 12 (bookworm)", "2.36"), inside
    text = ok(box.cli("show", "box")).stdout
    assert f"{oci_registry.ref(CPU)} ({box.image})" in text, text
    assert "on Debian GNU/Linux 12 (bookworm) (glibc 2.36)" in text, text
    assert f"sha256: {inside['sha256']}" in text.replace("  ", " "), text
    assert oci_registry.digests[CPU] in text, text
    assert "bin/activate" not in text, text
    listed = box.data("list")
    assert [(e["name"], e["health"]["status"], e["torch"]) for e in listed] == [
        ("box", "ok", containers.TORCH_BUILD)
    ]


def findings(data: dict, check: str) -> list[tuple[str, str]]:
    return [(f["severity"], f["message"]) for f in data["findings"] if f["check"] == check]


def doctor(box: BoxWorld, *names: str, **extra: str) -> tuple[int, dict]:
    res = box.cli("doctor", *names, "--json", "--facts", "tests/data/facts/cpu-only.json", **extra)
    return res.returncode, json.loads(res.stdout)["data"]


def test_doctor_checks_the_image_file_its_runtime_and_its_python_inside(box, apptainer):
    code, data = doctor(box, "box")
    assert code == 0, data
    # The env's python is the image's, started inside it through the runtime (nothing at PREFIX/bin/python).
    [(severity, said)] = findings(data, "python")
    assert (severity, said.rsplit(".", 1)[0]) == (
        "info",
        f"python3 starts inside its image: Python {containers.PYTHON}",
    )
    digest = sha256(box.image)
    assert findings(data, "image") == [
        ("info", f"its image {box.image} is the one recorded (sha256 {digest[:16]}…)")
    ]
    assert findings(data, "runtime") == [("info", f"apptainer runs its image: {apptainer.exe}")]
    # The sha256 is kept with the file's identity and times: doctor reads a multi-GB image again only once it
    # changed.
    cached = json.loads((box.home / "cache" / "image-hashes.json").read_text())["images"]
    assert cached[str(box.image)]["sha256"] == digest
    size = box.image.stat().st_size
    with box.image.open("ab") as f:  # a byte more: another image than the one built
        f.write(b"\0")
    try:
        code, data = doctor(box, "box")
        assert code == 14
        [(severity, said)] = findings(data, "image")
        assert severity == "action"
        assert said.startswith(f"its image {box.image} is not the one recorded: sha256 "), said
    finally:
        os.truncate(box.image, size)
    assert doctor(box, "box")[0] == 0
    # The runtime is looked for on the PATH the env's modules give: without it, nothing runs the image.
    code, data = doctor(box, "box", PATH="/usr/bin:/bin")
    assert code == 14
    [(severity, said)] = findings(data, "runtime")
    assert severity == "action"
    assert (
        said
        == "apptainer, the runtime that runs its image, is not on the PATH its modules give (/usr/bin:/bin)"
    )


def backup_dir(box: BoxWorld, backup_id: str) -> Path:
    name, stamp = backup_id.split("@")
    return box.root / "work" / "envbuilder" / "backups" / "envs" / name / stamp


def test_backup_copies_the_image_verified_and_restore_puts_it_back_atomically(box):
    digest = sha256(box.image)
    made = box.data("backup", "box")
    assert made["mode"] == "image"
    where = backup_dir(box, made["id"])
    assert sorted(p.name for p in where.iterdir()) == ["backup.json", "image.sif"]
    assert sha256(where / "image.sif") == digest
    assert box.data("verify-backup", "box")["ok"] is True
    # At another prefix, under another name: the same image, the same recorded sha256, whole.
    other = box.scratch / "envs" / "box2"
    restored = box.data("restore", "box", "--prefix", str(other), "--name", "box2")
    assert restored["status"] == "restored"
    assert sha256(other / "image.sif") == digest
    assert box.record("box2")["tools"]["image_sha256"] == digest
    assert box.data("show", "box2")["health"]["status"] == "ok"
    assert doctor(box, "box2")[0] == 0
    # Never over an env by itself; --force replaces it.
    refused(box.cli("restore", "box"), 9, "restore never overwrites an env by itself")
    assert box.data("restore", "box", "--force")["status"] == "replaced"
    assert sha256(box.image) == digest
    # Nothing left beside them but the runtime's cache that create made.
    assert sorted(p.name for p in box.prefix.parent.iterdir()) == [".envbuilder-apptainer", "box", "box2"]
    # A backup whose image lost a byte is not restored, and the env stays.
    with (where / "image.sif").open("r+b") as f:
        f.seek(4096)
        byte = f.read(1)
        f.seek(4096)
        f.write(bytes([byte[0] ^ 1]))
    # Read once: hashed as it is copied beside the env, before the rename.
    res = box.cli("restore", "box", "--force")
    refused(
        res, 12, f"the backup's image {where / 'image.sif'} does not match its sha256 (a changed or damaged"
    )
    assert sha256(box.image) == digest
    assert sorted(p.name for p in box.prefix.parent.iterdir()) == [".envbuilder-apptainer", "box", "box2"]
    refused(box.cli("verify-backup", "box"), 12, "does not match its sha256 (a changed or damaged byte)")


def test_an_image_that_changed_since_it_was_built_is_not_backed_up(box):
    size = box.image.stat().st_size
    with box.image.open("ab") as f:
        f.write(b"\0")
    try:
        res = box.cli("backup", "box")
        refused(res, 12, f"box's image {box.image} is not the one recorded (sha256 ")
    finally:
        os.truncate(box.image, size)
    # A container env's backup is its image: the other modes say so.
    refused(box.cli("backup", "box", "--mode", "archive"), 12, "its backup is its image file (--mode image)")


def test_remove_deletes_the_env_and_never_what_a_link_in_it_leads_to(box):
    made = box.data("backup", "box")
    other = box.scratch / "envs" / "box3"
    box.data("restore", "box", "--backup", made["id"], "--prefix", str(other), "--name", "box3")
    # Another user's file, linked from inside the env in place of its image: the link goes, the file stays.
    user = other_user()
    theirs = box.root / "theirs"
    theirs.mkdir()
    target = theirs / "their.sif"
    target.write_bytes(b"not yours")
    give_to(target, user, 0o644)
    give_to(theirs, user, 0o755)
    (other / "image.sif").unlink()
    (other / "image.sif").symlink_to(target)
    res = ok(box.cli("remove", "box3", "--yes"))
    assert "removed box3" in res.stdout, res.stdout
    assert not other.exists()
    assert target.read_bytes() == b"not yours"
    assert "box3" not in [e["name"] for e in box.data("list")]


NODES = ["n1", "n2"]


def salloc(env: dict[str, str], *args: str) -> dict:
    argv = ["salloc", "--nodes=2", "--ntasks-per-node=1", *cli_argv(*args, "--json")]
    return json.loads(ok(subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)).stdout)[
        "data"
    ]


@pytest.mark.slurm
@pytest.mark.multinode
def test_pack_leaves_the_image_file_and_stage_copies_it_to_each_node_checked(
    box, slurm_nodes: MultiNodeCluster
) -> None:
    digest = sha256(box.image)
    packed = box.data("pack", "box")
    assert (packed["path"], packed["sha256"], packed["packed"]) == (str(box.image), digest, False)
    assert sorted(p.name for p in box.prefix.iterdir()) == ["envbuilder", "image.sif"]
    env = cli_env({**box.env, **slurm_nodes.env, "TMPDIR": str(slurm_nodes.local)})
    staged = salloc(env, "stage", "box")
    assert (staged["nodes"], staged["copied"]) == (2, True), staged
    path = Path(staged["path"])
    assert path.name == f"box-{digest[:16]}.image.sif"
    relative = path.relative_to(slurm_nodes.local)
    try:
        for node in NODES:  # each node's own copy, the file as it is (the runtime runs it), nothing beside it
            copy = slurm_nodes.node_local(node) / relative
            assert sha256(copy) == digest, node
            assert not list(copy.parent.glob(f"*{transaction.PARTIAL}*")), node
        assert not (slurm_nodes.local / relative.parts[0]).exists()  # on the nodes, not here
        again = salloc(env, "stage", "box")
        assert (again["path"], again["copied"]) == (str(path), False)
        cleaned = salloc(env, "stage", "box", "--clean")
        assert cleaned["removed"] == dict.fromkeys(NODES, 1), cleaned
        for node in NODES:
            assert not (slurm_nodes.node_local(node) / relative).exists(), node
    finally:
        alias = image.default_base() / path.name
        if alias.is_symlink():
            alias.unlink()
