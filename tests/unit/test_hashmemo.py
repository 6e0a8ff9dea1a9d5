"""A stored file's remembered digest (envbuilder/backup/hashmemo.py) on real files: it holds only for the very file
that was hashed, unchanged since, and only when the file stayed the same while it was read."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from envbuilder.backup import hashmemo

REL = "store/ab/abcdef.whl.zst"


@pytest.fixture
def blob(tmp_path: Path) -> Path:
    path = tmp_path / REL
    path.parent.mkdir(parents=True)
    path.write_bytes(b"wheel bytes" * 1000)
    return path


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _remember(root: Path, blob: Path) -> str:
    st = os.stat(blob)
    digest = _sha(blob)
    hashmemo.remember(root, REL, digest, st, os.stat(blob))
    return digest


def test_a_remembered_digest_holds_for_the_unchanged_file_only(tmp_path: Path, blob: Path) -> None:
    digest = _remember(tmp_path, blob)
    memo = hashmemo.beside(blob)
    assert memo.name == ".abcdef.whl.zst.sha256" and json.loads(memo.read_text())["sha256"] == digest
    assert hashmemo.holds(tmp_path, REL, digest, os.stat(blob))
    assert not hashmemo.holds(tmp_path, REL, "0" * 64, os.stat(blob))  # another digest is not vouched for
    # The same size, and the modification time put back: the change time still moved.
    st = os.stat(blob)
    blob.write_bytes(b"WHEEL BYTES" * 1000)
    os.utime(blob, ns=(st.st_atime_ns, st.st_mtime_ns))
    after = os.stat(blob)
    assert after.st_size == st.st_size and after.st_mtime_ns == st.st_mtime_ns
    assert not hashmemo.holds(tmp_path, REL, digest, after)


def test_a_file_replaced_by_another_is_not_the_one_hashed(tmp_path: Path, blob: Path) -> None:
    digest = _remember(tmp_path, blob)
    other = blob.with_name("other")
    other.write_bytes(blob.read_bytes())
    os.replace(other, blob)  # the same bytes in a new inode: hashed again (cheap to be wrong this way)
    assert not hashmemo.holds(tmp_path, REL, digest, os.stat(blob))


def test_a_file_that_changed_while_it_was_read_is_not_remembered(tmp_path: Path, blob: Path) -> None:
    before = os.stat(blob)
    digest = _sha(blob)
    blob.write_bytes(b"changed meanwhile" * 100)
    hashmemo.remember(tmp_path, REL, digest, before, os.stat(blob))
    assert not hashmemo.beside(blob).exists()


def test_a_memo_of_another_shape_or_reached_through_a_link_is_no_memo(tmp_path: Path, blob: Path) -> None:
    digest = _remember(tmp_path, blob)
    memo = hashmemo.beside(blob)
    real = json.loads(memo.read_text())
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_text(json.dumps(real))
    memo.unlink()
    memo.symlink_to(elsewhere)
    assert not hashmemo.holds(tmp_path, REL, digest, os.stat(blob))
    memo.unlink()
    for text in ("not json", "[]", json.dumps({**real, "identity": real["identity"][:-1]})):
        memo.write_text(text)
        assert not hashmemo.holds(tmp_path, REL, digest, os.stat(blob)), text


def test_a_store_that_takes_no_memo_is_hashed_next_time(tmp_path: Path, blob: Path) -> None:
    blob.parent.chmod(0o500)
    try:
        if os.access(blob.parent, os.W_OK):  # root writes anyway: make the memo's name a directory instead
            blob.parent.chmod(0o700)
            hashmemo.beside(blob).mkdir()
        digest = _remember(tmp_path, blob)  # no error: best effort
        assert not hashmemo.holds(tmp_path, REL, digest, os.stat(blob))
    finally:
        blob.parent.chmod(0o700)
