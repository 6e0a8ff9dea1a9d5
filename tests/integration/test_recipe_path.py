"""The recipe search path as a hostile or careless user leaves it: broken files, FIFOs, devices, symlink loops,
unlistable directories, huge and deeply nested files, byte-order marks and CRLF line endings. Through the real
CLI: a recipe that is asked for and broken is an error naming its file (exit 3), never replaced by a built-in of
the same name; anything else broken on the path is a warning naming it, and every other command goes on.

And ``--facts`` takes what ``probe --json`` prints: the envelope, its ``data``, or a plain facts object."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import FACTS, PLAN_ENV, REPO, ok, refused, run_cli

pytestmark = pytest.mark.integration

H100 = str(FACTS / "h100.json")

USER_LOCAL = """\
schema_version = 1

[recipe]
name = "local"

[torch]
version = "2.7.1"
"""


def plan_env(*dirs: Path, **extra: str) -> dict[str, str]:
    return {**PLAN_ENV, "ENVBUILDER_RECIPE_PATH": ":".join(str(d) for d in dirs), **extra}


def plan(name: str, *dirs: Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return run_cli("plan", name, "--facts", H100, env=plan_env(*dirs), timeout=timeout)


def warned(res: subprocess.CompletedProcess[str], path: Path, reason: str) -> None:
    """The command succeeded and said, on stderr, that it skipped ``path`` and why."""
    ok(res)
    lines = [line for line in res.stderr.splitlines() if line.startswith("warning:") and str(path) in line]
    assert lines, res.stderr
    assert reason in lines[0], lines[0]


# ---------------------------------------------------------------------------------------------------------------
# A broken recipe that is asked for is an error, never replaced by the built-in of the same name


def test_user_local_with_a_syntax_error_is_an_error_not_the_builtin(tmp_path: Path) -> None:
    broken = tmp_path / "local.toml"
    broken.write_text(USER_LOCAL.replace("[torch]", "[torch"), encoding="utf-8")
    res = plan("local", tmp_path)
    refused(res, 3, f"error: {broken}: not valid TOML")
    assert "warning" not in res.stderr  # said once, as the error
    # The control: the same file, fixed, is the recipe plan uses.
    broken.write_text(USER_LOCAL, encoding="utf-8")
    res = ok(run_cli("plan", "local", "--facts", H100, "--json", env=plan_env(tmp_path)))
    assert json.loads(res.stdout)["data"]["files"] == [str(broken)]


def test_a_broken_user_recipe_also_refuses_extends_by_its_name(tmp_path: Path) -> None:
    (tmp_path / "local.toml").write_bytes(b'schema_version = 1\n[recipe]\nname = "local"\n\xff\n')
    (tmp_path / "mine.toml").write_text(
        'schema_version = 1\nextends = "local"\n[recipe]\nname = "mine"\n', encoding="utf-8"
    )
    refused(plan("mine", tmp_path), 3, f"{tmp_path / 'local.toml'}: not UTF-8 text")


def test_a_broken_file_in_a_lower_layer_is_shadowed_by_a_good_one(tmp_path: Path) -> None:
    low, high = tmp_path / "low", tmp_path / "high"
    low.mkdir()
    high.mkdir()
    (low / "local.toml").write_text("schema_version = 1\n[recipe\n", encoding="utf-8")
    (high / "local.toml").write_text(USER_LOCAL, encoding="utf-8")
    res = plan("local", low, high)
    warned(res, low / "local.toml", "not valid TOML")


# ---------------------------------------------------------------------------------------------------------------
# Files that are not recipes: skipped with a warning, an error only when asked for


def test_a_non_utf8_file_anywhere_on_the_path_is_a_warning(tmp_path: Path) -> None:
    junk = tmp_path / "deep" / "er" / "junk.toml"
    junk.parent.mkdir(parents=True)
    junk.write_bytes(b'schema_version = 1\nx = "\xff\xfe"\n')
    warned(plan("local", tmp_path), junk, "not UTF-8 text: byte 0xff (at line 2, column 6)")
    ok(run_cli("recipes", "list", env=plan_env(tmp_path)))
    refused(plan("junk", tmp_path), 3, f"error: {junk}: not UTF-8 text")


def test_a_fifo_is_skipped_not_read(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo.toml"
    os.mkfifo(fifo)
    # Before the fix, plan blocked on open(); the timeout turns a hang into a failure here.
    warned(plan("local", tmp_path, timeout=30), fifo, "not a regular file (a FIFO)")
    refused(plan("fifo", tmp_path, timeout=30), 3, f"error: {fifo}: not a regular file (a FIFO)")


def test_a_symlink_to_a_device_is_skipped_not_read(tmp_path: Path) -> None:
    zero = tmp_path / "zero.toml"
    zero.symlink_to("/dev/zero")
    warned(plan("local", tmp_path, timeout=30), zero, "not a regular file (a character device)")
    refused(plan("zero", tmp_path, timeout=30), 3, f"error: {zero}: not a regular file")


def test_a_file_over_the_size_limit_is_refused(tmp_path: Path) -> None:
    big = tmp_path / "big.toml"
    big.write_text('schema_version = 1\n[recipe]\nname = "big"\n' + "# padding\n" * 110_000, encoding="utf-8")
    assert big.stat().st_size > 1024 * 1024
    warned(plan("local", tmp_path), big, "larger than the 1 MiB limit for a recipe file")
    refused(plan("big", tmp_path), 3, f"error: {big}: larger than the 1 MiB limit")
    # The control: the same recipe without the padding plans.
    big.write_text('schema_version = 1\n[recipe]\nname = "big"\n', encoding="utf-8")
    ok(plan("big", tmp_path))


def test_deep_nesting_is_a_clear_error(tmp_path: Path) -> None:
    deep = tmp_path / "deep.toml"
    deep.write_text(
        'schema_version = 1\n[recipe]\nname = "deep"\n[site]\nnotes = ' + "[" * 20_000 + "]" * 20_000 + "\n",
        encoding="utf-8",
    )
    warned(plan("local", tmp_path), deep, "nested more than 32 levels deep (at line 5, column 41)")
    refused(plan("deep", tmp_path), 3, f"error: {deep}: site.notes: nested more than 32 levels deep")


def test_deep_dotted_keys_are_a_clear_error(tmp_path: Path) -> None:
    deep = tmp_path / "dotted.toml"
    deep.write_text(
        'schema_version = 1\n[recipe]\nname = "dotted"\n' + ".".join(["a"] * 5000) + " = 1\n",
        encoding="utf-8",
    )
    res = plan("dotted", tmp_path)
    refused(res, 3, f"error: {deep}: recipe.a.a.a.a.a.a.a.a.a.a.a.a.a.a")
    assert "a dotted key of more than 32 parts (at line 4, column 1); the limit is 32" in res.stderr


def test_symlink_loops_are_skipped(tmp_path: Path) -> None:
    path_dir = tmp_path / "recipes"
    path_dir.mkdir()
    loop = path_dir / "loop.toml"
    loop.symlink_to("loop.toml")
    (path_dir / "d1").symlink_to("d2")
    (path_dir / "d2").symlink_to("d1")
    looping_root = tmp_path / "root-a"
    looping_root.symlink_to(tmp_path / "root-b")
    (tmp_path / "root-b").symlink_to(looping_root)
    res = plan("local", path_dir, looping_root)
    warned(res, loop, "a symlink loop")
    warned(res, looping_root, "a symlink loop")
    refused(plan("loop", path_dir), 3, f"error: {loop}: a symlink loop")


def test_a_path_entry_that_is_a_file_is_a_warning(tmp_path: Path) -> None:
    entry = tmp_path / "not-a-dir"
    entry.write_text("", encoding="utf-8")
    warned(plan("local", entry), entry, "not a directory")


def _as_unprivileged(argv: list[str]) -> list[str]:
    """``argv`` run so that a mode-000 directory is really unlistable to it. Root reads one anyway; in a new user
    namespace with no uid mapped, root keeps the owner's rights to its files (the mode bits) but loses the
    override (CAP_DAC_OVERRIDE applies only to files whose owner is mapped)."""
    if os.geteuid() != 0:
        return argv
    unshare = shutil.which("unshare")
    if unshare is None or subprocess.run([unshare, "--user", "true"], check=False).returncode != 0:
        pytest.skip(
            "running as root, where a mode-000 directory is listable, and no user namespace to drop that"
        )
    return [unshare, "--user", *argv]


def test_an_unlistable_directory_is_a_warning(tmp_path: Path) -> None:
    recipes = tmp_path / "recipes"
    locked = recipes / "locked"
    locked.mkdir(parents=True)
    (locked / "local.toml").write_text(USER_LOCAL, encoding="utf-8")
    (recipes / "mine.toml").write_text('schema_version = 1\n[recipe]\nname = "mine"\n', encoding="utf-8")
    locked.chmod(0o000)
    argv = _as_unprivileged([sys.executable, "-m", "envbuilder", "plan", "mine", "--facts", H100])
    env = {"PATH": os.environ["PATH"], "NO_COLOR": "1", **plan_env(recipes)}
    try:
        res = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60, cwd=REPO, check=False)
        # The control: the directory really could not be listed by that process.
        probe = subprocess.run(_as_unprivileged(["ls", str(locked)]), capture_output=True, check=False)
    finally:
        locked.chmod(0o755)
    assert probe.returncode != 0
    warned(res, locked, "cannot list it (Permission denied)")


# ---------------------------------------------------------------------------------------------------------------
# What editors on other systems write


def test_a_byte_order_mark_and_crlf_line_endings_are_accepted(tmp_path: Path) -> None:
    text = USER_LOCAL.replace("\n", "\r\n").replace('name = "local"', 'name = "windows"')
    (tmp_path / "windows.toml").write_bytes(b"\xef\xbb\xbf" + text.encode())
    res = ok(run_cli("plan", "windows", "--facts", H100, "--json", env=plan_env(tmp_path)))
    assert json.loads(res.stdout)["data"]["recipe"] == "windows"
    assert "warning" not in res.stderr


# ---------------------------------------------------------------------------------------------------------------
# Numbers have ranges


@pytest.mark.parametrize(
    ("table", "line", "message"),
    [
        (
            "compute",
            "gpus_per_node = -4",
            "compute.gpus_per_node: expected an integer from 0 to 64, found integer -4",
        ),
        (
            "launcher",
            "port = 100000000000000000000000000",
            "launcher.port: expected an integer from 1 to 65535, found integer 100000000000000000000000000",
        ),
        (
            "validation",
            "timeout = -5",
            "validation.timeout: expected an integer from 1 to 604800, found integer -5",
        ),
        (
            "validation",
            "nodes = 9223372036854775807",
            "validation.nodes: expected an integer from 1 to 1000000, found integer 9223372036854775807",
        ),
    ],
)
def test_numbers_out_of_range_do_not_plan(tmp_path: Path, table: str, line: str, message: str) -> None:
    path = tmp_path / "local.toml"
    path.write_text(USER_LOCAL + f"\n[{table}]\n{line}\n", encoding="utf-8")
    refused(plan("local", tmp_path), 3, f"error: {path}: {message}")


def test_nodes_over_the_sites_maximum_do_not_plan(tmp_path: Path) -> None:
    path = tmp_path / "big-job.toml"
    path.write_text(
        'schema_version = 1\nextends = "frontera-venv-cu124"\n[recipe]\nname = "big-job"\n'
        '[validation]\nnodes = 17\npartition = "rtx"\n',
        encoding="utf-8",
    )
    refused(
        plan("big-job", tmp_path),
        3,
        f"error: {path}: validation.nodes: expected 1 to 16 nodes (scheduler.partitions.rtx.max_nodes), "
        "found integer 17",
    )
    # The control: the partition's maximum itself plans.
    path.write_text(path.read_text(encoding="utf-8").replace("nodes = 17", "nodes = 16"), encoding="utf-8")
    ok(plan("big-job", tmp_path))


# ---------------------------------------------------------------------------------------------------------------
# --facts takes what probe --json prints


@pytest.fixture(scope="module")
def probed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``envbuilder probe --json > node.json``, run for real on this machine."""
    res = ok(run_cli("probe", "--json"))
    path = tmp_path_factory.mktemp("probe") / "node.json"
    path.write_text(res.stdout, encoding="utf-8")
    assert json.loads(res.stdout)["command"] == "probe"
    return path


def test_plan_takes_the_probe_envelope(probed: Path) -> None:
    res = ok(run_cli("plan", "local", "--facts", str(probed), "--json"))
    data = json.loads(res.stdout)["data"]
    assert data["target"]["source"].startswith(str(probed))
    assert data["target"]["python"] == json.loads(probed.read_text())["data"]["python"]


def test_plan_takes_the_envelopes_data_too(probed: Path, tmp_path: Path) -> None:
    inner = tmp_path / "data.json"
    inner.write_text(json.dumps(json.loads(probed.read_text())["data"]), encoding="utf-8")
    ok(run_cli("plan", "local", "--facts", str(inner)))


def test_publish_takes_the_probe_envelope(probed: Path, tmp_path: Path) -> None:
    env = {**PLAN_ENV, "HOME": str(tmp_path / "home"), "ENVBUILDER_HOME": str(tmp_path / "eb")}
    res = run_cli("publish", "local", "--registry", str(tmp_path / "reg"), "--facts", str(probed), env=env)
    ok(res)
    assert (tmp_path / "reg" / "index.json").is_file()


def test_doctor_takes_the_probe_envelope(probed: Path, tmp_path: Path) -> None:
    env = {**PLAN_ENV, "HOME": str(tmp_path / "home"), "ENVBUILDER_HOME": str(tmp_path / "eb")}
    res = run_cli("doctor", "--facts", str(probed), "--json", env=env)
    assert res.returncode in (0, 14), res.stderr
    assert (
        json.loads(res.stdout)["data"]["facts"]["hostname"]
        == json.loads(probed.read_text())["data"]["hostname"]
    )


def test_facts_from_another_command_are_refused(tmp_path: Path) -> None:
    res = ok(run_cli("plan", "local", "--facts", H100, "--json"))
    path = tmp_path / "plan.json"
    path.write_text(res.stdout, encoding="utf-8")
    refused(
        run_cli("plan", "local", "--facts", str(path)),
        5,
        f"{path}: this is the output of `envbuilder plan --json`, not of `envbuilder probe --json`",
    )


@pytest.mark.parametrize("command", [["create", "local"], ["lock", "local"], ["plan", "local"], ["doctor"]])
def test_every_facts_reader_knows_the_envelope(tmp_path: Path, command: list[str]) -> None:
    # create and lock read --facts as plan does: an envelope of another command is named as such (before the fix
    # it was "unknown key 'envbuilder_result_version'"), and nothing is built.
    res = ok(run_cli("plan", "local", "--facts", H100, "--json"))
    path = tmp_path / "plan.json"
    path.write_text(res.stdout, encoding="utf-8")
    env = {**PLAN_ENV, "HOME": str(tmp_path / "home"), "SCRATCH": str(tmp_path / "scratch")}
    env["ENVBUILDER_HOME"] = str(tmp_path / "eb")
    res = run_cli(*command, "--facts", str(path), env=env)
    refused(res, 5, "not of `envbuilder probe --json`")
    assert not (tmp_path / "scratch").exists()


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b'{"arch": "x86_64", "hostname": "\xff"}', "not UTF-8 text"),
        (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
    ],
    ids=["not-utf8", "deep"],
)
def test_unreadable_facts_are_host_errors(tmp_path: Path, content: bytes, message: str) -> None:
    path = tmp_path / "facts.json"
    path.write_bytes(content)
    refused(run_cli("plan", "local", "--facts", str(path)), 5, message)


def test_a_fifo_as_facts_is_refused_not_read(tmp_path: Path) -> None:
    fifo = tmp_path / "facts.json"
    os.mkfifo(fifo)
    refused(run_cli("plan", "local", "--facts", str(fifo), timeout=30), 5, "not a regular file (a FIFO)")


def test_a_400kb_dotted_key_is_refused_by_its_limit_and_stops_no_other_recipe(tmp_path: Path) -> None:
    """One dotted key of 200,000 parts, under the 1 MiB limit: the parser's work on it grew with the square of
    its parts, so every plan on the path ran for minutes. Now the scan stops at the 33rd part."""
    bad = tmp_path / "huge.toml"
    bad.write_text(
        'schema_version = 1\n[recipe]\nname = "huge"\n[site]\n' + ".".join(["k"] * 200_000) + " = 1\n",
        encoding="utf-8",
    )
    assert 390_000 < bad.stat().st_size < 1024 * 1024
    # The timeout turns the old minutes-long parse into a failure; it is no measure of speed.
    res = plan("local", tmp_path, timeout=30)
    warned(res, bad, "a dotted key of more than 32 parts (at line 5, column 1); the limit is 32")
    res = plan("huge", tmp_path, timeout=30)
    refused(res, 3, f"error: {bad}: site" + ".k" * 26 + "...: a dotted key of more than 32 parts")


def test_a_path_directory_with_too_many_files_is_searched_up_to_the_limit(tmp_path: Path) -> None:
    from envbuilder.recipe.catalog import MAX_SCANNED

    crowd = tmp_path / "crowd"
    crowd.mkdir()
    for i in range(MAX_SCANNED + 5):
        (crowd / f"f{i}.txt").touch()
    res = plan("local", crowd, timeout=60)
    warned(res, crowd, f"more than {MAX_SCANNED} files and directories under it; the limit is {MAX_SCANNED}")
