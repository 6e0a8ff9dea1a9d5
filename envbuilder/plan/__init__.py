"""Resolve first, then apply: a loaded recipe and host facts become a frozen Plan of every step ``create`` takes.

The package's face: what callers outside it use. ``planning`` builds the plan (``build``, its ``Options``; a container env's
``build_container``, whose image part is ``container``'s); ``prefix`` says where the env goes; ``listing`` puts the steps in words; ``record`` is what a plan is and how it is
recorded; ``steps`` the install commands and ``installers`` each installer's command lines; ``activation`` the
activation; ``target`` the machine an env is for; ``lockfit`` whether a lock applies to it; ``suite`` what a
validation run launches (checks, device, launcher argv) and ``batch`` the job script around it, which a plan shows
and ``validate`` runs. All of it is pure: the caller brings the host facts, the environment mapping and the options.
"""

from __future__ import annotations

from envbuilder.core.records import RecordedPlan, RecordedPython
from envbuilder.plan.container import ContainerPlan
from envbuilder.plan.planning import Options, build, build_container, torch_request
from envbuilder.plan.prefix import FALLBACK_ROOT, expand
from envbuilder.plan.record import Plan, PrefixFilesystem

__all__ = [
    "FALLBACK_ROOT",
    "ContainerPlan",
    "Options",
    "Plan",
    "PrefixFilesystem",
    "RecordedPlan",
    "RecordedPython",
    "build",
    "build_container",
    "expand",
    "torch_request",
]
