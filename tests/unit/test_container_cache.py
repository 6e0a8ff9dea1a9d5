"""A removed container env's runtime cache beside it (``.envbuilder-RUNTIME``, which create makes in the prefix's
directory and every container env there shares), on real files: removed when no other env uses it, kept for a
container env of the same runtime or a create under way beside it, and never followed through a symlink."""

from __future__ import annotations

import json
from pathlib import Path

from sharedfs import give_to, other_user

from envbuilder.backends.container import drop_work_dir, work_dir


def _env(path: Path, kind: str, runtime: str) -> None:
    (path / "envbuilder").mkdir(parents=True)
    record = {"plan": {"kind": kind, "container": {"runtime": runtime}}, "tools": {"runtime": runtime}}
    (path / "envbuilder" / "record.json").write_text(json.dumps(record))


def _cache(parent: Path) -> Path:
    work = work_dir(parent, "apptainer")
    (work / "cache" / "blobs").mkdir(parents=True)
    (work / "cache" / "blobs" / "layer").write_bytes(b"x" * 64)
    return work


def test_the_cache_goes_with_the_last_container_env_of_its_runtime(tmp_path: Path) -> None:
    work = _cache(tmp_path)
    _env(tmp_path / "other", "container", "apptainer")
    _env(tmp_path / "venv", "venv", "")
    _env(tmp_path / "pod", "container", "podman")
    assert drop_work_dir(tmp_path / "box", "apptainer") == "other beside it uses it"
    assert work.is_dir()
    (tmp_path / "other" / "envbuilder" / "record.json").unlink()
    assert drop_work_dir(tmp_path / "box", "apptainer") is None
    assert not work.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other", "pod", "venv"]


def test_a_create_under_way_keeps_it_and_a_link_is_never_followed(tmp_path: Path) -> None:
    work = _cache(tmp_path)
    (tmp_path / ".partial-box2-123").mkdir()
    assert drop_work_dir(tmp_path / "box", "apptainer") == ".partial-box2-123 beside it uses it"
    (tmp_path / ".partial-box2-123").rmdir()
    elsewhere = tmp_path / "theirs"
    work.rename(elsewhere)
    work.symlink_to(elsewhere)
    said = drop_work_dir(tmp_path / "box", "apptainer")
    assert said is not None and "link" in said, said
    assert work.is_symlink() and (elsewhere / "cache" / "blobs" / "layer").read_bytes() == b"x" * 64


def test_another_users_cache_is_left_to_them(tmp_path: Path) -> None:
    # A group-shared envs directory where another user made the runtime's directory: it is not this user's to
    # remove, even as root.
    work = _cache(tmp_path)
    give_to(work, other_user())
    said = drop_work_dir(tmp_path / "box", "apptainer")
    assert said is not None and "belongs to another user" in said, said
    assert (work / "cache" / "blobs" / "layer").read_bytes() == b"x" * 64
