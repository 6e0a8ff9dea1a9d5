"""A registry on 127.0.0.1 that answers the OCI distribution API's two reads (``GET /v2/REPO/manifests/REF`` and
``GET /v2/REPO/blobs/DIGEST``) from dicts: images whose config carries the labels a test gives, for the platforms it
gives, and optionally one layer blob. The real docker-registry of the container test world (Debian's package)
takes its place in phase 2; this one is as small as the API it answers."""

from __future__ import annotations

import contextlib
import hashlib
import http.server
import json
import threading
from collections.abc import Iterator
from typing import Any, Optional

INDEX = "application/vnd.oci.image.index.v1+json"
MANIFEST = "application/vnd.oci.image.manifest.v1+json"


# real docker-registry of the test world comes in phase 2; this one is as small as the API it answers.


class Registry:
    def __init__(self) -> None:
        self.blobs: dict[str, bytes] = {}
        self.manifests: dict[str, tuple[bytes, str]] = {}
        self.url = ""
        #: Whether manifests come with Docker-Content-Digest (the distribution spec makes it optional).
        self.digest_header = True

    def blob(self, data: Any) -> str:
        body = json.dumps(data).encode()
        digest = "sha256:" + hashlib.sha256(body).hexdigest()
        self.blobs[digest] = body
        return digest

    def image(
        self,
        repo: str,
        tag: str,
        labels: dict[str, str],
        archs: tuple[str, ...] = ("amd64",),
        layer: Optional[bytes] = None,
    ) -> str:
        """An image whose config carries ``labels``, for ``archs`` (an index where there are several), with
        ``layer`` as its one layer; the digest its tag names."""
        entries = []
        layers = []
        if layer is not None:
            layer_digest = "sha256:" + hashlib.sha256(layer).hexdigest()
            self.blobs[layer_digest] = layer
            layers.append({"digest": layer_digest, "size": len(layer)})
        for arch in archs:
            config = self.blob({"architecture": arch, "os": "linux", "config": {"Labels": labels}})
            manifest = {
                "schemaVersion": 2,
                "mediaType": MANIFEST,
                "config": {"digest": config},
                "layers": layers,
            }
            body = json.dumps(manifest).encode()
            digest = "sha256:" + hashlib.sha256(body).hexdigest()
            self.manifests[f"{repo}@{digest}"] = (body, MANIFEST)
            entries.append({"digest": digest, "platform": {"os": "linux", "architecture": arch}})
        if len(archs) == 1:
            body, kind = self.manifests[f"{repo}@{entries[0]['digest']}"]
        else:
            body, kind = (
                json.dumps({"schemaVersion": 2, "mediaType": INDEX, "manifests": entries}).encode(),
                INDEX,
            )
        self.manifests[f"{repo}:{tag}"] = (body, kind)
        return "sha256:" + hashlib.sha256(body).hexdigest()


@contextlib.contextmanager
def serve() -> Iterator[Registry]:
    """A registry serving on 127.0.0.1 (a port of its own) for the ``with`` block."""
    reg = Registry()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            head, _, ref = path.removeprefix("/v2/").rpartition("/")
            repo, _, what = head.rpartition("/")
            if what == "manifests":
                key = f"{repo}@{ref}" if ref.startswith("sha256:") else f"{repo}:{ref}"
                found = reg.manifests.get(key)
                body, kind = found if found else (b"", "")
            else:
                body, kind = reg.blobs.get(ref, b""), "application/octet-stream"
            if not body:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Type", kind)
            if reg.digest_header:
                self.send_header("Docker-Content-Digest", "sha256:" + hashlib.sha256(body).hexdigest())
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    reg.url = f"127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield reg
    server.shutdown()
    server.server_close()
