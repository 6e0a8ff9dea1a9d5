"""What a plan is (``Plan``, frozen) and its record (``Plan.to_json``: ``plan --json`` and an env's record, shaped
as :class:`envbuilder.core.records.RecordedPlan`); ``envbuilder.plan.build`` makes one. Pure."""

from __future__ import annotations

from dataclasses import field
from typing import TYPE_CHECKING, Any, Optional

from envbuilder import lockfile
from envbuilder.core.facts import HostFacts
from envbuilder.core.records import RecordedPlan, RecordedPython
from envbuilder.core.structs import dataclass
from envbuilder.plan import lockfit
from envbuilder.plan.activation import Activation
from envbuilder.plan.prefix import PrefixFilesystem
from envbuilder.plan.steps import InstallStep
from envbuilder.plan.target import TargetFact
from envbuilder.recipe import sections
from envbuilder.resolver.wheels import Resolution

if TYPE_CHECKING:
    from envbuilder.plan.container import ContainerPlan


@dataclass(frozen=True)
class Plan:
    recipe: str
    site: Optional[str]
    status: str
    kind: str
    prefix: str
    python: RecordedPython
    module_system: str
    module_use: tuple[str, ...]
    modules: tuple[str, ...]
    build_modules: tuple[str, ...]
    resolution: Optional[Resolution]
    extra_index_urls: tuple[str, ...]
    requirements: tuple[str, ...]
    install_steps: tuple[InstallStep, ...]
    activate: Activation
    launcher: str
    launch_command: tuple[str, ...]
    interactive_command: Optional[tuple[str, ...]]
    batch_script: Optional[str]
    target: HostFacts
    warnings: tuple[str, ...]
    notes: tuple[str, ...]
    corrections: tuple[sections.Correction, ...]
    filesystem: Optional[PrefixFilesystem]
    chain: tuple[str, ...]
    steps: tuple[str, ...] = field(default_factory=tuple)
    installer: str = "uv"
    system_site_packages: bool = False
    prefix_missing: tuple[str, ...] = ()
    #: A published recipe's registry version ("" for a plain recipe file).
    recipe_version: str = ""
    #: What a lock for this target must have been resolved from (see lockfile.inputs).
    lock_inputs: dict[str, Any] = field(default_factory=dict)
    #: The lock found for the recipe, and whether it applies; None where there is none.
    lock: Optional[lockfit.LockStatus] = None
    #: The locked packages as hashed requirements, and as constraints, written into the env before installing.
    lock_requirements: str = ""
    lock_pins: str = ""
    #: conda packages of the lock in use, name -> sha256, checked against the env once it is created.
    lock_conda: dict[str, str] = field(default_factory=dict)
    #: The lock's platform as it applies to the target (its markers evaluated): what --locked installs, every
    #: wheel of it checked against the env once installed.
    locked: Optional[lockfile.PlatformLock] = None
    #: The partition planned for (``--partition``); None for the site's default one.
    partition: Optional[str] = None
    #: Where the target's os, glibc and python came from (the site, the recipe, this host); () without a site.
    target_facts: tuple[TargetFact, ...] = ()
    #: A container env's image, runtime and how it is fetched and run (env.kind = "container"); None otherwise.
    container: Optional[ContainerPlan] = None

    @property
    def install_commands(self) -> tuple[tuple[str, ...], ...]:
        return tuple(s.display() for s in self.install_steps)

    def to_json(self) -> RecordedPlan:
        res = self.resolution
        return {
            "recipe": self.recipe,
            "recipe_version": self.recipe_version,
            "site": self.site,
            "status": self.status,
            "files": list(self.chain),
            "kind": self.kind,
            "installer": self.installer,
            "prefix": self.prefix,
            "python": self.python,
            "module_system": self.module_system,
            "module_use": list(self.module_use),
            "modules": list(self.modules),
            "build_modules": list(self.build_modules),
            "torch": res.to_json() if res else None,
            "index_url": res.index_url if res else None,
            "extra_index_urls": list(self.extra_index_urls),
            "requirements": list(self.requirements),
            "install_commands": [list(c) for c in self.install_commands],
            "activate": self.activate.to_json(),
            "launcher": self.launcher,
            "launch_command": list(self.launch_command),
            "interactive_command": list(self.interactive_command) if self.interactive_command else None,
            "batch_script": self.batch_script,
            "target": self.target.to_json(),
            "target_facts": [f.to_json() for f in self.target_facts],
            "filesystem": self.filesystem.to_json() if self.filesystem else None,
            "corrections": [c.to_json() for c in self.corrections],
            "steps": list(self.steps),
            "lock": self.lock.to_json() if self.lock else None,
            "lock_inputs": self.lock_inputs,
            "warnings": list(self.warnings),
            "notes": list(self.notes),
            "partition": self.partition,
            "container": self.container.to_json() if self.container else None,
        }
