"""Pre-flight space arithmetic (pure): what an operation will write where, what each file system has room for,
and whether it fits.

- A :class:`Need` is bytes and files an operation puts under one directory, with where the figure came from.
- A :class:`Room` is what was found for the file system holding a directory: its free bytes and inodes for an
  unprivileged user (``statvfs``: ``f_bavail``, ``f_favail``), the user's quota there where the site has a way to
  ask (:class:`Quota`, read from ``lfs quota`` or ``quota -w`` output by :func:`parse_quota`, or from the answer of
  a quota command the site config names, :class:`SiteCommand`, by :func:`parse_answer`), and the limits the
  recipe states for it (``[filesystems.NAME] quota``/``files_quota``, read by :func:`parse_size`/
  :func:`parse_count`).
- :func:`compare` adds up the needs per file system and says, per limit, whether they fit (a refusal), fit within
  :data:`NEAR` of the limit (a warning) or fit; :func:`refusal` puts a refusal in words with the numbers.

The caller (``system.space``) measures; nothing here reads a file or starts a process.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Optional

from envbuilder.core.errors import RecipeError, did_you_mean
from envbuilder.core.structs import dataclass

#: A limit is "close" when the operation leaves less than this share of it free.
NEAR = 0.10
#: The quota tools a [filesystems] entry may name (``quota_command``): envbuilder builds their argv itself.
QUOTA_TOOLS = ("lfs", "quota")

_UNITS = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40, "P": 1 << 50}
_SIZE = re.compile(r"\s*([0-9][0-9,_]*(?:\.[0-9]+)?)\s*([KMGTP]?)(?:I?B)?\s*", re.IGNORECASE)
_COUNT = re.compile(r"\s*([0-9][0-9,_]*(?:\.[0-9]+)?)\s*([KM]?)\s*", re.IGNORECASE)


def parse_size(text: str) -> Optional[int]:
    """Bytes of a size as recipes write it ("25 GB", "1 TB", "500M", "2.5GiB"; binary units, as quota tools
    mean them), or None where it is not one."""
    m = _SIZE.fullmatch(text)
    if not m:
        return None
    return int(float(m.group(1).replace(",", "").replace("_", "")) * _UNITS[m.group(2).upper()])


def parse_count(text: str) -> Optional[int]:
    """A file count as recipes write it ("300,000", "3M", "200k"), or None where it is not one."""
    m = _COUNT.fullmatch(text)
    if not m:
        return None
    scale = {"": 1, "K": 1000, "M": 1000 * 1000}[m.group(2).upper()]
    return int(float(m.group(1).replace(",", "").replace("_", "")) * scale)


def gb(n: float) -> str:
    """Bytes in words: GB with two decimals above 1 GB, else MB (binary units, as df -h and quota -s say)."""
    return f"{n / (1 << 30):.2f} GB" if n >= 1 << 30 else f"{n / (1 << 20):.1f} MB"


@dataclass(frozen=True)
class Need:
    """Bytes and files an operation writes under ``path``; ``what`` names it ("the env", "uv's cache") and
    ``source`` says where the figures come from. ``soft``: a shortfall is a warning, not a refusal (an
    estimate that may already be there, such as a cache's copy)."""

    path: str
    what: str
    bytes: int
    files: int
    source: str
    soft: bool = False

    def to_json(self) -> dict[str, object]:
        return {
            "path": self.path,
            "what": self.what,
            "bytes": self.bytes,
            "files": self.files,
            "source": self.source,
            "soft": self.soft,
        }


@dataclass(frozen=True)
class Quota:
    """A user's quota on one file system as its tool reported it: use and limit in bytes and files (None where
    the tool reports no limit: 0 in its columns)."""

    tool: str
    used_bytes: int
    limit_bytes: Optional[int]
    used_files: int
    limit_files: Optional[int]


@dataclass(frozen=True)
class Stated:
    """The limits a recipe states for a [filesystems] entry (its quota, its file count)."""

    name: str
    bytes: Optional[int]
    files: Optional[int]


@dataclass(frozen=True)
class Room:
    """What the file system holding ``path`` has: ``device`` groups directories on one file system; ``size``/
    ``inodes`` its capacity (``inodes`` 0 where it keeps no count, as btrfs); ``free``/``free_files`` what an
    unprivileged user may still use; the user's quota (None where none was asked or could be read, ``quota_note``
    saying why), and the recipe's stated limits."""

    path: str
    device: int
    size: int
    free: int
    inodes: int
    free_files: int
    quota: Optional[Quota] = None
    quota_note: str = ""
    stated: Optional[Stated] = None


@dataclass(frozen=True)
class Shortfall:
    """One limit the needs on one file system meet: ``limit`` in words ("free space on /scratch"), the need,
    what is left, and the whole limit (for "close to")."""

    path: str
    limit: str
    unit: str
    need: int
    left: int
    total: int
    soft: bool
    #: A file system's free space or inodes, which every user shares (a quota is the user's own).
    shared: bool = False

    @property
    def fits(self) -> bool:
        return self.need <= self.left

    @property
    def near(self) -> bool:
        """It fits, closely: a quota left under NEAR of itself; a shared file system's room nearly all taken by
        this operation (one that is 90% full for everyone is no news to this user)."""
        if not self.fits or self.total <= 0:
            return False
        if self.shared:
            return self.need > (1 - NEAR) * self.left
        return self.left - self.need < NEAR * self.total

    def words(self) -> str:
        show = gb if self.unit == "bytes" else (lambda n: f"{n:,} files")
        return f"{self.limit}: need {show(self.need)}, {show(self.left)} left of {show(self.total)}"

    def to_json(self) -> dict[str, object]:
        return {
            "path": self.path,
            "limit": self.limit,
            "unit": self.unit,
            "need": self.need,
            "left": self.left,
            "total": self.total,
            "fits": self.fits,
            "near": self.near,
        }


@dataclass(frozen=True)
class Verdict:
    checks: tuple[Shortfall, ...]
    notes: tuple[str, ...] = ()

    @property
    def refused(self) -> tuple[Shortfall, ...]:
        return tuple(c for c in self.checks if not c.fits and not c.soft)

    @property
    def warnings(self) -> tuple[Shortfall, ...]:
        return tuple(c for c in self.checks if c.near or (not c.fits and c.soft))


def compare(needs: Sequence[Need], rooms: Sequence[Room]) -> Verdict:
    """The needs added up per file system (``rooms[i]`` is the room of ``needs[i].path``), each sum checked
    against the file system's free space and inodes, the user's quota and the recipe's stated limits."""
    groups: dict[int, tuple[Room, list[Need]]] = {}
    for need, room in zip(needs, rooms):
        groups.setdefault(room.device, (room, []))[1].append(need)
    checks: list[Shortfall] = []
    notes: list[str] = []
    for room, group in groups.values():
        for soft in (False, True):
            part = [n for n in group if n.soft == soft]
            if part:
                checks += _limits(room, sum(n.bytes for n in part), sum(n.files for n in part), soft)
        if room.quota_note:
            notes.append(room.quota_note)
    return Verdict(tuple(checks), tuple(notes))


def _limits(room: Room, need_bytes: int, need_files: int, soft: bool) -> list[Shortfall]:
    at = room.path
    out = [Shortfall(at, f"free space on {at}", "bytes", need_bytes, room.free, room.size, soft, shared=True)]
    if room.inodes:
        out.append(
            Shortfall(
                at,
                f"free inodes on {at}",
                "files",
                need_files,
                room.free_files,
                room.inodes,
                soft,
                shared=True,
            )
        )
    q = room.quota
    if q is not None:
        if q.limit_bytes:
            left = max(0, q.limit_bytes - q.used_bytes)
            out.append(
                Shortfall(at, f"your quota ({q.tool})", "bytes", need_bytes, left, q.limit_bytes, soft)
            )
        if q.limit_files:
            left = max(0, q.limit_files - q.used_files)
            out.append(
                Shortfall(at, f"your file quota ({q.tool})", "files", need_files, left, q.limit_files, soft)
            )
    s = room.stated
    if s is not None and q is None:  # a quota read from the tool says more than the recipe's figure
        what = f"the recipe's stated quota of [filesystems.{s.name}]"
        if s.bytes:
            out.append(Shortfall(at, what, "bytes", need_bytes, s.bytes, s.bytes, soft))
        if s.files:
            out.append(Shortfall(at, f"{what} (files)", "files", need_files, s.files, s.files, soft))
    return out


def parse_quota(tool: str, text: str, path: str) -> Optional[Quota]:
    """The user's quota from ``lfs quota -u USER PATH`` or ``quota -w -f PATH`` output: the data line after the
    "Filesystem ... files quota limit grace" header (lfs puts a long file system name on a line of its own and
    the numbers on the next; "*" marks a value over its soft limit and "[...]" one of an inactive target, both
    stripped). Sizes are KiB in both tools. None where the output has no such line: the caller reports it,
    never guesses."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if not re.match(r"\s*Filesystem\s+(kbytes|blocks|used|space)\s+quota\s+limit", line):
            continue
        rows = [ln.split() for ln in lines[i + 1 : i + 3] if ln.strip()]
        if not rows:
            return None
        fields = rows[0][1:] if len(rows[0]) > 1 or len(rows) == 1 else rows[1]
        return _quota_row(tool, fields)
    return None


def _number(field: str) -> Optional[int]:
    field = field.strip("[]").rstrip("*")
    return int(field) if field.isdigit() else None


def _quota_row(tool: str, fields: list[str]) -> Optional[Quota]:
    """blocks quota limit [grace] files quota limit [grace]: a grace column is there where the tool prints one
    (lfs always, "-" when none; quota only while over the soft limit)."""
    nums: list[int] = []
    for f in fields:
        n = _number(f)
        if n is not None:
            nums.append(n)
        elif len(nums) not in (3, 6):  # a word where a number belongs: not the format we know
            return None
    if len(nums) != 6:
        return None
    used_kb, soft_kb, hard_kb, used_files, soft_files, hard_files = nums
    limit_kb = hard_kb or soft_kb
    return Quota(
        tool,
        used_kb * 1024,
        limit_kb * 1024 if limit_kb else None,
        used_files,
        (hard_files or soft_files) or None,
    )


def refusal(verdict: Verdict) -> str:
    """The refusal's first line: every limit the needs do not fit, with the numbers."""
    return "not enough room: " + "; ".join(c.words() for c in verdict.refused)


# ---------------------------------------------------------------------------------------------------------------
# The site's own quota command (``[[quota_commands]]`` in the site config; never a recipe's)

#: The site config's table of quota commands: ``[[quota_commands]]`` with ``path``, ``argv`` and ``timeout``.
SITE_KEY = "quota_commands"
SITE_FIELDS = ("path", "argv", "timeout")
#: The words that may stand for a value in a site command's argv, each as a whole argument.
PLACEHOLDERS = ("{path}", "{user}")
#: The longest a site may let its command take, in seconds (a pre-flight that waits longer helps nobody).
MAX_TIMEOUT = 300.0
#: The keys of a site command's answer: one JSON object, each value a whole number of at least 0, or null.
ANSWER_KEYS = ("bytes_used", "bytes_limit", "files_used", "files_limit")


@dataclass(frozen=True)
class SiteCommand:
    """A quota command the site config names for the directories under ``path``: ``argv`` (an absolute program
    and fixed arguments, :data:`PLACEHOLDERS` among them), how long it may take, and where it was named
    (``file``, ``key``) for every message about it."""

    path: str
    argv: tuple[str, ...]
    timeout: Optional[float]
    file: str
    key: str

    @property
    def label(self) -> str:
        return f"the site's quota command ({self.key} in {self.file})"


def site_commands(items: object, file: str) -> list[SiteCommand]:
    """The site config's ``[[quota_commands]]``, checked: an error naming the file and key for anything a site
    should not write (a relative program, a placeholder inside an argument, an unknown key)."""
    if items is None:
        return []
    if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
        raise RecipeError(f"expected an array of tables ([[{SITE_KEY}]])", file=file, key=SITE_KEY)
    return [_site_command(item, f"{SITE_KEY}[{n}]", file) for n, item in enumerate(items)]


def _site_command(item: Mapping[str, object], key: str, file: str) -> SiteCommand:
    for k in item:
        if k not in SITE_FIELDS:
            hint = did_you_mean(k, SITE_FIELDS) or f"expected {', '.join(SITE_FIELDS)}"
            raise RecipeError(f"unknown key {k!r}", file=file, key=f"{key}.{k}", hint=hint)
    where, argv, timeout = item.get("path"), item.get("argv"), item.get("timeout")
    if not isinstance(where, str) or not where.startswith("/"):
        raise RecipeError(
            "expected an absolute path: the directory whose quota the command answers for",
            file=file,
            key=f"{key}.path",
        )
    if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
        raise RecipeError(
            "expected a list of strings: the program and its arguments", file=file, key=f"{key}.argv"
        )
    for n, arg in enumerate(argv):
        problem = _argument_problem(n, arg)
        if problem:
            raise RecipeError(problem, file=file, key=f"{key}.argv[{n}]", hint=_ARGV_HINT)
    if timeout is not None and (
        isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout <= MAX_TIMEOUT
    ):
        raise RecipeError(
            f"expected seconds, more than 0 and at most {MAX_TIMEOUT:g}", file=file, key=f"{key}.timeout"
        )
    return SiteCommand(where, tuple(argv), float(timeout) if timeout is not None else None, file, key)


_ARGV_HINT = (
    'e.g. argv = ["/usr/local/sbin/envbuilder-quota", "--user", "{user}", "{path}"]: an absolute program, '
    "then fixed arguments, {path} and {user} each as a whole argument"
)


def _argument_problem(n: int, arg: str) -> str:
    if n == 0:
        if not arg.startswith("/"):
            return f"expected an absolute program path, not {arg!r} (a command is never looked up on PATH)"
        return f"a placeholder cannot be the program: {arg!r}" if "{" in arg or "}" in arg else ""
    if arg in PLACEHOLDERS or ("{" not in arg and "}" not in arg):
        return ""
    return (
        f"{arg!r}: a placeholder stands as a whole argument, {' or '.join(PLACEHOLDERS)}, and no other "
        "argument holds a brace"
    )


def site_argv(command: SiteCommand, path: str, user: str) -> tuple[Optional[list[str]], str]:
    """The argv that asks ``command`` for ``user``'s quota on the file system holding ``path``, each placeholder
    replaced whole (never a substring, never through a shell), or None and why where a value could be read as
    an option (one starting with "-") or is empty."""
    values = {"{path}": path, "{user}": user}
    argv = [command.argv[0]]
    for arg in command.argv[1:]:
        if arg in values:
            value = values[arg]
            if not value or value.startswith("-"):
                return None, f"{arg} would be {value!r}, which the command could read as an option"
            argv.append(value)
        else:
            argv.append(arg)
    return argv, ""


def parse_answer(tool: str, text: str) -> tuple[Optional[Quota], str]:
    """A site command's answer: one JSON object with :data:`ANSWER_KEYS` (``bytes_used`` and ``bytes_limit``
    required, the files' pair optional; a limit null, 0 or absent: none; a use null only where its limit is
    none), or None and what is wrong with it: never a guess."""
    doc, why = _answer_object(text)
    if doc is None:
        return None, why
    nums: dict[str, Optional[int]] = {}
    for k in ANSWER_KEYS:
        v = doc.get(k)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
            return None, f"answered {k} = {json.dumps(v)}: expected a whole number of at least 0, or null"
        nums[k] = v
    for what in ("bytes", "files"):
        if nums[f"{what}_limit"] and nums[f"{what}_used"] is None:
            return None, f"answered a {what}_limit without its {what}_used"
    quota = Quota(
        tool,
        nums["bytes_used"] or 0,
        nums["bytes_limit"] or None,
        nums["files_used"] or 0,
        nums["files_limit"] or None,
    )
    return quota, ""


def _answer_object(text: str) -> tuple[Optional[dict[str, object]], str]:
    """The answer's one JSON object with known keys and the two required ones, or None and why not."""
    try:
        doc = json.loads(text)
    except ValueError:
        first = next((ln.strip() for ln in text.splitlines() if ln.strip()), "nothing")
        return None, f"printed no JSON object (it began: {first[:80]!r})"
    if not isinstance(doc, dict):
        return None, f"printed JSON that is not an object: {text.strip()[:80]!r}"
    unknown = sorted(set(doc) - set(ANSWER_KEYS))
    if unknown:
        return None, f"answered with an unknown key {unknown[0]!r} (expected {', '.join(ANSWER_KEYS)})"
    if "bytes_used" not in doc or "bytes_limit" not in doc:
        return None, "answered without bytes_used and bytes_limit"
    return doc, ""
