"""Scale mode for real: envs packed with real mksquashfs, mounted with real squashfuse (FUSE in user space),
imported from the mount in a real bash, deactivated (the mount goes), refused when stale, a killed squashfuse's
mount cleaned up on the next use, and the unpack path a node without FUSE takes."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest
from helpers import ORPHANS_SETTLE_S, UserWorld, bash, kill_at, ok, refused, size_now
from wheelindex import build_wheel, demo_wheels, mirror_env, serve

from envbuilder.system import transaction

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        not (shutil.which("mksquashfs") and shutil.which("squashfuse") and shutil.which("fusermount3")),
        reason="needs squashfs-tools, squashfuse and fuse3 (.ci/run installs them)",
    ),
]

RECIPE = """
schema_version = 1
[recipe]
name = "{name}"
[env]
kind = "{kind}"
installer = "{installer}"
prefix = "${{SCRATCH}}/envs/{{name}}"
[python]
command = "python3"
[torch]
install = false
[[packages]]
name = "ebdemo"
spec = "ebdemo==1.0"
"""


@pytest.fixture(scope="module")
def index(tmp_path_factory):
    d = tmp_path_factory.mktemp("pack-files")
    demo_wheels(d, tool=False)
    build_wheel(d, "ebextra", "1.0", {"ebextra/__init__.py": ""})
    with serve(d) as idx:
        yield idx


def _mounts() -> list[str]:
    return [line.split(" ")[1] for line in Path("/proc/mounts").read_text().splitlines()]


class World(UserWorld):
    def __init__(self, root: Path, index) -> None:
        super().__init__(root, mirror_env(index), TMPDIR=str(root / "node"))
        (root / "node").mkdir()
        self.index = index

    def small(self, name: str = "small", kind: str = "venv", installer: str = "uv") -> str:
        return self.write_recipe(name, RECIPE.format(name=name, kind=kind, installer=installer))

    def prefix(self, name: str) -> Path:
        return self.scratch / "envs" / name

    def node(self) -> Path:
        return Path(self.env["TMPDIR"]) / f"envbuilder-{os.getuid()}"

    def record(self, name: str) -> dict[str, Any]:
        return json.loads((self.home / "envs" / f"{name}.json").read_text())

    def shell(self, script: str) -> subprocess.CompletedProcess[str]:
        return bash(script, {**self.env, "PATH": "/usr/bin:/bin"})


@pytest.fixture
def world(tmp_path, index):
    w = World(tmp_path, index)
    yield w
    # Whatever a failed test left mounted under its own directory goes, so its tmp_path can be removed.
    for point in _mounts():
        if point.startswith(str(tmp_path)):
            subprocess.run(["fusermount3", "-u", "-z", point], check=False)


@pytest.fixture
def packed(world):
    ok(world.cli("create", world.small(), "--no-validate"))
    made = world.data("pack", "small")
    return world, made


def _squashfuse_of(mount_point: Path) -> int:
    """The pid of the squashfuse serving ``mount_point`` (the one this test's activate started)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and argv[0].endswith(b"squashfuse") and str(mount_point).encode() in argv:
            return int(entry.name)
    raise AssertionError(f"no squashfuse serves {mount_point}")


def test_pack_records_an_image_with_its_digest(packed):
    w, made = packed
    image = Path(made["path"])
    assert image == w.prefix("small").parent / "small.sqfs"
    assert made["sha256"] == hashlib.sha256(image.read_bytes()).hexdigest()
    assert made["compression"] == "zstd"
    assert not list(image.parent.glob(".small.sqfs.partial-*"))
    shown = w.data("show", "small")
    assert shown["image"]["sha256"] == made["sha256"]
    assert any(p.startswith("ebdemo-1.0") for p in shown["image"]["packages"])
    assert shown["image_status"]["status"] == "ok"
    assert [r["image"]["status"] for r in w.data("list")] == ["ok"]


def test_activate_image_mounts_imports_and_deactivate_unmounts(packed):
    w, _ = packed
    data = w.data("activate", "small", "--image")
    mount_point = Path(data["image"]["path"])
    assert data["image"]["how"] == "squashfuse"
    assert str(mount_point) in _mounts()
    assert "image mounted with squashfuse" in data["command"]
    # Nothing on the node is open to other users: the directory of mounts is 0700 and ours.
    node = w.node()
    assert stat.S_IMODE(node.stat().st_mode) == 0o700 and node.stat().st_uid == os.getuid()
    assert mount_point.parent == node
    res = ok(
        w.shell(
            f"{data['command']}\n"
            "python -c 'import ebdemo, ebdep, sys; print(ebdemo.__file__); print(sys.prefix)'\n"
            "deactivate\n"
            "type python3 >/dev/null && echo deactivated\n"
        )
    )
    imported, prefix, done = res.stdout.split()
    assert imported.startswith(str(mount_point) + "/") and prefix == str(mount_point)
    assert done == "deactivated"
    assert str(mount_point) not in _mounts()


@pytest.mark.skipif(not shutil.which("zsh"), reason="needs zsh (.ci/run installs it)")
def test_zsh_deactivate_unmounts_too(packed):
    w, _ = packed
    data = w.data("activate", "small", "--image", SHELL="/bin/zsh")
    mount_point = data["image"]["path"]
    script = f"{data['command']}\npython -c 'import ebdemo; print(ebdemo.__file__)'\ndeactivate\n"
    res = subprocess.run(
        ["zsh", "-f", "-c", script],
        env={**w.env, "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip().startswith(mount_point + "/")
    assert mount_point not in _mounts()


def test_run_from_the_image(packed):
    w, _ = packed
    res = ok(
        w.cli(
            "run",
            "small",
            "--image",
            "--launcher",
            "local",
            "--",
            "python",
            "-c",
            "import ebdemo, sys; print(sys.prefix)",
        )
    )
    mount_point = w.node() / f"small-{w.data('show', 'small')['image']['sha256'][:16]}"
    assert res.stdout.strip() == str(mount_point)
    # The record keeps the env's own prefix.
    assert w.data("show", "small")["prefix"] == str(w.prefix("small"))


def test_stale_image_is_reported_and_refused(packed):
    w, _ = packed
    subprocess.run(
        [
            "uv",
            "pip",
            "install",
            "--python",
            str(w.prefix("small") / "bin" / "python"),
            "--index-url",
            f"{w.index.url}/simple/",
            "ebextra==1.0",
        ],
        check=True,
        capture_output=True,
        env={**w.env, "UV_NO_CONFIG": "1"},
    )
    listed = w.data("list")[0]
    assert listed["image"]["status"] == "stale" and "+ebextra-1.0.dist-info" in listed["image"]["detail"]
    assert w.data("show", "small")["image_status"]["status"] == "stale"
    doctor = json.loads(w.cli("doctor", "small", "--json", "--offline").stdout)
    found = [f for f in doctor["data"]["findings"] if f["check"] == "image"]
    assert found and found[0]["severity"] == "warning" and found[0]["fix"] == "envbuilder pack small"
    refused(w.cli("activate", "small", "--image"), 9, "older than the env")
    refused(w.cli("run", "small", "--image", "--", "python", "-V"), 9, "older than the env")
    ok(w.cli("pack", "small"))
    assert w.data("activate", "small", "--image")["image"]["how"] == "squashfuse"


def test_ranks_starting_at_once_share_one_mount(packed):
    w, _ = packed
    starts = [w.spawn("activate", "small", "--image", "--json") for _ in range(4)]
    points = set()
    for started in starts:
        out, err = started.communicate(timeout=120)
        assert started.returncode == 0, err
        points.add(json.loads(out)["data"]["image"]["path"])
    assert len(points) == 1
    assert _mounts().count(points.pop()) == 1


def test_killed_squashfuse_mount_is_cleaned_up_on_next_use(packed):
    w, _ = packed
    mount_point = Path(w.data("activate", "small", "--image")["image"]["path"])
    pid = _squashfuse_of(mount_point)
    os.kill(pid, signal.SIGKILL)  # as a job's end kills what it left behind
    with pytest.raises(OSError):
        mount_point.stat()
    assert str(mount_point) in _mounts()
    res = ok(w.cli("activate", "small", "--image"))
    assert "dead mount" in res.stderr
    assert mount_point.stat().st_mode
    ok(w.shell(f"{res.stdout}\npython -c 'import ebdemo'\ndeactivate\n"))
    assert str(mount_point) not in _mounts()


def test_no_fuse_unpacks_to_the_node(packed):
    """ENVBUILDER_NO_FUSE=1 stands in for a node without FUSE (no /dev/fuse, no squashfuse): the image is
    unpacked to node-local storage instead, and the line says so."""
    w, _ = packed
    data = w.data("activate", "small", "--image", ENVBUILDER_NO_FUSE="1")
    copy = Path(data["image"]["path"])
    assert data["image"]["how"] == "unpacked" and "unpacked (no FUSE on this node)" in data["command"]
    assert copy.parent == w.node() and str(copy) not in _mounts()
    res = ok(w.shell(f"{data['command']}\npython -c 'import ebdemo; print(ebdemo.__file__)'\ndeactivate\n"))
    assert res.stdout.strip().startswith(str(copy) + "/")
    # The copy is reused, not unpacked again.
    marker = copy / ".envbuilder-image"
    before = marker.stat().st_mtime_ns
    w.data("activate", "small", "--image", ENVBUILDER_NO_FUSE="1")
    assert marker.stat().st_mtime_ns == before


def test_a_tmpdir_missing_on_the_node_falls_back_to_tmp(packed):
    """A job inherits its submit host's TMPDIR, which a compute node may lack: the node's copy goes under /tmp
    then (as Python's tempfile falls back), not nowhere."""
    w, _ = packed
    data = w.data("activate", "small", "--image", ENVBUILDER_NO_FUSE="1", TMPDIR=str(w.root / "login-only"))
    copy = Path(data["image"]["path"])
    try:
        assert copy.parent == Path("/tmp") / f"envbuilder-{os.getuid()}"
        assert (copy / ".envbuilder-image").is_file() and not (w.root / "login-only").exists()
    finally:
        shutil.rmtree(copy, ignore_errors=True)
        Path(f"{copy}.activate.sh").unlink(missing_ok=True)


# ---------------------------------------------------------------------------------------------------------------
# Killed mid-way: the previous state stays, and the next run leaves no partial file


def _weigh(w: World, mib: int = 96) -> None:
    """Bytes that do not compress in the env, so that packing and unpacking it last long enough to be killed."""
    site = next(w.prefix("small").glob("lib/python*/site-packages"))
    with (site / "ebdemo" / "ballast.bin").open("wb") as fh:
        for _ in range(mib):
            fh.write(os.urandom(2**20))


def test_a_killed_pack_keeps_the_previous_image_and_the_next_pack_leaves_no_partial(packed):
    w, made = packed
    image = Path(made["path"])
    before = image.read_bytes()
    _weigh(w)
    partials = lambda: list(image.parent.glob(".small.sqfs.partial-*"))  # noqa: E731
    proc = w.spawn("pack", "small")
    kill_at(
        proc,
        lambda: any(size_now(p) > 0 for p in partials()),
        "mksquashfs wrote its partial",
        settle=ORPHANS_SETTLE_S,
    )
    assert image.read_bytes() == before and w.data("show", "small")["image"]["sha256"] == made["sha256"]
    again = w.data("pack", "small")
    assert again["sha256"] != made["sha256"] and partials() == []


@pytest.mark.parametrize("point", ["pack-recorded", "after-rename"])
def test_a_pack_killed_between_its_image_and_its_record_leaves_the_two_together(packed, point):
    """pack killed after it wrote the record of its new image but before renaming that image in
    (``pack-recorded``), or after the rename but before its record was final (``after-rename``): the next
    ``activate --image`` finds under the image's name the image its record names, uses it, and no partial stays.
    (Killed between the rename and the record, an envbuilder that wrote the record last left the new image
    under the old image's record: activate refused it, and the image the record described was gone.)"""
    w, made = packed
    image = Path(made["path"])
    _weigh(w, mib=1)  # an env that packs to another image
    partials = lambda: list(image.parent.glob(".small.sqfs.partial-*"))  # noqa: E731
    before = image.stat().st_ino
    reached = {
        "pack-recorded": lambda: "pending" in w.record("small")["image"],
        "after-rename": lambda: image.stat().st_ino != before and not partials(),
    }[point]
    proc = w.spawn("pack", "small", extra={transaction.PAUSE_VAR: point})
    kill_at(proc, reached, f"the pack reached {point}", settle=ORPHANS_SETTLE_S)
    assert proc.returncode == -signal.SIGKILL
    recorded = w.data("activate", "small", "--image")
    mount = Path(recorded["image"]["path"])
    assert (next(mount.glob("lib/python*/site-packages/ebdemo")) / "ballast.bin").stat().st_size == 2**20
    record = w.record("small")["image"]
    assert "pending" not in record and partials() == []
    assert hashlib.sha256(image.read_bytes()).hexdigest() == record["sha256"] != made["sha256"]


def test_a_killed_unpack_leaves_no_copy_and_the_next_use_no_partial(packed):
    """A node without FUSE unpacks the image: killed in unsquashfs, no copy is there to be used half-made, and
    the next use unpacks it whole and removes what the killed one left."""
    w, _ = packed
    _weigh(w)
    made = w.data("pack", "small")
    key = f"small-{made['sha256'][:16]}"
    partials = lambda: list(w.node().glob(f".{key}.unpacked.partial-*"))  # noqa: E731
    proc = w.spawn("activate", "small", "--image", extra={"ENVBUILDER_NO_FUSE": "1"})
    kill_at(proc, partials, "unsquashfs began", settle=ORPHANS_SETTLE_S)
    assert partials() and not (w.node() / f"{key}.unpacked").exists()
    data = w.data("activate", "small", "--image", ENVBUILDER_NO_FUSE="1")
    copy = Path(data["image"]["path"])
    assert (copy / ".envbuilder-image").is_file() and partials() == []
    assert (next(copy.glob("lib/python*/site-packages/ebdemo")) / "ballast.bin").stat().st_size == 96 * 2**20


def test_a_killed_stage_on_a_node_leaves_no_partial_after_the_next(packed):
    """stage's node side (``__stage-node fetch``, what each node of a PBS job runs) killed while unpacking the
    image it copied: the next stage on that node completes and leaves no partial copy or unpack there."""
    w, _ = packed
    _weigh(w)
    made = w.data("pack", "small")
    key, digest = f"small-{made['sha256'][:16]}", made["sha256"]
    node = lambda: [p.name for p in w.node().glob(f".{key}*") if not p.name.endswith(".lock")]  # noqa: E731
    proc = w.spawn("__stage-node", "fetch", key, digest, made["path"])
    kill_at(
        proc,
        lambda: any(".partial-" in n for n in node()),
        "a partial copy or unpack appeared",
        settle=ORPHANS_SETTLE_S,
    )
    assert not (w.node() / f"{key}.unpacked").exists()
    res = ok(w.cli("__stage-node", "fetch", key, digest, made["path"]))
    assert res.stdout.startswith("copied ") and str(w.node() / f"{key}.unpacked") in res.stdout
    assert (w.node() / f"{key}.unpacked" / ".envbuilder-image").is_file()
    assert node() == [] and not (w.node() / f"{key}.sqfs").exists()


def test_conda_and_overlay_envs_are_refused_with_the_reason(packed):
    """Records as pack reads them: kind and installer decide, before any file is touched."""
    w, _ = packed
    records = w.home / "envs"
    base = json.loads((records / "small.json").read_text())
    for name, plan, reason in (
        ("condaenv", {"kind": "conda"}, "is a conda env"),
        ("overlayenv", {"kind": "overlay"}, "is an overlay env"),
    ):
        rec = {**base, "name": name, "plan": {**base["plan"], **plan}, "image": {}}
        (records / f"{name}.json").write_text(json.dumps(rec))
        refused(w.cli("pack", name), 9, reason)
    refused(w.cli("activate", "condaenv", "--image"), 9, "cannot run from an image: it is a conda env")


def test_restore_packs_the_image_again(packed):
    w, made = packed
    ok(w.cli("backup", "small", "--to", str(w.root / "backups")))
    shutil.rmtree(w.prefix("small"))
    Path(made["path"]).unlink()
    data = w.data("restore", "small", "--from", str(w.root / "backups"), "--no-validate")
    assert data["image"] == made["path"] and Path(made["path"]).is_file()
    assert w.data("show", "small")["image_status"]["status"] == "ok"


def test_torch_env_imports_torch_from_its_image(cpu_torch_world, tmp_path):
    """The session's torch env, packed into a directory of this test's, with a copy of the world's records: the
    env itself is only read."""
    home = tmp_path / "eb-home"
    shutil.copytree(cpu_torch_world.home, home)
    (tmp_path / "node").mkdir()
    env = {**cpu_torch_world.env, "ENVBUILDER_HOME": str(home), "TMPDIR": str(tmp_path / "node")}
    made = json.loads(
        ok(cpu_torch_world.cli("pack", "vcpu", "--to", str(tmp_path / "images"), "--json", **env)).stdout
    )
    assert Path(made["data"]["path"]).parent == tmp_path / "images"
    data = json.loads(ok(cpu_torch_world.cli("activate", "vcpu", "--image", "--json", **env)).stdout)["data"]
    mount_point = data["image"]["path"]
    try:
        res = ok(
            bash(
                f"{data['command']}\npython -c 'import torch; print(torch.__file__)'\ndeactivate\n",
                {**env, "PATH": "/usr/bin:/bin"},
                timeout=300,
            )
        )
        assert res.stdout.strip().startswith(mount_point + "/")
        assert mount_point not in _mounts()
        # validate --image mounts it again and checks torch from there; the record keeps the env's prefix.
        res = cpu_torch_world.cli(
            "validate", "vcpu", "--image", "--cpu", "--checks", "import", "--json", **env
        )
        report = json.loads(ok(res).stdout)["data"]
        assert report["checks"]["import"]["status"] == "pass", report
        assert mount_point in _mounts()
        shown = json.loads(ok(cpu_torch_world.cli("show", "vcpu", "--json", **env)).stdout)["data"]
        assert shown["prefix"] == str(cpu_torch_world.prefix) and shown["validation"]
    finally:
        if mount_point in _mounts():
            subprocess.run(["fusermount3", "-u", "-z", mount_point], check=False)


#: A node-local directory with what shells treat specially in its name: the mount and the scripts beside it live
#: under it, so every path the generated scripts name holds these characters.
HOSTILE_TMP = "node $HOME; `id` 'sq' \"dq\""
#: Each shell run reading no rc file, and how it tells that `python3` is the system's again.
OTHER_SHELLS = {
    "fish": (["fish", "--no-config", "-c"], "command -q python3; and echo deactivated\n"),
    "tcsh": (["tcsh", "-f", "-c"], "which python3 >/dev/null && echo deactivated\n"),
}


@pytest.mark.parametrize("shell", sorted(OTHER_SHELLS))
def test_fish_and_tcsh_activate_the_image_and_deactivate_unmounts(packed, shell):
    """The line `activate --image --shell fish|tcsh` prints, sourced in that shell (twice, as a user may): python
    runs from the mount, one deactivate unmounts it; the mount's path holds spaces, quotes, `$`, `;` and
    backquotes."""
    if not shutil.which(shell):
        pytest.skip(f"{shell} is not installed (.ci/run installs it)")
    w, _ = packed
    node = w.root / HOSTILE_TMP
    node.mkdir()
    data = w.data("activate", "small", "--image", "--shell", shell, TMPDIR=str(node))
    mount_point = data["image"]["path"]
    assert data["image"]["how"] == "squashfuse" and mount_point.startswith(str(node) + "/")
    assert mount_point in [p.replace("\\040", " ") for p in _mounts()]
    argv, deactivated = OTHER_SHELLS[shell]
    script = (
        f"{data['command']}\n{data['command']}\n"
        "python -c 'import ebdemo, sys; print(ebdemo.__file__); print(sys.prefix)'\n"
        "deactivate\n" + deactivated
    )
    res = subprocess.run(
        [*argv, script], env={**w.env, "PATH": "/usr/bin:/bin"}, cwd=w.root,
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    imported, prefix, done = res.stdout.splitlines()
    assert imported.startswith(mount_point + "/") and prefix == mount_point
    assert done == "deactivated"
    assert mount_point not in [p.replace("\\040", " ") for p in _mounts()]
    assert not list(w.root.glob("PWNED*")) and res.stderr == ""


@pytest.mark.parametrize("shell", sorted(OTHER_SHELLS))
def test_fish_and_tcsh_use_an_unpacked_copy_where_there_is_no_fuse(packed, shell):
    if not shutil.which(shell):
        pytest.skip(f"{shell} is not installed (.ci/run installs it)")
    w, _ = packed
    data = w.data("activate", "small", "--image", "--shell", shell, ENVBUILDER_NO_FUSE="1")
    copy = data["image"]["path"]
    argv, _ = OTHER_SHELLS[shell]
    script = f"{data['command']}\npython -c 'import sys; print(sys.prefix)'\ndeactivate\n"
    res = subprocess.run(
        [*argv, script], env={**w.env, "PATH": "/usr/bin:/bin"}, cwd=w.root,
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == copy and Path(copy, "bin", "python").exists()
