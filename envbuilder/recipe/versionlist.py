"""The signed list of the versions a registry holds, and each user's memory of the newest one seen: whoever can
write a registry, without its signing key, can neither hide a version nor bring back an older list (as TUF's
snapshot role prevents rollback).

``publish`` writes the list into ``index.json`` (key ``signed_versions``: the list's exact text, and an
``ssh-keygen -Y sign`` signature over it in namespace ``envbuilder-versions``), so the index and its list change
in one atomic rename. The list names every recipe's versions with their sha256 (and their lock's), a serial that
every publish raises, and when it was made.

A reader checks the list's signature, refuses an index whose entries for the recipe used differ from the list,
and remembers, in the user's envbuilder home (beside the registry's pinned trust settings), the highest serial
and the highest version of each recipe it has seen: an older list, a list gone where a signed one was seen, or a
request for the latest version that resolves lower than one seen before is refused. A version asked for by name
(``NAME@VERSION``) may be older.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Optional

from packaging.version import InvalidVersion, Version

from envbuilder.core.errors import PublishError
from envbuilder.core.structs import dataclass
from envbuilder.system import fsutil

#: The signature namespace: a recipe's signature is never a list's, nor the reverse.
NAMESPACE = "envbuilder-versions"
KEY = "signed_versions"
FORMAT = 1
REPUBLISH = (
    "its admins: publish any recipe again with `envbuilder publish NAME --registry DIR --sign-key KEY`; "
    "that signs the list of every version anew"
)

#: name -> version -> {"sha256": ..., "lock_sha256": ... or None}
Listing = Mapping[str, Mapping[str, Mapping[str, Optional[str]]]]


def version_key(v: str) -> tuple[int, Any]:
    """Sorts versions oldest first: release numbers by their value, after any other names."""
    try:
        return (1, Version(v))
    except InvalidVersion:
        return (0, v)


@dataclass(frozen=True)
class VersionList:
    serial: int
    made: str
    recipes: Listing
    #: The sha256 of the list's text: two lists of one serial must be the same list.
    digest: str


def build(recipes: Listing, serial: int) -> str:
    """The text of a list (what is signed): canonical JSON, so a list that did not change reads the same."""
    doc = {
        "format": FORMAT,
        "serial": serial,
        "made": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "recipes": {n: {v: dict(e) for v, e in sorted(vs.items())} for n, vs in sorted(recipes.items())},
    }
    return json.dumps(doc, sort_keys=True)


def parse(text: str, where: str) -> VersionList:
    try:
        doc = json.loads(text)
        if doc["format"] != FORMAT or not isinstance(doc["serial"], int):
            raise ValueError(f"format {doc['format']!r}, serial {doc['serial']!r}")
        recipes = {
            str(n): {
                str(v): {"sha256": e["sha256"], "lock_sha256": e.get("lock_sha256")} for v, e in vs.items()
            }
            for n, vs in doc["recipes"].items()
        }
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise PublishError(f"{where}: the signed version list is not one envbuilder wrote: {exc}") from None
    return VersionList(doc["serial"], str(doc.get("made", "")), recipes, _digest(text))


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def stored(doc: Mapping[str, Any]) -> tuple[Optional[str], Optional[str]]:
    """(the list's text, its signature) as ``index.json`` holds them; None for what is not there."""
    part = doc.get(KEY)
    if not isinstance(part, dict):
        return None, None
    text, sig = part.get("list"), part.get("signature")
    return (text if isinstance(text, str) else None), (sig if isinstance(sig, str) else None)


def compare(listed: VersionList, name: str, entries: Listing, where: str, only: Optional[str] = None) -> None:
    """The index's versions of ``name`` (with their sha256) must be exactly the signed list's; ``only``: just
    that version's."""
    have, signed = entries.get(name, {}), listed.recipes.get(name, {})
    for version in [only] if only is not None else sorted(set(have) | set(signed)):
        if version not in have:
            problem = f"{name}@{version} is in the signed version list but not in the index (removed from it)"
        elif version not in signed:
            problem = f"{name}@{version} is in the index but not in the signed version list"
        elif have[version].get("sha256") != signed[version].get("sha256"):
            problem = f"the index's sha256 of {name}@{version} is not the signed version list's"
        elif have[version].get("lock_sha256") != signed[version].get("lock_sha256"):
            problem = f"the index's sha256 of the lock of {name}@{version} is not the signed version list's"
        else:
            continue
        raise PublishError(
            f"{where}: {problem}; whoever can write the registry could have done this, so {name} is not used",
            hint=REPUBLISH,
        )


# -- what a user has seen ------------------------------------------------------------------------------------


def memory_file(pins: Path, real_root: str) -> Path:
    return pins / f"{hashlib.sha256(real_root.encode()).hexdigest()[:16]}.versions.json"


def recall(path: Path) -> Optional[dict[str, Any]]:
    """What the user saw of a registry last (None: nothing yet)."""
    try:
        data = json.loads(path.read_bytes())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise PublishError(
            f"cannot read {path}, where the newest version list you saw of a registry is kept: {exc}",
            hint=f"remove {path}: your next use remembers the registry's current list",
        ) from None
    if (
        not isinstance(data, dict)
        or not isinstance(data.get("serial"), int)
        or not isinstance(data.get("recipes"), dict)
    ):
        raise PublishError(f"{path} is not a version memory envbuilder wrote", hint=f"remove {path}")
    return data


def remember(path: Path, root: str, listed: VersionList, seen: Optional[Mapping[str, Any]]) -> dict[str, str]:
    """Refuse ``listed`` if it is older than what was ``seen``; else keep it as the newest seen (the highest
    version of each recipe kept even if a list lacks it). The highest version of each recipe, as now kept."""
    if seen is not None:
        _not_older(root, listed, seen, path)
    highest = {str(k): str(v) for k, v in (seen or {}).get("recipes", {}).items()}
    for name, versions in listed.recipes.items():
        top = max(versions, key=version_key, default=None)
        if top is not None and (name not in highest or version_key(top) > version_key(highest[name])):
            highest[name] = top
    doc = {"registry": root, "serial": listed.serial, "made": listed.made, "digest": listed.digest}
    if seen is None or doc != {k: seen.get(k) for k in doc} or highest != seen.get("recipes"):
        try:
            fsutil.write_atomic(path, json.dumps({**doc, "recipes": highest}, indent=1).encode(), 0o644)
        except OSError as exc:
            raise PublishError(
                f"cannot keep the version list of {root} in {path}: {exc.strerror}",
                hint="check that your envbuilder home (ENVBUILDER_HOME) is writable",
            ) from None
    return highest


def _not_older(root: str, listed: VersionList, seen: Mapping[str, Any], path: Path) -> None:
    was = f"serial {seen['serial']}, made {seen.get('made', '?')}"
    now = f"serial {listed.serial}, made {listed.made}"
    if listed.serial < seen["serial"]:
        problem = f"its signed version list ({now}) is older than one you have seen ({was})"
    elif listed.serial == seen["serial"] and listed.digest != seen.get("digest"):
        problem = f"its signed version list ({now}) differs from the one of the same serial you have seen"
    else:
        return
    raise PublishError(
        f"{root}: {problem}: an older copy of the registry was put back, so it is not used",
        hint=f"ask its admins to publish again (a new serial); if they restored it from a backup on purpose, "
        f"remove {path} to accept its current list",
    )


def refuse_gone(root: str, path: Path, why: str) -> PublishError:
    return PublishError(
        f"{root}: {why}, but you have seen a signed one; whoever can write the registry could have removed it, "
        "so it is not used",
        hint=f"{REPUBLISH}; if the registry was rebuilt on purpose, remove {path}",
    )
