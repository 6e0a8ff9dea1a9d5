"""Pre-flight's arithmetic (core.space, plan.preflight): sizes as recipes write them, quota tools' output as they
print it, and the comparison that refuses, warns or lets pass."""

from __future__ import annotations

from pathlib import Path

import pytest

from envbuilder import lockfile, plan
from envbuilder.core import space
from envbuilder.core.errors import RecipeError
from envbuilder.core.facts import HostFacts
from envbuilder.core.space import Need, Quota, Room, Stated
from envbuilder.lockfile import pylock, reader
from envbuilder.plan import preflight
from envbuilder.recipe.catalog import Catalog, Layer
from envbuilder.recipe.loader import load
from envbuilder.system import space as system_space

GiB = 1 << 30
CPU_HOST = HostFacts(arch="x86_64", python="3.11.7", glibc="2.34", gpus=())
ENV = {"SCRATCH": "/scratch/u", "HOME": "/home/u"}

#: `lfs quota -u bob /scratch` as Lustre prints it (lfs-quota(1), the Lustre manual's "Checking Quotas"):
#: kbytes, soft and hard block limits, grace ("-" when none), then the same for files; "*" marks a value over
#: its soft limit; a trailing line per default setting.
LFS = """\
Disk quotas for usr bob (uid 1000):
     Filesystem  kbytes   quota   limit   grace   files   quota   limit   grace
       /scratch 9961472* 9437184 10485760  6d23h59m  180000  190000  200000       -
uid 1000 is using default file quota setting
"""
#: lfs puts a file system name too long for its column on a line of its own, the numbers on the next.
LFS_WRAPPED = """\
Disk quotas for usr bob (uid 1000):
     Filesystem  kbytes   quota   limit   grace   files   quota   limit   grace
/lus/eagle/projects/a-very-long-project-name
                1048576       0 2097152       -      12       0       0       -
"""
#: `quota -w -f /home` (Linux quota tools): KiB blocks, no grace column while under the soft limit.
QUOTA_W = """\
Disk quotas for user bob (uid 1000):
     Filesystem  blocks   quota   limit   grace   files   quota   limit   grace
      /dev/vdb1  524288       0 1048576             1000       0       0
"""


@pytest.mark.parametrize(
    ("text", "expected"),
    [("25 GB", 25 * GiB), ("1 TB", 1 << 40), ("500M", 500 << 20), ("2.5GiB", int(2.5 * GiB)), ("none", None)],
)
def test_sizes_as_recipes_write_them(text, expected):
    assert space.parse_size(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"), [("300,000", 300_000), ("3M", 3_000_000), ("200k", 200_000), ("lots", None)]
)
def test_file_counts_as_recipes_write_them(text, expected):
    assert space.parse_count(text) == expected


def test_lfs_quota_output_is_read_with_its_hard_limits():
    q = space.parse_quota("lfs", LFS, "/scratch")
    assert q == Quota("lfs", 9961472 * 1024, 10485760 * 1024, 180000, 200000)


def test_lfs_quota_output_with_a_wrapped_file_system_name():
    q = space.parse_quota("lfs", LFS_WRAPPED, "/lus/eagle/projects/a-very-long-project-name")
    assert q == Quota("lfs", GiB, 2 * GiB, 12, None)


def test_quota_w_output_without_a_grace_column():
    assert space.parse_quota("quota", QUOTA_W, "/home") == Quota("quota", 512 << 20, GiB, 1000, None)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "lfs: command failed: quotas are not enabled\n",
        "Disk quotas for usr bob (uid 1000):\n     Filesystem  used  quota\n   /scratch  1G  2G\n",
        LFS.replace("180000", "lots"),
    ],
)
def test_output_in_no_known_format_is_none_never_a_guess(text):
    assert space.parse_quota("lfs", text, "/scratch") is None


def _room(free=10 * GiB, size=100 * GiB, free_files=1_000_000, inodes=1_000_000, **kw) -> Room:
    return Room("/scratch", 7, size, free, inodes, free_files, **kw)


def _need(b=GiB, files=20_000, soft=False) -> Need:
    return Need("/scratch/envs", "the env", b, files, "a figure", soft=soft)


def test_what_fits_passes_without_a_warning():
    verdict = space.compare([_need()], [_room()])
    assert not verdict.refused and not verdict.warnings


def test_too_few_bytes_is_refused_with_the_numbers():
    verdict = space.compare([_need(b=4 * GiB)], [_room(free=3 * GiB)])
    (short,) = verdict.refused
    assert short.limit == "free space on /scratch"
    assert space.refusal(verdict) == (
        "not enough room: free space on /scratch: need 4.00 GB, 3.00 GB left of 100.00 GB"
    )


def test_bytes_enough_but_inodes_not_is_refused():
    verdict = space.compare([_need(files=20_000)], [_room(free_files=5_000)])
    assert [c.unit for c in verdict.refused] == ["files"]


def test_needs_on_one_file_system_add_up():
    needs = [_need(b=3 * GiB), Need("/scratch/x", "more", 3 * GiB, 1, "a figure")]
    verdict = space.compare(needs, [_room(free=5 * GiB)] * 2)
    assert verdict.refused[0].need == 6 * GiB


def test_a_soft_need_short_of_room_is_a_warning_not_a_refusal():
    verdict = space.compare([_need(b=GiB), _need(b=8 * GiB, soft=True)], [_room(free=4 * GiB)] * 2)
    assert not verdict.refused
    assert [w.need for w in verdict.warnings] == [8 * GiB]


def test_a_quota_nearly_used_warns_and_a_full_one_refuses():
    near = Quota("lfs", 22 * GiB, 25 * GiB, 0, None)
    verdict = space.compare([_need(b=GiB)], [_room(quota=near)])
    assert not verdict.refused and [w.limit for w in verdict.warnings] == ["your quota (lfs)"]
    full = Quota("lfs", 24 * GiB + GiB // 2, 25 * GiB, 0, None)
    verdict = space.compare([_need(b=GiB)], [_room(quota=full)])
    assert [c.limit for c in verdict.refused] == ["your quota (lfs)"]


def test_a_shared_file_system_already_90_percent_full_is_no_warning():
    """Others' use is not this user's news: only an operation that takes nearly all the room left warns."""
    assert not space.compare([_need(b=GiB)], [_room(free=5 * GiB)]).warnings
    assert space.compare([_need(b=GiB)], [_room(free=GiB + GiB // 20)]).warnings


def test_the_recipes_stated_limit_counts_where_no_quota_was_read():
    stated = Stated("home", 25 * GiB, 200_000)
    verdict = space.compare([_need(b=30 * GiB)], [_room(free=100 * GiB, stated=stated)])
    assert [c.limit for c in verdict.refused] == ["the recipe's stated quota of [filesystems.home]"]
    read = Quota("quota", 0, 50 * GiB, 0, None)  # what the tool says wins over the recipe's figure
    verdict = space.compare([_need(b=30 * GiB)], [_room(free=100 * GiB, stated=stated, quota=read)])
    assert not verdict.refused


@pytest.mark.parametrize(
    ("variant", "key"), [("cpu", "cpu"), ("cu126", "cuda"), ("cu130", "cuda"), (None, "none")]
)
def test_each_variant_has_a_figure_with_its_source(variant, key):
    fig = preflight.figure(variant)
    assert fig == preflight.INSTALLED[key]
    assert "2026" in fig.source or "20" in fig.source  # dated
    assert fig.bytes > 0 and fig.files > 0


def test_an_unknown_variant_takes_the_largest_figure_and_says_so():
    fig = preflight.figure("rocm6.4")
    assert fig.bytes == preflight.INSTALLED["cuda"].bytes and fig.source.startswith("no figure for rocm6.4")


def test_a_record_measured_at_create_is_used_over_the_table():
    rec = {
        "files": {"bytes": 123, "count": 4, "measured": "2026-11-28"},
        "plan": {"resolution": {"variant": "cpu"}},
    }
    assert preflight.of_record(rec) == preflight.Figure(123, 4, "the env's record (measured 2026-11-28)")
    older = {"files": {"sentinels": []}, "plan": {"resolution": {"variant": "cpu"}}}
    assert preflight.of_record(older).bytes == preflight.INSTALLED["cpu"].bytes


def test_a_backup_of_an_unmeasured_container_env_is_its_image_file():
    data = {"record": {"files": {}, "plan": {}}, "image": {"file": "x.sif", "size": 5_000_000_000}}
    assert preflight.of_backup(data).bytes == 5_000_000_000
    measured = {"record": {"files": {"bytes": 9, "count": 2}}, "image": {"size": 5_000_000_000}}
    assert preflight.of_backup(measured).bytes == 9


# --- estimates from a plan: the lock's sizes where it gives every one, else the table -------------------------


def _recipe(tmp_path: Path):
    (tmp_path / "demo.toml").write_text(
        'schema_version = 1\n[recipe]\nname = "demo"\n[env]\nkind = "venv"\ninstaller = "uv"\n'
        'prefix = "${SCRATCH}/envs/{name}"\n[python]\ncommand = "python3"\nversion = "3.11"\n'
        '[torch]\nversion = "2.7.1"\nvariant = "cpu"\npackages = ["torch"]\n',
        encoding="utf-8",
    )
    return load("demo", Catalog([Layer("test", tmp_path)]))


def _lock(inputs: dict, sizes: tuple) -> lockfile.Lock:
    pkgs = tuple(
        lockfile.LockedPackage(
            name, "1.0", "wheel", (lockfile.LockedFile(f"https://x/{name}.whl", "a" * 64, size),)
        )
        for name, size in zip(("torch", "numpy"), sizes)
    )
    platform = lockfile.PlatformLock("x86_64", "x86_64-manylinux_2_28", inputs, pkgs)
    return lockfile.Lock(
        "demo", "", "f" * 64, "venv", "uv", "now", "test", (platform,), path="/l", origin="--lock"
    )


def test_a_lock_with_every_size_gives_the_estimate(tmp_path):
    r = _recipe(tmp_path)
    inputs = plan.build(r, CPU_HOST, ENV).lock_inputs
    p = plan.build(r, CPU_HOST, ENV, lock=_lock(inputs, (190_000_000, 10_000_000)))
    env_need, cache_need = preflight.for_plan(p, "/scratch/u/uv-cache")
    assert env_need.path == "/scratch/u/envs"
    assert env_need.bytes == int(200_000_000 * 3.95) + preflight.INSTALLED["none"].bytes
    assert env_need.source.startswith("the lock's sizes: 2 files, 200,000,000 bytes packed, times 3.95")
    assert cache_need.soft and cache_need.path == "/scratch/u/uv-cache"


def test_a_lock_missing_a_size_falls_back_to_the_table(tmp_path):
    r = _recipe(tmp_path)
    inputs = plan.build(r, CPU_HOST, ENV).lock_inputs
    p = plan.build(r, CPU_HOST, ENV, lock=_lock(inputs, (190_000_000, None)))
    (env_need, _) = preflight.for_plan(p, "/cache")
    assert env_need.bytes == preflight.INSTALLED["cpu"].bytes and env_need.source.startswith("measured")


def test_lock_sizes_are_read_and_written_again(tmp_path):
    text = (
        'lock-version = "1.0"\ncreated-by = "uv"\n[[packages]]\nname = "torch"\nversion = "2.7.1"\n'
        '[[packages.wheels]]\nurl = "https://x/torch.whl"\nsize = 191794682\nhashes = {sha256 = "'
        + "a" * 64
        + '"}\n'
    )
    (pkg,) = reader.from_pylock(text, "a test lock")
    assert pkg.files[0].size == 191_794_682
    lock = _lock({"kind": "venv"}, (191_794_682, 7))
    assert "size = 191794682" in pylock.render(lock, lock.platforms[0])
    path = tmp_path / "demo.lock.toml"
    path.write_text(lock.dumps(), encoding="utf-8")
    again = lockfile.read(path, "yours").platforms[0]
    assert [p.files[0].size for p in again.packages] == [191_794_682, 7]


# --- the site's own quota command: its entry in the site config, its argv, its answer ---

SITE = "/etc/envbuilder/config.toml"


def _site(argv: list[str], path: str = "/scratch", **more: object) -> space.SiteCommand:
    (command,) = space.site_commands([{"path": path, "argv": argv, **more}], SITE)
    return command


def test_a_site_answer_is_read_with_its_limits():
    answer = (
        '{"bytes_used": 1073741824, "bytes_limit": 2147483648, "files_used": 12, "files_limit": 500000}\n'
    )
    assert space.parse_answer("site: q", answer) == (Quota("site: q", GiB, 2 * GiB, 12, 500_000), "")


def test_a_site_answer_with_no_limits_and_no_file_counts_is_a_quota_without_limits():
    quota, why = space.parse_answer("site: q", '{"bytes_used": 5, "bytes_limit": null}')
    assert quota == Quota("site: q", 5, None, 0, None) and why == ""
    assert space.compare([_need()], [_room(quota=quota)]).checks[-1].limit == "free inodes on /scratch"


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("", "printed no JSON object (it began: 'nothing')"),
        ("9.5G used of 10G\n", "printed no JSON object (it began: '9.5G used of 10G')"),
        ('[{"bytes_used": 1, "bytes_limit": 2}]', "printed JSON that is not an object"),
        ('{"bytes_used": 1, "bytes_limit": 2}\n{"bytes_used": 1}', "printed no JSON object"),
        ('{"bytes_used": 1, "byte_limit": 2}', "unknown key 'byte_limit'"),
        ('{"bytes_used": 1}', "without bytes_used and bytes_limit"),
        ('{"bytes_used": "1G", "bytes_limit": 2}', 'bytes_used = "1G": expected a whole number'),
        ('{"bytes_used": 1.5, "bytes_limit": 2}', "bytes_used = 1.5"),
        ('{"bytes_used": -1, "bytes_limit": 2}', "bytes_used = -1"),
        ('{"bytes_used": true, "bytes_limit": 2}', "bytes_used = true"),
        ('{"bytes_used": null, "bytes_limit": 2}', "a bytes_limit without its bytes_used"),
        ('{"bytes_used": 1, "bytes_limit": 2, "files_limit": 9}', "a files_limit without its files_used"),
    ],
)
def test_a_site_answer_in_any_other_form_is_none_and_says_why(text, why):
    quota, said = space.parse_answer("site: q", text)
    assert quota is None and why in said, said


def test_the_site_argv_puts_each_value_in_whole_and_never_reads_a_placeholder_twice():
    command = _site(["/usr/local/sbin/q", "--user", "{user}", "--", "{path}", "fixed"])
    hostile = "/scratch/$(touch x); rm -rf ~ `id` {user}\nnext"
    assert space.site_argv(command, hostile, "bob") == (
        ["/usr/local/sbin/q", "--user", "bob", "--", hostile, "fixed"],
        "",
    )


@pytest.mark.parametrize(("path", "user"), [("/scratch", "-rf"), ("/scratch", "--help"), ("/scratch", "")])
def test_a_value_that_could_be_an_option_is_never_put_in_the_argv(path, user):
    argv, why = space.site_argv(_site(["/usr/local/sbin/q", "{user}", "{path}"]), path, user)
    assert argv is None and "{user}" in why and "option" in why


@pytest.mark.parametrize(
    ("entry", "key", "said"),
    [
        ({"argv": ["myquota", "{path}"]}, "quota_commands[0].argv[0]", "expected an absolute program path"),
        ({"argv": ["./myquota"]}, "quota_commands[0].argv[0]", "expected an absolute program path"),
        ({"argv": ["/x/{user}"]}, "quota_commands[0].argv[0]", "a placeholder cannot be the program"),
        ({"argv": ["/x/q", "--dir={path}"]}, "quota_commands[0].argv[1]", "a placeholder stands as a whole"),
        ({"argv": ["/x/q", "{path};id"]}, "quota_commands[0].argv[1]", "a placeholder stands as a whole"),
        ({"argv": ["/x/q", "{PATH}"]}, "quota_commands[0].argv[1]", "a placeholder stands as a whole"),
        ({"argv": ["/x/q", "{ path }"]}, "quota_commands[0].argv[1]", "a placeholder stands as a whole"),
        ({"argv": "/x/q {path}"}, "quota_commands[0].argv", "expected a list of strings"),
        ({"argv": []}, "quota_commands[0].argv", "expected a list of strings"),
        ({"argv": ["/x/q"], "path": "scratch"}, "quota_commands[0].path", "expected an absolute path"),
        ({"argv": ["/x/q"], "timeout": 0}, "quota_commands[0].timeout", "expected seconds"),
        ({"argv": ["/x/q"], "timeout": 3600}, "quota_commands[0].timeout", "at most 300"),
        ({"argv": ["/x/q"], "timeout": True}, "quota_commands[0].timeout", "expected seconds"),
        ({"argv": ["/x/q"], "shell": True}, "quota_commands[0].shell", "unknown key 'shell'"),
    ],
)
def test_a_site_entry_a_site_should_not_write_is_an_error_naming_the_file_and_key(entry, key, said):
    with pytest.raises(RecipeError) as err:
        space.site_commands([{"path": "/scratch", **entry}], SITE)
    assert err.value.file == SITE and err.value.key == key and said in err.value.message


def test_the_site_config_holds_an_array_of_quota_command_tables():
    assert space.site_commands(None, SITE) == []
    with pytest.raises(RecipeError, match=r"expected an array of tables \(\[\[quota_commands\]\]\)"):
        space.site_commands({"path": "/scratch"}, SITE)


def test_the_longest_site_entry_holding_a_directory_is_its_command(tmp_path):
    (tmp_path / "scratch" / "proj").mkdir(parents=True)
    (tmp_path / "scratchy").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "scratch" / "proj")
    outer = _site(["/x/outer"], path=str(tmp_path / "scratch"))
    inner = _site(["/x/inner"], path=str(tmp_path / "scratch" / "proj"))
    commands = [outer, inner]
    assert system_space.site_command_for(tmp_path / "scratch" / "proj" / "envs", commands) is inner
    assert system_space.site_command_for(tmp_path / "scratch", commands) is outer
    assert system_space.site_command_for(tmp_path / "link", commands) is inner  # the directory it resolves to
    assert system_space.site_command_for(tmp_path / "scratchy", commands) is None  # a prefix, not a parent
