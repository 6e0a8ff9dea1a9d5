"""What a registry says of an image (the network half of ``resolver.images``): its manifest (an index lists the
platforms it is published for), its config's labels and environment, and its digest, read over the OCI
distribution API (``GET /v2/REPO/manifests/REF``, ``GET /v2/REPO/blobs/DIGEST``) through the plan environment's
proxies, with an anonymous bearer token where the registry asks for one (Docker Hub, nvcr.io). A registry on
this machine (127.0.0.1, localhost) is read over plain HTTP. Offline (``--offline``, ENVBUILDER_OFFLINE) nothing is
read. Every failure becomes the reason the plan gives for using the table alone, never an exception."""

from __future__ import annotations

import hashlib
import json
import re
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from typing import Any, Optional

from envbuilder import __version__
from envbuilder.core.containers import DOCKER_HUB, ImageRef
from envbuilder.core.structs import dataclass
from envbuilder.resolver.images import ImageFacts, label_facts
from envbuilder.resolver.indexfetch import _opener, _why
from envbuilder.resolver.indexread import offline_reason, timeout

_INDEX_TYPES = (
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
)
_MANIFEST_TYPES = (
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
)
_ACCEPT = ", ".join((*_INDEX_TYPES, *_MANIFEST_TYPES))
#: The host that serves Docker Hub's registry API.
_HUB_API = "registry-1.docker.io"
#: A manifest or config larger than this is not one.
_MAX_BYTES = 4 * 1024 * 1024
_GOARCH = {"x86_64": "amd64", "aarch64": "arm64"}


@dataclass(frozen=True)
class RegistryImage:
    """What the registry said: the facts its labels and platforms give, the digest the reference names now."""

    facts: ImageFacts
    digest: str
    platforms: tuple[str, ...]


class _Failed(Exception):
    """A read that failed; its text is the reason."""


def read_image(
    ref: ImageRef, env: Mapping[str, str], *, arch: Optional[str], offline: bool = False
) -> tuple[Optional[RegistryImage], str]:
    """What the registry says of ``ref`` (the manifest for ``arch`` where it lists several), or None and why not."""
    if ref.local:
        return None, "a local image: no registry to ask; create reads the torch inside it"
    why_offline = "--offline" if offline else offline_reason(env)
    if why_offline:
        return None, f"offline ({why_offline}): the image table alone"
    reader = _Reader(ref, env, timeout(env))
    try:
        return reader.read(arch), ""
    except _Failed as e:
        return None, f"{ref.host}: {e}"


class _Reader:
    def __init__(self, ref: ImageRef, env: Mapping[str, str], seconds: float) -> None:
        host = _HUB_API if ref.host == DOCKER_HUB else ref.host
        scheme = "http" if ref.loopback else "https"
        self.base = f"{scheme}://{host}/v2/{ref.repository}"
        self.ref, self.env, self.seconds = ref, env, seconds
        self.token = ""

    def read(self, arch: Optional[str]) -> RegistryImage:
        top, digest = self._manifest(self.ref.digest or self.ref.tag)
        platforms: tuple[str, ...] = ()
        manifest = top
        if top.get("mediaType") in _INDEX_TYPES or "manifests" in top:
            entries = [m for m in top.get("manifests", ()) if isinstance(m, dict)]
            platforms = tuple(_platform(m) for m in entries if _platform(m))
            chosen = _choose(entries, arch)
            if chosen is None:
                return RegistryImage(label_facts({}, platforms), digest, platforms)
            manifest, _ = self._manifest(str(chosen["digest"]))
        config_digest = str((manifest.get("config") or {}).get("digest", ""))
        if not re.fullmatch(r"sha256:[0-9a-f]{64}", config_digest):
            raise _Failed("the manifest names no config")
        config = self._json(f"{self.base}/blobs/{config_digest}", "application/json")[0]
        inner = config.get("config") or {}
        if not platforms and config.get("architecture"):
            platforms = (f"{config.get('os', 'linux')}/{config['architecture']}",)
        return RegistryImage(label_facts(inner, platforms), digest, platforms)

    def _manifest(self, reference: str) -> tuple[dict[str, Any], str]:
        return self._json(f"{self.base}/manifests/{urllib.parse.quote(reference, safe=':')}", _ACCEPT)

    def _json(self, url: str, accept: str) -> tuple[dict[str, Any], str]:
        try:
            body, digest = self._get(url, accept)
        except urllib.error.HTTPError as e:
            if e.code != 401 or self.token:
                raise _Failed(f"HTTP {e.code} {e.reason} for {url}") from None
            self.token = self._bearer(e.headers.get("WWW-Authenticate", ""))
            body, digest = self._get(url, accept)
        try:
            data = json.loads(body)
        except ValueError as e:
            raise _Failed(f"not JSON at {url} ({e})") from None
        if not isinstance(data, dict):
            raise _Failed(f"not a manifest at {url}")
        return data, digest

    def _get(self, url: str, accept: str) -> tuple[bytes, str]:
        headers = {"Accept": accept, "User-Agent": f"envbuilder/{__version__}"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        request = urllib.request.Request(url, headers=headers)  # noqa: S310 (http(s) only: built above)
        try:
            with _opener(url, self.env).open(request, timeout=self.seconds) as response:
                body = response.read(_MAX_BYTES + 1)
                digest = response.headers.get("Docker-Content-Digest", "")
        except urllib.error.HTTPError:
            raise
        except (urllib.error.URLError, OSError, ValueError) as e:
            raise _Failed(_why(e, self.seconds)) from None
        if len(body) > _MAX_BYTES:
            raise _Failed(f"{url} is larger than a manifest")
        # A manifest's digest is the sha256 of its bytes, whether or not the registry names it.
        return body, digest or "sha256:" + hashlib.sha256(body).hexdigest()

    def _bearer(self, challenge: str) -> str:
        """An anonymous pull token from the realm the 401's challenge names."""
        params = dict(re.findall(r'(\w+)="([^"]*)"', challenge))
        realm = params.pop("realm", "")
        if not challenge.lower().startswith("bearer") or not realm.startswith(("https://", "http://")):
            raise _Failed("the registry wants credentials envbuilder does not have")
        url = f"{realm}?{urllib.parse.urlencode(params)}"
        data, _ = self._json_plain(url)
        token = data.get("token") or data.get("access_token") or ""
        if not isinstance(token, str) or not token:
            raise _Failed("the registry's token service gave no token")
        return token

    def _json_plain(self, url: str) -> tuple[dict[str, Any], str]:
        try:
            body, digest = self._get(url, "application/json")
        except urllib.error.HTTPError as e:
            raise _Failed(f"HTTP {e.code} {e.reason} for the token") from None
        data = json.loads(body)
        return (data if isinstance(data, dict) else {}), digest


def _platform(entry: Mapping[str, Any]) -> str:
    platform = entry.get("platform") or {}
    os_, arch = platform.get("os"), platform.get("architecture")
    return f"{os_}/{arch}" if os_ and arch and arch != "unknown" else ""


def _choose(entries: list[dict[str, Any]], arch: Optional[str]) -> Optional[dict[str, Any]]:
    """The index's manifest for ``arch`` (the first linux one where no arch is known)."""
    want = _GOARCH.get(arch or "", arch)
    for entry in entries:
        platform = entry.get("platform") or {}
        if platform.get("os") == "linux" and (want is None or platform.get("architecture") == want):
            return entry
    return None
