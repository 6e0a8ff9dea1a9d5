"""Site recipe registries: published recipes, one immutable file per version, an index of their sha256, a
publish log, and OpenSSH signatures.

Layout of a registry directory (shared, read-only to users)::

    registry.toml                 policy: require_signatures, allowed_signers (a file in the registry)
    index.json                    name -> version -> file, sha256, signer, when, who, validations
    publish.log                   one JSON line per publish: who, when, what changed
    recipes/NAME/VERSION.toml     the recipe, flattened (its extends chain merged): one file says everything
    recipes/NAME/VERSION.toml.sig ssh-keygen -Y sign signature (namespace envbuilder-recipe)
    recipes/NAME/VERSION.lock.toml   the version's lockfile, when one was published with it (and its .sig)
    locks/                        the publish lock (mkdir-based: works on Lustre and NFS)

A published file is used only after its sha256 matches the index and, where the registry or the site requires
it, its signature verifies against the allowed-signers file. Signing and verifying are ssh-keygen's: no crypto
code of ours.
"""

from __future__ import annotations

import contextlib
import getpass
import hashlib
import json
import os
import re
import shutil
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Optional

from packaging.version import InvalidVersion, Version

from envbuilder import lockfile, proc, state
from envbuilder._toml import TOMLDecodeError, dumps, loads
from envbuilder.errors import CommandFailed, LockError, PublishError

INDEX = "index.json"
LOG = "publish.log"
CONFIG = "registry.toml"
NAMESPACE = "envbuilder-recipe"
INDEX_VERSION = 1
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,99}")
FILE_MODE = 0o444  # published files never change; the registry's owner can still remove a directory
DIR_MODE = 0o755


def check_name(what: str, value: str) -> str:
    """A recipe name or version safe to use as one path component (no separators, no traversal)."""
    if not NAME_RE.fullmatch(value) or ".." in value:
        raise PublishError(
            f"invalid {what} {value!r}",
            hint="use letters, digits and . _ + - (starting with a letter or digit; no '/', no '..')",
        )
    return value


def _version_key(v: str) -> tuple[int, Any]:
    try:
        return (1, Version(v))
    except InvalidVersion:
        return (0, v)


@dataclass(frozen=True)
class Published:
    name: str
    version: str
    file: str  # relative to the registry root
    sha256: str
    signer: Optional[str]
    published: str
    by: str
    validations: tuple[Mapping[str, Any], ...] = ()
    #: The version's lockfile (relative to the registry root) and its sha256, when one was published.
    lock_file: Optional[str] = None
    lock_sha256: Optional[str] = None

    def to_json(self) -> dict[str, Any]:
        out = {
            "file": self.file,
            "sha256": self.sha256,
            "signer": self.signer,
            "published": self.published,
            "by": self.by,
            "validations": list(self.validations),
        }
        if self.lock_file:
            out.update(lock_file=self.lock_file, lock_sha256=self.lock_sha256)
        return out


@dataclass(frozen=True)
class Policy:
    """What a site demands of a registry (its config file), on top of what the registry says of itself."""

    require_signatures: bool = False
    allowed_signers: Optional[Path] = None


class Registry:
    def __init__(self, root: Path, policy: Policy = Policy()) -> None:
        self.root = root
        self.site_policy = policy

    @staticmethod
    def looks_like(path: Path) -> bool:
        return (path / INDEX).is_file() or (path / CONFIG).is_file()

    # -- policy ---------------------------------------------------------------------------------------------

    def _config(self) -> dict[str, Any]:
        path = self.root / CONFIG
        if not path.is_file():
            return {}
        try:
            doc = loads(path.read_text(encoding="utf-8"))
        except (OSError, TOMLDecodeError) as exc:
            raise PublishError(f"{path}: cannot read the registry's policy: {exc}") from None
        unknown = set(doc) - {"require_signatures", "allowed_signers", "description"}
        if unknown:
            raise PublishError(
                f"{path}: unknown key {sorted(unknown)[0]!r}",
                hint="expected require_signatures, allowed_signers",
            )
        return doc

    def require_signatures(self) -> bool:
        return self.site_policy.require_signatures or bool(self._config().get("require_signatures", False))

    def allowed_signers(self) -> Optional[Path]:
        if self.site_policy.allowed_signers is not None:
            return self.site_policy.allowed_signers
        rel = self._config().get("allowed_signers")
        if not rel:
            return None
        path = (self.root / str(rel)).resolve()
        if not path.is_relative_to(self.root.resolve()):
            raise PublishError(f"{self.root / CONFIG}: allowed_signers must lie inside the registry")
        return path

    # -- reading --------------------------------------------------------------------------------------------

    def index(self) -> dict[str, dict[str, Published]]:
        path = self.root / INDEX
        if not path.is_file():
            return {}
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
            out: dict[str, dict[str, Published]] = {}
            for name, versions in doc["recipes"].items():
                out[name] = {
                    v: Published(
                        name,
                        v,
                        str(e["file"]),
                        str(e["sha256"]),
                        e.get("signer"),
                        str(e.get("published", "")),
                        str(e.get("by", "")),
                        tuple(e.get("validations", ())),
                        e.get("lock_file"),
                        e.get("lock_sha256"),
                    )
                    for v, e in versions.items()
                }
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise PublishError(f"{path} is not a valid registry index: {exc}") from None
        return out

    def versions(self, name: str) -> list[Published]:
        return sorted(self.index().get(name, {}).values(), key=lambda p: _version_key(p.version))

    def get(self, name: str, version: Optional[str] = None) -> Published:
        versions = self.versions(name)
        if not versions:
            raise PublishError(f"no recipe {name!r} in the registry {self.root}")
        if version is None:
            return versions[-1]
        for p in versions:
            if p.version == version:
                return p
        have = ", ".join(p.version for p in versions)
        raise PublishError(f"{name} has no version {version!r} in {self.root}", hint=f"published: {have}")

    def verify(self, pub: Published) -> Path:
        """The published file, once its bytes match the index and (where required) its signature verifies."""
        return self._verified(pub, pub.file, pub.sha256, f"{pub.name}@{pub.version}")

    def verify_lock(self, pub: Published) -> Optional[lockfile.Lock]:
        """The version's published lock, verified like the recipe, or None when it was published without one."""
        if not pub.lock_file or not pub.lock_sha256:
            return None
        path = self._verified(pub, pub.lock_file, pub.lock_sha256, f"the lock of {pub.name}@{pub.version}")
        try:
            return lockfile.read(path, "published")
        except LockError as exc:
            raise PublishError(
                f"{pub.name}@{pub.version}: its published lock is unreadable: {exc.message}"
            ) from None

    def _verified(self, pub: Published, rel: str, sha256: str, what: str) -> Path:
        check_name("recipe name", pub.name)
        check_name("version", pub.version)
        path = self.root / rel
        if path.resolve().parent != (self.root / "recipes" / pub.name).resolve():
            raise PublishError(f"{what}: the index points outside recipes/{pub.name}/")
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise PublishError(f"{what}: cannot read {path}: {exc.strerror}") from None
        if hashlib.sha256(data).hexdigest() != sha256:
            raise PublishError(
                f"{what}: {path} does not match the sha256 in {self.root / INDEX}; "
                "it was changed after publishing, so it is not used",
                hint="ask the registry's admins to republish it",
            )
        sig = path.with_name(path.name + ".sig")
        if self.require_signatures() or sig.exists():
            self._check_signature(what, path, sig)
        return path

    def _check_signature(self, what: str, path: Path, sig: Path) -> str:
        if not sig.is_file():
            raise PublishError(f"{what} is not signed, and {self.root} requires signatures; it is not used")
        signers = self.allowed_signers()
        if signers is None or not signers.is_file():
            raise PublishError(
                f"{what} is signed but there is no allowed-signers file to check it against",
                hint=f"set allowed_signers in {self.root / CONFIG} or in the site config",
            )
        return verify_signature(path, sig, signers, what)

    # -- publishing -----------------------------------------------------------------------------------------

    def publish(
        self,
        name: str,
        doc: dict[str, Any],
        sign_key: Optional[Path] = None,
        lock_timeout: float = 60.0,
        lock: Optional[lockfile.Lock] = None,
    ) -> tuple[Published, str, list[str]]:
        """Write ``doc`` (a flattened recipe), with ``lock`` when given, as a new version; (published, status,
        changed keys). status is "published", "unchanged" (the same recipe, and the same lock or none given, is
        already the latest or the declared version) or "lock added" (a version published without a lock gets one;
        a version's lock, once there, never changes)."""
        check_name("recipe name", name)
        self._init()
        if self.require_signatures() and sign_key is None:
            raise PublishError(f"{self.root} requires signed recipes", hint="pass --sign-key KEY")
        with state.EnvLock(self.root / "locks" / "publish.lock", timeout=lock_timeout):
            index = self.index()
            versions = sorted(index.get(name, {}).values(), key=lambda p: _version_key(p.version))
            declared = (doc.get("recipe") or {}).get("version")
            previous = versions[-1] if versions else None
            same: Optional[Published] = None
            if declared is not None:
                version = check_name("version", str(declared))
                same = next((p for p in versions if p.version == version), None)
                if same is not None and self._text(same) != _render(doc, version):
                    raise PublishError(
                        f"{name}@{version} is already published with other content; a published version "
                        "never changes",
                        hint="give the recipe a new [recipe] version, or leave version out to number it "
                        "automatically",
                    )
            else:
                numbers = [int(p.version) for p in versions if p.version.isdigit()]
                version = str(max(numbers, default=0) + 1)
                if previous is not None and _body(self._text(previous)) == _body(
                    _render(doc, previous.version)
                ):
                    same = previous
            if same is not None:
                kept = self._same_lock(same, lock)
                if kept is not None:
                    return same, kept, []
                if same.lock_file is None and lock is not None:
                    return self._add_lock(index, same, lock, sign_key), "lock added", []
                if declared is not None:
                    raise PublishError(
                        f"{name}@{version} already ships another lock; a published version never changes",
                        hint="give the recipe a new [recipe] version to publish the new lock with it",
                    )
            text = _render(doc, version)
            changed = _changed(loads(self._text(previous)) if previous else {}, loads(text))
            if same is not None:
                changed = ["lock"]
            pub = self._write(name, version, text, sign_key)
            if lock is not None:
                pub = self._with_lock(pub, lock, sign_key)
            index.setdefault(name, {})[version] = pub
            self._save_index(index)
            self._log(
                {
                    "action": "publish",
                    "name": name,
                    "version": version,
                    "sha256": pub.sha256,
                    "signer": pub.signer,
                    "lock_sha256": pub.lock_sha256,
                    "previous": previous.version if previous else None,
                    "changed": changed,
                }
            )
        return pub, "published", changed

    def _same_lock(self, pub: Published, lock: Optional[lockfile.Lock]) -> Optional[str]:
        """ "unchanged" when publishing ``lock`` beside ``pub`` changes nothing, else None."""
        if lock is None:
            return "unchanged"
        if pub.lock_file is None:
            return None
        old = self.verify_lock(pub)
        return "unchanged" if old is not None and old.content() == lock.content() else None

    def _add_lock(
        self, index: dict[str, dict[str, Published]], pub: Published, lock: lockfile.Lock, key: Optional[Path]
    ) -> Published:
        updated = self._with_lock(pub, lock, key)
        index[pub.name][pub.version] = updated
        self._save_index(index)
        self._log(
            {"action": "lock", "name": pub.name, "version": pub.version, "lock_sha256": updated.lock_sha256}
        )
        return updated

    def _with_lock(self, pub: Published, lock: lockfile.Lock, key: Optional[Path]) -> Published:
        stamped = replace(lock, recipe_version=pub.version)
        rel = str(Path(pub.file).with_name(f"{pub.version}{lockfile.SUFFIX}"))
        data = stamped.dumps().encode()
        self._put_file(self.root / rel, data, key, f"the lock of {pub.name}@{pub.version}")
        return replace(pub, lock_file=rel, lock_sha256=hashlib.sha256(data).hexdigest())

    def attach_validation(
        self, name: str, version: str, report: Mapping[str, Any], lock_timeout: float = 60.0
    ) -> Published:
        """Record a passing validation report against a published version (the file itself stays unchanged)."""
        if not os.access(self.root / INDEX, os.W_OK) or not os.access(self.root, os.W_OK):
            raise PublishError(
                f"cannot write to the registry {self.root}: attaching a report is for its admins",
                hint="ask them to run `envbuilder validate ENV --publish-report` on their copy of the env",
            )
        with state.EnvLock(self.root / "locks" / "publish.lock", timeout=lock_timeout):
            index = self.index()
            pub = index.get(name, {}).get(version)
            if pub is None:
                raise PublishError(f"{name}@{version} is not published in {self.root}")
            updated = Published(**{**pub.__dict__, "validations": (*pub.validations, dict(report))})
            index[name][version] = updated
            self._save_index(index)
            self._log({"action": "validation", "name": name, "version": version, "report": dict(report)})
        return updated

    def _text(self, pub: Published) -> str:
        return (self.root / pub.file).read_text(encoding="utf-8")

    def configure(self, allowed_signers: Optional[Path], require_signatures: bool) -> None:
        """Set the registry's own policy: copy the allowed-signers file in, and require signatures from now on.
        Requiring cannot be undone here (a registry that required signatures keeps requiring them)."""
        self._init()
        doc = self._config()
        if allowed_signers is not None:
            try:
                text = allowed_signers.read_text(encoding="utf-8")
            except OSError as exc:
                raise PublishError(
                    f"cannot read the allowed-signers file {allowed_signers}: {exc.strerror}"
                ) from None
            dest = self.root / "allowed_signers"
            tmp = dest.with_name(f".allowed_signers.tmp-{os.getpid()}")
            tmp.write_text(text, encoding="utf-8")
            tmp.chmod(0o644)
            tmp.replace(dest)
            doc["allowed_signers"] = "allowed_signers"
        if require_signatures:
            doc["require_signatures"] = True
        state.write_atomic(self.root / CONFIG, dumps(doc).encode(), 0o644)

    def _init(self) -> None:
        try:
            self.root.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
            for sub in ("recipes", "locks"):
                (self.root / sub).mkdir(mode=DIR_MODE, exist_ok=True)
        except OSError as exc:
            raise PublishError(f"cannot create the registry at {self.root}: {exc.strerror}") from None
        if self.root.stat().st_mode & 0o002:
            raise PublishError(
                f"{self.root} is world-writable: anyone could replace its recipes",
                hint=f"chmod o-w {self.root}",
            )

    def _write(self, name: str, version: str, text: str, sign_key: Optional[Path]) -> Published:
        folder = self.root / "recipes" / name
        folder.mkdir(mode=DIR_MODE, exist_ok=True)
        final = folder / f"{version}.toml"
        data = text.encode()
        signer = self._put_file(final, data, sign_key, f"{name}@{version}")
        return Published(
            name,
            version,
            str(final.relative_to(self.root)),
            hashlib.sha256(data).hexdigest(),
            signer,
            time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            _who(),
        )

    def _put_file(self, final: Path, data: bytes, sign_key: Optional[Path], what: str) -> Optional[str]:
        """Write ``final`` read-only (and its signature first), each through a temp file and a rename."""
        tmp = final.with_name(f".{final.name}.tmp-{os.getpid()}")
        signer = None
        try:
            tmp.write_bytes(data)
            tmp.chmod(FILE_MODE)
            if sign_key is not None:
                signer = self._sign(tmp, sign_key, what)
                Path(str(tmp) + ".sig").chmod(FILE_MODE)
                Path(str(tmp) + ".sig").replace(str(final) + ".sig")
            tmp.replace(final)
        finally:
            for leftover in (tmp, Path(str(tmp) + ".sig")):
                with contextlib.suppress(FileNotFoundError):
                    leftover.unlink()
        return signer

    def _sign(self, path: Path, key: Path, what: str) -> str:
        if not key.is_file():
            raise PublishError(f"signing key {key} does not exist")
        try:
            proc.run(["ssh-keygen", "-q", "-Y", "sign", "-f", str(key), "-n", NAMESPACE, str(path)])
        except CommandFailed as exc:
            raise PublishError(
                f"ssh-keygen could not sign {what} with {key}: {exc.stderr_tail.strip()}"
            ) from None
        signers = self.allowed_signers()
        if signers is None:
            raise PublishError(
                f"{self.root} has no allowed-signers file, so users could not check the signature",
                hint="publish once with --allowed-signers FILE (lines: PRINCIPAL KEYTYPE KEY)",
            )
        # Refuse to publish what users would refuse to use: the key must be one the site allows.
        return verify_signature(path, Path(str(path) + ".sig"), signers, what)

    def _save_index(self, index: Mapping[str, Mapping[str, Published]]) -> None:
        doc = {
            "version": INDEX_VERSION,
            "recipes": {
                n: {v: p.to_json() for v, p in sorted(vs.items())} for n, vs in sorted(index.items())
            },
        }
        state.write_atomic(self.root / INDEX, (json.dumps(doc, indent=1) + "\n").encode(), 0o644)

    def _log(self, entry: dict[str, Any]) -> None:
        line = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "user": _who(),
            "host": socket.gethostname(),
            **entry,
        }
        fd = os.open(self.root / LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (json.dumps(line) + "\n").encode())
            os.fsync(fd)
        finally:
            os.close(fd)

    def log(self) -> list[dict[str, Any]]:
        path = self.root / LOG
        if not path.is_file():
            return []
        return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def verify_signature(path: Path, sig: Path, signers: Path, what: str) -> str:
    """The principal whose key made ``sig`` over ``path``; PublishError if none of the allowed signers did."""
    ssh_keygen = shutil.which("ssh-keygen")
    if ssh_keygen is None:
        raise PublishError(
            "ssh-keygen is not installed, so signatures cannot be checked", hint="install openssh-client"
        )
    found = proc.run([ssh_keygen, "-Y", "find-principals", "-s", str(sig), "-f", str(signers)], check=False)
    principals = [p for p in found.stdout.split() if p]
    if found.returncode != 0 or not principals:
        raise PublishError(
            f"{what}: the signature is not from any key in {signers} (unknown signer); it is not used"
        )
    text = path.read_text(encoding="utf-8")
    res = proc.run(
        [
            ssh_keygen,
            "-Y",
            "verify",
            "-f",
            str(signers),
            "-I",
            principals[0],
            "-n",
            NAMESPACE,
            "-s",
            str(sig),
        ],
        check=False,
        input_text=text,
    )
    if res.returncode != 0:
        raise PublishError(f"{what}: bad signature ({(res.stderr or res.stdout).strip()}); it is not used")
    return principals[0]


def _who() -> str:
    with contextlib.suppress(Exception):
        return getpass.getuser()
    return str(os.getuid())


def _render(doc: Mapping[str, Any], version: str) -> str:
    body = {k: v for k, v in doc.items() if k not in ("schema_version", "extends")}
    body["recipe"] = {**body.get("recipe", {}), "version": version}
    return (
        "# Published by envbuilder; do not edit (the registry's index holds this file's sha256).\n"
        + dumps({"schema_version": doc.get("schema_version", 1), **body})
    )


def _body(text: str) -> dict[str, Any]:
    doc = loads(text)
    doc.get("recipe", {}).pop("version", None)
    return doc


def leaves(node: Any, path: str = "") -> dict[str, Any]:
    if isinstance(node, Mapping) and node:
        out: dict[str, Any] = {}
        for key, value in node.items():
            out.update(leaves(value, f"{path}.{key}" if path else key))
        return out
    return {path: node}


def _changed(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    if not old:
        return []  # a first version: nothing to compare with
    a, b = leaves(old), leaves(new)
    return sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k) and k != "recipe.version")


def diff(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[tuple[str, Any, Any]]:
    """(key, old value, new value) for every leaf that differs (None where absent)."""
    a, b = leaves(old), leaves(new)
    return [(k, a.get(k), b.get(k)) for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]


def parse_ref(text: str) -> tuple[str, Optional[str]]:
    """``NAME`` or ``NAME@VERSION``."""
    name, sep, version = text.partition("@")
    if sep and not version:
        raise PublishError(f"{text!r}: nothing after '@'", hint="NAME@VERSION, e.g. vista-venv-cu124@3")
    return name, (version if sep else None)


def flatten_for_publish(data: Mapping[str, Any]) -> dict[str, Any]:
    """The merged recipe, built-in defaults included: a published file means the same under a later envbuilder
    whose defaults differ."""
    copy: dict[str, Any] = json.loads(json.dumps(data))
    return copy
