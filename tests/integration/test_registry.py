"""Site registries for real: recipes published to a directory, listed and built from it by a user with real uv
against a local index, tampered with, signed and checked with real ssh-keygen keys made here, republished, and
published by several processes at once."""

from __future__ import annotations

import json
import shutil
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO, ok, refused, run_cli, user_env
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


class Site:
    def __init__(self, root: Path, index: Any) -> None:
        self.root = root
        self.source = root / "admin-recipes"
        self.source.mkdir()
        (self.source / "base.toml").write_text(BASE)
        self.registry = root / "registry"
        self.scratch = root / "scratch"
        self.env = user_env(root, mirror_env(index))

    def write(self, name: str, demo: str = "1.0", description: str = "demo", version: str = "") -> Path:
        line = f'version = "{version}"' if version else ""
        path = self.source / f"{name}.toml"
        path.write_text(RECIPE.format(name=name, demo=demo, description=description, version=line))
        return path

    def admin(self, *args: str) -> subprocess.CompletedProcess[str]:
        return self._run(args, {"ENVBUILDER_RECIPE_PATH": str(self.source)})

    def user(self, *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
        return self._run(args, {"ENVBUILDER_RECIPE_PATH": str(self.registry), **extra})

    def _run(self, args: tuple[str, ...], extra: dict[str, str]) -> subprocess.CompletedProcess[str]:
        return run_cli(*args, env={**self.env, **extra}, timeout=300)

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
    assert "published regenv@1" in res.stderr
    # The published file is the whole recipe: the base it extended is merged in, so no unpublished file counts.
    text = (site.registry / "recipes" / "regenv" / "1.toml").read_text()
    assert "extends" not in text and 'installer = "uv"' in text and 'version = "1"' in text
    assert "unchanged" in ok(site.publish("regenv")).stderr

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
    assert "published regenv@2" in res.stderr and "packages" in res.stderr
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
    ok(site.user("create", "regenv@1", "--prefix", str(pinned), "--no-validate"))
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
    assert "unchanged" in ok(site.publish("pinned")).stderr
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
    assert "signed by admin@site" in res.stderr
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
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "envbuilder",
                    "publish",
                    str(src / "busy.toml"),
                    "--registry",
                    str(site.registry),
                ],
                env={**site.env, "ENVBUILDER_RECIPE_PATH": ""},
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                cwd=REPO,
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
    refused(site.publish("ww"), 10, "world-writable")
