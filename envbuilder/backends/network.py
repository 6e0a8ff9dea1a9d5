"""An installer that could not reach its index or channel, in words (pure: it reads the stderr the installer left).

Compute nodes often have no route out. uv, pip and conda then end in their own network messages (a DNS error
three ``Caused by`` lines deep, pip's retries, conda's ``HTTP 000 CONNECTION FAILED``); :func:`network_error`
turns such a failure into a NetworkError that names the URL, says what went wrong and how to build without that
network: a mirror or wheelhouse through ENVBUILDER_INDEX_MIRROR, or the env restored from a backup.
"""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Sequence
from typing import Optional

from envbuilder.core.errors import CommandFailed, NetworkError
from envbuilder.resolver import mirror

#: What the installers print for each network failure (uv and rattler: Rust's reqwest/hyper; pip: urllib3;
#: conda: requests), and the cause in words. The first that matches wins.
_CAUSES: tuple[tuple[re.Pattern[str], str], ...] = (
    (
        re.compile(
            r"dns error|failed to lookup address|name or service not known|temporary failure in name resolution"
            r"|could not resolve host|nodename nor servname|no address associated with hostname|getaddrinfo",
            re.IGNORECASE,
        ),
        "its host name does not resolve here (no DNS, as on a compute node without internet)",
    ),
    (
        re.compile(r"network is unreachable|no route to host", re.IGNORECASE),
        "there is no network route to it from this node",
    ),
    (
        re.compile(r"connection refused", re.IGNORECASE),
        "the connection was refused (nothing listens there, or a firewall turns it away)",
    ),
    (
        re.compile(r"timed out|network timeout|connecttimeout|read timeout", re.IGNORECASE),
        "the connection timed out (a firewall that drops the packets, or no way out of this node)",
    ),
    (
        re.compile(
            r"connection failed|failed to establish a new connection|error sending request|connect error"
            r"|connection reset|proxyerror|unable to connect",
            re.IGNORECASE,
        ),
        "the connection failed",
    ),
)
_URL = re.compile(r"(?:https?|ftp)://[^\s'\"`<>()\[\]{}]+")


def network_error(exc: CommandFailed, urls: Sequence[str] = ()) -> Optional[NetworkError]:
    """``exc`` as a NetworkError where the installer's stderr says it could not reach a server; None otherwise.
    ``urls`` (else the URLs on its command line) are named where its stderr names none."""
    tail = exc.stderr_tail
    cause = next((words for pattern, words in _CAUSES if pattern.search(tail)), None)
    if cause is None:
        return None
    given = [*urls, *(a for a in exc.argv if _URL.fullmatch(a))]
    url = _first_url(tail) or (given[0] if given else "its index")
    said = _cause_line(tail)
    return NetworkError(
        exc.argv, exc.returncode, exc.stderr_tail, url=url, cause=cause, said=said, hint=way_out(url)
    )


def way_out(url: str) -> str:
    """How to build without reaching ``url``."""
    host = urllib.parse.urlsplit(url).netloc or url
    return (
        f"this node cannot reach {host}. Point {mirror.VAR} at an index it can reach or at a wheelhouse "
        f"directory (e.g. {mirror.VAR}='https://download.pytorch.org/whl/=https://mirror.site/whl/ "
        "pypi=/path/to/wheels'); or create the env where the index is reachable and bring it here with "
        "`envbuilder restore` from its backup (offline). --offline only plans from the shipped table: the "
        "install still needs a reachable index or a wheelhouse"
    )


def _first_url(text: str) -> Optional[str]:
    found = _URL.search(text)
    return found.group(0).rstrip(".,;:") if found else None


def _cause_line(text: str) -> str:
    """The installer's own last word on it: the deepest line that matched a cause, trimmed."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for line in reversed(lines):
        if any(pattern.search(line) for pattern, _ in _CAUSES):
            return line[:200]
    return ""


def plan_saw(errors: Sequence[str]) -> str:
    """What the plan's own read of the wheel indexes met (each error names its URL), in one sentence."""
    more = f", and {len(errors) - 1} more" if len(errors) > 1 else ""
    return (
        f"the plan could not read the wheel index either ({errors[0]}{more}): without a mirror or a wheelhouse "
        "the install meets the same wall"
    )


def with_plan(exc: NetworkError, errors: Sequence[str]) -> NetworkError:
    """``exc`` saying that the plan had met the same failure first."""
    if errors:
        exc.message += f"; {plan_saw(errors)}"
        exc.args = (exc.message,)
    return exc
