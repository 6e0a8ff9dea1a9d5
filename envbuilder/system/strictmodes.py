"""ssh's StrictModes, for the directories envbuilder manages: before envbuilder uses one, creates under it, or tells a
user to source a script from it, no one else may be able to replace what is there.

What is checked is the directory (or script) itself, everything between it and the managed root it lies in (an
env prefix below its envs root, a record below the home), and the root's parents up to the first directory the user
owns and on through the user's own ones ($SCRATCH itself, say). Above those (/scratch, a project's directory), the
user's own directory stands between envbuilder and the rest, as ssh stops at the home directory: only one that
everyone can write (no sticky bit) is refused there. A path that does
not exist yet is checked from its nearest existing parent: that is what it would be created under. Each is a stat,
no more; the site config is read only where a backup root's group or owner needs it.

Refused: a directory or file owned by another user (root is trusted, as it must be), or one that others can write:
a file writable by its group or everyone; a directory writable by its group or everyone without the sticky bit
(with it, as on ``/tmp``, others can add entries but not rename or remove the user's). A group-writable directory
whose group is the user's own private group (named after the user, no other members) is the user's alone.

A site can say that a group writes a backup root on purpose (a project's shared backups): ``[[shared_roots]]`` in
the site config, read only from the admin's config (``ENVBUILDER_CONFIG`` or /etc/envbuilder/config.toml, itself
checked like a script). Below such a root, a directory of that group may be the group's to write and another
member's; it is still never writable by everyone.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Optional

from envbuilder.core.errors import RecipeError, UnsafePath
from envbuilder.core.structs import dataclass

#: The site config's table of group-shared roots: ``[[shared_roots]]`` with ``path`` and ``group``.
SHARED_KEY = "shared_roots"
SHARED_FIELDS = ("path", "group")


@dataclass(frozen=True)
class SharedRoot:
    """A root the site lets a group write: ``path`` (resolved) and the group's id."""

    path: str
    gid: int
    group: str


def check(
    target: Path,
    *,
    what: str,
    elsewhere: str,
    root: Optional[Path] = None,
    owners: Iterable[int] = (),
    site: Optional[Mapping[str, str]] = None,
    above: bool = True,
) -> None:
    """Refuse ``target`` (a directory or file, which may not exist yet) unless only the user (or root) can change
    it: ``target``, each directory between it and ``root`` (default: ``target`` itself), and ``root``'s parents up
    to the user's own directories and through them; of the first directory above those that is not the user's
    (/scratch, a project's directory), only that everyone can write it is refused.

    ``what`` names the path for the message ("the env prefix"), ``elsewhere`` says where else to go ("choose
    another --prefix"). ``owners``: other users trusted like the user (a registry's publisher). ``site``: the
    environment whose site config may name group-shared roots (backup roots only). ``above=False``: not
    ``root``'s parents (a check of them was just made)."""
    euid = os.geteuid()
    trusted = frozenset({0, euid, *owners})
    stops = frozenset({euid, *owners})
    real = Path(os.path.realpath(target))
    top = Path(os.path.realpath(root if root is not None else target))
    if top != real and top not in real.parents:  # a link out of the root: its target stands alone
        top, above = real, True
    shared = _Shared(site)
    own = False  # whether the walk, at or above the root, is in the user's own directories
    here: Optional[Path] = real
    while here is not None:
        try:
            st = here.stat()
        except FileNotFoundError:
            here = _parent(here)
            continue
        except OSError:
            return  # cannot be looked at (no search permission): nothing there can be used either
        at_or_above = here == top or here in top.parents
        if at_or_above and own and st.st_uid not in stops:
            # Above the user's own directories (/scratch, a project's directory): whoever owns it and its group
            # are the site's business; one open to everyone is not.
            if _open_to_all(st):
                raise _refusal(target, here, st, _OPEN.format(mode=_mode(st)), what=what, elsewhere=elsewhere)
            return
        problem = _problem(st, trusted)
        in_shared = shared.holding(here, st) if problem and problem[0] in ("owner", "group") else None
        if problem and in_shared is None:
            raise _refusal(target, here, st, problem[1], what=what, elsewhere=elsewhere)
        if in_shared is not None and str(here) == in_shared.path:
            return  # the root the site names: what is above it is the site's
        if here == top and not above:
            return
        own = own or (at_or_above and st.st_uid in stops)
        here = _parent(here)


class _Shared:
    """The site's group-shared roots for a check that may use them, read the first time one is needed."""

    def __init__(self, site: Optional[Mapping[str, str]]) -> None:
        self.site = site
        self.roots: Optional[list[SharedRoot]] = None

    def holding(self, path: Path, st: os.stat_result) -> Optional[SharedRoot]:
        if self.site is None:
            return None
        if self.roots is None:
            self.roots = _shared_roots(self.site)
        return _shared_for(path, st, self.roots)


#: The directories of the envbuilder home (settings.py names them): records, mutexes, logs, locks, caches, pins.
HOME_PARTS = ("envs", "locks", "logs", "lockfiles", "cache", "trust")


def home(path: Path) -> None:
    """The envbuilder home, its parents, and the directories in it (a stat each)."""
    for part in ("", *HOME_PARTS):
        check(
            path / part,
            root=path,
            what="the envbuilder home" if not part else f"the envbuilder home's {part}/",
            elsewhere="set ENVBUILDER_HOME to a directory of your own",
            above=not part,
        )


def env_prefix(prefix: Path) -> None:
    """An env prefix (it may not exist yet) and its envs root: what create and restore build under."""
    check(
        prefix, root=prefix.parent, what="the env prefix", elsewhere="choose another --prefix (or $SCRATCH)"
    )


def env_scripts(prefix: Path, scripts: Iterable[str]) -> None:
    """Before a line to source (or a modulefile) is handed out: the env prefix, its envs root, and the
    ``scripts`` (relative to the prefix) that the line sources, those that exist."""
    env_prefix(prefix)
    for rel in scripts:
        if os.path.lexists(prefix / rel):
            check(
                prefix / rel,
                root=prefix,
                what=f"the env's {rel}",
                elsewhere="rebuild the env where only you can write (envbuilder create NAME --force)",
                above=False,
            )


#: The directories of a backup root that every backup and prune writes in.
BACKUP_PARTS = ("envs", "store", "locks")


def backup_root(root: Path, env: Mapping[str, str], sub: str = "") -> None:
    """A backup root, its parts, and ``sub`` in it (one backup): group-shared only where the site config says."""
    for part in ("", *BACKUP_PARTS, *((sub,) if sub else ())):
        check(
            root / part,
            root=root,
            what="the backup root",
            elsewhere="pass --to DIR (or set ENVBUILDER_BACKUP_ROOT) to a directory of your own; a root a "
            "group shares needs [[shared_roots]] in the site config",
            site=env,
            above=not part,
        )


def _parent(path: Path) -> Optional[Path]:
    return None if path.parent == path else path.parent


_OPEN = "is writable by everyone (mode {mode:o}, no sticky bit)"


def _mode(st: os.stat_result) -> int:
    return stat.S_IMODE(st.st_mode)


def _sticky(st: os.stat_result) -> bool:
    """A directory with the sticky bit: others may add entries to it, but not rename or remove the user's."""
    return stat.S_ISDIR(st.st_mode) and bool(st.st_mode & stat.S_ISVTX)


def _open_to_all(st: os.stat_result) -> bool:
    return bool(st.st_mode & 0o002) and not _sticky(st)


def _problem(st: os.stat_result, trusted: frozenset[int]) -> Optional[tuple[str, str]]:
    """(kind, words) of what makes ``st`` unsafe, or None."""
    if st.st_uid not in trusted:
        return "owner", f"is owned by {_user(st.st_uid)}, who is neither you nor root"
    if _open_to_all(st):
        return "world", _OPEN.format(mode=_mode(st))
    if st.st_mode & 0o020 and not _sticky(st) and not _private_group(st.st_gid):
        return "group", f"is writable by its group {_group(st.st_gid)} (mode {_mode(st):o}, no sticky bit)"
    return None


def _private_group(gid: int) -> bool:
    """Whether ``gid`` is the user's own group: named after the user, with no other members."""
    import grp  # noqa: PLC0415 - only a group-writable directory needs the group database
    import pwd  # noqa: PLC0415

    try:
        me = pwd.getpwuid(os.geteuid())
        group = grp.getgrgid(gid)
    except KeyError:
        return False
    return me.pw_gid == gid and group.gr_name == me.pw_name and set(group.gr_mem) <= {me.pw_name}


def _user(uid: int) -> str:
    import pwd  # noqa: PLC0415 - only a refusal names the owner

    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def _group(gid: int) -> str:
    import grp  # noqa: PLC0415 - only a refusal names the group

    try:
        return f"{grp.getgrgid(gid).gr_name} (gid {gid})"
    except KeyError:
        return f"gid {gid}"


def _refusal(
    target: Path, bad: Path, st: os.stat_result, words: str, *, what: str, elsewhere: str
) -> UnsafePath:
    if words.startswith("is owned"):
        fix = f"{elsewhere}: a directory of your own"
    else:
        sticky = " (or chmod +t where others must add files there)" if stat.S_ISDIR(st.st_mode) else ""
        who = "" if st.st_uid == os.geteuid() else f"its owner, {_user(st.st_uid)}, can "
        fix = f"{who}chmod go-w {bad}{sticky}; or {elsewhere}"
    where = "" if bad == Path(os.path.realpath(target)) else f": {bad}"
    return UnsafePath(
        f"{what} {target}{where} {words}: another user could replace what envbuilder keeps or runs there, "
        "so it is not used",
        path=str(bad),
        hint=fix,
    )


# ---------------------------------------------------------------------------------------------------------------
# Group-shared roots (site config)


def site_tables(env: Mapping[str, str], key: str) -> tuple[list[dict[str, object]], str]:
    """The site config's array of tables ``[[key]]`` and the file it came from: from the admin's file only (one
    another user could change stops the command, exit 9); none where there is no site config."""
    from envbuilder.system import siteconfig  # noqa: PLC0415 - only a few checks need the site config

    path = siteconfig.config_path(env)
    if path is None or not path.is_file():
        return [], ""
    check(
        path, what="the site config", elsewhere="ask the admins to fix its mode, or unset ENVBUILDER_CONFIG"
    )
    items = siteconfig.read_toml(path).get(key, [])
    if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
        raise RecipeError(f"expected an array of tables ([[{key}]])", file=str(path), key=key)
    return items, str(path)


def _shared_roots(env: Mapping[str, str]) -> list[SharedRoot]:
    """The site config's ``[[shared_roots]]``, read only where a check needs them (most never do)."""
    items, file = site_tables(env, SHARED_KEY)
    return [_shared_root(item, f"{SHARED_KEY}[{n}]", file) for n, item in enumerate(items)]


def _shared_root(item: Mapping[str, object], key: str, file: str) -> SharedRoot:
    import grp  # noqa: PLC0415

    for k in item:
        if k not in SHARED_FIELDS:
            raise RecipeError(
                f"unknown key {k!r}", file=file, key=f"{key}.{k}", hint="expected path and group"
            )
    where, group = item.get("path"), item.get("group")
    if not isinstance(where, str) or not where.startswith("/"):
        raise RecipeError("expected an absolute path: the shared root", file=file, key=f"{key}.path")
    if not isinstance(group, str):
        raise RecipeError("expected a group name: the group that writes it", file=file, key=f"{key}.group")
    try:
        gid = grp.getgrnam(group).gr_gid
    except KeyError:
        raise RecipeError(f"no group named {group!r} on this host", file=file, key=f"{key}.group") from None
    return SharedRoot(os.path.realpath(where), gid, group)


def _shared_for(path: Path, st: os.stat_result, roots: list[SharedRoot]) -> Optional[SharedRoot]:
    """The shared root ``path`` is (or lies below) whose group owns it; never a directory everyone can write."""
    if st.st_mode & 0o002:
        return None
    for shared in roots:
        if st.st_gid == shared.gid and (str(path) == shared.path or str(path).startswith(shared.path + "/")):
            return shared
    return None
