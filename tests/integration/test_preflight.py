"""Pre-flight (issue 40): create, restore and backup refuse before writing what the target file system cannot
hold, on real tmpfs mounts with ``size=`` and ``nr_inodes=`` (tests/sharedfs.py), and read the user's quota from
the site's tool (a stand-in of Lustre's ``lfs quota``, tests/shims/lustre/lfs, printing lfs's own format).

The CPU torch env is refused from its plan alone (planned offline from the shipped table; nothing is installed);
the envs that are built are small ones from the tests' loopback index."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import UserWorld, demo_recipe, ok, run_cli
from sharedfs import fill, give_to, other_user, tmpfs
from wheelindex import build_wheel, demo_wheels, mirror_env, serve

from envbuilder.core.errors import DiskError
from envbuilder.scale import image, staging

pytestmark = pytest.mark.integration

SHIMS = Path(__file__).resolve().parent.parent / "shims" / "lustre"


def torch_recipe(name: str, scratch_fs: str = "") -> str:
    """A CPU torch venv on $SCRATCH (the shipped `local` recipe's shape, its variant fixed), with a
    [filesystems.scratch] entry where ``scratch_fs`` gives its keys."""
    return (
        f'schema_version = 1\n[recipe]\nname = "{name}"\n[env]\nkind = "venv"\ninstaller = "uv"\n'
        'prefix = "${SCRATCH}/envs/{name}"\n[python]\ncommand = "python3"\n'
        '[torch]\nversion = "latest"\nvariant = "cpu"\npackages = ["torch"]\n'
        + (f'[filesystems.scratch]\npath = "${{SCRATCH}}"\n{scratch_fs}' if scratch_fs else "")
    )


def big_recipe(name: str, scratch_fs: str = "") -> str:
    """The demo venv recipe (no torch) with ``ebbig``, a wheel of 3 MiB of incompressible text, added."""
    text = demo_recipe(name, prefix="${SCRATCH}/envs/{name}")
    text += '[[packages]]\nname = "ebbig"\nspec = "ebbig==1.0"\n'
    return text + (f'[filesystems.scratch]\npath = "${{SCRATCH}}"\n{scratch_fs}' if scratch_fs else "")


@pytest.fixture(scope="module")
def index(tmp_path_factory):
    files = tmp_path_factory.mktemp("preflight-files")
    demo_wheels(files)
    blob = os.urandom(3 << 19).hex()  # 3 MiB of text that compresses to about half
    build_wheel(files, "ebbig", "1.0", {"ebbig/__init__.py": "", "ebbig/blob.txt": blob})
    with serve(files) as idx:
        yield idx


def _refused(res, *words: str) -> dict:
    assert res.returncode == 15, f"exit {res.returncode}\n{res.stderr}"
    assert "Traceback" not in res.stderr and "internal error" not in res.stderr, res.stderr
    for w in words:
        assert w in res.stderr, res.stderr
    (problem,) = json.loads(res.stdout)["errors"]
    assert problem["family"] == "disk"
    return problem


def test_a_cpu_torch_env_that_does_not_fit_is_refused_before_anything_is_written(tmp_path):
    w = UserWorld(tmp_path)
    w.write_recipe("t", torch_recipe("t"))
    cache = w.scratch / "uv-cache"  # uv's cache beside the envs, as on a cluster: pruning it makes room
    with tmpfs(w.scratch, size="256m"):
        res = w.cli("create", "t", "--no-validate", "--json", UV_CACHE_DIR=str(cache))
        problem = _refused(
            res,
            f"free space on {w.scratch}: need 832.3 MB",
            "build elsewhere with --prefix DIR",
            f"make room in uv's cache (its unpacked copy) at {cache} (uv cache prune)",
            "torch 2.13.0+cpu",  # where the figure comes from
            "--no-preflight skips this check",
        )
        assert problem["path"] == str(w.scratch) and problem["errno"] == 28  # ENOSPC
        checks = json.loads(res.stdout)["data"]["preflight"]["checks"]
        assert {(c["limit"], c["fits"]) for c in checks if c["unit"] == "bytes"} == {
            (f"free space on {w.scratch}", False)
        }
        assert list(w.scratch.iterdir()) == []  # not even the env's parent directory, nor uv's cache


def test_a_cpu_torch_env_that_fits_in_bytes_but_not_in_inodes_is_refused(tmp_path):
    w = UserWorld(tmp_path)
    w.write_recipe("t", torch_recipe("t"))
    with tmpfs(w.scratch, size="2g", nr_inodes=8000):
        res = w.cli("create", "t", "--no-validate", "--json")
        _refused(res, f"free inodes on {w.scratch}: need 21,784 files")
        assert "free space on" not in res.stderr.split("hint:")[0]  # the bytes fit
        assert list(w.scratch.iterdir()) == []


def _lustre(w: UserWorld, columns: str) -> dict[str, str]:
    """The stand-in lfs first on PATH, answering ``columns`` for the user's quota."""
    answer = w.root / "lfs-answer"
    answer.write_text(columns + "\n", encoding="utf-8")
    return {"PATH": f"{SHIMS}:{os.environ['PATH']}", "LFS_QUOTA_STANDIN": str(answer)}


def test_a_nearly_full_lustre_quota_refuses_with_its_numbers(tmp_path):
    w = UserWorld(tmp_path)
    w.scratch.mkdir()
    w.write_recipe("t", torch_recipe("t", 'quota = "10 GB"\nquota_command = "lfs"\n'))
    # 9.5 of 10 GiB used (over the soft limit of 9 GiB: lfs's "*"), well under the file limit.
    lfs = _lustre(w, "9961472* 9437184 10485760 6d23h59m 1200 0 500000 -")
    res = w.cli("create", "t", "--no-validate", "--json", **lfs)
    problem = _refused(res, "your quota (lfs): need 832.3 MB, 512.0 MB left of 10.00 GB")
    assert problem["errno"] == 122  # EDQUOT
    user = __import__("pwd").getpwuid(os.getuid()).pw_name
    calls = Path(lfs["LFS_QUOTA_STANDIN"] + ".calls").read_text(encoding="utf-8").splitlines()
    assert calls and all(c == f"quota -u {user} {w.scratch}" for c in calls)
    assert list(w.scratch.iterdir()) == []


def test_a_quota_close_to_its_limit_warns_and_create_goes_on(tmp_path, index):
    w = UserWorld(tmp_path, mirror_env(index))
    w.scratch.mkdir()
    w.write_recipe("a", big_recipe("a", 'quota_command = "lfs"\n'))
    # 30 MiB left of 100 MiB: the small env's 23 MB leaves under a tenth of the quota.
    lfs = _lustre(w, "71680 0 102400 - 10 0 0 -")
    res = ok(w.cli("create", "a", "--no-validate", **lfs))
    assert "pre-flight: close to the limit: your quota (lfs): need 22.0 MB, 30.0 MB left" in res.stderr


def test_quota_output_envbuilder_cannot_read_is_reported_not_guessed(tmp_path, index):
    w = UserWorld(tmp_path, mirror_env(index))
    w.scratch.mkdir()
    w.write_recipe("a", big_recipe("a", 'quota_command = "lfs"\n'))
    lfs = _lustre(w, "about 9.5G used of your 10G")
    res = ok(w.cli("create", "a", "--no-validate", **lfs))
    assert "printed no quota line envbuilder can read" in res.stderr
    assert "your quota was not checked" not in res.stderr  # it ran; its output was not understood


class Built(UserWorld):
    """A world whose $SCRATCH and backup root are small tmpfs mounts, env ``a`` (3 MiB of ebbig) built there and
    backed up."""

    def __init__(self, root: Path, index) -> None:
        self.backups = root / "backups"
        super().__init__(root, mirror_env(index), ENVBUILDER_BACKUP_ROOT=str(self.backups))
        self.write_recipe("a", big_recipe("a"))


@pytest.fixture
def built(tmp_path, index) -> Iterator[Built]:
    w = Built(tmp_path, index)
    with contextlib.ExitStack() as mounts:
        mounts.enter_context(tmpfs(w.scratch, size="64m"))
        mounts.enter_context(tmpfs(w.backups, size="32m"))
        ok(w.cli("create", "a", "--no-validate"))
        ok(w.cli("backup", "a"))
        yield w


def test_restore_is_refused_on_a_full_scratch_and_the_env_and_its_backup_stay(built):
    w = built
    env_bytes = w.data("show", "a")["files"]["bytes"]
    assert env_bytes > 3 << 20  # measured at create: ebbig's 3 MiB and the venv
    fill(w.scratch, leave=1 << 20)
    res = w.cli("restore", "a", "--force", "--json")
    _refused(res, f"free space on {w.scratch}/envs: need", "restore elsewhere with --prefix DIR")
    assert "the env's record (measured" in res.stderr
    ok(w.cli("show", "a"))
    assert (w.scratch / "envs" / "a" / "bin" / "python").exists()
    assert [p.name for p in (w.scratch / "envs").iterdir()] == ["a"]  # no partial restore beside it
    (b,) = w.data("backups", "a")
    ok(w.cli("verify-backup", b["id"]))


def test_backup_is_refused_where_the_store_lacks_room_and_passes_where_it_has_the_wheels(built, tmp_path):
    w = built
    with tmpfs(tmp_path / "small-root", size="2m") as small:
        res = w.cli("backup", "a", "--to", str(small), "--json")
        _refused(res, f"free space on {small}: need", "3 wheel(s) the store does not have", "--to DIR")
        assert not list((small / "envs").glob("a/*"))  # nothing half-written, not even the partial
    # The backup root has ebbig stored already: another backup needs next to nothing, and passes on a full root.
    fill(w.backups, leave=256 << 10)
    ok(w.cli("backup", "a"))
    assert len(w.data("backups", "a")) == 2


def test_pack_is_refused_where_the_image_cannot_fit_and_goes_elsewhere_with_to(built, tmp_path):
    w = built
    fill(w.scratch, leave=1 << 20)
    res = w.cli("pack", "a", "--json")
    _refused(res, f"free space on {w.scratch}/envs: need", "write the image elsewhere with --to DIR")
    assert sorted(p.name for p in (w.scratch / "envs").iterdir()) == ["a"]  # no partial image
    elsewhere = tmp_path / "work"
    elsewhere.mkdir()
    made = w.data("pack", "a", "--to", str(elsewhere))
    assert Path(made["path"]).parent == elsewhere


def test_no_preflight_lets_create_start_and_fail_in_the_installer_cleanly(tmp_path, index):
    w = UserWorld(tmp_path, mirror_env(index))
    w.write_recipe("a", big_recipe("a"))
    with tmpfs(w.scratch, size="2m"):
        _refused(w.cli("create", "a", "--no-validate", "--json"), f"free space on {w.scratch}: need 22.0 MB")
        res = w.cli("create", "a", "--no-validate", "--no-preflight", "--json")
        assert "pre-flight skipped (--no-preflight)" in res.stderr
        problem = _refused(res, "no space left on the device (ENOSPC)")
        assert problem["path"].startswith(str(w.scratch))
        leftovers = [p.name for p in (w.scratch / "envs").iterdir()] if (w.scratch / "envs").exists() else []
        assert leftovers == []  # the partial env is gone


# --- stage: each node checks its own directory before it copies (the node side, run here as a node runs it) ----


@pytest.fixture
def node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """This node's TMPDIR, a 4 MiB tmpfs; the aliases a copy makes in the directory every node names alike are
    removed after."""
    local = tmp_path / "node-local"
    with tmpfs(local, size="4m"):
        monkeypatch.setenv("TMPDIR", str(local))
        yield local / f"envbuilder-{os.getuid()}"
    for alias in image.default_base().glob("box-*.image.sif"):
        if alias.is_symlink() and str(tmp_path) in os.readlink(alias):
            alias.unlink()


def test_a_node_refuses_an_image_file_its_directory_cannot_hold_and_takes_one_it_can(tmp_path, node):
    content = os.urandom(6 << 20)
    source = tmp_path / "envs" / "box" / "image.sif"
    source.parent.mkdir(parents=True)
    source.write_bytes(content)
    digest = hashlib.sha256(content).hexdigest()
    key = f"box-{digest[:16]}"
    with pytest.raises(DiskError, match=r"free space on .*node-local.*: need 6.0 MB") as refused:
        staging.on_node("fetch-file", key, digest, str(source), need=f"{len(content)}:1")
    assert "a TMPDIR on a larger node-local disk" in (refused.value.hint or "")
    assert not list(node.glob(f"*{key}*")), list(node.iterdir())  # not even a partial copy
    small = tmp_path / "envs2" / "box" / "image.sif"
    small.parent.mkdir(parents=True)
    small.write_bytes(content[: 1 << 20])
    small_digest = hashlib.sha256(small.read_bytes()).hexdigest()
    small_key = f"box-{small_digest[:16]}"
    line = staging.on_node("fetch-file", small_key, small_digest, str(small), need=f"{1 << 20}:1")
    assert line.startswith("copied ")
    fill(node)  # full now, but the copy is there: nothing to write, nothing to check
    assert (
        staging.on_node("fetch-file", small_key, small_digest, str(small), need=f"{1 << 20}:1")
        == f"ready {node}"
    )


def test_a_node_refuses_before_the_broadcast_where_the_image_and_its_env_cannot_fit(node):
    with pytest.raises(DiskError, match=r"free (space|inodes) on"):
        staging.on_node("prepare", "a-0123456789abcdef", "0" * 64, need=f"{64 << 20}:100")
    assert staging.on_node("prepare", "a-0123456789abcdef", "0" * 64, need=f"{1 << 20}:10") == f"empty {node}"
    # As stage runs it on each node: the hidden verb takes --need, and a refusal is a disk error on its stderr.
    argv = ("__stage-node", "prepare", "a-1123456789abcdef", "0" * 64, "--need", f"{64 << 20}:100")
    res = run_cli(*argv, env={"TMPDIR": os.environ["TMPDIR"], "HOME": str(node.parent)})
    assert res.returncode == 15 and "error: not enough room: free space on" in res.stderr, res.stderr


# --- the site's own quota command ([[quota_commands]] in the admin's site config), a real script standing in ---


class SiteQuota:
    """A stand-in site quota command (a root-owned script under the test's directory, as an admin installs a
    wrapper around their own tool) named in a real site config for $SCRATCH. It writes its argv, one argument a
    line, to ``calls``, and runs ``body`` (shell) to answer."""

    def __init__(self, w: UserWorld, body: str, argv: str = '"--user", "{user}", "--dir", "{path}"') -> None:
        admin = w.root / "admin"
        admin.mkdir(exist_ok=True)
        self.program = admin / "site-quota"
        self.calls = admin / "calls"
        self.program.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" >> {self.calls}\n{body}\n', encoding="utf-8")
        self.program.chmod(0o755)
        self.config = w.root / "site.toml"
        self.write(f'path = "{w.scratch}"\nargv = ["{self.program}", {argv}]\ntimeout = 2\n')

    def write(self, entry: str) -> None:
        self.config.write_text(f"[[quota_commands]]\n{entry}", encoding="utf-8")
        self.config.chmod(0o644)

    @property
    def env(self) -> dict[str, str]:
        return {"ENVBUILDER_CONFIG": str(self.config)}

    def called(self) -> list[str]:
        return self.calls.read_text(encoding="utf-8").splitlines() if self.calls.exists() else []


def _site(w: UserWorld, **numbers: object) -> SiteQuota:
    return SiteQuota(w, f"echo '{json.dumps(numbers)}'")


def test_a_site_quota_command_that_says_nearly_full_refuses_with_its_numbers(tmp_path):
    w = UserWorld(tmp_path)
    w.scratch.mkdir()
    # The recipe names lfs and states 100 GB: the site's own command is the admin's word, and is taken over both.
    w.write_recipe("t", torch_recipe("t", 'quota = "100 GB"\nquota_command = "lfs"\n'))
    site = _site(w, bytes_used=9 << 30, bytes_limit=(9 << 30) + (300 << 20), files_used=10, files_limit=None)
    res = w.cli("create", "t", "--no-validate", "--json", **site.env)
    problem = _refused(res, "your quota (site: site-quota): need 832.3 MB, 300.0 MB left of 9.29 GB")
    assert problem["errno"] == 122  # EDQUOT
    user = __import__("pwd").getpwuid(os.getuid()).pw_name
    assert site.called() == ["--user", user, "--dir", str(w.scratch)]  # each value one whole argument
    assert "recipe's stated quota" not in res.stderr and "lfs" not in res.stderr
    assert list(w.scratch.iterdir()) == []


def test_a_site_quota_close_to_its_limit_warns_and_one_with_room_passes(tmp_path, index):
    w = UserWorld(tmp_path, mirror_env(index))
    w.scratch.mkdir()
    w.write_recipe("a", big_recipe("a"))
    w.write_recipe("b", big_recipe("b"))
    # 30 MiB left of 100 MiB: the small env's 22 MB leaves under a tenth; its files are far from their limit.
    site = _site(w, bytes_used=70 << 20, bytes_limit=100 << 20, files_used=10, files_limit=100_000)
    res = ok(w.cli("create", "a", "--no-validate", **site.env))
    assert "pre-flight: close to the limit: your quota (site: site-quota): need 22.0 MB, 30.0 MB left" in (
        res.stderr
    )
    site = _site(w, bytes_used=1 << 20, bytes_limit=10 << 30, files_used=10, files_limit=100_000)
    res = ok(w.cli("create", "b", "--no-validate", **site.env))
    assert "pre-flight" not in res.stderr, res.stderr
    assert len(site.called()) == 2 * 4  # asked once per create (the cache is elsewhere: not under $SCRATCH)


@pytest.mark.parametrize(
    ("body", "said"),
    [
        (
            "echo 'myquota: cannot reach the quota server' >&2; exit 3",
            "failed (exit 3: myquota: cannot reach",
        ),
        ("echo 'Disk usage: 9.5G of 10G'", "printed no JSON object (it began: 'Disk usage: 9.5G of 10G')"),
        ('echo \'{"bytes_used": "9.5G", "bytes_limit": null}\'', 'answered bytes_used = "9.5G"'),
        ("exec sleep 30", "did not answer: timed out after 2 s"),
    ],
    ids=["fails", "garbage", "wrong-type", "hangs"],
)
def test_a_site_quota_command_that_fails_is_a_warning_and_the_other_checks_still_run(tmp_path, body, said):
    w = UserWorld(tmp_path)
    w.write_recipe("t", torch_recipe("t"))
    site = SiteQuota(w, body)
    with tmpfs(w.scratch, size="256m"):
        res = w.cli("create", "t", "--no-validate", "--json", **site.env)
        # The free space check refuses the CPU torch env all the same; the command's trouble is a warning.
        _refused(res, f"free space on {w.scratch}: need 832.3 MB")
        warning = next(ln for ln in res.stderr.splitlines() if "the site's quota command" in ln)
        assert warning.startswith("warning: pre-flight: the site's quota command (quota_commands[0] in ")
        assert str(site.program) in warning and said in warning, warning
        assert "your quota (" not in res.stderr  # nothing guessed
    assert site.called()  # it did run


def test_a_failing_site_quota_command_does_not_stop_a_create_that_fits(tmp_path, index):
    w = UserWorld(tmp_path, mirror_env(index))
    w.scratch.mkdir()
    w.write_recipe("a", big_recipe("a"))
    site = SiteQuota(w, "exit 1")
    res = ok(w.cli("create", "a", "--no-validate", **site.env))
    assert (
        f"the site's quota command (quota_commands[0] in {site.config}) failed (exit 1) (ran: " in res.stderr
    )
    assert (w.scratch / "envs" / "a" / "bin" / "python").exists()


@pytest.mark.parametrize(
    ("argv", "key", "said"),
    [
        ('"--dir={path}"', "quota_commands[0].argv[1]", "a placeholder stands as a whole argument"),
        (
            '"{path}; touch /tmp/pwned"',
            "quota_commands[0].argv[1]",
            "a placeholder stands as a whole argument",
        ),
        ('"{home}"', "quota_commands[0].argv[1]", "a placeholder stands as a whole argument"),
    ],
)
def test_a_site_config_placeholder_inside_an_argument_is_refused_naming_the_file_and_key(
    tmp_path, argv, key, said
):
    w = UserWorld(tmp_path)
    w.scratch.mkdir()
    w.write_recipe("t", torch_recipe("t"))
    site = SiteQuota(w, "exit 0", argv=argv)
    res = w.cli("create", "t", "--no-validate", **site.env)
    assert res.returncode == 3, res.stderr  # a configuration error
    assert f"error: {site.config}: {key}: " in res.stderr and said in res.stderr, res.stderr
    assert "Traceback" not in res.stderr
    assert site.called() == [] and list(w.scratch.iterdir()) == []


def test_a_site_config_naming_a_relative_program_is_refused(tmp_path):
    w = UserWorld(tmp_path)
    w.scratch.mkdir()
    w.write_recipe("t", torch_recipe("t"))
    site = SiteQuota(w, "exit 0")
    site.write(f'path = "{w.scratch}"\nargv = ["site-quota", "{{path}}"]\n')
    res = w.cli(
        "create", "t", "--no-validate", **site.env, PATH=f"{site.program.parent}:{os.environ['PATH']}"
    )
    assert res.returncode == 3, res.stderr
    assert f"error: {site.config}: quota_commands[0].argv[0]: expected an absolute program path" in res.stderr
    assert "Traceback" not in res.stderr and site.called() == []


def test_a_site_quota_command_others_can_change_is_not_run(tmp_path):
    other = other_user()
    w = UserWorld(tmp_path)
    w.write_recipe("t", torch_recipe("t"))
    site = _site(w, bytes_used=0, bytes_limit=100 << 20)
    with tmpfs(w.scratch, size="256m"):
        res = w.cli("create", "t", "--no-validate", **site.env)
        assert "your quota (site: site-quota): need 832.3 MB" in res.stderr, res.stderr
        assert site.called()
        site.calls.unlink()
        # A program another user owns: a warning, it is not run; the other checks go on (free space refuses).
        give_to(site.program, other, 0o755)
        res = w.cli("create", "t", "--no-validate", **site.env)
        assert f"was not run: the program {site.program} is owned by" in res.stderr, res.stderr
        assert f"free space on {w.scratch}: need 832.3 MB" in res.stderr
        assert "your quota (" not in res.stderr and site.called() == []
        # A site config another user can write is not obeyed at all (the rule every reader of it follows).
        os.chown(site.program, 0, 0)
        site.config.chmod(0o666)
        res = w.cli("create", "t", "--no-validate", **site.env)
        assert res.returncode == 9 and f"the site config {site.config} is writable" in res.stderr, res.stderr
        assert site.called() == []
