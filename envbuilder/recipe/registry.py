"""Site recipe registries: published recipes, one immutable file per version, an index of their sha256, a
publish log, and OpenSSH signatures.

Layout of a registry directory (shared, read-only to users)::

    registry.toml                 the registry's own policy: require_signatures, allowed_signers (a file in it)
    index.json                    name -> version -> file, sha256, signer, when, who, validations
    publish.log                   one JSON line per publish: who, when, what changed
    recipes/NAME/VERSION.toml     the recipe, flattened (its extends chain merged): one file says everything,
                                  [recipe] name and version included, so the signature covers both
    recipes/NAME/VERSION.toml.sig ssh-keygen -Y sign signature (namespace envbuilder-recipe)
    recipes/NAME/VERSION.lock.toml   the version's lockfile, when one was published with it (and its .sig)
    locks/                        the publish mutex (fsutil.Mutex: works on Lustre and NFS)

A published file is used only once (1) no registry part on the way (the directory, index.json, registry.toml, the
allowed-signers file, recipes/NAME/, the file, its signature) can be written by anyone but its owner, (2) the
file sits at recipes/NAME/VERSION.* for the name and version the index lists, is a regular file and its bytes
match the index's sha256, (3) where signatures are required, or a signature is there, an allowed signer signed
exactly those bytes, and (4) the name and version inside the file are the index's. The bytes checked are the
bytes used: readers get them from here, never by opening the file again.

Trust settings (require_signatures, the allowed signers) are never taken from the registry alone, since whoever
can write it could change them: the config that names the registry (the site config) can set them, and what the
registry says of itself is pinned in the user's envbuilder home on first use. A registry that required
signatures then keeps requiring them with the same signers; a change is refused until the user removes the pin.
Signing and verifying are ssh-keygen's: no crypto code of ours.
"""

from __future__ import annotations

import contextlib
import errno
import getpass
import hashlib
import json
import os
import re
import shutil
import socket
import stat
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Optional

from packaging.version import InvalidVersion, Version

from envbuilder import fsutil, lockfile, proc, settings, transaction
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
#: Bounds on what a reader takes from a registry: no file there makes it read without end.
MAX_FILE = 16 * 1024 * 1024
MAX_INDEX = 64 * 1024 * 1024
#: Under the user's envbuilder home: what each registry said of its trust settings when first used.
REPUBLISH = "ask the registry's admins to check publish.log and republish it"


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
    """What the config naming a registry (the site config) demands of it, from outside the registry; and where
    the registry's own settings are pinned (None: they are read as they are, as its admins do when publishing)."""

    require_signatures: bool = False
    allowed_signers: Optional[Path] = None
    pins: Optional[Path] = None
    #: The config file these settings come from (checked like the registry: nobody else may write it).
    config: Optional[Path] = None


@dataclass(frozen=True)
class Trust:
    """The settings a registry's files are checked against, once resolved."""

    require_signatures: bool
    #: The allowed-signers file's bytes (None: there is none), and where they were read, for messages.
    signers: Optional[bytes]
    signers_from: str


def pin_dir(home: Path) -> Path:
    """Where registries' trust settings are pinned, in the envbuilder home ``settings.home`` names."""
    return settings.trust_dir(home)


class Registry:
    def __init__(self, root: Path, policy: Policy = Policy()) -> None:
        self.root = root
        self.site_policy = policy
        self._trust: Optional[Trust] = None
        self._owners: Optional[frozenset[int]] = None

    @staticmethod
    def looks_like(path: Path) -> bool:
        return (path / INDEX).is_file() or (path / CONFIG).is_file()

    # -- who may write it -----------------------------------------------------------------------------------

    def owners(self) -> frozenset[int]:
        """Who may own a part of the registry: root and the owner of its directory (whoever publishes)."""
        if self._owners is None:
            self._owners = frozenset({0, self._stat(self.root, "the registry").st_uid})
        return self._owners

    def _stat(self, path: Path, what: str) -> os.stat_result:
        try:
            return path.stat()
        except OSError as exc:
            raise PublishError(f"{what}: cannot read {path}: {exc.strerror}") from None

    def _guard(
        self, path: Path, st: Optional[os.stat_result] = None, owners: Optional[frozenset[int]] = None
    ) -> None:
        """Refuse ``path`` if anyone but its owner can write it, or (inside the registry) its owner is not the
        registry's: whoever could change it could change what users build."""
        st = st if st is not None else self._stat(path, "the registry")
        refuse_writable(path, st)
        owners = self.owners() if owners is None else owners
        if owners and st.st_uid not in owners:
            raise PublishError(
                f"{path} belongs to uid {st.st_uid}, not to the registry's owner (uid {max(owners)}) or root: "
                "another user could change it, so the registry is not used",
                hint=f"the registry's admins: chown {max(owners)} {path}",
            )

    def _guard_parts(self, *rels: str) -> None:
        """The registry directory and the named parts of it that exist."""
        self._guard(self.root, owners=frozenset())
        for rel in rels:
            path = self.root / rel
            with contextlib.suppress(FileNotFoundError):
                self._guard(path, path.stat())

    def _read(self, rel: str, what: str, limit: int = MAX_FILE) -> bytes:
        return read_guarded(self.root / rel, what, limit, self._guard)

    # -- policy ---------------------------------------------------------------------------------------------

    def _config(self) -> dict[str, Any]:
        path = self.root / CONFIG
        if not os.path.lexists(path):
            return {}
        try:
            doc = loads(self._read(CONFIG, "the registry's policy").decode("utf-8"))
        except (UnicodeDecodeError, TOMLDecodeError) as exc:
            raise PublishError(f"{path}: cannot read the registry's policy: {exc}") from None
        unknown = set(doc) - {"require_signatures", "allowed_signers", "description"}
        if unknown:
            raise PublishError(
                f"{path}: unknown key {sorted(unknown)[0]!r}",
                hint="expected require_signatures, allowed_signers",
            )
        return doc

    def _own_settings(self) -> tuple[bool, Optional[bytes], str]:
        """What the registry says of itself: whether it requires signatures, its allowed-signers bytes, and
        where they are."""
        doc = self._config()
        rel = doc.get("allowed_signers")
        signers = None
        where = f"{self.root / CONFIG} (no allowed_signers)"
        if rel:
            where = str(self.root / str(rel))
            path = (self.root / str(rel)).resolve()
            if not path.is_relative_to(self.root.resolve()):
                raise PublishError(f"{self.root / CONFIG}: allowed_signers must lie inside the registry")
            if os.path.lexists(self.root / str(rel)):
                signers = self._read(str(rel), "the registry's allowed-signers file")
        return bool(doc.get("require_signatures", False)), signers, where

    def trust(self) -> Trust:
        """The settings signatures are checked against (see the module's docstring)."""
        if self._trust is None:
            self._trust = self._resolve_trust()
        return self._trust

    def _resolve_trust(self) -> Trust:
        site = self.site_policy
        if site.config is not None:
            refuse_writable(site.config, self._stat(site.config, "the config naming the registry"))
        external: Optional[bytes] = None
        if site.allowed_signers is not None:
            # Outside the registry a link is fine (the site's own layout): what it leads to is checked.
            external = read_guarded(
                site.allowed_signers.resolve(),
                f"the allowed-signers file of {site.config or 'the site config'}",
                MAX_FILE,
                refuse_writable,
            )
        if site.require_signatures and external is not None:
            # Everything comes from outside: what the registry says of itself is not even read.
            return Trust(True, external, str(site.allowed_signers))
        require, own, where = self._own_settings()
        if site.pins is not None:
            # Signers that are not used (the config names its own) are not pinned: their changes harm nobody.
            self._pin(site.pins, require, own if external is None else None, site.require_signatures)
        if external is not None:
            return Trust(site.require_signatures or require, external, str(site.allowed_signers))
        return Trust(site.require_signatures or require, own, where)

    def _pin(self, pins: Path, require: bool, signers: Optional[bytes], site_requires: bool) -> None:
        """Compare what the registry says of itself with what it said on first use (pinning it then): where
        signatures were required (by the registry then, or by the site config), neither that nor the signers may
        change."""
        real = str(self.root.resolve())
        pin = pins / f"{hashlib.sha256(real.encode()).hexdigest()[:16]}.toml"
        digest = hashlib.sha256(signers).hexdigest() if signers is not None else ""
        try:
            old: Optional[dict[str, Any]] = loads(pin.read_text(encoding="utf-8")) if pin.exists() else None
        except (OSError, UnicodeDecodeError, TOMLDecodeError) as exc:
            raise PublishError(
                f"cannot read {pin}, where the trust settings of {self.root} are pinned: {exc}",
                hint=f"remove {pin}: your next use pins the registry's current settings",
            ) from None
        if old is not None:
            was_required = bool(old.get("require_signatures"))
            was_signers = str(old.get("allowed_signers_sha256", ""))
            if was_required == require and was_signers == digest:
                return
            changes = []
            if was_required and not require:
                changes.append("require_signatures true -> false")
            # Signers where there were none are a first use: nothing signed could be used before.
            if was_signers and was_signers != digest and (was_required or site_requires):
                changes.append(
                    "the allowed-signers file changed"
                    if signers is not None
                    else "its allowed-signers file is gone"
                )
            if changes:
                raise PublishError(
                    f"{self.root}: its trust settings changed since you first used it ({old.get('pinned', '?')}): "
                    f"{'; '.join(changes)}. Whoever can write the registry could have done this, so it is not used",
                    hint=f"if its admins rotated the signing keys, confirm the new allowed_signers with them, then "
                    f"remove {pin} (your next use pins the new settings); a site can instead keep the trust "
                    "settings in its site config ([[registries]] require_signatures, allowed_signers)",
                )
        # First use, a registry that starts requiring signatures, or one that did not require them (so it
        # protected nothing a change could lose): pin what it says now.
        doc = {
            "registry": real,
            "pinned": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "require_signatures": require,
            "allowed_signers_sha256": digest,
            "allowed_signers": signers.decode("utf-8", "replace") if signers is not None else "",
        }
        try:
            fsutil.write_atomic(pin, dumps(doc).encode(), 0o644)
        except OSError as exc:
            raise PublishError(
                f"cannot pin the trust settings of {self.root} in {pin}: {exc.strerror}",
                hint="check that your envbuilder home (ENVBUILDER_HOME) is writable",
            ) from None

    def require_signatures(self) -> bool:
        return self.trust().require_signatures

    # -- reading --------------------------------------------------------------------------------------------

    def index(self) -> dict[str, dict[str, Published]]:
        path = self.root / INDEX
        if not path.is_file():
            return {}
        try:
            # Not guarded here (listing names harms nobody); every use of an entry goes through _verified.
            doc = json.loads(read_guarded(path, "the registry's index", MAX_INDEX, None).decode("utf-8"))
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
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
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

    def load(self, pub: Published) -> dict[str, Any]:
        """The published recipe, parsed from the bytes that were verified (see the module's docstring)."""
        what = f"{pub.name}@{pub.version}"
        path, data = self._verified(pub, pub.file, pub.sha256, what, ".toml")
        try:
            doc = loads(data.decode("utf-8"))
        except (UnicodeDecodeError, TOMLDecodeError) as exc:
            raise PublishError(f"{what}: {path} is not valid TOML: {exc}", hint=REPUBLISH) from None
        recipe = doc.get("recipe")
        name = recipe.get("name") if isinstance(recipe, dict) else None
        version = recipe.get("version") if isinstance(recipe, dict) else None
        _bound(what, path, pub, kind="", name=name, version=version)
        if "extends" in doc:
            raise PublishError(
                f"{what}: {path} extends another file; a published recipe never does", hint=REPUBLISH
            )
        return doc

    def verify_lock(self, pub: Published) -> Optional[lockfile.Lock]:
        """The version's published lock, verified like the recipe, or None when it was published without one."""
        if not pub.lock_file or not pub.lock_sha256:
            return None
        what = f"the lock of {pub.name}@{pub.version}"
        path, data = self._verified(pub, pub.lock_file, pub.lock_sha256, what, lockfile.SUFFIX)
        try:
            lock = lockfile.parse(data.decode("utf-8"), str(path))
        except UnicodeDecodeError as exc:
            raise PublishError(f"{what}: {path} is not UTF-8: {exc}", hint=REPUBLISH) from None
        except LockError as exc:
            raise PublishError(f"{what}: its published lock is unreadable: {exc.message}") from None
        _bound(what, path, pub, kind="the lock of ", name=lock.recipe, version=lock.recipe_version)
        return replace(lock, origin="published")

    def _verified(self, pub: Published, rel: str, sha256: str, what: str, suffix: str) -> tuple[Path, bytes]:
        """The bytes of ``rel``, once the registry's parts may be trusted, the index points at the one place the
        name and version allow, the bytes match its sha256 and, where required or present, the signature."""
        check_name("recipe name", pub.name)
        check_name("version", pub.version)
        expected = f"recipes/{pub.name}/{pub.version}{suffix}"
        if rel != expected:
            raise PublishError(
                f"{what}: the index points at {rel}, but {pub.name}@{pub.version} can only be {expected}; "
                "it is not used",
                hint=REPUBLISH,
            )
        self._guard_parts(INDEX, CONFIG, "recipes", f"recipes/{pub.name}")
        trust = self.trust()
        path = self.root / rel
        data = self._read(rel, what)
        if hashlib.sha256(data).hexdigest() != sha256:
            raise PublishError(
                f"{what}: {path} does not match the sha256 in {self.root / INDEX}; "
                "it was changed after publishing, so it is not used",
                hint="ask the registry's admins to republish it",
            )
        sig = f"{rel}.sig"
        if trust.require_signatures or os.path.lexists(self.root / sig):
            if not os.path.lexists(self.root / sig):
                raise PublishError(
                    f"{what} is not signed, and {self.root} requires signatures; it is not used"
                )
            self._check_signature(what, data, self._read(sig, f"the signature of {what}"), trust)
        return path, data

    def _check_signature(self, what: str, data: bytes, sig: bytes, trust: Trust) -> str:
        if trust.signers is None:
            raise PublishError(
                f"{what} is signed but there is no allowed-signers file to check it against",
                hint=f"set allowed_signers in {self.root / CONFIG} or in the site config",
            )
        return verify_signature(data, sig, trust.signers, what, trust.signers_from)

    # -- publishing -----------------------------------------------------------------------------------------

    def publish(
        self,
        name: str,
        doc: dict[str, Any],
        sign_key: Optional[Path] = None,
        wait: float = 60.0,
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
        with fsutil.Mutex(self.root / "locks" / "publish.lock", timeout=wait):
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
        self, name: str, version: str, report: Mapping[str, Any], wait: float = 60.0
    ) -> Published:
        """Record a passing validation report against a published version (the file itself stays unchanged)."""
        if not os.access(self.root / INDEX, os.W_OK) or not os.access(self.root, os.W_OK):
            raise PublishError(
                f"cannot write to the registry {self.root}: attaching a report is for its admins",
                hint="ask them to run `envbuilder validate ENV --publish-report` on their copy of the env",
            )
        with fsutil.Mutex(self.root / "locks" / "publish.lock", timeout=wait):
            index = self.index()
            pub = index.get(name, {}).get(version)
            if pub is None:
                raise PublishError(f"{name}@{version} is not published in {self.root}")
            updated = replace(pub, validations=(*pub.validations, dict(report)))
            index[name][version] = updated
            self._save_index(index)
            self._log({"action": "validation", "name": name, "version": version, "report": dict(report)})
        return updated

    def _text(self, pub: Published) -> str:
        return self._read(pub.file, f"{pub.name}@{pub.version}").decode("utf-8")

    def configure(self, allowed_signers: Optional[Path], require_signatures: bool) -> bool:
        """Set the registry's own policy: copy the allowed-signers file in, and require signatures from now on.
        Requiring cannot be undone here (a registry that required signatures keeps requiring them). True when
        the signers of a registry that required signatures changed: users who pinned the old ones refuse it
        until they accept the new ones."""
        self._init()
        doc = self._config()
        self._trust = None
        before = self._own_settings()
        if allowed_signers is not None:
            try:
                text = allowed_signers.read_text(encoding="utf-8")
            except OSError as exc:
                raise PublishError(
                    f"cannot read the allowed-signers file {allowed_signers}: {exc.strerror}"
                ) from None
            fsutil.write_atomic(self.root / "allowed_signers", text.encode(), 0o644)
            doc["allowed_signers"] = "allowed_signers"
        if require_signatures:
            doc["require_signatures"] = True
        fsutil.write_atomic(self.root / CONFIG, dumps(doc).encode(), 0o644)
        return before[0] and before[1] != self._own_settings()[1]

    def _init(self) -> None:
        try:
            self.root.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
            for sub in ("recipes", "locks"):
                (self.root / sub).mkdir(mode=DIR_MODE, exist_ok=True)
        except OSError as exc:
            raise PublishError(f"cannot create the registry at {self.root}: {exc.strerror}") from None
        # Refuse to publish into a registry its users would refuse to read.
        self._guard_parts(INDEX, CONFIG, "recipes", "locks")

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
        """Write ``final`` read-only, and its signature before it, each built beside and swapped in (the publish
        mutex held). ssh-keygen writes the signature beside the file it signs: ``.NAME.partial-PID.sig``, which
        the signature's transaction swaps in as ``NAME.sig``."""
        transaction.recover(final)  # what a publish killed here left (both partials match)
        signer = None
        with transaction.Transaction(final) as tx:
            tx.partial.write_bytes(data)
            tx.partial.chmod(FILE_MODE)
            if sign_key is not None:
                with transaction.Transaction(Path(f"{final}.sig"), Path(f"{tx.partial}.sig")) as sig:
                    signer = self._sign(tx.partial, sign_key, what)
                    sig.partial.chmod(FILE_MODE)
                    sig.swap()
            tx.swap()
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
        trust = self.trust()
        if trust.signers is None:
            raise PublishError(
                f"{self.root} has no allowed-signers file, so users could not check the signature",
                hint="publish once with --allowed-signers FILE (lines: PRINCIPAL KEYTYPE KEY)",
            )
        # Refuse to publish what users would refuse to use: the key must be one the site allows.
        return verify_signature(
            path.read_bytes(), Path(f"{path}.sig").read_bytes(), trust.signers, what, trust.signers_from
        )

    def _save_index(self, index: Mapping[str, Mapping[str, Published]]) -> None:
        doc = {
            "version": INDEX_VERSION,
            "recipes": {
                n: {v: p.to_json() for v, p in sorted(vs.items())} for n, vs in sorted(index.items())
            },
        }
        fsutil.write_atomic(self.root / INDEX, (json.dumps(doc, indent=1) + "\n").encode(), 0o644)

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


def verify_signature(data: bytes, sig: bytes, signers: bytes, what: str, signers_from: str) -> str:
    """The principal whose key made ``sig`` over ``data``; PublishError if none of the allowed signers did.
    ssh-keygen reads private copies of the signature and the signers, and the data on stdin: what it checks is
    what the caller holds, whatever happens to the registry's files meanwhile."""
    ssh_keygen = shutil.which("ssh-keygen")
    if ssh_keygen is None:
        raise PublishError(
            "ssh-keygen is not installed, so signatures cannot be checked", hint="install openssh-client"
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise PublishError(f"{what}: not UTF-8, so not a file envbuilder published; it is not used") from None
    with tempfile.TemporaryDirectory(prefix="envbuilder-sig-") as tmp:
        sig_file, signers_file = Path(tmp) / "file.sig", Path(tmp) / "allowed_signers"
        sig_file.write_bytes(sig)
        signers_file.write_bytes(signers)
        found = proc.run(
            [ssh_keygen, "-Y", "find-principals", "-s", str(sig_file), "-f", str(signers_file)], check=False
        )
        principals = [p for p in found.stdout.split() if p]
        if found.returncode != 0 or not principals:
            raise PublishError(
                f"{what}: the signature is not from any key in {signers_from} (unknown signer); it is not used"
            )
        argv = [ssh_keygen, "-Y", "verify", "-f", str(signers_file), "-I", principals[0], "-n", NAMESPACE]
        res = proc.run([*argv, "-s", str(sig_file)], check=False, input_text=text)
    if res.returncode != 0:
        raise PublishError(f"{what}: bad signature ({(res.stderr or res.stdout).strip()}); it is not used")
    return principals[0]


def refuse_writable(path: Path, st: os.stat_result) -> None:
    """PublishError when anyone but ``path``'s owner can write it (its group, or everyone)."""
    mode = stat.S_IMODE(st.st_mode)
    if mode & 0o022:
        who = "anyone" if mode & 0o002 else "its group"
        raise PublishError(
            f"{path} is writable by {who} (mode {mode:o}): whoever can write it could change the recipes users "
            "build, so it is not used",
            hint=f"its owner: chmod go-w {path}",
        )


def read_guarded(
    path: Path, what: str, limit: int, guard: Optional[Callable[[Path, os.stat_result], None]]
) -> bytes:
    """The bytes of ``path``, a regular file (never a link, FIFO or device: opened without following a link or
    blocking), ``guard``-ed on the descriptor read (no swap between the check and the read), at most ``limit``
    bytes."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise PublishError(
                f"{what}: {path} is a symbolic link; nothing envbuilder publishes is, so it is not used",
                hint=REPUBLISH,
            ) from None
        raise PublishError(f"{what}: cannot read {path}: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise PublishError(f"{what}: {path} is not a regular file, so it is not used", hint=REPUBLISH)
        if guard is not None:
            guard(path, st)
        if st.st_size > limit:
            raise PublishError(f"{what}: {path} is larger than {limit // (1024 * 1024)} MiB; it is not used")
        chunks, size = [], 0
        while size <= limit:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > limit:
            raise PublishError(f"{what}: {path} is larger than {limit // (1024 * 1024)} MiB; it is not used")
        return b"".join(chunks)
    except OSError as exc:
        raise PublishError(f"{what}: cannot read {path}: {exc.strerror}") from None
    finally:
        os.close(fd)


def _bound(what: str, path: Path, pub: Published, *, kind: str, name: Any, version: Any) -> None:
    """The name and version inside the (signed) bytes must be the index's: a copy of another version's or
    another recipe's file, with its valid signature, is not this one."""
    if name != pub.name or version != pub.version:
        found = (
            f"{name}@{version}"
            if isinstance(name, str) and isinstance(version, str)
            else "no name and version"
        )
        raise PublishError(
            f"{what}: {path} holds {kind}{found}, not {kind}{pub.name}@{pub.version} (another version's or another "
            "recipe's file, put in its place); it is not used",
            hint=REPUBLISH,
        )


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
