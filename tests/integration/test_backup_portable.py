"""Portable archives for real (`backup ENV --portable`): a venv of small test wheels built with real uv from a local
index, packed, its original removed, then unpacked with `sh unpack.sh NEW_PREFIX` where no envbuilder is on PATH and
PYTHONPATH is empty; its python, bash activation and console scripts used at the new prefix (one with a space);
refusals of an existing directory, an unsafe prefix and a damaged archive. One torch env is unpacked and imports
torch."""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest
from backupworld import BARE_PATH, World, bare_env, extract, pack, unpack
from helpers import ok

from envbuilder.backup import portable

pytestmark = pytest.mark.integration


@pytest.fixture
def world(tmp_path, backup_index):
    return World(tmp_path, backup_index)


def bash(script: str, home: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "--norc", "--noprofile", "-c", script], capture_output=True, text=True, env=bare_env(home)
    )


def test_a_portable_venv_unpacks_at_a_new_prefix_with_a_space_without_envbuilder(world):
    w = world
    ok(w.cli("create", w.small("port", "ebtool==1.0", "ebdemo==1.0", installer="pip"), "--no-validate"))
    old = w.prefix("port")
    old.chmod(0o750)  # the archive is no more readable than the env (as a backup)
    made = pack(w, "port", w.root / "port.portable.tar")
    assert (w.root / "port.portable.tar").stat().st_mode & 0o777 == 0o640
    assert made["env"] == "port" and made["prefix"] == str(old) and made["kind"] == "venv"
    assert made["payload"]["compression"] == ("zstd" if shutil.which("zstd") else "gzip")
    assert {"bin/ebtool", "bin/activate.csh", "envbuilder/record.json"} <= set(made["rewrite"])
    with tarfile.open(w.root / "port.portable.tar") as tar:
        assert tar.getnames()[0] == "unpack.sh"
    kit = extract(w.root / "port.portable.tar", w.root / "kit")
    assert json.loads((kit / "portable.json").read_text())["recipe"] == made["recipe"]
    subprocess.run(["rm", "-rf", str(old)], check=True)  # nothing can work through the old prefix

    new = w.root / "new place" / "port env"
    res = unpack(kit, str(new), w.root / "home")
    assert res.returncode == 0, res.stderr
    py = subprocess.run(
        [str(new / "bin" / "python"), "-c", "import sys, ebtool, ebdemo; print(sys.prefix, ebdemo.__file__)"],
        capture_output=True,
        text=True,
        env=bare_env(w.root / "home"),
    )
    assert py.returncode == 0, py.stderr
    assert py.stdout.strip().startswith(f"{new} {new}/lib/")
    # bash's activate puts the new prefix first on PATH; the console script runs from there (its #! line, which
    # the kernel cannot read with a space in it, became the /bin/sh trampoline).
    run = bash(
        f'. "{new}/bin/activate" && command -v ebtool && echo "$VIRTUAL_ENV" && ebtool', w.root / "home"
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines() == [f"{new}/bin/ebtool", str(new), f"ebtool from {new}"]
    path = bash(f'. "{new}/bin/activate" && echo "$PATH"', w.root / "home").stdout.strip()
    assert path.startswith(f"{new}/bin:") and path.endswith(f":{BARE_PATH}")
    # Every file unpack.sh rewrote names the new prefix and no longer the old one.
    for rel in made["rewrite"]:
        text = (new / rel).read_text()
        assert str(old) not in text.replace(str(new), ""), rel
    assert (new / "bin" / "ebtool").read_text().startswith("#!/bin/sh\n'''exec' ")

    # The kit is used again: onto the unpacked env it refuses, and the env is as it was.
    before = (new / "bin" / "ebtool").read_bytes()
    res = unpack(kit, str(new), w.root / "home")
    assert res.returncode == 1 and "exists and is not empty" in res.stderr, res.stderr
    assert (new / "bin" / "ebtool").read_bytes() == before
    assert list(new.parent.glob(".*unpack-*")) == []


def test_unpack_refuses_what_it_cannot_do_safely(world):
    w = world
    ok(w.cli("create", w.small("ref", "ebtool==1.0"), "--no-validate"))
    pack(w, "ref", w.root / "ref.tar")
    kit = extract(w.root / "ref.tar", w.root / "kit")
    home = w.root / "home"
    for bad in (str(w.root / "it's"), str(w.root / "a$HOME"), str(w.root / "x\ny"), str(w.root / "a:b")):
        res = unpack(kit, bad, home)
        assert res.returncode == 1 and "cannot put the env at" in res.stderr, (bad, res.stderr)
        assert not Path(bad).exists()
    (w.root / "real").mkdir()
    (w.root / "link").symlink_to(w.root / "real")
    res = unpack(kit, str(w.root / "link"), home)
    assert res.returncode == 1 and "symbolic link" in res.stderr and list((w.root / "real").iterdir()) == []
    # An empty directory is taken; a payload changed by one byte is refused before anything is extracted.
    (w.root / "empty").mkdir()
    ok(unpack(kit, str(w.root / "empty"), home))
    assert (w.root / "empty" / "bin" / "ebtool").is_file()
    payload = next(kit.glob("payload.tar.*"))
    raw = bytearray(payload.read_bytes())
    raw[len(raw) // 2] ^= 0x01
    payload.write_bytes(bytes(raw))
    res = unpack(kit, str(w.root / "fresh"), home)
    assert res.returncode == 1 and "SHA256" in res.stderr and not (w.root / "fresh").exists()
    # The CLI: an existing output file is never replaced; the backup root's options are not the archive's.
    res = w.cli("backup", "ref", "--portable", "-o", str(w.root / "ref.tar"))
    assert res.returncode == 12 and "never replaces" in res.stderr, res.stderr
    res = w.cli("backup", "ref", "--portable", "--mode", "archive", "--to", str(w.root / "b"))
    assert res.returncode == 2 and "it takes no --to, --mode" in res.stderr, res.stderr
    res = w.cli("backup", "ref", "-o", str(w.root / "other.tar"))
    assert res.returncode == 2 and "--portable -o FILE" in res.stderr, res.stderr
    assert not (w.root / "b").exists() and not (w.root / "other.tar").exists()


def test_a_portable_torch_env_imports_torch_after_unpacking(cpu_torch_world, tmp_path):
    w = cpu_torch_world
    out = tmp_path / "vcpu.portable.tar"
    data = json.loads(ok(w.cli("backup", "vcpu", "--portable", "-o", str(out), "--json")).stdout)["data"]
    assert data["torch"]["version"].startswith("2.")
    kit = extract(out, tmp_path / "kit")
    new = tmp_path / "moved" / "vcpu"
    res = unpack(kit, str(new), tmp_path)
    assert res.returncode == 0, res.stderr
    run = bash(
        f'. "{new}/bin/activate" && python -c "import sys, torch; print(sys.prefix, torch.__version__)"',
        tmp_path,
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == [str(new), data["torch"]["version"]]


def test_without_zstd_the_payload_is_gzip_and_unpacks_with_gzip(world):
    w = world
    ok(w.cli("create", w.small("gz", "ebdemo==1.0"), "--no-validate"))
    no_zstd = w.root / "no-zstd-bin"  # envbuilder runs from this checkout; only zstd is looked up on PATH
    no_zstd.mkdir()
    out = w.root / "gz.portable.tar"
    made = w.data("backup", "gz", "--portable", "-o", str(out), PATH=str(no_zstd))
    assert made["payload"] == {**made["payload"], "compression": "gzip", "file": "payload.tar.gz"}
    kit = extract(out, w.root / "kit")
    assert sorted(p.name for p in kit.iterdir()) == [
        "links.txt", "payload.sha256", "payload.tar.gz", "portable.json", "prefix.txt", "rewrite.txt", "unpack.sh"
    ]  # fmt: skip
    new = w.root / "gz2"
    ok(unpack(kit, str(new), w.root / "home"))
    py = subprocess.run([str(new / "bin" / "python"), "-c", "import ebdemo; print(ebdemo.__file__)"],
                        capture_output=True, text=True, env=bare_env(w.root / "home"))  # fmt: skip
    assert py.stdout.startswith(f"{new}/lib/"), py.stderr


def test_other_shells_activate_the_unpacked_env(world):
    w = world
    shells = [s for s in ("zsh", "fish", "tcsh") if shutil.which(s, path=BARE_PATH)]
    if not shells:
        pytest.skip("none of zsh, fish, tcsh is installed (.ci/run installs them)")
    ok(w.cli("create", w.small("sh", "ebtool==1.0", installer="pip"), "--no-validate"))
    pack(w, "sh", w.root / "sh.tar")
    kit = extract(w.root / "sh.tar", w.root / "kit")
    subprocess.run(["rm", "-rf", str(w.prefix("sh"))], check=True)
    new = w.root / "other place" / "sh"
    ok(unpack(kit, str(new), w.root / "home"))
    lines = {
        "zsh": f'. "{new}/bin/activate" && echo "$VIRTUAL_ENV" && ebtool',
        "fish": f'source "{new}/bin/activate.fish"; and echo "$VIRTUAL_ENV"; and ebtool',
        "tcsh": f'source "{new}/bin/activate.csh" && echo "$VIRTUAL_ENV" && ebtool',
    }
    for shell in shells:
        argv = [shell, "-f", "-c", lines[shell]] if shell == "tcsh" else [shell, "-c", lines[shell]]
        run = subprocess.run(argv, capture_output=True, text=True, env=bare_env(w.root / "home"))
        assert run.returncode == 0, (shell, run.stderr)
        assert run.stdout.splitlines()[-2:] == [str(new), f"ebtool from {new}"], (shell, run.stdout)


def _kit(root: Path, old: str, files: dict[str, str], rewrite: list[str], links: dict[str, str]) -> Path:
    """A portable archive's parts made by hand (a gzip payload of ``files`` and the symlinks ``links``), for
    unpack.sh's rewrite rules."""
    kit = root / "kit"
    kit.mkdir()
    (kit / "unpack.sh").write_bytes(portable.SCRIPT.read_bytes())
    with tarfile.open(kit / "payload.tar.gz", "w:gz") as tar:
        for rel, text in files.items():
            info = tarfile.TarInfo(rel)
            data = text.encode()
            info.size, info.mode = len(data), 0o755
            tar.addfile(info, io.BytesIO(data))
        for rel, target in links.items():
            info = tarfile.TarInfo(rel)
            info.type, info.linkname = tarfile.SYMTYPE, target
            tar.addfile(info)
    (kit / "prefix.txt").write_text(old + "\n")
    (kit / "rewrite.txt").write_text("".join(f"{r}\n" for r in rewrite))
    into = {rel: t[len(old) :] for rel, t in links.items() if t.startswith(old + "/")}
    (kit / "links.txt").write_text("".join(f"{rel}\n{rest}\n" for rel, rest in into.items()))
    sums = "".join(
        f"{hashlib.sha256((kit / n).read_bytes()).hexdigest()}  {n}\n"
        for n in ("prefix.txt", "rewrite.txt", "links.txt", "payload.tar.gz")
    )
    (kit / "payload.sha256").write_text(sums)
    return kit


def test_unpack_rewrites_whole_paths_only_in_the_listed_files(tmp_path):
    old = "/old/e.v"  # a dot: a regex would match /old/eXv too
    files = {
        "bin/tool": f"#!{old}/bin/python3 -E\nimport sys  # {old}2 {old}X/y /old/eXv\n",
        "bin/run": f"#!{old}/bin/bash\necho '{old}' \"{old}/lib\" {old}:{old}\n",
        "envbuilder/activate.sh": f"X={old}",  # no newline at its end: none is added
        "lib/data.txt": f"{old}/data\n",  # not listed: left as it is
    }
    links = {"lib/abs": f"{old}/lib/data.txt", "lib/rel": "data.txt", "lib/away": "/etc/hostname"}
    kit = _kit(tmp_path, old, files, ["bin/tool", "bin/run", "envbuilder/activate.sh"], links)
    new = tmp_path / "new env"
    res = unpack(kit, str(new), tmp_path)
    assert res.returncode == 0, res.stderr
    assert (new / "bin" / "tool").read_text() == (
        f"#!/bin/sh\n'''exec' '{new}/bin/python3' -E \"$0\" \"$@\"\n' '''\n"
        f"import sys  # {old}2 {old}X/y /old/eXv\n"
    )
    # A shell script's #! line cannot hold a space and has no trampoline: the rest is rewritten, a warning says so.
    assert (new / "bin" / "run").read_text() == f"#!{new}/bin/bash\necho '{new}' \"{new}/lib\" {new}:{new}\n"
    assert "bin/run: its #! line cannot name" in res.stderr
    assert (new / "envbuilder" / "activate.sh").read_text() == f"X={new}"
    assert (new / "lib" / "data.txt").read_text() == f"{old}/data\n"
    assert os.access(new / "bin" / "tool", os.X_OK)
    # A link into the old prefix points into the new one; the others are as they were.
    assert {n: os.readlink(new / n) for n in links} == {**links, "lib/abs": f"{new}/lib/data.txt"}
    assert (new / "lib" / "abs").read_text() == f"{old}/data\n"
    # Without a space, the #! line stays a #! line.
    plain = tmp_path / "plain"
    ok(unpack(kit, str(plain), tmp_path))
    assert (plain / "bin" / "tool").read_text().startswith(f"#!{plain}/bin/python3 -E\n")
