"""strictmodes on real directories, real modes and the real second Unix user (tests/sharedfs.py): what is refused,
what is not, and which path the refusal names."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

import pytest
from sharedfs import give_to, other_user

from envbuilder.core.errors import RecipeError, UnsafePath
from envbuilder.scale import image
from envbuilder.system import strictmodes


def _refused(target: Path, *, root: Optional[Path] = None, **kw: object) -> UnsafePath:
    with pytest.raises(UnsafePath) as caught:
        strictmodes.check(target, what="the test dir", elsewhere="go elsewhere", root=root, **kw)  # type: ignore[arg-type]
    assert caught.value.exit_code == 9 and caught.value.family == "state"
    return caught.value


def _fine(target: Path, *, root: Optional[Path] = None, **kw: object) -> None:
    strictmodes.check(target, what="the test dir", elsewhere="go elsewhere", root=root, **kw)  # type: ignore[arg-type]


def test_a_path_not_made_yet_is_judged_by_what_it_would_be_made_under(tmp_path):
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)
    err = _refused(open_dir / "a" / "b")
    assert err.path == str(open_dir) and "writable by everyone" in err.message
    assert "chmod go-w" in (err.hint or "") and "go elsewhere" in (err.hint or "")


def test_sticky_directories_are_fine_unless_another_user_owns_them(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    _fine(shared / "mine")
    give_to(shared, other_user(), 0o1777)  # its owner can rename anything in it, sticky or not
    err = _refused(shared / "mine")
    assert "ebother" in err.message and err.path == str(shared)


def test_group_write_is_the_users_own_only_for_their_private_group(tmp_path):
    d = tmp_path / "g"
    d.mkdir()
    d.chmod(0o775)
    os.chown(d, os.geteuid(), os.getegid())  # root's own group, named after root, no other members
    _fine(d)
    os.chown(d, os.geteuid(), other_user().gid)
    assert "writable by its group ebother" in _refused(d).message


def test_everything_below_the_root_is_checked_and_the_users_own_above_it(tmp_path):
    root = tmp_path / "mine" / "envs"
    (root / "env" / "bin").mkdir(parents=True)
    script = root / "env" / "bin" / "activate"
    script.write_text("")
    _fine(script, root=root)
    give_to(root / "env", other_user(), 0o755)  # between the script and the root: refused
    assert _refused(script, root=root).path == str(root / "env")
    os.chown(root / "env", os.geteuid(), os.getegid())
    # The user's own directories above the root count ($SCRATCH left open by its owner).
    (tmp_path / "mine").chmod(0o777)
    assert _refused(script, root=root).path == str(tmp_path / "mine")
    (tmp_path / "mine").chmod(0o755)
    # Above them, another's directory (a project's, its lead's, its group's to write) is the site's business:
    # the user's own stands between. Only one open to everyone is not.
    give_to(tmp_path, other_user(), 0o2770)
    try:
        _fine(script, root=root)
        tmp_path.chmod(0o777)
        assert _refused(script, root=root).path == str(tmp_path)
    finally:
        os.chown(tmp_path, os.geteuid(), os.getegid())
        tmp_path.chmod(0o700)


def test_a_link_out_of_the_root_is_judged_where_it_leads(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    give_to(elsewhere, other_user(), 0o755)
    root = tmp_path / "envs"
    root.mkdir()
    (root / "env").symlink_to(elsewhere)
    assert _refused(root / "env", root=root).path == str(elsewhere)


def test_trusted_owners_are_trusted(tmp_path):
    d = tmp_path / "publisher"
    d.mkdir()
    other = other_user()
    give_to(d, other, 0o755)
    _refused(d)
    _fine(d, owners=[other.uid])
    d.chmod(0o777)
    _refused(d, owners=[other.uid])  # trusted to own it, not to leave it open


def test_shared_roots_come_from_the_site_config_and_never_open_to_everyone(tmp_path):
    other = other_user()
    shared = tmp_path / "project"
    shared.mkdir()
    give_to(shared, other, 0o2770)  # the project's lead owns it; the group writes it
    config = tmp_path / "site.toml"
    config.write_text(f'[[shared_roots]]\npath = "{shared}"\ngroup = "{other.name}"\n')
    site = {"ENVBUILDER_CONFIG": str(config)}
    _refused(shared / "envs")
    _fine(shared / "envs", site=site)
    _refused(shared / "envs", site={})  # the opt-in is the config's, nowhere else
    shared.chmod(0o2777)
    _refused(shared / "envs", site=site)
    shared.chmod(0o2770)
    config.write_text(f'[[shared_roots]]\npath = "{shared}"\ngroups = "{other.name}"\n')
    with pytest.raises(RecipeError, match=r"shared_roots\[0\]\.groups"):
        _fine(shared / "envs", site=site)


def test_the_node_local_directory_refuses_an_open_tmpdir(tmp_path):
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    tmpdir.chmod(0o777)
    with pytest.raises(UnsafePath, match="node-local"):
        image.node_dir({"TMPDIR": str(tmpdir)})
    tmpdir.chmod(0o1777)  # as /tmp is
    assert image.node_dir({"TMPDIR": str(tmpdir)}).parent == tmpdir
