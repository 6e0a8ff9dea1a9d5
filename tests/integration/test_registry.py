"""Site registries for real: recipes published to a directory, listed and built from it by a user with real uv
against a local index, tampered with, signed and checked with real ssh-keygen keys made here, republished, and
published by several processes at once."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import stat
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from helpers import UserWorld, ok, refused
from wheelindex import build_wheel, mirror_env, serve

pytestmark = pytest.mark.integration
SSH_KEYGEN = shutil.which("ssh-keygen")
needs_ssh = pytest.mark.skipif(SSH_KEYGEN is None, reason="ssh-keygen is not installed (openssh-client)")

BASE = """
schema_version = 1
[env]
kind = "venv"
installer = "uv"
prefix = "${SCRATCH}/envs/{name}"
[python]
command = "python3"
[torch]
install = false
"""

RECIPE = """
schema_version = 1
extends = "base.toml"
[recipe]
name = "{name}"
description = "{description}"
{version}
[[packages]]
name = "regdemo"
spec = "regdemo=={demo}"
"""


@pytest.fixture(scope="module")
def index(tmp_path_factory):
    d = tmp_path_factory.mktemp("registry-files")
    build_wheel(d, "regdemo", "1.0", {"regdemo/__init__.py": "VERSION = '1.0'\n"})
    build_wheel(d, "regdemo", "2.0", {"regdemo/__init__.py": "VERSION = '2.0'\n"})
    with serve(d) as idx:
        yield idx


class Site(UserWorld):
    def __init__(self, root: Path, index: Any) -> None:
        super().__init__(root, mirror_env(index), recipes="admin-recipes")
        self.source = self.recipes
        (self.source / "base.toml").write_text(BASE)
        self.registry = root / "registry"

    def write(self, name: str, demo: str = "1.0", description: str = "demo", version: str = "") -> Path:
        line = f'version = "{version}"' if version else ""
        path = self.source / f"{name}.toml"
        path.write_text(RECIPE.format(name=name, demo=demo, description=description, version=line))
        return path

    def admin(self, *args: str) -> subprocess.CompletedProcess[str]:
        return self.cli(*args, ENVBUILDER_RECIPE_PATH=str(self.source))

    def user(self, *args: str, timeout: float = 300, **extra: str) -> subprocess.CompletedProcess[str]:
        return self.cli(*args, timeout=timeout, **{"ENVBUILDER_RECIPE_PATH": str(self.registry), **extra})

    def user_data(self, *args: str, **extra: str) -> Any:
        return json.loads(ok(self.user(*args, "--json", **extra)).stdout)["data"]

    def publish(self, *args: str) -> subprocess.CompletedProcess[str]:
        return self.admin("publish", *args, "--registry", str(self.registry))


@pytest.fixture
def site(tmp_path, index):
    return Site(tmp_path, index)


def keypair(dirpath: Path, name: str) -> tuple[Path, str]:
    key = dirpath / name
    subprocess.run([str(SSH_KEYGEN), "-q", "-t", "ed25519", "-N", "", "-C", name, "-f", str(key)], check=True)
    return key, (dirpath / f"{name}.pub").read_text().strip()


def test_publish_list_create_diff_update(site):
    site.write("regenv")
    res = ok(site.publish("regenv"))
    assert "published regenv@1" in res.stdout
    # The published file is the whole recipe: the base it extended is merged in, so no unpublished file counts.
    text = (site.registry / "recipes" / "regenv" / "1.toml").read_text()
    assert "extends" not in text and 'installer = "uv"' in text and 'version = "1"' in text
    assert "unchanged" in ok(site.publish("regenv")).stdout

    rows = {r["name"]: r for r in site.user_data("recipes", "list")["recipes"]}
    assert rows["regenv"]["version"] == "1"
    assert rows["regenv"]["layer"] == str(site.registry)
    assert rows["regenv"]["published"]["sha256"]

    created = site.user_data("create", "regenv", "--no-validate")
    prefix = Path(created["env"]["prefix"]) if "env" in created else site.scratch / "envs" / "regenv"
    py = prefix / "bin" / "python"
    assert (
        subprocess.run(
            [str(py), "-c", "import regdemo; print(regdemo.VERSION)"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        == "1.0"
    )
    shown = site.user_data("show", "regenv")
    assert shown["plan"]["recipe_version"] == "1"

    site.write("regenv", demo="2.0", description="demo, regdemo 2")
    res = ok(site.publish("regenv"))
    assert "published regenv@2" in res.stdout and "packages" in res.stdout
    log = [json.loads(x) for x in (site.registry / "publish.log").read_text().splitlines()]
    assert [(e["name"], e["version"]) for e in log] == [("regenv", "1"), ("regenv", "2")]
    assert log[1]["previous"] == "1" and "recipe.description" in log[1]["changed"] and log[1]["user"]

    changes = {c["key"]: c for c in site.user_data("recipes", "diff", "regenv", "1", "2")["changes"]}
    assert changes["recipe.description"]["new"] == "demo, regdemo 2"
    assert changes["packages"]["old"] == [{"name": "regdemo", "spec": "regdemo==1.0"}]

    update = site.user_data("recipes", "update")["recipes"]
    assert update == [
        {
            "name": "regenv",
            "latest": "2",
            "registry": str(site.registry),
            "envs_behind": [{"env": "regenv", "built_from": "1"}],
        }
    ]
    # A pinned old version still builds, exactly as published.
    pinned = site.scratch / "pinned"
    ok(site.user("create", "regenv@1", "--name", "regenv-1", "--prefix", str(pinned), "--no-validate"))
    out = subprocess.run(
        [str(pinned / "bin" / "python"), "-c", "import regdemo; print(regdemo.VERSION)"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == "1.0"
    refused(site.user("plan", "regenv@9"), 3, "no published version '9' of regenv")

    # Published files are read-only, directories not writable by others, nothing world-writable.
    for path in site.registry.rglob("*"):
        mode = stat.S_IMODE(path.stat().st_mode)
        assert not mode & 0o002, path
        if path.suffix == ".toml" and path.parent.parent.name == "recipes":
            assert mode == 0o444, (path, oct(mode))


def test_a_tampered_file_is_refused_and_nothing_is_created(site):
    site.write("tamper")
    ok(site.publish("tamper"))
    path = site.registry / "recipes" / "tamper" / "1.toml"
    path.chmod(0o644)
    path.write_text(path.read_text().replace("regdemo==1.0", "regdemo==2.0"))
    refused(site.user("create", "tamper", "--no-validate"), 10, "does not match the sha256")
    assert not (site.scratch / "envs" / "tamper").exists()
    listed = {r["name"]: r for r in site.user_data("recipes", "list")["recipes"]}
    assert "changed after publishing" in listed["tamper"]["error"]


def test_a_version_is_never_republished_with_other_content(site):
    site.write("pinned", version="2024.1")
    ok(site.publish("pinned"))
    assert "unchanged" in ok(site.publish("pinned")).stdout
    site.write("pinned", demo="2.0", version="2024.1")
    refused(site.publish("pinned"), 10, "pinned@2024.1 is already published with other content")
    site.write("pinned", version="../escape")
    refused(site.publish("pinned"), 10, "invalid version '../escape'")
    assert sorted(p.name for p in (site.registry / "recipes" / "pinned").iterdir()) == ["2024.1.toml"]


@needs_ssh
def test_signatures_round_trip_unknown_signer_unsigned_and_bad(site, tmp_path):
    keys = tmp_path / "keys"
    keys.mkdir()
    admin_key, admin_pub = keypair(keys, "admin")
    rogue_key, _ = keypair(keys, "rogue")
    allowed = keys / "allowed_signers"
    allowed.write_text(f"admin@site {admin_pub}\n")
    site.write("signed")
    # A registry that requires signatures refuses an unsigned publish, and a key it does not allow.
    refused(
        site.publish("signed", "--allowed-signers", str(allowed), "--require-signatures"),
        10,
        "requires signed",
    )
    refused(site.publish("signed", "--sign-key", str(rogue_key)), 10, "unknown signer")
    res = ok(site.publish("signed", "--sign-key", str(admin_key)))
    assert "signed by admin@site" in res.stdout
    shown = site.user_data("recipes", "show", "signed")
    assert shown["published"]["signer"] == "admin@site"
    ok(site.user("plan", "signed"))

    path = site.registry / "recipes" / "signed" / "1.toml"
    sig = Path(f"{path}.sig")
    good_sig = sig.read_bytes()
    sig.chmod(0o644)
    # The same bytes signed by a key the site does not list: unknown signer.
    copy = tmp_path / "copy.toml"
    shutil.copy(path, copy)
    subprocess.run(
        [str(SSH_KEYGEN), "-q", "-Y", "sign", "-f", str(rogue_key), "-n", "envbuilder-recipe", str(copy)],
        check=True,
    )
    sig.write_bytes(Path(f"{copy}.sig").read_bytes())
    refused(site.user("create", "signed", "--no-validate"), 10, "unknown signer")
    # A signature by the right key over other bytes: bad signature.
    other = tmp_path / "other.toml"
    other.write_text("something else\n")
    subprocess.run(
        [str(SSH_KEYGEN), "-q", "-Y", "sign", "-f", str(admin_key), "-n", "envbuilder-recipe", str(other)],
        check=True,
    )
    sig.write_bytes(Path(f"{other}.sig").read_bytes())
    refused(site.user("create", "signed", "--no-validate"), 10, "bad signature")
    # No signature at all, where the registry requires one.
    sig.unlink()
    refused(site.user("create", "signed", "--no-validate"), 10, "is not signed")
    assert not (site.scratch / "envs" / "signed").exists()
    sig.write_bytes(good_sig)
    ok(site.user("plan", "signed"))


@needs_ssh
def test_the_site_config_can_require_signatures_of_a_registry_that_does_not(site, tmp_path):
    site.write("plain")
    ok(site.publish("plain"))
    config = tmp_path / "config.toml"
    config.write_text(f'[[registries]]\npath = "{site.registry}"\nrequire_signatures = true\n')
    env = {"ENVBUILDER_RECIPE_PATH": "", "ENVBUILDER_CONFIG": str(config)}
    refused(site.user("plan", "plain", **env), 10, "is not signed")
    config.write_text(f'[[registries]]\npath = "{site.registry}"\nrequire_signature = true\n')
    refused(site.user("plan", "plain", **env), 3, "did you mean 'require_signatures'")
    config.write_text(f'[[registries]]\npath = "{site.registry}"\n')
    rows = {r["name"]: r for r in site.user_data("recipes", "list", **env)["recipes"]}
    assert rows["plain"]["version"] == "1" and rows["plain"]["layer"].startswith("site config")


def test_concurrent_publishes_are_serialized(site):
    procs = []
    for i in range(4):
        src = site.root / f"src{i}"
        src.mkdir()
        (src / "base.toml").write_text(BASE)
        (src / "busy.toml").write_text(
            RECIPE.format(name="busy", demo="1.0", description=f"writer {i}", version="")
        )
        procs.append(
            site.spawn(
                "publish",
                str(src / "busy.toml"),
                "--registry",
                str(site.registry),
                extra={"ENVBUILDER_RECIPE_PATH": ""},
            )
        )
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
    index = json.loads((site.registry / "index.json").read_text())
    assert sorted(index["recipes"]["busy"]) == ["1", "2", "3", "4"]
    descriptions = set()
    for version, entry in index["recipes"]["busy"].items():
        text = (site.registry / entry["file"]).read_text()
        descriptions.add(next(line for line in text.splitlines() if line.startswith("description")))
        assert f'version = "{version}"' in text
    assert len(descriptions) == 4  # each writer's content, none lost or overwritten
    assert len((site.registry / "publish.log").read_text().splitlines()) == 4
    assert not list((site.registry / "locks").iterdir())


@needs_ssh
def test_a_killed_publish_leaves_the_registry_as_it_was_and_the_next_publish_no_partial(site, tmp_path):
    """A publish killed while ssh-keygen asks for the signing key's passphrase (an askpass program that never
    answers, so the kill lands with the recipe's partial file written): the index is as before, and the next
    publish, of another recipe, removes what the killed one left."""
    keys = tmp_path / "keys"
    keys.mkdir()
    key, pub = keypair(keys, "admin")
    slow = keys / "slow"
    subprocess.run([str(SSH_KEYGEN), "-q", "-t", "ed25519", "-N", "secret", "-f", str(slow)], check=True)
    allowed = keys / "allowed_signers"
    allowed.write_text(f"admin@site {pub}\nslow@site {(keys / 'slow.pub').read_text().strip()}\n")
    site.write("roll")
    ok(site.publish("roll", "--sign-key", str(key), "--allowed-signers", str(allowed)))
    before = (site.registry / "index.json").read_bytes()
    asked = tmp_path / "asked"
    askpass = tmp_path / "askpass"
    askpass.write_text(f"#!/bin/sh\necho $$ > {asked}.tmp && mv {asked}.tmp {asked}\nexec sleep 600\n")
    askpass.chmod(0o755)
    site.write("other", description="another recipe")
    proc = site.spawn(
        "publish", "other", "--sign-key", str(slow), "--registry", str(site.registry),
        extra={"ENVBUILDER_RECIPE_PATH": str(site.source), "SSH_ASKPASS": str(askpass),
               "SSH_ASKPASS_REQUIRE": "force"},
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not asked.exists():
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "ssh-keygen never asked for the passphrase"
            time.sleep(0.01)
        proc.send_signal(signal.SIGKILL)
        proc.communicate()
    finally:
        with contextlib.suppress(OSError, ValueError):
            os.kill(int(asked.read_text()), signal.SIGKILL)
    partials = lambda: sorted(site.registry.rglob(".*.partial-*")) + sorted(site.registry.glob(".*.tmp-*"))  # noqa: E731
    assert [p.name for p in partials()] and all(p.parent.name == "other" for p in partials())
    assert (site.registry / "index.json").read_bytes() == before
    refused(site.user("plan", "other"), 3, "other")
    site.write("roll", demo="2.0")
    ok(site.publish("roll", "--sign-key", str(key)))
    assert partials() == []
    assert sorted(json.loads((site.registry / "index.json").read_text())["recipes"]["roll"]) == ["1", "2"]


def test_publish_checks_every_recipe_before_writing_any(site):
    site.write("good")
    (site.source / "broken.toml").write_text(
        'schema_version = 1\nextends = "base.toml"\n[recipe]\nname = "broken"\n[env]\nkind = "venvv"\n'
    )
    refused(site.publish("good", "broken"), 3, "kind")
    assert not (site.registry / "recipes" / "good").exists()


def test_publish_runs_the_resolver_gates_on_the_sites_compute_facts(site):
    """No --facts and a GPU-less host: the recipe's own [compute] (V100s) still decides, and a cu128 torch that
    dropped sm_70 is refused before anything is written."""
    (site.source / "v100.toml").write_text(
        'schema_version = 1\nextends = "base.toml"\n[recipe]\nname = "v100"\n'
        '[compute]\narch = "x86_64"\ngpu = "Tesla V100-SXM2-32GB"\ncompute_capability = "7.0"\n'
        'gpus_per_node = 4\nmax_cuda = "12.9"\n'
        '[torch]\ninstall = true\nversion = "2.11.0"\nvariant = "cu128"\n'
    )
    site.write("good")
    res = site.publish("good", "v100")
    refused(res, 10, "v100 does not plan on its site's compute facts")
    assert "sm_70, which torch 2.11.0 cu128 does not carry" in res.stderr
    assert "hint: use cu126 with torch 2.11.0" in res.stderr
    assert not (site.registry / "recipes" / "good").exists()


def test_world_writable_registry_refused(site):
    site.registry.mkdir()
    site.registry.chmod(0o777)
    site.write("ww")
    refused(site.publish("ww"), 10, f"{site.registry} is writable by anyone (mode 777)")
    assert not (site.registry / "recipes" / "ww").exists()


# -- tampering by whoever can write the registry: each refused with exit 10 before anything is created ----------


def nothing_created(site: Site) -> None:
    """No env, no partial build, no record: the refusal came before anything was made."""
    made = sorted(site.scratch.rglob("*")) if site.scratch.exists() else []
    assert made == [], made
    envs = site.root / "eb-home" / "envs"
    assert not envs.exists() or not any(envs.iterdir())


def overwrite(path: Path, data: bytes) -> None:
    """What a registry writer does to a read-only published file: replace it (the directory is theirs)."""
    path.unlink()
    path.write_bytes(data)


def edit_index(site: Site, name: str, version: str, **fields: str) -> None:
    path = site.registry / "index.json"
    doc = json.loads(path.read_text())
    doc["recipes"][name][version].update(fields)
    path.write_text(json.dumps(doc, indent=1))


@pytest.fixture
def signed(site, tmp_path):
    """A registry that requires signatures: roll@1, roll@2 and other@1, signed by the admin; the user has used
    it once (so its signers are pinned in the user's envbuilder home)."""
    keys = tmp_path / "keys"
    keys.mkdir()
    site.key, admin_pub = keypair(keys, "admin")
    site.rogue, site.rogue_pub = keypair(keys, "rogue")
    site.allowed = keys / "allowed_signers"
    site.allowed.write_text(f"admin@site {admin_pub}\n")
    site.write("roll")
    key = ("--sign-key", str(site.key))
    ok(site.publish("roll", *key, "--allowed-signers", str(site.allowed), "--require-signatures"))
    site.write("roll", demo="2.0")
    ok(site.publish("roll", *key))
    site.write("other", description="another recipe")
    ok(site.publish("other", *key))
    assert site.user_data("plan", "roll")["recipe_version"] == "2"
    return site


def sign_as(key: Path, path: Path) -> bytes:
    subprocess.run(
        [str(SSH_KEYGEN), "-q", "-Y", "sign", "-f", str(key), "-n", "envbuilder-recipe", str(path)],
        check=True,
    )
    sig = Path(f"{path}.sig")
    data = sig.read_bytes()
    sig.unlink()
    return data


def _rollback(site: Site) -> str:
    """Version 1's file and signature copied over version 2's, and the index's sha256 with them."""
    d = site.registry / "recipes" / "roll"
    for suffix in (".toml", ".toml.sig"):
        overwrite(d / f"2{suffix}", (d / f"1{suffix}").read_bytes())
    index = json.loads((site.registry / "index.json").read_text())
    edit_index(site, "roll", "2", sha256=index["recipes"]["roll"]["1"]["sha256"])
    return "holds roll@1, not roll@2"


def _repoint(site: Site) -> str:
    """Version 2's index entry pointed at 1.toml."""
    index = json.loads((site.registry / "index.json").read_text())
    edit_index(site, "roll", "2", file="recipes/roll/1.toml", sha256=index["recipes"]["roll"]["1"]["sha256"])
    return "the index points at recipes/roll/1.toml"


def _swap(site: Site) -> str:
    """Another recipe's signed file (and signature) put in place of roll@2."""
    src, dst = site.registry / "recipes" / "other", site.registry / "recipes" / "roll"
    for suffix in (".toml", ".toml.sig"):
        overwrite(dst / f"2{suffix}", (src / f"1{suffix}").read_bytes())
    index = json.loads((site.registry / "index.json").read_text())
    edit_index(site, "roll", "2", sha256=index["recipes"]["other"]["1"]["sha256"])
    return "holds other@1, not roll@2"


def _link(site: Site) -> str:
    """2.toml made a symbolic link to 1.toml (and its signature to 1's)."""
    d = site.registry / "recipes" / "roll"
    for suffix in (".toml", ".toml.sig"):
        (d / f"2{suffix}").unlink()
        (d / f"2{suffix}").symlink_to(f"1{suffix}")
    index = json.loads((site.registry / "index.json").read_text())
    edit_index(site, "roll", "2", sha256=index["recipes"]["roll"]["1"]["sha256"])
    return "is a symbolic link"


def _fifo(site: Site) -> str:
    """2.toml replaced by a FIFO: a reader that opened it would wait for ever."""
    path = site.registry / "recipes" / "roll" / "2.toml"
    path.unlink()
    os.mkfifo(path)
    return "is not a regular file"


@needs_ssh
@pytest.mark.parametrize("attack", [_rollback, _repoint, _swap, _link, _fifo], ids=lambda f: f.__name__[1:])
def test_a_tampered_version_is_refused_before_anything_is_created(signed, attack):
    said = attack(signed)
    for ref in ("roll", "roll@2"):
        refused(signed.user("create", ref, "--no-validate", timeout=30), 10, said)
    nothing_created(signed)
    # The untouched version is still good, and so is the listing of everything else.
    ok(signed.user("plan", "roll@1"))
    rows = {r["name"]: r for r in signed.user_data("recipes", "list")["recipes"]}
    assert said in rows["roll"]["error"] and "error" not in rows["other"]


@needs_ssh
def test_the_registry_cannot_turn_its_own_signatures_off(signed):
    """require_signatures = false written into the registry's registry.toml, then an unsigned roll@2."""
    config = signed.registry / "registry.toml"
    overwrite(
        config, config.read_bytes().replace(b"require_signatures = true", b"require_signatures = false")
    )
    path = signed.registry / "recipes" / "roll" / "2.toml"
    evil = path.read_bytes().replace(b"regdemo==2.0", b"regdemo==1.0")
    overwrite(path, evil)
    Path(f"{path}.sig").unlink()
    edit_index(signed, "roll", "2", sha256=hashlib.sha256(evil).hexdigest(), signer="")
    res = signed.user("create", "roll", "--no-validate")
    refused(res, 10, "its trust settings changed since you first used it")
    assert "require_signatures true -> false" in res.stderr
    pins = list((signed.root / "eb-home" / "trust").glob("*.toml"))
    assert len(pins) == 1 and "hint: if its admins rotated" in res.stderr and str(pins[0]) in res.stderr
    nothing_created(signed)


@needs_ssh
def test_the_registry_cannot_add_a_signer_of_its_own(signed, tmp_path):
    """A rogue key appended to the registry's allowed_signers, and roll@2 rewritten and signed with it."""
    signers = signed.registry / "allowed_signers"
    overwrite(signers, signers.read_bytes() + f"admin@site {signed.rogue_pub}\n".encode())
    path = signed.registry / "recipes" / "roll" / "2.toml"
    evil = path.read_bytes().replace(b"regdemo==2.0", b"regdemo==1.0")
    work = tmp_path / "evil.toml"
    work.write_bytes(evil)
    overwrite(path, evil)
    overwrite(Path(f"{path}.sig"), sign_as(signed.rogue, work))
    edit_index(signed, "roll", "2", sha256=hashlib.sha256(evil).hexdigest())
    res = signed.user("create", "roll", "--no-validate")
    refused(res, 10, "its trust settings changed since you first used it")
    assert "the allowed-signers file changed" in res.stderr
    nothing_created(signed)

    # Trust taken from the site config instead: whatever the registry says of itself is not read at all.
    config = tmp_path / "config.toml"
    config.write_text(
        f'[[registries]]\npath = "{signed.registry}"\nrequire_signatures = true\n'
        f'allowed_signers = "{signed.allowed}"\n'
    )
    site_env = {"ENVBUILDER_RECIPE_PATH": "", "ENVBUILDER_CONFIG": str(config)}
    refused(signed.user("create", "roll", "--no-validate", **site_env), 10, "unknown signer")
    nothing_created(signed)
    ok(signed.user("plan", "roll@1", **site_env))
    # A site config's signers file that others can write is no better than the registry's own.
    signed.allowed.chmod(0o666)
    refused(signed.user("plan", "roll@1", **site_env), 10, f"{signed.allowed} is writable by anyone")


@needs_ssh
def test_an_admin_rotates_the_signing_key(signed, tmp_path):
    """New signers, published by the admin: a user who pinned the old ones is refused until they accept the new
    ones (by removing the pin the refusal names); a registry may start requiring signatures at any time."""
    new_key, new_pub = keypair(tmp_path / "keys", "admin2")
    new_signers = tmp_path / "keys" / "allowed_signers2"
    new_signers.write_text(f"admin2@site {new_pub}\n")
    signed.write("roll", demo="1.0", description="rotated")
    res = ok(signed.publish("roll", "--sign-key", str(new_key), "--allowed-signers", str(new_signers)))
    assert "users who used this registry before refuse it" in res.stderr
    res = signed.user("plan", "roll")
    refused(res, 10, "the allowed-signers file changed")
    pin = next((signed.root / "eb-home" / "trust").glob("*.toml"))
    assert f"remove {pin}" in res.stderr
    pin.unlink()
    assert signed.user_data("plan", "roll")["recipe_version"] == "3"

    # An unsigned registry, used once, that starts requiring signatures: accepted, and pinned from then on.
    other = tmp_path / "registry2"
    signed.write("late")
    ok(signed.admin("publish", "late", "--registry", str(other)))
    env = {"ENVBUILDER_RECIPE_PATH": str(other)}
    ok(signed.user("plan", "late", **env))
    ok(signed.admin("publish", "late", "--registry", str(other), "--sign-key", str(signed.key),
                    "--allowed-signers", str(signed.allowed), "--require-signatures"))  # fmt: skip
    refused(signed.user("plan", "late", **env), 10, "late@1 is not signed")
    config = other / "registry.toml"
    overwrite(config, config.read_bytes().replace(b"require_signatures = true", b""))
    refused(signed.user("plan", "late", **env), 10, "require_signatures true -> false")


@needs_ssh
def test_registry_parts_that_others_can_write_are_refused_when_read(signed):
    parts = {
        ".": 0o777,
        "index.json": 0o666,
        "registry.toml": 0o664,
        "allowed_signers": 0o646,
        "recipes": 0o775,
        "recipes/roll": 0o757,
        "recipes/roll/2.toml": 0o644 | 0o020,
        "recipes/roll/2.toml.sig": 0o446,
    }
    for rel, mode in parts.items():
        path = signed.registry / rel
        before = stat.S_IMODE(path.stat().st_mode)
        path.chmod(mode)
        try:
            res = signed.user("create", "roll", "--no-validate")
            who = "anyone" if mode & 0o002 else "its group"
            refused(res, 10, f"{path} is writable by {who} (mode {mode:o})")
            assert "chmod go-w" in res.stderr
            nothing_created(signed)
        finally:
            path.chmod(before)
    ok(signed.user("plan", "roll"))


@needs_ssh
def test_a_published_lock_is_bound_to_its_version(signed, tmp_path):
    """roll@3 and roll@4 published with their locks; version 3's lock and signature copied over version 4's."""
    key = ("--sign-key", str(signed.key))
    for version, demo in (("3", "1.0"), ("4", "2.0")):
        signed.write("roll", demo=demo, description=f"locked {version}")
        lock = tmp_path / f"roll{version}.lock.toml"
        ok(signed.admin("lock", "roll", "-o", str(lock)))
        ok(signed.publish("roll", *key, "--lock", str(lock)))
    assert signed.user_data("plan", "roll")["lock"]["origin"] == "published"
    d = signed.registry / "recipes" / "roll"
    for suffix in (".lock.toml", ".lock.toml.sig"):
        overwrite(d / f"4{suffix}", (d / f"3{suffix}").read_bytes())
    index = json.loads((signed.registry / "index.json").read_text())
    edit_index(signed, "roll", "4", lock_sha256=index["recipes"]["roll"]["3"]["lock_sha256"])
    res = signed.user("create", "roll", "--locked", "--no-validate")
    # The signed version list names each version's lock: the swap is refused there, before the lock is read.
    refused(res, 10, "the index's sha256 of the lock of roll@4 is not the signed version list's")
    nothing_created(signed)
    ok(signed.user("plan", "roll@3", "--locked"))


@needs_ssh
def test_a_site_that_requires_signatures_keeps_the_registrys_signers_pinned(site, tmp_path):
    """The site config requires signatures; the signers are the registry's own (it does not require them
    itself). A rogue key added to them later does not make a rogue signature good."""
    keys = tmp_path / "keys"
    keys.mkdir()
    admin_key, admin_pub = keypair(keys, "admin")
    rogue_key, rogue_pub = keypair(keys, "rogue")
    allowed = keys / "allowed_signers"
    allowed.write_text(f"admin@site {admin_pub}\n")
    site.write("held")
    ok(site.publish("held", "--sign-key", str(admin_key), "--allowed-signers", str(allowed)))
    config = tmp_path / "config.toml"
    config.write_text(f'[[registries]]\npath = "{site.registry}"\nrequire_signatures = true\n')
    env = {"ENVBUILDER_RECIPE_PATH": "", "ENVBUILDER_CONFIG": str(config)}
    ok(site.user("plan", "held", **env))

    signers = site.registry / "allowed_signers"
    overwrite(signers, signers.read_bytes() + f"admin@site {rogue_pub}\n".encode())
    path = site.registry / "recipes" / "held" / "1.toml"
    evil = path.read_bytes().replace(b"regdemo==1.0", b"regdemo==2.0")
    (tmp_path / "evil.toml").write_bytes(evil)
    overwrite(path, evil)
    overwrite(Path(f"{path}.sig"), sign_as(rogue_key, tmp_path / "evil.toml"))
    edit_index(site, "held", "1", sha256=hashlib.sha256(evil).hexdigest())
    refused(site.user("create", "held", "--no-validate", **env), 10, "the allowed-signers file changed")
    nothing_created(site)


# -- signed means current: the signed version list, and what each user has seen of it --------------------------


def drop(site: Site, name: str, version: str) -> None:
    """What a registry writer without the key does to hide a version: remove it from index.json."""
    path = site.registry / "index.json"
    doc = json.loads(path.read_text())
    del doc["recipes"][name][version]
    overwrite(path, json.dumps(doc, indent=1).encode())


def memory(site: Site) -> Path:
    """Where the user's envbuilder keeps the newest version list it saw of the registry."""
    (found,) = (site.root / "eb-home" / "trust").glob("*.versions.json")
    return found


@needs_ssh
def test_a_version_dropped_from_the_index_is_refused_not_silently_older(signed, tmp_path):
    """roll@2 removed from index.json (no key needed): the latest request used to get roll@1 without a word."""
    drop(signed, "roll", "2")
    res = signed.user("create", "roll", "--no-validate")
    refused(res, 10, "roll@2 is in the signed version list but not in the index (removed from it)")
    assert "hint: its admins: publish any recipe again" in res.stderr
    nothing_created(signed)
    # Asking for the older version by name is allowed, and the registry's other recipes are untouched.
    assert signed.user_data("plan", "roll@1")["recipe_version"] == "1"
    assert signed.user_data("plan", "other")["recipe_version"] == "1"
    # The same with the signers pinned in the site config.
    config = tmp_path / "config.toml"
    config.write_text(
        f'[[registries]]\npath = "{signed.registry}"\nrequire_signatures = true\n'
        f'allowed_signers = "{signed.allowed}"\n'
    )
    site_env = {"ENVBUILDER_RECIPE_PATH": "", "ENVBUILDER_CONFIG": str(config)}
    refused(signed.user("plan", "roll", **site_env), 10, "roll@2 is in the signed version list but not")


@needs_ssh
def test_an_older_signed_index_put_back_is_refused(signed):
    """index.json as it was before roll@3, replayed after the user saw roll@3: a genuine, signed, older list."""
    before = (signed.registry / "index.json").read_bytes()
    signed.write("roll", demo="1.0", description="third")
    ok(signed.publish("roll", "--sign-key", str(signed.key)))
    assert signed.user_data("plan", "roll")["recipe_version"] == "3"
    overwrite(signed.registry / "index.json", before)
    res = signed.user("create", "roll", "--no-validate")
    refused(res, 10, "its signed version list (serial 3, made ")
    assert "is older than one you have seen (serial 4, made " in res.stderr
    assert f"remove {memory(signed)}" in res.stderr
    nothing_created(signed)
    # The whole replayed list is refused, a pinned version's too: none of it is the registry as it stands.
    refused(signed.user("plan", "roll@1"), 10, "is older than one you have seen")


@needs_ssh
def test_a_latest_request_never_resolves_lower_than_a_version_seen(signed):
    """Its admin, with the key, drops roll@2 and signs a list without it: the latest request is refused (the
    user saw roll@2), an explicit roll@1 still plans."""
    drop(signed, "roll", "2")
    signed.write("other", description="another recipe, again")
    ok(signed.publish("other", "--sign-key", str(signed.key)))
    res = signed.user("plan", "roll")
    refused(res, 10, "roll: the newest version")
    assert "lists now is 1, but you have seen roll@2 there" in res.stderr
    assert (
        "hint: ask its admins why roll@2 is gone; to use the older one on purpose, ask for roll@1"
        in res.stderr
    )
    assert signed.user_data("plan", "roll@1")["recipe_version"] == "1"
    assert json.loads(memory(signed).read_text())["recipes"]["roll"] == "2"


@needs_ssh
def test_an_index_without_its_signed_list_is_refused_and_republishing_migrates_it(signed):
    """The list stripped from index.json: refused where the user saw a signed one; for a user who never did
    (a registry published by an older envbuilder), refused because signatures are required, until republished."""
    path = signed.registry / "index.json"
    doc = json.loads(path.read_text())
    assert doc["signed_versions"]["signature"].startswith("-----BEGIN SSH SIGNATURE-----")
    del doc["signed_versions"]
    overwrite(path, json.dumps(doc, indent=1).encode())
    refused(
        signed.user("plan", "roll"), 10, "its index carries no version list, but you have seen a signed one"
    )
    memory(signed).unlink()
    res = signed.user("plan", "roll")
    refused(res, 10, "its index carries no version list (a registry published by an envbuilder before")
    assert "hint: its admins: publish any recipe again with `envbuilder publish NAME" in res.stderr
    # Publishing an unchanged recipe with the key signs the list anew.
    signed.write("other", description="another recipe")
    assert "unchanged" in ok(signed.publish("other", "--sign-key", str(signed.key))).stdout
    assert "signature" in json.loads(path.read_text())["signed_versions"]
    assert signed.user_data("plan", "roll")["recipe_version"] == "2"


@needs_ssh
def test_the_signer_shown_is_the_one_the_signature_names(signed, tmp_path):
    """index.json claims mallory signed roll@2 (the index is not signed): show and list name the real signer."""
    edit_index(signed, "roll", "2", signer="mallory@evil")
    shown = signed.user_data("recipes", "show", "roll")
    assert shown["published"]["signer"] == "admin@site"
    out = ok(signed.user("recipes", "show", "roll")).stdout
    assert "signed by admin@site" in out and "mallory" not in out
    rows = {r["name"]: r for r in signed.user_data("recipes", "list")["recipes"]}
    assert rows["roll"]["published"]["signer"] == "admin@site"
    # A forged signature is no signer at all: refused, whatever the index claims.
    copy = tmp_path / "2.toml"
    shutil.copy(signed.registry / "recipes" / "roll" / "2.toml", copy)
    overwrite(signed.registry / "recipes" / "roll" / "2.toml.sig", sign_as(signed.rogue, copy))
    refused(signed.user("recipes", "show", "roll"), 10, "unknown signer")


def test_an_unsigned_version_is_shown_unsigned_whatever_the_index_claims(site):
    site.write("plain")
    ok(site.publish("plain"))
    edit_index(site, "plain", "1", signer="admin@site")
    assert site.user_data("recipes", "show", "plain")["published"]["signer"] is None
    assert "; unsigned" in ok(site.user("recipes", "show", "plain")).stdout


@needs_ssh
def test_attaching_a_report_keeps_the_signed_list(signed):
    """A validation report changes the index but no version: its signed list (serial and signature) stays."""
    from envbuilder.recipe import publish
    from envbuilder.recipe.registry import Registry

    before = json.loads((signed.registry / "index.json").read_text())["signed_versions"]
    publish.attach_validation(Registry(signed.registry), "roll", "2", {"status": "passed", "date": "today"})
    after = json.loads((signed.registry / "index.json").read_text())
    assert after["signed_versions"] == before
    assert after["recipes"]["roll"]["2"]["validations"][0]["status"] == "passed"
    assert signed.user_data("plan", "roll")["recipe_version"] == "2"


@needs_ssh
def test_a_publish_without_the_key_cannot_leave_a_signed_list_unsigned(site, tmp_path):
    """A registry that does not require signatures but whose list was signed: an unsigned publish would drop the
    list's signature (and lock out every user who saw it), so it is refused before anything is written."""
    keys = tmp_path / "keys"
    keys.mkdir()
    key, pub = keypair(keys, "admin")
    allowed = keys / "allowed_signers"
    allowed.write_text(f"admin@site {pub}\n")
    site.write("opt")
    ok(site.publish("opt", "--sign-key", str(key), "--allowed-signers", str(allowed)))
    site.write("opt", demo="2.0")
    refused(site.publish("opt"), 10, "signs its list of versions, so every publish must sign it anew")
    assert sorted(p.name for p in (site.registry / "recipes" / "opt").iterdir()) == ["1.toml", "1.toml.sig"]
    assert site.user_data("plan", "opt")["recipe_version"] == "1"
