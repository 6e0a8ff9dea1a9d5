"""A container env's plan with what its image's registry says of it (labels, platforms, the digest it names now),
where the registry answers: the plan and create verbs both plan a container env through here."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Optional

from envbuilder import plan as planner
from envbuilder.core import containers
from envbuilder.core.facts import HostFacts
from envbuilder.recipe.loader import Recipe


def container_plan(
    recipe: Recipe,
    facts: HostFacts,
    env: Mapping[str, str],
    opts: Optional[planner.Options],
    *,
    offline: bool,
) -> planner.Plan:
    """``planner.build_container`` with the registry's facts (none offline, or for a local image)."""
    from envbuilder.resolver import imagefetch  # noqa: PLC0415 - urllib only when a registry is read

    image, why = None, ""
    text = recipe.container.image
    if text and containers.image_problem(text) is None:
        arch = (opts.arch if opts else None) or recipe.compute.arch or facts.arch
        ref = containers.mirrored(containers.parse_image(text), containers.registry_mirrors(env))
        image, why = imagefetch.read_image(ref, env, arch=arch, offline=offline)
    the_plan = planner.build_container(recipe, facts, env, opts, image=image.facts if image else None)
    notes = [f"registry: {why}"] if why else []
    box = the_plan.container
    if image is not None and image.digest and box is not None:
        notes.append(f"registry: {text} is {image.digest} now")
        box = replace(box, registry_digest=image.digest)
    return replace(the_plan, container=box, notes=(*the_plan.notes, *notes))
