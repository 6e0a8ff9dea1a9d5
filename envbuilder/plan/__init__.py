"""Resolve first, then apply: a loaded recipe and host facts become a frozen Plan of every step ``create`` takes.

The package's face: what callers outside it use. ``planning`` builds the plan (``build``, its ``Options``; a container env's
``build_container``, whose image part is ``container``'s); ``prefix`` says where the env goes; ``listing`` puts the steps in words; ``record`` is what a plan is and how it is
recorded; ``steps`` the install commands and ``installers`` each installer's command lines; ``activation`` the
activation; ``target`` the machine an env is for; ``lockfit`` whether a lock applies to it; ``suite`` what a
validation run launches (checks, device, launcher argv) and ``batch`` the job script around it, which a plan shows
and ``validate`` runs. All of it is pure: the caller brings the host facts, the environment mapping and the options.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from envbuilder.core.faces import lazy
from envbuilder.core.records import RecordedPlan, RecordedPython

if TYPE_CHECKING:  # `X as X`: mypy's strict re-exports; several on a line (ruff's I001 is off for faces)
    from envbuilder.plan.container import ContainerPlan as ContainerPlan
    from envbuilder.plan.planning import Options as Options, build as build, torch_request as torch_request
    from envbuilder.plan.planning import build_container as build_container
    from envbuilder.plan.prefix import FALLBACK_ROOT as FALLBACK_ROOT, PrefixFilesystem as PrefixFilesystem
    from envbuilder.plan.prefix import expand as expand
    from envbuilder.plan.record import Plan as Plan

__all__, __getattr__ = lazy(
    __name__,
    {
        "container": "ContainerPlan",
        "planning": "Options build build_container torch_request",
        "prefix": "FALLBACK_ROOT PrefixFilesystem expand",
        "record": "Plan",
    },
)
__all__ += ["RecordedPlan", "RecordedPython"]
