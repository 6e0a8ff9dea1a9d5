"""Writing a registry (its admins' side): publish a recipe version (with its lock), attach a validation report,
set the registry's own policy; and the recipe text a published file holds, with what changed between versions.

Every write holds the publish mutex (``locks/publish.lock``), builds a file beside its final name and swaps it
in, appends one line to ``publish.log`` and rewrites ``index.json`` atomically; a published file never changes.
"""

from __future__ import annotations

import contextlib
import getpass
import hashlib
import json
import os
import socket
import time
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any, Optional

from envbuilder import lockfile
from envbuilder.core._toml import dumps, loads
from envbuilder.core.errors import CommandFailed, PublishError
from envbuilder.recipe import versionlist
from envbuilder.recipe.registry import (
    CONFIG,
    INDEX,
    LOG,
    Published,
    Registry,
    check_name,
    listing,
)
from envbuilder.recipe.trust import NAMESPACE, verify_signature
from envbuilder.recipe.versionlist import version_key
from envbuilder.system import fsutil, proc, transaction

INDEX_VERSION = 1
FILE_MODE = 0o444  # published files never change; the registry's owner can still remove a directory
DIR_MODE = 0o755


def publish(
    reg: Registry,
    name: str,
    doc: dict[str, Any],
    sign_key: Optional[Path] = None,
    *,
    wait: float = 60.0,
    lock: Optional[lockfile.Lock] = None,
) -> tuple[Published, str, list[str]]:
    """Write ``doc`` (a flattened recipe), with ``lock`` when given, as a new version; (published, status,
    changed keys). status is "published", "unchanged" (the same recipe, and the same lock or none given, is
    already the latest or the declared version) or "lock added" (a version published without a lock gets one;
    a version's lock, once there, never changes)."""
    check_name("recipe name", name)
    _init(reg)
    if reg.require_signatures() and sign_key is None:
        raise PublishError(f"{reg.root} requires signed recipes", hint="pass --sign-key KEY")
    with fsutil.Mutex(reg.root / "locks" / "publish.lock", timeout=wait):
        _sweep(reg)
        index = _index_to_extend(reg, sign_key)
        versions = sorted(index.get(name, {}).values(), key=lambda p: version_key(p.version))
        declared = (doc.get("recipe") or {}).get("version")
        previous = versions[-1] if versions else None
        same: Optional[Published] = None
        if declared is not None:
            version = check_name("version", str(declared))
            same = next((p for p in versions if p.version == version), None)
            if same is not None and reg.text(same) != _render(doc, version):
                raise PublishError(
                    f"{name}@{version} is already published with other content; a published version "
                    "never changes",
                    hint="give the recipe a new [recipe] version, or leave version out to number it "
                    "automatically",
                )
        else:
            numbers = [int(p.version) for p in versions if p.version.isdigit()]
            version = str(max(numbers, default=0) + 1)
            if previous is not None and _body(reg.text(previous)) == _body(_render(doc, previous.version)):
                same = previous
        if same is not None:
            kept = _same_lock(reg, same, lock)
            if kept is not None:
                # Where the list is not signed yet (published before the lists), it is signed now.
                _save_index(reg, index, sign_key)
                return same, kept, []
            if same.lock_file is None and lock is not None:
                return _add_lock(reg, index, same, lock, sign_key), "lock added", []
            if declared is not None:
                raise PublishError(
                    f"{name}@{version} already ships another lock; a published version never changes",
                    hint="give the recipe a new [recipe] version to publish the new lock with it",
                )
        text = _render(doc, version)
        changed = _changed(loads(reg.text(previous)) if previous else {}, loads(text))
        if same is not None:
            changed = ["lock"]
        pub = _write(reg, name, version, text, sign_key)
        if lock is not None:
            pub = _with_lock(reg, pub, lock, sign_key)
        index.setdefault(name, {})[version] = pub
        _save_index(reg, index, sign_key)
        _log(
            reg,
            {
                "action": "publish",
                "name": name,
                "version": version,
                "sha256": pub.sha256,
                "signer": pub.signer,
                "lock_sha256": pub.lock_sha256,
                "previous": previous.version if previous else None,
                "changed": changed,
            },
        )
    return pub, "published", changed


def _index_to_extend(reg: Registry, sign_key: Optional[Path]) -> dict[str, dict[str, Published]]:
    """The index a publish adds to (the mutex held); refused without a key where its version list is signed."""
    doc = reg.document()
    if sign_key is None and versionlist.stored(doc)[1] is not None:
        raise PublishError(
            f"{reg.root} signs its list of versions, so every publish must sign it anew",
            hint="pass --sign-key KEY",
        )
    return reg.index(doc)


def _same_lock(reg: Registry, pub: Published, lock: Optional[lockfile.Lock]) -> Optional[str]:
    """ "unchanged" when publishing ``lock`` beside ``pub`` changes nothing, else None."""
    if lock is None:
        return "unchanged"
    if pub.lock_file is None:
        return None
    old = reg.verify_lock(pub)
    return "unchanged" if old is not None and old.content() == lock.content() else None


def _add_lock(
    reg: Registry,
    index: dict[str, dict[str, Published]],
    pub: Published,
    lock: lockfile.Lock,
    key: Optional[Path],
) -> Published:
    updated = _with_lock(reg, pub, lock, key)
    index[pub.name][pub.version] = updated
    _save_index(reg, index, key)
    _log(
        reg, {"action": "lock", "name": pub.name, "version": pub.version, "lock_sha256": updated.lock_sha256}
    )
    return updated


def _with_lock(reg: Registry, pub: Published, lock: lockfile.Lock, key: Optional[Path]) -> Published:
    stamped = replace(lock, recipe_version=pub.version)
    rel = str(Path(pub.file).with_name(f"{pub.version}{lockfile.SUFFIX}"))
    data = stamped.dumps().encode()
    _put_file(reg, reg.root / rel, data, key, f"the lock of {pub.name}@{pub.version}")
    return replace(pub, lock_file=rel, lock_sha256=hashlib.sha256(data).hexdigest())


def attach_validation(
    reg: Registry, name: str, version: str, report: Mapping[str, Any], wait: float = 60.0
) -> Published:
    """Record a passing validation report against a published version (the file itself stays unchanged)."""
    if not os.access(reg.root / INDEX, os.W_OK) or not os.access(reg.root, os.W_OK):
        raise PublishError(
            f"cannot write to the registry {reg.root}: attaching a report is for its admins",
            hint="ask them to run `envbuilder validate ENV --publish-report` on their copy of the env",
        )
    with fsutil.Mutex(reg.root / "locks" / "publish.lock", timeout=wait):
        _sweep(reg)
        index = reg.index()
        pub = index.get(name, {}).get(version)
        if pub is None:
            raise PublishError(f"{name}@{version} is not published in {reg.root}")
        updated = replace(pub, validations=(*pub.validations, dict(report)))
        index[name][version] = updated
        _save_index(reg, index, None)  # the versions and their files are unchanged: so is their signed list
        _log(reg, {"action": "validation", "name": name, "version": version, "report": dict(report)})
    return updated


def configure(reg: Registry, allowed_signers: Optional[Path], require_signatures: bool) -> bool:
    """Set the registry's own policy: copy the allowed-signers file in, and require signatures from now on.
    Requiring cannot be undone here (a registry that required signatures keeps requiring them). True when
    the signers of a registry that required signatures changed: users who pinned the old ones refuse it
    until they accept the new ones."""
    _init(reg)
    doc = reg.config()
    before = reg.own_settings()
    if allowed_signers is not None:
        try:
            text = allowed_signers.read_text(encoding="utf-8")
        except OSError as exc:
            raise PublishError(
                f"cannot read the allowed-signers file {allowed_signers}: {exc.strerror}"
            ) from None
        fsutil.write_atomic(reg.root / "allowed_signers", text.encode(), 0o644)
        doc["allowed_signers"] = "allowed_signers"
    if require_signatures:
        doc["require_signatures"] = True
    fsutil.write_atomic(reg.root / CONFIG, dumps(doc).encode(), 0o644)
    reg.forget_trust()
    return before[0] and before[1] != reg.own_settings()[1]


def _init(reg: Registry) -> None:
    try:
        reg.root.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
        for sub in ("recipes", "locks"):
            (reg.root / sub).mkdir(mode=DIR_MODE, exist_ok=True)
    except OSError as exc:
        if exc.errno in fsutil.DISK_ERRNOS:
            raise  # a disk error with the path and the way out (the command's fsutil.disk_errors)
        raise PublishError(f"cannot create the registry at {reg.root}: {exc.strerror}") from None
    # Refuse to publish into a registry its users would refuse to read.
    reg.guard_parts(INDEX, CONFIG, "recipes", "locks")


def _sweep(reg: Registry) -> None:
    """Remove what a publish killed mid-way left (the publish mutex held, so no writer is at work): partial
    recipe, lock and signature files of any recipe, and index.json's temporary copy. The index never named them,
    so the registry is as it was before that publish; a recipe directory that is a symbolic link is not entered."""
    recipes = reg.root / "recipes"
    folders = (
        [d for d in sorted(recipes.iterdir()) if d.is_dir() and not d.is_symlink()]
        if recipes.is_dir()
        else []
    )
    left = [p for d in folders for p in d.glob(f".*{transaction.PARTIAL}*")]
    for path in [*left, *reg.root.glob(f".{INDEX}.tmp-*")]:
        transaction.delete(path)


def _write(reg: Registry, name: str, version: str, text: str, sign_key: Optional[Path]) -> Published:
    folder = reg.root / "recipes" / name
    folder.mkdir(mode=DIR_MODE, exist_ok=True)
    final = folder / f"{version}.toml"
    data = text.encode()
    signer = _put_file(reg, final, data, sign_key, f"{name}@{version}")
    return Published(
        name,
        version,
        str(final.relative_to(reg.root)),
        hashlib.sha256(data).hexdigest(),
        signer,
        time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        _who(),
    )


def _put_file(reg: Registry, final: Path, data: bytes, sign_key: Optional[Path], what: str) -> Optional[str]:
    """Write ``final`` read-only, and its signature before it, each built beside and swapped in (the publish
    mutex held). ssh-keygen writes the signature beside the file it signs: ``.NAME.partial-PID.sig``, which
    the signature's transaction swaps in as ``NAME.sig``."""
    signer = None
    with transaction.Transaction(final) as tx:
        tx.partial.write_bytes(data)
        tx.partial.chmod(FILE_MODE)
        if sign_key is not None:
            with transaction.Transaction(Path(f"{final}.sig"), Path(f"{tx.partial}.sig")) as sig:
                signer = _sign(reg, tx.partial, sign_key, what)
                sig.partial.chmod(FILE_MODE)
                sig.swap()
        tx.swap()
    return signer


def _sign(reg: Registry, path: Path, key: Path, what: str) -> str:
    if not key.is_file():
        raise PublishError(f"signing key {key} does not exist")
    try:
        proc.run(["ssh-keygen", "-q", "-Y", "sign", "-f", str(key), "-n", NAMESPACE, str(path)])
    except CommandFailed as exc:
        raise PublishError(
            f"ssh-keygen could not sign {what} with {key}: {exc.stderr_tail.strip()}"
        ) from None
    trust = reg.trust()
    if trust.signers is None:
        raise PublishError(
            f"{reg.root} has no allowed-signers file, so users could not check the signature",
            hint="publish once with --allowed-signers FILE (lines: PRINCIPAL KEYTYPE KEY)",
        )
    # Refuse to publish what users would refuse to use: the key must be one the site allows.
    return verify_signature(
        path.read_bytes(), Path(f"{path}.sig").read_bytes(), trust.signers, what, trust.signers_from
    )


def _save_index(
    reg: Registry, index: Mapping[str, Mapping[str, Published]], sign_key: Optional[Path]
) -> None:
    """Write ``index.json`` with the list of its versions, signed with ``sign_key`` (see versionlist): a list
    whose versions did not change is kept as it is (serial and signature); a new one gets the next serial."""
    old = reg.document()
    text, sig = versionlist.stored(old)
    versions = listing(index)
    serial = 1
    if text is not None:
        prior = versionlist.parse(text, str(reg.root / INDEX))
        serial = prior.serial + 1
        if prior.recipes == versions and (sig is not None or sign_key is None):
            serial = 0  # unchanged
    part: dict[str, Any] = dict(old.get(versionlist.KEY) or {})
    if serial:
        text = versionlist.build(versions, serial)
        part = {"list": text}
        if sign_key is not None:
            part["signature"] = _sign_list(reg, text, sign_key)
    doc = {
        "version": INDEX_VERSION,
        "recipes": {n: {v: p.to_json() for v, p in sorted(vs.items())} for n, vs in sorted(index.items())},
        versionlist.KEY: part,
    }
    if doc != old:
        fsutil.write_atomic(reg.root / INDEX, (json.dumps(doc, indent=1) + "\n").encode(), 0o644)


def _sign_list(reg: Registry, text: str, key: Path) -> str:
    """ssh-keygen's signature over the list's text (read from stdin), checked against the registry's signers."""
    if not key.is_file():
        raise PublishError(f"signing key {key} does not exist")
    try:
        res = proc.run(["ssh-keygen", "-q", "-Y", "sign", "-f", str(key), "-n", versionlist.NAMESPACE],
                       input_text=text)  # fmt: skip
    except CommandFailed as exc:
        raise PublishError(
            f"ssh-keygen could not sign the version list with {key}: {exc.stderr_tail.strip()}"
        ) from None
    trust = reg.trust()
    if trust.signers is None:
        raise PublishError(
            f"{reg.root} has no allowed-signers file, so users could not check the signature",
            hint="publish once with --allowed-signers FILE (lines: PRINCIPAL KEYTYPE KEY)",
        )
    what = f"the version list of {reg.root}"
    verify_signature(
        text.encode(),
        res.stdout.encode(),
        trust.signers,
        what,
        trust.signers_from,
        namespace=versionlist.NAMESPACE,
    )
    return res.stdout


def _log(reg: Registry, entry: dict[str, Any]) -> None:
    line = {
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "user": _who(),
        "host": socket.gethostname(),
        **entry,
    }
    fd = os.open(reg.root / LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(line) + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def _who() -> str:
    with contextlib.suppress(Exception):
        return getpass.getuser()
    return str(os.getuid())


# -- recipe text ---------------------------------------------------------------------------------------------


def flatten_for_publish(data: Mapping[str, Any]) -> dict[str, Any]:
    """The merged recipe, built-in defaults included: a published file means the same under a later envbuilder
    whose defaults differ."""
    copy: dict[str, Any] = json.loads(json.dumps(data))
    return copy


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


def _leaves(node: Any, path: str = "") -> dict[str, Any]:
    if isinstance(node, Mapping) and node:
        out: dict[str, Any] = {}
        for key, value in node.items():
            out.update(_leaves(value, f"{path}.{key}" if path else key))
        return out
    return {path: node}


def _changed(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    if not old:
        return []  # a first version: nothing to compare with
    a, b = _leaves(old), _leaves(new)
    return sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k) and k != "recipe.version")


def diff(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[tuple[str, Any, Any]]:
    """(key, old value, new value) for every leaf that differs (None where absent)."""
    a, b = _leaves(old), _leaves(new)
    return [(k, a.get(k), b.get(k)) for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
