"""Index mirrors (pure): send a recipe's upstream wheel index to a site mirror or a local wheelhouse.

``ENVBUILDER_INDEX_MIRROR`` holds ``UPSTREAM=TARGET`` pairs separated by whitespace or ``;``. UPSTREAM is a URL
prefix (the longest matching prefix wins) or ``pypi`` for the default index. TARGET is one source or several
joined by ``,``: a URL (the prefix is replaced, so ``https://download.pytorch.org/whl/=https://mirror.site/torch/``
maps every variant), ``pypi``, or an absolute directory holding wheels (``--find-links DIR``). The first URL becomes
the index, later ones extra indexes; with directories only there is no index at all (``--no-index``), so
``https://download.pytorch.org/whl/cpu=/opt/wheels,pypi`` means "torch from that wheelhouse, its dependencies from
PyPI". Sites without internet and the tests' local index use the same mechanism.

Conda channels go through the same rules: a channel name (``conda-forge``) stands for its anaconda.org URL, on
either side of a rule (``conda-forge=/srv/conda-mirror/conda-forge`` or
``https://conda.anaconda.org/=https://mirror.site/conda/``); a directory target becomes a ``file://`` channel.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Optional

from envbuilder.core.errors import UsageError
from envbuilder.core.structs import dataclass

VAR = "ENVBUILDER_INDEX_MIRROR"
PYPI = "https://pypi.org/simple"
CONDA = "https://conda.anaconda.org/"


@dataclass(frozen=True)
class Rule:
    upstream: str
    targets: tuple[str, ...]

    def apply(self, url: str) -> tuple[list[str], list[str]]:
        """The (index URLs, wheel directories) that replace ``url``."""
        rest = url[len(self.upstream) :] if url.startswith(self.upstream) else ""
        urls = [t if t == PYPI else t + rest for t in self.targets if not t.startswith("/")]
        return urls, [t for t in self.targets if t.startswith("/")]


def parse(text: str) -> list[Rule]:
    rules = []
    for part in re.split(r"[;\s]+", text.strip()):
        if not part:
            continue
        upstream, sep, target = part.partition("=")
        if not sep or not upstream or not target:
            raise UsageError(
                f"{VAR}: expected UPSTREAM=TARGET, found {part!r}",
                hint=f"e.g. {VAR}='https://download.pytorch.org/whl/=https://mirror.example/torch/ pypi=/opt/wheels'",
            )
        if upstream == "pypi":
            upstream = PYPI
        elif "://" not in upstream and not upstream.startswith("/"):
            upstream = CONDA + upstream  # a conda channel name
        targets = []
        for given in target.split(","):
            one = PYPI if given == "pypi" else given
            if not one.startswith(("http://", "https://", "file://", "/")):
                raise UsageError(
                    f"{VAR}: target {one!r} is neither a URL, `pypi` nor an absolute directory",
                    hint="e.g. https://download.pytorch.org/whl/cpu=/opt/wheels,pypi",
                )
            targets.append(one)
        rules.append(Rule(upstream, tuple(targets)))
    return rules


def from_env(env: Mapping[str, str]) -> list[Rule]:
    return parse(env.get(VAR, ""))


def _match(rules: Sequence[Rule], url: str) -> Optional[Rule]:
    hits = [r for r in rules if url.startswith(r.upstream) or url.rstrip("/") == r.upstream.rstrip("/")]
    return max(hits, key=lambda r: len(r.upstream)) if hits else None


def sources_for(url: str, rules: Sequence[Rule]) -> tuple[list[str], list[str]]:
    """The (index URLs, wheel directories) an install from ``url`` reads: its rule's targets, else ``url``."""
    rule = _match(rules, url)
    return rule.apply(url) if rule is not None else ([url], [])


def served_from(upstream: str, rules: Sequence[Rule]) -> tuple[str, ...]:
    """Where a project on the index ``upstream`` is read from after the rules: URLs and wheel directories. PyPI
    beside a mirror of another index only serves the dependencies, so it is left out."""
    urls, dirs = sources_for(upstream, rules)
    if upstream.rstrip("/") != PYPI and len(urls) + len(dirs) > 1:
        urls = [u for u in urls if u != PYPI]
    return tuple(dict.fromkeys([*urls, *dirs]))


def shown(upstream: str, rules: Sequence[Rule]) -> str:
    """The index ``upstream`` as an install really reads it, for people: its mirror, naming what it stands for."""
    sources = served_from(upstream, rules)
    if sources == (upstream,):
        return upstream
    return f"{', '.join(sources)} (mirror of {upstream}, {VAR})"


def _is_install(cmd: Sequence[str]) -> bool:
    # uv pip install ..., python -m pip install ..., env K=V uv pip install ..., uv pip compile (locks) ...
    return ("install" in cmd or "compile" in cmd) and "pip" in cmd


def remap(commands: Sequence[Sequence[str]], rules: Sequence[Rule]) -> tuple[list[list[str]], list[str]]:
    """Install commands with their indexes mirrored, and a note per change."""
    if not rules:
        return [list(c) for c in commands], []
    notes: list[str] = []
    out: list[list[str]] = []
    for original in commands:
        cmd = list(original)
        if not _is_install(cmd):
            out.append(cmd)
            continue
        new: list[str] = []
        has_index = False
        i = 0
        while i < len(cmd):
            arg = cmd[i]
            if arg in ("--index-url", "--extra-index-url") and i + 1 < len(cmd):
                has_index = True
                new += _mirrored(arg, cmd[i + 1], rules, notes)
                i += 2
                continue
            new.append(arg)
            i += 1
        if not has_index:
            # The default index (PyPI) is used: mirror it if a rule says so.
            rule = _match(rules, PYPI)
            if rule is not None:
                at = new.index("install" if "install" in new else "compile") + 1
                new[at:at] = _mirrored("--index-url", PYPI, rules, notes)
        out.append(new)
    return out, list(dict.fromkeys(notes))


def _mirrored(flag: str, url: str, rules: Sequence[Rule], notes: list[str]) -> list[str]:
    rule = _match(rules, url)
    if rule is None:
        return [flag, url]
    urls, dirs = rule.apply(url)
    notes.append(f"index {url} -> {', '.join([*urls, *dirs])} ({VAR})")
    fallback: list[str] = []
    if url != PYPI and PYPI in urls:
        # `URL,pypi` means "this index, and PyPI (as the `pypi` rule reaches it) for what it lacks". uv searches
        # extra indexes before the main one and takes a package from the first index that has it, so PyPI is the
        # main index and the mirror an extra one: PyPI's own torch build can never win over the mirror's (pip
        # merges all indexes alike either way).
        urls = [u for u in urls if u != PYPI]
        fallback, more = _pypi(rules)
        dirs = [*dirs, *(d for d in more if d not in dirs)]
    if flag == "--index-url" and fallback:
        main: Optional[str] = fallback[0]
        extra = [*urls, *fallback[1:]]
    elif flag == "--index-url":
        main, extra = (urls[0], urls[1:]) if urls else (None, [])
    else:
        main, extra = None, [*urls, *fallback]
    out: list[str] = []
    if flag == "--index-url":
        out += ["--index-url", main] if main else ["--no-index"]
    for target in extra:
        out += ["--extra-index-url", target]
    for d in dirs:
        out += ["--find-links", d]
    return out


def _pypi(rules: Sequence[Rule]) -> tuple[list[str], list[str]]:
    """PyPI as this site reaches it: the targets of the `pypi` rule, or PyPI itself."""
    rule = next((r for r in rules if r.upstream == PYPI), None)
    if rule is None:
        return [PYPI], []
    return rule.apply(PYPI)


def channel_url(channel: str) -> str:
    """A conda channel as a URL: names are anaconda.org's, directories are file:// channels."""
    if "://" in channel:
        return channel.rstrip("/")
    if channel.startswith("/"):
        return "file://" + channel.rstrip("/")
    return CONDA + channel.strip("/")


def remap_channels(channels: Sequence[str], rules: Sequence[Rule]) -> tuple[list[str], list[str]]:
    """The recipe's conda channels as URLs, mirrored where a rule says so; and a note per change."""
    out: list[str] = []
    notes: list[str] = []
    for channel in channels:
        url = channel_url(channel)
        rule = _match(rules, url)
        if rule is None:
            out.append(url)
            continue
        urls, dirs = rule.apply(url)
        targets = [u.rstrip("/") for u in urls if u != PYPI] + ["file://" + d.rstrip("/") for d in dirs]
        notes.append(f"channel {url} -> {', '.join(targets)} ({VAR})")
        out.extend(targets)
    return list(dict.fromkeys(out)), notes


# ---------------------------------------------------------------------------------------------------------------
# Managed Pythons (python.source = "managed"): where uv downloads CPython from

#: The variable (setting ``python_mirror``) that names where uv downloads CPython builds from.
PYTHON_VAR = "ENVBUILDER_PYTHON_MIRROR"
#: The release URL uv's downloads list names (python-build-standalone's) and the one newer uv releases use; a
#: mirror stands for either, with the same ``<release>/<file>`` below it (uv's UV_PYTHON_INSTALL_MIRROR).
PYTHON_UPSTREAMS = (
    "https://github.com/astral-sh/python-build-standalone/releases/download",
    "https://releases.astral.sh/github/python-build-standalone/releases/download",
)


@dataclass(frozen=True)
class PythonDownloads:
    """Where uv downloads a managed CPython: ``mirror`` (a URL; None: uv's own default) and why, in words."""

    mirror: Optional[str]
    why: str

    @property
    def shown(self) -> str:
        return f"{self.mirror} ({self.why})" if self.mirror else self.why


def python_downloads(env: Mapping[str, str]) -> PythonDownloads:
    """The download source of managed Pythons: ``ENVBUILDER_PYTHON_MIRROR`` (a URL, or a directory holding
    ``<release>/<file>`` as the releases do); else an ``ENVBUILDER_INDEX_MIRROR`` rule for the release URL, as for
    wheels (its first URL, else its first directory); else uv's default."""
    given = env.get(PYTHON_VAR, "").strip()
    if given:
        return PythonDownloads(_python_target(given, PYTHON_VAR), PYTHON_VAR)
    rules = from_env(env)
    for upstream in PYTHON_UPSTREAMS:
        rule = _match(rules, upstream)
        if rule is not None:
            urls, dirs = rule.apply(upstream)
            first = next((u for u in urls if u != PYPI), None) or (dirs[0] if dirs else None)
            if first is not None:
                return PythonDownloads(_python_target(first, VAR), f"{VAR} rule for {upstream}")
    return PythonDownloads(None, "uv's default: python-build-standalone's releases")


def _python_target(given: str, var: str) -> str:
    """A Python mirror as uv takes it: a URL, or a directory as a ``file://`` URL."""
    if given.startswith("/"):
        return "file://" + given.rstrip("/")
    if not given.startswith(("http://", "https://", "file://")):
        raise UsageError(
            f"{var}: {given!r} is neither a URL nor an absolute directory",
            hint=f"e.g. {PYTHON_VAR}=https://mirror.site/python-build-standalone (holding <release>/<file>)",
        )
    return given.rstrip("/")
