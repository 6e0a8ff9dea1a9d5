"""PEP 592 yanked files (pure): what the resolver says when a pinned torch release is yanked on its index.

A yanked file stays on its index, but installers take it only for an exact pin. ``latest`` never chooses one
(knowledge leaves yanked files out of the releases it sees), and a pin to one is refused with the index's own
reason, under the gate ``yanked``; a recipe that lists it in ``torch.allow`` gets the build anyway, with a warning.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import TYPE_CHECKING, Optional

from packaging.version import InvalidVersion, Version

from envbuilder.core.errors import ResolverError, ResolverErrors
from envbuilder.resolver.gates import Finding, TorchRequest
from envbuilder.resolver.matrix import Matrix, Release

if TYPE_CHECKING:  # the pure parts only name these types; indexfacts is read at plan time
    from envbuilder.resolver.indexfacts import IndexFacts, WheelFile

GATE = "yanked"


def files(index: Optional[IndexFacts], upstream: str, version: str, arch: str) -> list[WheelFile]:
    """The yanked ``version`` files ``upstream``'s page lists for ``arch`` ([] where the page was not read)."""
    if index is None or index.page(upstream) is None:
        return []
    return [f for f in index.files_for(upstream, version, arch=arch) if f.yanked]


def finding(
    index: Optional[IndexFacts], upstream: str, version: str, arch: str, where: str = ""
) -> Optional[Finding]:
    """The ``yanked`` finding when ``upstream`` lists ``version`` for ``arch`` only as yanked files, else None."""
    found = files(index, upstream, version, arch)
    if not found or index is None:
        return None
    reasons = sorted({f.yanked_reason for f in found if f.yanked_reason})
    why = f": {'; '.join(reasons)}" if reasons else ", which gives no reason"
    fine = index.versions(upstream, arch=arch)
    other = (
        f"pin another release (the newest there that is not yanked: {fine[-1]})"
        if fine
        else "pin another release"
    )
    return Finding(
        GATE,
        f"torch {version} is yanked on the index{why} ({where or upstream})",
        f'{other}; torch.allow = ["{GATE}"] installs this build anyway',
    )


def label(index: Optional[IndexFacts], upstream: str, version: str, arch: str, python: Optional[str]) -> str:
    """The local label every yanked ``version`` file for ``arch`` and ``python`` carries, "" unless exactly one."""
    found = {f.local for f in files(index, upstream, version, arch) if f.supports(python)}
    return found.pop() if len(found) == 1 else ""


def pinned(
    refused: ResolverErrors,
    request: TorchRequest,
    *,
    m: Matrix,
    index: Optional[IndexFacts],
    arch: str,
    notes: list[str],
) -> Release:
    """For a pin to a release the merged knowledge does not hold (``refused``): when the index lists it, but
    only yanked, raise the ``yanked`` error with the index's reason, or, where the recipe allows the gate, plan
    it with facts inferred from the newest release the table knows. Anything else re-raises ``refused``."""
    template = m.index.get(request.channel, "")
    pages = [u for u in _channel_pages(index, template) if request.variant in ("auto", _variant(template, u))]
    found = next(
        (f for f in (finding(index, u, request.version, arch) for u in pages) if f is not None), None
    )
    pool = [r for r in m.releases if r.channel == request.channel]
    if found is None or not pool or not _exact(request.version):
        raise refused
    if GATE not in request.allow:
        raise ResolverErrors([ResolverError(found.message, gate=found.gate, hint=found.hint)]) from None
    base = max(pool, key=lambda r: r.version)
    notes.append(f"torch {request.version} is yanked on the index; allowed by the recipe ({GATE})")
    return replace(
        base,
        torch=request.version,
        torchvision="",
        torchaudio="",
        source=f"yanked on the index; facts inferred from torch {base.torch}",
        origin="inferred",
    )


def _exact(version: str) -> bool:
    try:
        return len(Version(version).release) >= 3
    except InvalidVersion:
        return False


def _pattern(template: str) -> Optional[re.Pattern[str]]:
    if "{variant}" not in template:
        return None
    head, _, tail = template.rstrip("/").partition("{variant}")
    return re.compile(re.escape(head) + r"(?P<variant>[^/]+)" + re.escape(tail) + "/?")


def _variant(template: str, url: str) -> str:
    pattern = _pattern(template)
    m = pattern.fullmatch(url) if pattern else None
    return m["variant"] if m else ""


def _channel_pages(index: Optional[IndexFacts], template: str) -> list[str]:
    """The upstreams of ``index`` that are variant pages of the channel whose URL template is ``template``."""
    if index is None:
        return []
    return [u for u in index.pages if _variant(template, u)]
