"""Pre-flight, the measuring half: what the file system under a directory has room for (``statvfs`` as an
unprivileged user sees it, the user's quota from the site's tool), and the check that refuses before an
operation writes what cannot fit. The arithmetic is ``core.space``'s; the estimates are the caller's
(``plan.preflight``)."""

from __future__ import annotations

import errno
import os
import pwd
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Callable, Optional

from envbuilder.core import space
from envbuilder.core.errors import CommandFailed, DiskError, UnsafePath
from envbuilder.core.space import Need, Room, Stated, Verdict
from envbuilder.system import proc, strictmodes

#: How long a quota tool may take (a Lustre client waits on its servers).
QUOTA_TIMEOUT = 20.0

#: What a file system entry's limits and quota tool are, for a directory ("" for none); None: no entry holds it.
Limits = Callable[[str], Optional[tuple[Stated, str]]]


def existing(path: str) -> Path:
    """``path`` or its nearest ancestor that exists (what it will be made under)."""
    p = Path(path).absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def quota_argv(tool: str, where: Path) -> list[str]:
    """The argv that asks ``tool`` for this user's quota on the file system holding ``where`` (an absolute path:
    never read as an option)."""
    if tool == "lfs":
        return ["lfs", "quota", "-u", pwd.getpwuid(os.getuid()).pw_name, str(where)]
    return ["quota", "-w", "-f", str(where)]


def ask_quota(tool: str, where: Path, env: Mapping[str, str]) -> tuple[Optional[space.Quota], str]:
    """The user's quota from the tool a recipe names (lfs, quota), or None and why (the tool missing or failing,
    or output in no format this knows: reported, never guessed)."""
    argv = quota_argv(tool, where)
    shown = " ".join(argv)
    if shutil.which(argv[0], path=env.get("PATH")) is None:
        return None, f"{shown}: {argv[0]} is not on PATH here; your quota was not checked"
    out, why = _ask(argv, env, QUOTA_TIMEOUT)
    if out is None:
        return None, f"{shown} {why}; your quota was not checked"
    quota = space.parse_quota(tool, out, str(where))
    if quota is None:
        first = next((ln.strip() for ln in out.splitlines() if ln.strip()), "nothing")
        return None, f"{shown} printed no quota line envbuilder can read (it began: {first!r}); not used"
    return quota, ""


def ask_site(
    command: space.SiteCommand, where: Path, env: Mapping[str, str]
) -> tuple[Optional[space.Quota], str]:
    """The user's quota from the site's own command (its answer in the documented JSON form), or None and why:
    the command unsafe to run, missing, failing, hanging past its timeout, or answering in another form. Each is
    a warning naming the command; none is fatal, and the other checks still run."""
    program = command.argv[0]
    tool = f"site: {Path(program).name}"
    argv, why = space.site_argv(command, str(where), pwd.getpwuid(os.getuid()).pw_name)
    shown = proc.quote(argv or command.argv)
    if argv is None:
        return None, f"{command.label} was not run: {why}; your quota was not checked"
    unsafe = _unsafe(program)
    if unsafe:
        return None, f"{command.label} was not run: {unsafe}; your quota was not checked"
    out, why = _ask(argv, env, command.timeout or QUOTA_TIMEOUT)
    if out is None:
        return None, f"{command.label} {why} (ran: {shown}); your quota was not checked"
    quota, why = space.parse_answer(tool, out)
    if quota is None:
        return None, f"{command.label} {why} (ran: {shown}); not used (docs/site-quota.md has its form)"
    return quota, ""


def _unsafe(program: str) -> str:
    """Why the site's program is not to be run ("" where it may be): missing, or one another user could replace
    (the rule that guards the site config itself)."""
    if not Path(program).is_file():
        return f"{program} is not a file on this host"
    try:
        strictmodes.check(Path(program), what="the program", elsewhere="ask the admins to fix its mode")
    except UnsafePath as exc:
        return exc.message
    return ""


def _ask(argv: Sequence[str], env: Mapping[str, str], timeout: float) -> tuple[Optional[str], str]:
    """A quota tool's stdout, or None and what went wrong, in words that follow its argv."""
    try:
        res = proc.run(argv, env=proc.scrubbed_env(env), timeout=timeout, check=False)
    except CommandFailed as exc:  # a timeout
        return None, f"did not answer: {exc.message.splitlines()[-1].strip('()')}"
    except OSError as exc:
        return None, f"could not be started: {exc.strerror or exc}"
    if res.returncode != 0:
        tail = (res.stderr.strip() or res.stdout.strip()).splitlines()[-1:]
        return None, f"failed (exit {res.returncode}{': ' + tail[0] if tail else ''})"
    return res.stdout, ""


def site_commands(env: Mapping[str, str]) -> list[space.SiteCommand]:
    """The site config's ``[[quota_commands]]``, from the admin's file only (strictmodes.site_tables)."""
    items, file = strictmodes.site_tables(env, space.SITE_KEY)
    return space.site_commands(items, file)


def site_command_for(where: Path, commands: Sequence[space.SiteCommand]) -> Optional[space.SiteCommand]:
    """The command for the directory ``where``: the entry whose path (resolved) is it or holds it, the longest."""
    real = os.path.realpath(where)
    held = []
    for c in commands:
        root = os.path.realpath(c.path)
        if real == root or real.startswith(root.rstrip("/") + "/"):
            held.append((len(root), c))
    return max(held, key=lambda h: h[0])[1] if held else None


def room(
    path: str, limits: Limits, env: Mapping[str, str], commands: Sequence[space.SiteCommand] = ()
) -> Room:
    """The room under ``path``; the user's quota from the site's command where one is named for it (the admin's
    word, over the recipe's tool), else from the tool the recipe names."""
    where = existing(path)
    st = os.statvfs(where)
    found = limits(str(where))
    stated, tool = found if found else (None, "")
    site = site_command_for(where, commands)
    if site is not None:
        quota, note = ask_site(site, where, env)
    else:
        quota, note = ask_quota(tool, where, env) if tool else (None, "")
    return Room(
        str(where),
        where.stat().st_dev,
        st.f_blocks * st.f_frsize,
        st.f_bavail * st.f_frsize,
        st.f_files,
        st.f_favail,
        quota,
        note,
        stated,
    )


def no_limits(path: str) -> None:
    return None


def check(
    needs: Sequence[Need],
    *,
    env: Mapping[str, str],
    warn: Callable[[str], None],
    way_out: str,
    limits: Limits = no_limits,
    elsewhere: Sequence[str] = (),
) -> Verdict:
    """Measure the room for each need and compare; warn on stderr (``warn``) of a limit nearly reached or a
    quota that could not be read, and refuse with the numbers (a DiskError) where the needs do not fit."""
    commands = site_commands(env)
    seen: dict[Path, Room] = {}  # one statvfs and one quota tool run per directory
    rooms = []
    for n in needs:
        where = existing(n.path)
        if where not in seen:
            seen[where] = room(n.path, limits, env, commands)
        rooms.append(seen[where])
    verdict = space.compare(needs, rooms)
    for note in verdict.notes:
        warn(f"pre-flight: {note}")
    for c in verdict.warnings:
        warn(f"pre-flight: {'may not fit' if not c.fits else 'close to the limit'}: {c.words()}")
    if verdict.refused:
        raise _refusal(needs, rooms, verdict, way_out, elsewhere)
    return verdict


def _refusal(
    needs: Sequence[Need], rooms: Sequence[Room], verdict: Verdict, way_out: str, elsewhere: Sequence[str]
) -> DiskError:
    """The refusal: the numbers, then the ways out (the verb's own, the site's other file systems, and pruning a
    cache that shares the full file system), with where the estimate came from."""
    worst = verdict.refused[0]
    ways = [way_out]
    if elsewhere:
        ways.append(f"another file system of the site: {', '.join(elsewhere)}")
    full = {r.device for r in rooms if r.path == worst.path}
    for need, r in zip(needs, rooms):
        if need.soft and r.device in full:
            ways.append(f"make room in {need.what} at {need.path} (uv cache prune)")
    sources = "; ".join(dict.fromkeys(f"{n.what}: {n.source}" for n in needs if not n.soft))
    err = DiskError(
        space.refusal(verdict),
        path=worst.path,
        errno=errno.EDQUOT if "quota" in worst.limit else errno.ENOSPC,
        hint="; or ".join(ways) + f" (estimate: {sources}; --no-preflight skips this check)",
    )
    err.data = {"preflight": to_json(needs, verdict)}
    return err


def to_json(needs: Sequence[Need], verdict: Verdict) -> dict[str, object]:
    return {
        "needs": [n.to_json() for n in needs],
        "checks": [c.to_json() for c in verdict.checks],
        "notes": list(verdict.notes),
    }


#: Set to 1: every verb skips pre-flight, as --no-preflight does (a site whose file systems misreport statvfs).
SKIP_VAR = "ENVBUILDER_NO_PREFLIGHT"


def skipped(flag: bool, env: Mapping[str, str], warn: Callable[[str], None]) -> bool:
    """Whether pre-flight is skipped (``--no-preflight``, or ENVBUILDER_NO_PREFLIGHT=1), said on stderr."""
    why = "--no-preflight" if flag else f"{SKIP_VAR}=1" if env.get(SKIP_VAR) == "1" else ""
    if why:
        warn(f"pre-flight skipped ({why}): space, inodes and quota were not checked before writing")
    return bool(why)
