"""A node's side of staging a container env's image file (``__stage-node prepare-file|place|fetch-file``), run
here on real files as each node runs it: the file copied as it is (a runtime runs it; nothing is unpacked),
checked against the recorded sha256 before it takes its copy's name, the env's older copies dropped; a file that
is not the recorded image never appears under a copy's name. The Slurm path (one sbcast, then ``place`` on
each node) runs in test_container_keep.py."""

from __future__ import annotations

import hashlib
import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from envbuilder.core.errors import StateError, UsageError
from envbuilder.scale import image, staging
from envbuilder.system import transaction

pytestmark = pytest.mark.integration


@pytest.fixture
def node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """This node's directory for copies (its TMPDIR's); the aliases made in the one every node names alike are
    removed after."""
    local = tmp_path / "node-local"
    local.mkdir()
    monkeypatch.setenv("TMPDIR", str(local))
    yield local / f"envbuilder-{os.getuid()}"
    for alias in image.default_base().glob("box-*.image.sif"):
        if alias.is_symlink() and str(tmp_path) in os.readlink(alias):
            alias.unlink()


def made(path: Path, content: bytes) -> tuple[Path, str, str]:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)
    digest = hashlib.sha256(content).hexdigest()
    return path, digest, f"box-{digest[:16]}"


def test_a_node_copies_the_image_file_checked_and_drops_the_env_s_older_copy(tmp_path, node):
    source, digest, key = made(tmp_path / "envs" / "box" / "image.sif", os.urandom(1 << 20))
    copy = node / f"{key}.image.sif"
    assert staging.on_node("fetch-file", key, digest, str(source)) == f"copied {socket.gethostname()} {copy}"
    assert copy.read_bytes() == source.read_bytes()
    assert staging.on_node("fetch-file", key, digest, str(source)) == f"ready {node}"
    assert staging.on_node("prepare-file", key, digest, "image.sif") == f"ready {node}"
    # The env's image replaced (create --force): its new copy, and the old one gone from the node.
    newer, new_digest, new_key = made(tmp_path / "envs2" / "box" / "image.sif", os.urandom(1 << 20))
    assert staging.on_node("prepare-file", new_key, new_digest, "image.sif") == f"empty {node}"
    staging.on_node("fetch-file", new_key, new_digest, str(newer))
    assert sorted(p.name for p in node.iterdir() if not p.name.endswith(".lock")) == [f"{new_key}.image.sif"]


def test_a_file_that_is_not_the_recorded_image_never_takes_a_copy_s_name(tmp_path, node):
    source, digest, key = made(tmp_path / "envs" / "box" / "image.sif", b"the image")
    source.write_bytes(b"another image")  # changed after its sha256 was recorded
    with pytest.raises(StateError, match="does not match its recorded sha256"):
        staging.on_node("fetch-file", key, digest, str(source))
    assert not list(node.glob(f"*{key}*image.sif*")), list(node.iterdir())
    # What a node step is handed is a file name of a runtime's image or the path of a broadcast, nothing else.
    with pytest.raises(UsageError, match="is not a container image file name"):
        staging.on_node("prepare-file", key, digest, "../../etc/passwd")
    with pytest.raises(UsageError, match="is not where stage broadcasts the image file"):
        staging.on_node("place", key, digest, str(node / f"{key}.image.sif"))
    sent = node / f".{key}.image.sif{transaction.PARTIAL}42"
    sent.write_bytes(b"another image")
    with pytest.raises(StateError, match="does not match its recorded sha256"):
        staging.on_node("place", key, digest, str(sent))
    assert not sent.exists()
    assert not (node / f"{key}.image.sif").exists()
