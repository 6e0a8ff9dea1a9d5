"""`envbuilder report --site`: the site's history store (``history_dir``: ``<store>/<user>/<recipe>/<env>/``, one
JSON file per run, as ``validate`` writes it for envs of published recipes) reported per recipe across users, envs
and partitions, read by a user who is not root (the second Unix user, as an admin without root would), so that
the store's permissions are honoured for real: another user's private env directory, a run file only its owner
may read and a planted link are left out and named, on stderr and on the page. The HTML page in Chromium is in
test_report_page.py."""

from __future__ import annotations

import datetime
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import REPO, cli_argv, cli_env, ok, refused, run_cli
from historyfiles import START, write_run
from sharedfs import User, give_to, other_user

from envbuilder.render.report_md import cell

pytestmark = pytest.mark.integration


def _checks(busbw: float, status: str = "pass") -> list[dict[str, Any]]:
    return [
        {"name": "import", "status": status, "figures": {"import_s": 2.0}, "units": {"import_s": "s"}},
        {"name": "nccl", "status": "pass", "figures": {"busbw": busbw}, "units": {"busbw": "GB/s"}},
    ]


def _facts(driver: str) -> dict[str, Any]:
    return {"driver": driver, "cuda": "12.4", "torch": "2.5.1+cu124", "glibc": "2.34", "modules": {}}


def site_store(site: Path, other: User) -> None:
    """The other user's env e1 of site-torch on gpu-a100 (six runs near 330 GB/s, then 200 GB/s after a driver
    upgrade), root's env e2 of site-torch on gpu-h100 (version 4; one failed run, then passing) and e3 of
    tools-cpu, root's private env of site-torch (0700), a run of e2 only root may read, a link among e1's envs."""
    for day in range(7):
        upgraded = day == 6
        write_run(
            site,
            "e1",
            START + datetime.timedelta(days=day),
            directory=site / other.name / "site-torch" / "e1",
            facts=_facts("570.86" if upgraded else "550.54"),
            checks=_checks(200.0 if upgraded else 330.0 + day % 2),
        )
        status = "fail" if day == 0 else "pass"
        write_run(
            site,
            "e2",
            START + datetime.timedelta(days=day, hours=1),
            host="gpu101",
            directory=site / "root" / "site-torch" / "e2",
            partition="gpu-h100",
            recipe_version="4",
            facts=_facts("550.54"),
            checks=_checks(400.0, status),
            status=status,
        )
    write_run(
        site, "e3", START, directory=site / "root" / "tools-cpu" / "e3", recipe="tools-cpu", partition=""
    )
    write_run(site, "secret", START, directory=site / "root" / "site-torch" / "secret").parent.chmod(0o700)
    private = write_run(site, "e2", START, pid=1, directory=site / "root" / "site-torch" / "e2")
    private.chmod(0o600)
    (site / other.name / "site-torch" / "linked").symlink_to(site / "root" / "site-torch" / "e2")
    for path in (site / other.name, *(site / other.name).rglob("*")):
        give_to(path, other)


@pytest.fixture
def site() -> Iterator[Path]:
    """A store the other user can reach (pytest's own tmp directories are root's, 0700)."""
    top = Path(tempfile.mkdtemp(prefix="envbuilder-site-", dir="/tmp"))
    top.chmod(0o755)
    store = top / "history"
    store.mkdir()
    store.chmod(0o1777)
    try:
        yield store
    finally:
        shutil.rmtree(top)


def _reachable_by_all(path: Path) -> bool:
    """Whether every user may run ``path``: each directory above it searchable by others, the file theirs to run."""
    real = path.resolve()
    return all(p.stat().st_mode & 0o001 for p in real.parents) and bool(real.stat().st_mode & 0o001)


def _argv_for_others(*args: str) -> tuple[list[str], dict[str, str]]:
    """The CLI's argv as another user can run it, and what its environment needs. The tests' python may live
    where only root reaches (pyenv under /root): then the system's python of the same version runs it, with the
    checkout and this venv's packages on its path."""
    if _reachable_by_all(Path(sys.executable)):
        return cli_argv(*args), {}
    system = Path("/usr/bin/python3")
    probe = subprocess.run(
        [str(system), "-c", "import sys; print(sys.version_info[:2])"],
        capture_output=True,
        text=True,
        check=False,
    )
    if probe.stdout.strip() != str(sys.version_info[:2]):
        pytest.skip(
            f"{sys.executable} is not another user's to run, and {system} is not Python {sys.version[:4]}"
        )
    packages = next(p for p in sys.path if p.endswith("site-packages") and p.startswith(sys.prefix))
    return [str(system), "-m", "envbuilder", *args], {"PYTHONPATH": f"{REPO}:{packages}"}


def as_user(user: User, site: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The real CLI in a child process run by ``user``."""
    argv, more = _argv_for_others(*args)
    env = cli_env({"ENVBUILDER_HISTORY_DIR": str(site), "HOME": str(site.parent), "LANG": "C.UTF-8", **more})
    return subprocess.run(
        argv,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        user=user.uid,
        group=user.gid,
        extra_groups=[],
    )


def test_the_site_report_reads_what_the_user_may_and_names_the_rest(site: Path) -> None:
    other = other_user()
    site_store(site, other)
    res = ok(as_user(other, site, "report", "--site", "--format", "md"))
    text = res.stdout
    assert text.startswith("# envbuilder site validation history\n")
    assert f"from the site's history store {cell(str(site))}: 2 recipe(s), 3 env(s) of 2 user(s)." in text
    assert "## recipe site-torch\n\n2 env(s) of 2 user(s), 14 run(s) from 2026-11-01 08:00 UTC" in text
    # Where site-torch passes: e1 on gpu-a100 (7/7 runs), e2 on gpu-h100 (the 7 runs it could read, one failed).
    assert "| gpu-a100 | 1/1 | 7/7 | 3 | 2026-11-07 08:00 UTC |" in text
    assert "| gpu-h100 | 1/1 | 6/7 | 4 | 2026-11-07 09:00 UTC |" in text
    assert f"| {other.name} | e1 | gpu-a100 | 3 | pass | 7/7 | 2026-11-07 08:00 UTC | 570.86 |" in text
    assert "| root | e2 | gpu-h100 | 4 | pass | 6/7 | 2026-11-07 09:00 UTC | 550.54 |" in text
    # The drop of e1's newest run, with the upgrade named; e2's steady figures raise nothing.
    assert (
        f"| {other.name}/e1 | gpu-a100 | nccl bus bandwidth 200 GB/s, 39% below its median of 330 GB/s over "
        "the last 6 runs on gpu-a100 since driver 550.54 -> 570.86 | 2026-11-07 08:00 UTC |"
    ) in text
    assert "| 2026-11-07 08:00 UTC | driver 550.54 -> 570.86 (" + other.name + "/e1) |" in text
    assert "| nccl busbw | GB/s | gpu-h100, root/e2 | 400 | 400 | 400 | 400 | 7 |" in text
    assert f"| nccl busbw | GB/s | gpu-a100, {other.name}/e1 | 200 | 330 | 200 | 331 | 7 |" in text
    assert "| import on gpu-h100, root/e2 | pass | 6/7 | fail pass pass pass pass pass pass |" in text
    assert "## recipe tools-cpu" in text and "| root | e3 | (no partition) |" in text
    # What this user may not read, or what is not the store's, is left out and named.
    skipped = {
        site / "root" / "site-torch" / "secret": "not readable (permission denied)",
        site / "root" / "site-torch" / "e2" / "20261101T080000.000000Z-gpu001-1.json": (
            "not a readable history record"
        ),
        site / other.name / "site-torch" / "linked": "a link (not followed)",
    }
    for path, why in skipped.items():
        assert f"left out {path}: {why}" in res.stderr, res.stderr
        assert f"| {cell(path)} | {why} |" in text
    assert "## Not read (3)" in text


def test_one_recipe_of_the_site(site: Path) -> None:
    other = other_user()
    site_store(site, other)
    text = ok(as_user(other, site, "report", "--site", "--recipe", "tools-cpu", "--format", "md")).stdout
    assert "## recipe tools-cpu" in text and "site-torch" not in text
    assert "1 recipe(s), 1 env(s) of 1 user(s)" in text
    refused(
        as_user(other, site, "report", "--site", "--recipe", "nope"),
        9,
        "no validation history of recipe nope",
    )


def test_site_refusals_say_what_to_give(tmp_path: Path) -> None:
    env = {"ENVBUILDER_HOME": str(tmp_path / "home"), "HOME": str(tmp_path)}
    refused(run_cli("report", "--site", env=env), 2, "no site store to report on: history_dir is not set")
    site = {**env, "ENVBUILDER_HISTORY_DIR": str(tmp_path / "store")}
    (tmp_path / "store").mkdir()
    refused(run_cli("report", "--site", "e", env=site), 2, "--site reports on the site's store")
    refused(run_cli("report", "e", "--recipe", "x", env=site), 2, "--recipe goes with --site")
    refused(
        run_cli("report", "--site", env=site), 9, "no validation history of any recipe in the site's store"
    )
    (tmp_path / "file").write_text("")
    bad = {**env, "ENVBUILDER_HISTORY_DIR": str(tmp_path / "file")}
    refused(
        run_cli("report", "--site", env=bad),
        9,
        f"the site's validation history {tmp_path / 'file'} (history_dir) is not a directory",
    )
    out = tmp_path / "site.md"
    write_run(tmp_path, "e", START, directory=tmp_path / "store" / "u" / "r" / "e")
    res = ok(run_cli("report", "--site", "--format", "md", "-o", str(out), env=site))
    assert f"wrote the site report on 1 recipe(s), 1 env(s) to {out}" in res.stderr
    assert out.read_text().startswith("# envbuilder site validation history\n")


def test_the_site_config_names_the_store(tmp_path: Path) -> None:
    """history_dir as an admin sets it: in the site config file, not in the user's environment."""
    store = tmp_path / "store"
    write_run(tmp_path, "e", START, directory=store / "u" / "pytorch-gpu" / "e")
    config = tmp_path / "site.toml"
    config.write_text(f'[settings]\nhistory_dir = "{store}"\n')
    env = {"ENVBUILDER_HOME": str(tmp_path / "home"), "HOME": str(tmp_path), "ENVBUILDER_CONFIG": str(config)}
    text = ok(run_cli("report", "--site", "--format", "md", env=env)).stdout
    assert f"from the site's history store {cell(str(store))}: 1 recipe(s), 1 env(s) of 1 user(s)." in text
    assert "## recipe pytorch-gpu" in text
