"""The venv backends: a venv (kind ``venv``, and ``overlay``: a venv that sees the site python's packages) made
by the installer (uv, virtualenv, or python -m venv) and filled by it, and a user prefix (kind ``user-prefix``: no
env of its own; the site python installs into it and runs it, with PYTHONUSERBASE pointing there)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Optional

from envbuilder.backends import activation
from envbuilder.backends.base import Backend, Build
from envbuilder.plan.activation import Activation
from envbuilder.plan.steps import InstallStep


class VenvBackend(Backend):
    """A venv the installer makes and fills; an overlay's sees the site python's packages."""

    def create(self, build: Build, step: Optional[InstallStep], env: Mapping[str, str]) -> None:
        super().create(build, step, env)
        if not (build.parent and self.system_site_packages):
            return
        sites = sorted(build.partial.glob("lib/python*/site-packages"))
        pth = parent_site_pth(sites[0], build.parent) if sites else None
        if pth is not None:
            build.log.write(
                f"parent python is a venv ({build.parent['prefix']}): {pth.name} adds its site-packages"
            )

    def move_in(self, build: Build) -> None:
        if build.installer.relocatable:
            return
        changed = relocate_scripts(build.partial, build.final)
        build.log.write(f"relocated {len(changed)} file(s) from {build.partial} to {build.final}")


class UserPrefixBackend(Backend):
    """A user base on top of the site python, which installs into it and runs it."""

    def needs_parent(self) -> bool:
        return True

    def own_env(self, partial: Path, env: Mapping[str, str]) -> dict[str, str]:
        return {"PYTHONUSERBASE": str(partial)}

    def create(self, build: Build, step: Optional[InstallStep], env: Mapping[str, str]) -> None:
        build.partial.mkdir(mode=0o755)

    def activate(self, build: Build, act: Activation) -> None:
        activation.install_user_prefix(build.partial, str(build.final), act)

    def site_python(self, build: Build) -> Optional[str]:
        return build.python


def parent_site_pth(env_site: Path, parent: Mapping[str, Any]) -> Optional[Path]:
    """When the base python is itself a venv, --system-site-packages reaches its *base*, not the venv: a .pth
    adds the parent venv's site-packages after the env's own (so the env's packages still win)."""
    if parent["prefix"] == parent["base_prefix"]:
        return None
    pth = env_site / "_envbuilder_parent_env.pth"
    pth.write_text("".join(f"{p}\n" for p in parent["site_packages"]), encoding="utf-8")
    return pth


def relocate_scripts(build: Path, final: Path) -> list[str]:
    """After a virtualenv/pip build beside the prefix: rewrite the build path to the final one in the files
    that carry it (activate scripts, script headers, pyvenv.cfg). Paths are plain (installers.choose checks)."""
    old, new = str(build), str(final)
    changed = []
    candidates = [build / "pyvenv.cfg", *sorted((build / "bin").iterdir())]
    for path in candidates:
        if path.is_symlink() or not path.is_file():
            continue
        data = path.read_bytes()
        if old.encode() not in data or b"\0" in data[:4096]:
            continue
        path.write_bytes(data.replace(old.encode(), new.encode()))
        changed.append(path.name)
    return changed
