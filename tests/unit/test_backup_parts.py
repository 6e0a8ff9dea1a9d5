"""The pure parts of backups: script headers, wheel names, digests that ignore the prefix, relocation boundaries,
purge arithmetic, advice, and the self-checksum of backup.json."""

from __future__ import annotations

import base64
import hashlib
import os
import threading
import time
from pathlib import Path

import pytest

from envbuilder import backup
from envbuilder.backup import wheelhouse
from envbuilder.core import settings
from envbuilder.core.errors import BackupError
from envbuilder.system import purge, relocate, state


def _record_line(rel: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{rel},sha256={digest},{len(data)}"


def fake_env(prefix: Path, header: bytes, name: str = "demo", payload: bytes = b"X = 1\n") -> Path:
    """A venv-shaped directory holding one installed distribution with a module, a data file, an entry-point
    script and a plain script whose header the installer rewrote to ``header`` (call again with another
    ``name`` for a second distribution in the same env)."""
    site = prefix / "lib" / "python3.11" / "site-packages"
    info = site / f"{name}-1.0.dist-info"
    info.mkdir(parents=True)
    (prefix / "bin").mkdir(exist_ok=True)
    (prefix / "share").mkdir(exist_ok=True)
    files = {
        site / name / "__init__.py": payload,
        info / "METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n".encode(),
        info / "WHEEL": b"Wheel-Version: 1.0\nTag: py2-none-any\nTag: py3-none-any\n",
        info / "entry_points.txt": f"[console_scripts]\n{name}-cli = {name}:main\n".encode(),
        info / "INSTALLER": b"uv\n",
        prefix / "bin" / f"{name}-cli": header + f"from {name} import main\n".encode(),
        prefix / "bin" / f"{name}-run": header + b"print('run')\n",
        prefix / "share" / f"{name}.txt": b"data\n",
    }
    lines = []
    for path, data in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        lines.append(_record_line(os.path.relpath(path, site), data))
    (info / "RECORD").write_text("\n".join([*lines, f"{name}-1.0.dist-info/RECORD,,"]) + "\n")
    return prefix


def test_headers_written_by_installers_go_back_to_python():
    body = b"import sys\n"
    assert wheelhouse.restore_header(b"#!/scratch/env/bin/python3.11\n" + body) == b"#!python\n" + body
    trampoline = (
        b"#!/bin/sh\n'''exec' \"$(dirname -- \"$(realpath -- \"$0\")\")\"/'python' \"$0\" \"$@\"\n' '''\n"
    )
    assert wheelhouse.restore_header(trampoline + body) == b"#!python\n" + body
    assert wheelhouse.restore_header(b"#!/bin/bash\necho hi\n") == b"#!/bin/bash\necho hi\n"
    assert wheelhouse.restore_header(b"no header") == b"no header"


def test_digest_ignores_the_prefix_and_the_installers_own_files(tmp_path):
    a = wheelhouse.scan(fake_env(tmp_path / "a", b"#!/a/bin/python\n"))
    b = wheelhouse.scan(fake_env(tmp_path / "b" / "deeper", b"#!/bin/sh\n'''exec' x \"$0\" \"$@\"\n' '''\n"))
    assert len(a) == len(b) == 1
    assert a[0].digest == b[0].digest
    arcs = {e.arcname for e in a[0].entries}
    # The entry-point script and INSTALLER are the installer's; the plain script and the data file are the wheel's.
    assert "demo-1.0.data/scripts/demo-run" in arcs and "demo-1.0.data/data/share/demo.txt" in arcs
    assert not any(x.endswith(("demo-cli", "INSTALLER", "RECORD")) for x in arcs)
    assert a[0].wheel_filename() == "demo-1.0-py2.py3-none-any.whl"


def test_a_changed_file_changes_nothing_in_the_digest_but_is_refused_when_packed(tmp_path):
    prefix = fake_env(tmp_path / "env", b"#!/x/bin/python\n")
    before = wheelhouse.scan(prefix)[0]
    (prefix / "lib/python3.11/site-packages/demo/__init__.py").write_text("X = 2\n")
    after = wheelhouse.scan(prefix)[0]
    assert after.digest == before.digest  # RECORD did not change
    with pytest.raises(wheelhouse.Modified, match="differ from what was installed"):
        wheelhouse.check_unchanged(after)
    with (tmp_path / "out.whl").open("wb") as fh, pytest.raises(wheelhouse.Modified):
        wheelhouse.pack(after, fh)


@pytest.mark.skipif(not wheelhouse.zstd(), reason="zstd is not installed (CI installs it)")
def test_a_blob_is_checked_as_it_is_decompressed(tmp_path):
    prefix = fake_env(tmp_path / "env", b"#!/x/bin/python\n")
    dist = wheelhouse.scan(prefix)[0]
    store = wheelhouse.Store(tmp_path / "root", zstd_bin=wheelhouse.zstd())
    blob = store.put(dist).to_json()
    with (tmp_path / "plain.whl").open("wb") as fh:
        assert wheelhouse.pack(dist, fh) == blob["wheel_size"]
    good = store.extract({**blob, "name": "demo"}, tmp_path)
    assert good.read_bytes() == (tmp_path / "plain.whl").read_bytes()
    good.unlink()
    stored = tmp_path / "root" / blob["path"]
    data = bytearray(stored.read_bytes())
    data[len(data) // 2] ^= 0x01
    stored.write_bytes(bytes(data))
    with pytest.raises(BackupError, match=r"demo: .* does not match its sha256"):
        store.extract({**blob, "name": "demo"}, tmp_path)
    assert not good.exists()  # no half-written wheel is left behind


def test_a_cancelled_pack_stops_and_leaves_no_temp_blob(tmp_path):
    dist = wheelhouse.scan(fake_env(tmp_path / "env", b"#!/x/bin/python\n"))[0]
    store = wheelhouse.Store(tmp_path / "root", zstd_bin=wheelhouse.zstd())
    cancel = threading.Event()
    cancel.set()
    with pytest.raises(wheelhouse.Cancelled):
        store.put(dist, cancel=cancel)
    assert [p for p in (tmp_path / "root").rglob("*") if p.is_file()] == []


def test_the_first_real_failure_is_reported_not_the_cancellation_of_the_others(tmp_path):
    prefix = fake_env(tmp_path / "env", b"#!/x/bin/python\n", "big", b"X = 1\n" * 3_000_000)
    fake_env(prefix, b"#!/x/bin/python\n", "small")
    (prefix / "lib/python3.11/site-packages/small/__init__.py").write_text("edited\n")
    record = state.EnvRecord("two", "r", "", str(prefix), "", plan={"kind": "venv"})
    root = tmp_path / "root"
    with pytest.raises(wheelhouse.Modified, match=r"small 1\.0: 1 file"):
        backup.make(record, root, "wheelhouse")
    # No temporary file is left. A wheel stored whole before the failure stays (the store is content-addressed;
    # prune removes what no backup uses), with the digest remembered beside it (.NAME.sha256).
    hidden = [p for p in root.rglob(".*") if p.is_file()]
    assert all(p.name.endswith(".sha256") and p.with_name(p.name[1:-7]).is_file() for p in hidden), hidden
    assert not (root / "envs" / "two").exists() or list((root / "envs" / "two").iterdir()) == []


def test_a_missing_file_is_reported(tmp_path):
    prefix = fake_env(tmp_path / "env", b"#!/x/bin/python\n")
    (prefix / "share" / "demo.txt").unlink()
    assert wheelhouse.scan(prefix)[0].missing == ("share/demo.txt",)


@pytest.mark.parametrize(
    "rel",
    [
        "torch/__init__.py",
        "../../../bin/torchrun",
        "./pkg/mod.py",
        "pkg//mod.py",
        "pkg/./mod.py",
        "pkg/sub/../mod.py",
        "pkg/.hidden",
        ".libs/libx.so",
        "pkg/",
        "..",
        ".",
        "/abs/file",
        "a,b/c.py",
    ],
)
def test_a_record_path_is_joined_as_normpath_join_does(rel):
    site = "/p/lib/python3.11/site-packages"
    assert wheelhouse._joined(site, rel) == os.path.normpath(os.path.join(site, rel))


def test_a_file_is_there_as_lexists_has_it(tmp_path):
    """scan's listing of each directory answers as ``os.path.lexists`` would: a broken symlink is there, a name
    under a file or under a missing directory is not, a directory reached through a link is listed."""
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "f").write_text("x")
    (tmp_path / "d" / "dangling").symlink_to(tmp_path / "nowhere")
    (tmp_path / "linked").symlink_to(tmp_path / "d")
    listing = wheelhouse._Listing()
    for directory, name in [
        ("d", "f"),
        ("d", "dangling"),
        ("d", "gone"),
        ("linked", "f"),
        ("d/f", "x"),
        ("missing", "f"),
    ]:
        path = tmp_path / directory / name
        assert listing.has(str(tmp_path / directory), name) == os.path.lexists(path), path


def test_relocation_rewrites_whole_paths_in_safe_files_only(tmp_path):
    root = tmp_path / "env"
    (root / "bin").mkdir(parents=True)
    (root / "lib" / "python3.11" / "site-packages").mkdir(parents=True)
    (root / "bin" / "tool").write_text("#!/old/env/bin/python\n# /old/env2 is another env\n")
    (root / "pyvenv.cfg").write_text("home = /usr/bin\ncommand = /usr/bin/python3 -m venv /old/env\n")
    (root / "lib" / "python3.11" / "site-packages" / "x.pth").write_text("/old/env/src\n")
    (root / "lib" / "libfoo.so").write_bytes(b"\x7fELF\0\0/old/env/lib\0")
    (root / "notes.txt").write_text("built in /old/env\n")
    result = relocate.relocate(root, "/old/env", "/new/place")
    assert sorted(result.rewritten) == ["bin/tool", "lib/python3.11/site-packages/x.pth", "pyvenv.cfg"]
    assert sorted(result.left) == ["lib/libfoo.so", "notes.txt"]
    assert (root / "bin" / "tool").read_text() == "#!/new/place/bin/python\n# /old/env2 is another env\n"
    # A new prefix that would need quoting in a shell script is written nowhere.
    again = relocate.relocate(root, "/new/place", "/new/it's here")
    assert again.rewritten == () and "bin/tool" in again.left


def _record(prefix: Path, fs: dict) -> state.EnvRecord:
    return state.EnvRecord("e", "e", "d", str(prefix), "now", plan={"kind": "venv", "filesystem": fs})


def test_purge_days_left_come_from_the_least_recently_read_file(tmp_path):
    prefix = tmp_path / "env"
    (prefix / "a").mkdir(parents=True)
    (prefix / "a" / "old.py").write_text("")
    (prefix / "new.py").write_text("")
    now = time.time()
    os.utime(prefix / "a" / "old.py", (now - 3 * 86400, now))
    status = purge.status(_record(prefix, {"name": "scratch", "purge_days": 10}), now=now)
    assert status is not None and status.oldest == "a/old.py"
    assert status.days_left == pytest.approx(7, abs=0.01)
    assert purge.status(_record(prefix, {"name": "work"})) is None  # not purged
    gone = purge.status(_record(tmp_path / "nope", {"name": "scratch", "purge_days": 10}))
    assert gone is not None and gone.days_left is None


def test_advice_suggests_backup_on_purged_file_systems_and_restore_when_gone(tmp_path):
    purged = _record(tmp_path, {"name": "scratch", "purge_days": 10})
    safe = _record(tmp_path, {"name": "home"})
    assert backup.advice(purged, "ok", have_backup=False) == "envbuilder backup e"
    assert backup.advice(purged, "ok", have_backup=True) is None
    assert backup.advice(safe, "ok", have_backup=False) is None
    assert backup.advice(safe, "gone", have_backup=True) == "envbuilder restore e"
    assert backup.advice(purged, "damaged", have_backup=True) == "envbuilder restore e --force"


def test_an_edited_backup_json_is_reported_not_trusted(tmp_path):
    d = tmp_path / "envs" / "e" / "20260101T000000Z"
    d.mkdir(parents=True)
    data = {"version": backup.BACKUP_VERSION, "mode": "wheelhouse", "wheels": []}
    data["checksum"] = backup.checksum(data)
    (d / "backup.json").write_text(__import__("json").dumps(data))
    assert backup.backups(tmp_path)[0].error is None
    data["mode"] = "archive"
    (d / "backup.json").write_text(__import__("json").dumps(data))
    found = backup.backups(tmp_path)[0]
    assert found.error is not None and "checksum" in found.error
    assert backup.verify(found) == [found.error]


def test_backup_root_order(tmp_path):
    assert settings.backup_root({"ENVBUILDER_BACKUP_ROOT": "/r", "WORK": "/w"})[0] == Path("/r")
    assert settings.backup_root({"WORK": "/w"})[0] == Path("/w/envbuilder/backups")
    assert settings.backup_root({"ENVBUILDER_HOME": "/h"})[0] == Path("/h/backups")


def test_restore_asks_uv_cache_with_the_recorded_indexes():
    from envbuilder.backup.restore import _index_flags

    torch_step = [
        "uv",
        "pip",
        "install",
        "--python",
        "/e/bin/python",
        "--index-url",
        "https://i/whl/cpu",
        "torch==2.7.1",
    ]
    pkgs_step = ["uv", "pip", "install", "--python", "/e/bin/python", "--constraint", "/e/c.txt", "numpy"]
    assert _index_flags([torch_step, pkgs_step]) == [
        "--index-url", "https://i/whl/cpu", "--extra-index-url", "https://pypi.org/simple",
    ]  # fmt: skip
    mirrored = [
        "uv",
        "pip",
        "install",
        "--index-url",
        "http://m/simple/",
        "--find-links",
        "/opt/w",
        "--pre",
        "x",
    ]
    assert _index_flags([torch_step, mirrored]) == [
        "--index-url", "https://i/whl/cpu", "--extra-index-url", "http://m/simple/", "--find-links", "/opt/w", "--pre",
    ]  # fmt: skip
    assert _index_flags([["uv", "pip", "install", "--no-index", "--find-links", "/w", "x"]]) == [
        "--no-index", "--find-links", "/w",
    ]  # fmt: skip


def test_a_container_env_with_packages_on_top_is_backed_up_with_its_overlay_never_half(tmp_path):
    """An image backup of an env whose packages live in a venv beside the image (an overlay) holds both: the image
    file and an archive of the venv with its manifest. Without the venv it is refused with the reason before
    anything is written, rather than backed up without them."""
    from envbuilder.backup import image

    prefix = tmp_path / "box"
    prefix.mkdir()
    (prefix / "image.sif").write_bytes(b"sqsh")
    plan = {"kind": "container", "container": {"overlay": {"path": f"{prefix}/venv"}}}
    record = state.EnvRecord("box", "r", "", str(prefix), "", plan=plan, tools={"image_file": "image.sif"})
    partial = tmp_path / "partial"
    partial.mkdir()
    with pytest.raises(BackupError, match=r"overlay venv .* is missing: a backup of the image alone"):
        image.store(record, prefix, partial, 0o600, lambda _: None)
    assert list(partial.iterdir()) == []
    (prefix / "venv" / "lib").mkdir(parents=True)
    (prefix / "venv" / "lib" / "demo.py").write_text("X = 1\n")
    data = image.store(record, prefix, partial, 0o600, lambda _: None)
    assert data["overlay"]["file"].startswith("overlay.tar") and data["overlay"]["dir"] == "venv"
    assert sorted(p.name for p in partial.iterdir()) == [
        "image.sif",
        "overlay-manifest.json",
        data["overlay"]["file"],
    ]
    assert data["bytes"] == 4 + data["overlay"]["size"]
    restored = tmp_path / "restored"
    restored.mkdir()
    assert image.put_back_overlay(tmp_path, "partial", data, restored, None) is None
    assert (restored / "venv" / "lib" / "demo.py").read_text() == "X = 1\n"


METADATA = """Metadata-Version: 2.4
Name: Demo-Pkg
Version: 1.0.post1
Summary: a summary
License: first line
 second line
\tthird line
Classifier: A
classifier: B
Requires-Dist: x>=1; extra == "y"
description-content-type: text/markdown

# Demo
Name: not-a-header
Version: 9
"""

WHEEL = "Wheel-Version: 1.0\nGenerator: bdist_wheel\nRoot-Is-Purelib: false\nTag: cp311-cp311-linux_x86_64\nTag: cp311-abi3-linux_x86_64\n"


@pytest.mark.parametrize("text", [METADATA, WHEEL, "", "Name: only\n", "\n\nName: after a blank\n"])
def test_metadata_headers_read_as_email_parser_reads_them(text):
    from email.parser import HeaderParser

    parsed = HeaderParser().parsestr(text)
    ours = wheelhouse.headers(text)
    for key in {k.lower() for k in parsed} | set(ours):
        theirs = [" ".join(v.split()) for v in parsed.get_all(key) or []]
        assert [" ".join(v.split()) for v in ours.get(key, [])] == theirs, key
    assert wheelhouse.headers(METADATA)["name"] == ["Demo-Pkg"]  # the description's lines are no headers
    assert wheelhouse.headers(METADATA)["classifier"] == ["A", "B"]
