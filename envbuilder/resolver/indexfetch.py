"""The network half of reading wheel indexes (indexread): GET each project page, all at once, through the plan
environment's proxies; every failure becomes the page's error text, never an exception. Imported only when a page
is not in the cache, so a plan from cached pages loads no HTTP machinery."""

from __future__ import annotations

import http.client
import socket
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Optional

from envbuilder import __version__
from envbuilder.resolver.indexfacts import ACCEPT, JSON_TYPE, parse_simple_html, parse_simple_json
from envbuilder.resolver.indexread import TIMEOUT_VAR, Read


def fetch_all(urls: Sequence[str], project: str, env: Mapping[str, str], seconds: float) -> list[Read]:
    """Each page of ``urls`` read in parallel, in order, all within ``seconds``: a page still unread then is given
    up as unanswered. The sockets' own timeout does not bound a host name's lookup, which on a node whose packets
    out are dropped waits for the resolver's every try at every name server (10 s and more) before it fails."""
    started = time.time()
    reads: list[Optional[Read]] = [None] * len(urls)

    def read(i: int) -> None:
        reads[i] = _fetch(urls[i], project, env, seconds)

    # Threads of their own, not a pool's: a daemon thread still waiting on a lookup is left behind, where a
    # pool's workers would be waited for when the CLI exits.
    workers = [threading.Thread(target=read, args=(i,), daemon=True) for i in range(len(urls))]
    deadline = time.monotonic() + seconds
    for t in workers:
        t.start()
    for t in workers:
        t.join(max(0.0, deadline - time.monotonic()))
    late = Read(read_at=started, error=f"no answer within {seconds:g} s ({TIMEOUT_VAR})")
    return [r if r is not None else replace(late, error=f"{u}: {late.error}") for u, r in zip(urls, reads)]


def _fetch(url: str, project: str, env: Mapping[str, str], seconds: float) -> Read:
    """GET one project page; every failure becomes an error text."""
    started = time.time()
    if not url.startswith(("http://", "https://")):
        return Read(read_at=started, error=f"{url}: only http(s) indexes are read")
    headers = {"Accept": ACCEPT, "User-Agent": f"envbuilder/{__version__}"}
    request = urllib.request.Request(url, headers=headers)  # noqa: S310 (http(s) only, checked above)
    try:
        with _opener(url, env).open(request, timeout=seconds) as response:
            body, ctype = response.read(), response.headers.get_content_type()
    except urllib.error.HTTPError as e:
        if e.code == 404:
            return Read(read_at=started)  # the index has no such project
        return Read(read_at=started, error=f"{url}: HTTP {e.code} {e.reason}")
    except (urllib.error.URLError, OSError, http.client.HTTPException, ValueError) as e:
        return Read(read_at=started, error=f"{url}: {_why(e, seconds)}")
    return _parse(url, body, ctype, project, started)


def _why(error: Exception, seconds: float) -> str:
    reason = error.reason if isinstance(error, urllib.error.URLError) else error
    if isinstance(reason, (socket.timeout, TimeoutError)):
        return f"no answer within {seconds:g} s ({TIMEOUT_VAR})"
    if isinstance(reason, OSError) and reason.strerror:
        return f"cannot connect ({reason.strerror})"
    return f"cannot read ({reason})"


def _parse(url: str, body: bytes, ctype: str, project: str, started: float) -> Read:
    if ctype not in (JSON_TYPE, "text/html", "application/vnd.pypi.simple.v1+html"):
        return Read(read_at=started, error=f"{url}: not an index page (Content-Type {ctype})")
    try:
        files = parse_simple_json(body, project) if ctype == JSON_TYPE else parse_simple_html(body, project)
    except ValueError as e:  # json's errors are ValueErrors too
        return Read(read_at=started, error=f"{url}: not an index page ({e})")
    return Read(tuple(files), started)


def _opener(url: str, env: Mapping[str, str]) -> urllib.request.OpenerDirector:
    """An opener that honours the plan environment's proxies (``https_proxy``, ``no_proxy``), not the process's."""
    host = urllib.parse.urlsplit(url).hostname or ""
    bypass = [
        h.strip().lstrip(".") for h in env.get("no_proxy", env.get("NO_PROXY", "")).split(",") if h.strip()
    ]
    proxies: dict[str, str] = {}
    if not any(h in ("*", host) or host.endswith("." + h) for h in bypass):
        for name, value in env.items():
            low = name.lower()
            if low.endswith("_proxy") and low not in ("no_proxy", "all_proxy") and value:
                proxies[low[: -len("_proxy")]] = value
    return urllib.request.build_opener(urllib.request.ProxyHandler(proxies))
