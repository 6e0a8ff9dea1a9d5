"""Site recipe registries: published recipes, one immutable file per version, an index of their sha256, a
publish log, and OpenSSH signatures. Here a registry is read and verified; ``publish`` writes one, and ``trust``
holds the settings its signatures are checked against.

Layout of a registry directory (shared, read-only to users)::

    registry.toml                 the registry's own policy: require_signatures, allowed_signers (a file in it)
    index.json                    name -> version -> file, sha256, signer (a claim, never shown), when, who,
                                  validations; and the signed list of every version (versionlist)
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
exactly those bytes, (4) the name and version inside the file are the index's, and (5) where the index carries
a signed version list (always, where signatures are required) the version is in it with the same sha256, the
index hides none of its recipe's versions when the newest is asked for, and neither the list nor that version
is older than the user has seen (versionlist). The bytes checked are the
bytes used: readers get them from here, never by opening the file again.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any, Optional

from envbuilder import lockfile
from envbuilder.core._toml import TOMLDecodeError, loads
from envbuilder.core.errors import LockError, PublishError
from envbuilder.core.structs import dataclass
from envbuilder.recipe import versionlist
from envbuilder.recipe.trust import (
    MAX_FILE,
    NAMESPACE,
    REPUBLISH,
    OwnSettings,
    Policy,
    Trust,
    read_guarded,
    refuse_writable,
    resolve_trust,
    stat_of,
    verify_signature,
)
from envbuilder.recipe.versionlist import version_key
from envbuilder.system import strictmodes

INDEX = "index.json"
LOG = "publish.log"
CONFIG = "registry.toml"
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,99}")
#: Bound on the index a reader takes from a registry (each other file's is ``trust.MAX_FILE``).
MAX_INDEX = 64 * 1024 * 1024


def check_name(what: str, value: str) -> str:
    """A recipe name or version safe to use as one path component (no separators, no traversal)."""
    if not NAME_RE.fullmatch(value) or ".." in value:
        raise PublishError(
            f"invalid {what} {value!r}",
            hint="use letters, digits and . _ + - (starting with a letter or digit; no '/', no '..')",
        )
    return value


@dataclass(frozen=True)
class Published:
    name: str
    version: str
    file: str  # relative to the registry root
    sha256: str
    #: Who the index says signed it: kept in the index for its readers, never shown (``Registry.describe``
    #: shows the signer the signature check found).
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


class Registry:
    def __init__(self, root: Path, policy: Optional[Policy] = None) -> None:
        self.root = root
        # None: nothing demanded from outside, and nothing pinned (the admins' view when publishing).
        self.site_policy = policy if policy is not None else Policy()
        self._trust: Optional[Trust] = None
        self._owners: Optional[frozenset[int]] = None
        #: Who signed each version's file, as its signature check found: (name, version) -> principal.
        self._signers: dict[tuple[str, str], str] = {}
        #: Version lists whose signature checked, by their text (one check per list, not per file read).
        self._lists: dict[str, versionlist.VersionList] = {}

    @staticmethod
    def looks_like(path: Path) -> bool:
        return (path / INDEX).is_file() or (path / CONFIG).is_file()

    # -- who may write it -----------------------------------------------------------------------------------

    def owners(self) -> frozenset[int]:
        """Who may own a part of the registry: root and the owner of its directory (whoever publishes)."""
        if self._owners is None:
            self._owners = frozenset({0, stat_of(self.root, "the registry").st_uid})
        return self._owners

    def _guard(
        self, path: Path, st: Optional[os.stat_result] = None, owners: Optional[frozenset[int]] = None
    ) -> None:
        """Refuse ``path`` if anyone but its owner can write it, or (inside the registry) its owner is not the
        registry's: whoever could change it could change what users build."""
        st = st if st is not None else stat_of(path, "the registry")
        refuse_writable(path, st)
        owners = self.owners() if owners is None else owners
        if owners and st.st_uid not in owners:
            raise PublishError(
                f"{path} belongs to uid {st.st_uid}, not to the registry's owner (uid {max(owners)}) or root: "
                "another user could change it, so the registry is not used",
                hint=f"the registry's admins: chown {max(owners)} {path}",
            )

    def guard_parts(self, *rels: str) -> None:
        """The registry directory and the named parts of it that exist, once its parents are safe (someone who
        could rename the registry could put another in its place)."""
        strictmodes.check(
            self.root.parent,
            what=f"the registry {self.root}: its directory",
            elsewhere="ask the registry's admins to keep it where only they can write",
            owners=self.owners(),
        )
        self._guard(self.root, owners=frozenset())
        for rel in rels:
            path = self.root / rel
            with contextlib.suppress(FileNotFoundError):
                self._guard(path, path.stat())

    def _read(self, rel: str, what: str, limit: int = MAX_FILE) -> bytes:
        return read_guarded(self.root / rel, what, limit, self._guard)

    # -- policy ---------------------------------------------------------------------------------------------

    def config(self) -> dict[str, Any]:
        """The registry's own policy file (registry.toml), checked; empty where there is none."""
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

    def own_settings(self) -> OwnSettings:
        """What the registry says of itself: whether it requires signatures, its allowed-signers bytes, and
        where they are."""
        doc = self.config()
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
        """The settings signatures are checked against (see ``trust``'s docstring)."""
        if self._trust is None:
            self._trust = resolve_trust(self.root, self.site_policy, self.own_settings)
        return self._trust

    def forget_trust(self) -> None:
        """Resolve the trust settings again on next use: the registry's own policy was just changed."""
        self._trust = None

    def require_signatures(self) -> bool:
        return self.trust().require_signatures

    # -- reading --------------------------------------------------------------------------------------------

    def document(self) -> dict[str, Any]:
        """``index.json`` as it stands (empty where there is none), read once: its entries and its signed version
        list always come from one read."""
        path = self.root / INDEX
        if not path.is_file():
            return {}
        try:
            # Not guarded here (listing names harms nobody); every use of an entry goes through _verified.
            doc = json.loads(read_guarded(path, "the registry's index", MAX_INDEX, None).decode("utf-8"))
        except ValueError as exc:
            raise PublishError(f"{path} is not a valid registry index: {exc}") from None
        if not isinstance(doc, dict):
            raise PublishError(f"{path} is not a valid registry index: not a JSON object")
        return doc

    def index(self, doc: Optional[Mapping[str, Any]] = None) -> dict[str, dict[str, Published]]:
        """The index's entries (of ``doc``, else of ``document()``)."""
        doc = self.document() if doc is None else doc
        if not doc:
            return {}
        try:
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
            raise PublishError(f"{self.root / INDEX} is not a valid registry index: {exc}") from None
        return out

    def versions(self, name: str) -> list[Published]:
        return sorted(self.index().get(name, {}).values(), key=lambda p: version_key(p.version))

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

    def text(self, pub: Published) -> str:
        """A published file's text as it stands: guarded like every read, not checked against the index (what
        publishing compares a new version with)."""
        return self._read(pub.file, f"{pub.name}@{pub.version}").decode("utf-8")

    def load(self, pub: Published, latest: bool = False) -> dict[str, Any]:
        """The published recipe, parsed from the bytes that were verified (see the module's docstring).
        ``latest``: ``pub`` was chosen as the newest version (no version asked for), so it must be no older than
        the newest the user has seen."""
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
        self._check_listed(pub, latest)
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
        self._check_listed(pub, latest=False)
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
        self.guard_parts(INDEX, CONFIG, "recipes", f"recipes/{pub.name}")
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
            signer = self._check_signature(what, data, self._read(sig, f"the signature of {what}"), trust)
            if suffix == ".toml":
                self._signers[(pub.name, pub.version)] = signer
        return path, data

    def _check_signature(
        self, what: str, data: bytes, sig: bytes, trust: Trust, namespace: str = NAMESPACE
    ) -> str:
        if trust.signers is None:
            raise PublishError(
                f"{what} is signed but there is no allowed-signers file to check it against",
                hint=f"set allowed_signers in {self.root / CONFIG} or in the site config",
            )
        return verify_signature(data, sig, trust.signers, what, trust.signers_from, namespace=namespace)

    def describe(self, pub: Published) -> dict[str, Any]:
        """``pub`` for users: its signer is the one its signature check found (None before one, or unsigned),
        never the index's claim."""
        return {**pub.to_json(), "signer": self._signers.get((pub.name, pub.version))}

    # -- the signed version list (see versionlist) ----------------------------------------------------------

    def _check_listed(self, pub: Published, latest: bool) -> None:
        """``pub`` and the index's other versions of its recipe are those of the registry's signed version list,
        that list is not older than one the user has seen, and (``latest``) neither is ``pub``'s version."""
        if self.site_policy.pins is None:
            return  # the admins' view (publishing): their next publish signs the list anew, with today's key
        doc = self.document()
        text, sig = versionlist.stored(doc)
        real = str(self.root.resolve())
        memory = versionlist.memory_file(self.site_policy.pins, real)
        seen = versionlist.recall(memory)
        where = str(self.root / INDEX)
        if text is None or sig is None:
            self._unlisted(where, text is None, seen, memory, real)
            return
        listed = self._signed_list(text, sig, where)
        # The version used as it was read, and (when it was chosen as the newest) every version of its recipe
        # as the index stands: a version hidden from the index is one the list still names.
        versionlist.compare(listed, pub.name, {pub.name: {pub.version: _entry(pub)}}, where, only=pub.version)
        if latest:
            versionlist.compare(listed, pub.name, listing(self.index(doc)), where)
        top = versionlist.remember(memory, real, listed, seen).get(pub.name)
        if latest and top is not None and version_key(pub.version) < version_key(top):
            raise PublishError(
                f"{pub.name}: the newest version {self.root} lists now is {pub.version}, but you have seen "
                f"{pub.name}@{top} there; a registry goes back only when someone undoes what was published, so "
                "it is not used",
                hint=f"ask its admins why {pub.name}@{top} is gone; to use the older one on purpose, ask for "
                f"{pub.name}@{pub.version}",
            )

    def _signed_list(self, text: str, sig: str, where: str) -> versionlist.VersionList:
        key = f"{sig}\n{text}"
        if key not in self._lists:
            what = f"the version list in {where}"
            self._check_signature(what, text.encode(), sig.encode(), self.trust(), versionlist.NAMESPACE)
            self._lists[key] = versionlist.parse(text, where)
        return self._lists[key]

    def _unlisted(
        self, where: str, missing: bool, seen: Optional[Mapping[str, Any]], memory: Path, real: str
    ) -> None:
        """An index without a signed version list: refused where one was seen, or where signatures are
        required (a registry published by an envbuilder before the lists: its admins republish it)."""
        why = "its index carries no version list" if missing else "its version list is not signed"
        if seen is not None:
            raise versionlist.refuse_gone(real, memory, why)
        if self.trust().require_signatures:
            raise PublishError(
                f"{where}: {why} (a registry published by an envbuilder before 2026-11, or one whose list was "
                "removed): where signatures are required, an unsigned list could hide versions, so it is not used",
                hint=versionlist.REPUBLISH,
            )


def _entry(pub: Published) -> dict[str, Optional[str]]:
    """What a version list says of one version."""
    return {"sha256": pub.sha256, "lock_sha256": pub.lock_sha256}


def listing(index: Mapping[str, Mapping[str, Published]]) -> dict[str, dict[str, dict[str, Optional[str]]]]:
    """The index's entries as a version list names them."""
    return {n: {v: _entry(p) for v, p in vs.items()} for n, vs in index.items()}


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
