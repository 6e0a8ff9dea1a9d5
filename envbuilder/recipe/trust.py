"""Whether a registry's files may be trusted: the settings its signatures are checked against, pinned on first
use, the signature check itself, and reads that refuse a file others could have written.

Trust settings (require_signatures, the allowed signers) are never taken from the registry alone, since whoever
can write it could change them: the config that names the registry (the site config) can set them, and what the
registry says of itself is pinned in the user's envbuilder home on first use. A registry that required
signatures then keeps requiring them with the same signers; a change is refused until the user removes the pin.
Signing and verifying are ssh-keygen's: no crypto code of ours.
"""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
import stat
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional

from envbuilder.core import settings
from envbuilder.core._toml import TOMLDecodeError, dumps, loads
from envbuilder.core.errors import PublishError
from envbuilder.core.structs import dataclass
from envbuilder.system import fsutil, proc

NAMESPACE = "envbuilder-recipe"
#: Bounds on what a reader takes from a registry: no file there makes it read without end.
MAX_FILE = 16 * 1024 * 1024
REPUBLISH = "ask the registry's admins to check publish.log and republish it"

#: What a registry says of itself: whether it requires signatures, its allowed-signers bytes (None: there are
#: none), and where they are, for messages.
OwnSettings = tuple[bool, Optional[bytes], str]


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


def resolve_trust(root: Path, site: Policy, own: Callable[[], OwnSettings]) -> Trust:
    """The settings the registry at ``root`` is checked against: the site's where it names both, else with what
    the registry says of itself (``own``, read only then), compared with its pin where ``site.pins`` is set."""
    if site.config is not None:
        refuse_writable(site.config, stat_of(site.config, "the config naming the registry"))
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
    require, signers, where = own()
    if site.pins is not None:
        # Signers that are not used (the config names its own) are not pinned: their changes harm nobody.
        _pin(root, site.pins, require, signers if external is None else None, site.require_signatures)
    if external is not None:
        return Trust(site.require_signatures or require, external, str(site.allowed_signers))
    return Trust(site.require_signatures or require, signers, where)


def _pin(root: Path, pins: Path, require: bool, signers: Optional[bytes], site_requires: bool) -> None:
    """Compare what the registry says of itself with what it said on first use (pinning it then): where
    signatures were required (by the registry then, or by the site config), neither that nor the signers may
    change."""
    real = str(root.resolve())
    pin = pins / f"{hashlib.sha256(real.encode()).hexdigest()[:16]}.toml"
    digest = hashlib.sha256(signers).hexdigest() if signers is not None else ""
    try:
        old: Optional[dict[str, Any]] = loads(pin.read_text(encoding="utf-8")) if pin.exists() else None
    except (OSError, UnicodeDecodeError, TOMLDecodeError) as exc:
        raise PublishError(
            f"cannot read {pin}, where the trust settings of {root} are pinned: {exc}",
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
                f"{root}: its trust settings changed since you first used it ({old.get('pinned', '?')}): "
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
            f"cannot pin the trust settings of {root} in {pin}: {exc.strerror}",
            hint="check that your envbuilder home (ENVBUILDER_HOME) is writable",
        ) from None


def verify_signature(
    data: bytes, sig: bytes, signers: bytes, what: str, signers_from: str, *, namespace: str = NAMESPACE
) -> str:
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
        argv = [ssh_keygen, "-Y", "verify", "-f", str(signers_file), "-I", principals[0], "-n", namespace]
        res = proc.run([*argv, "-s", str(sig_file)], check=False, input_text=text)
    if res.returncode != 0:
        raise PublishError(f"{what}: bad signature ({(res.stderr or res.stdout).strip()}); it is not used")
    return principals[0]


def stat_of(path: Path, what: str) -> os.stat_result:
    """``path``'s stat, or a PublishError naming ``what`` it is."""
    try:
        return path.stat()
    except OSError as exc:
        raise PublishError(f"{what}: cannot read {path}: {exc.strerror}") from None


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
