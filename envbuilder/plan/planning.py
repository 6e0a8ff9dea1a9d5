"""Resolve first, then apply: turn a loaded recipe and host facts into a frozen Plan of every step ``create`` takes.

Pure: the caller passes the host facts (probe or --facts), the environment mapping used for ${VAR} expansion,
and options. Nothing here reads the file system or starts a process. Where the env goes is ``prefix``'s, the steps
in words ``listing``'s; what a plan is and how it is recorded is ``record``'s; the install commands are ``steps``',
the activation ``activation``'s, the target machine ``target``'s.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Optional

from envbuilder import lockfile
from envbuilder.core import launchers
from envbuilder.core.facts import HostFacts
from envbuilder.core.kinds import AUTO, CLI_ENGINES, kind_info
from envbuilder.core.records import RecordedPython
from envbuilder.core.structs import dataclass
from envbuilder.plan import interpreter, lockfit, suite
from envbuilder.plan.activation import activation_for
from envbuilder.plan.container import box_python, container_plan, exec_prefix, image_target_facts
from envbuilder.plan.container import steps_in_words as container_steps
from envbuilder.plan.listing import steps_in_words
from envbuilder.plan.prefix import filesystem_for, prefix_for
from envbuilder.plan.record import Plan
from envbuilder.plan.steps import InstallStep, NewEnv, install_steps
from envbuilder.plan.target import env_python, fact_origins, host_fact_warnings, target_facts
from envbuilder.resolver import gates, mirror
from envbuilder.resolver.wheels import Matrix, Resolution, TorchRequest, resolve

if TYPE_CHECKING:
    # indexfacts is read at plan time by envbuilder.resolver.indexread; the planner only receives the value. loader is only
    # named: it reaches the registry (ssh-keygen), which a pure module must not import.
    from envbuilder.recipe.loader import Recipe
    from envbuilder.resolver.images import ImageFacts
    from envbuilder.resolver.indexfacts import IndexFacts


@dataclass(frozen=True)
class Options:
    prefix: Optional[str] = None
    launcher: Optional[str] = None
    nodes: Optional[int] = None
    nproc_per_node: Optional[int] = None
    account: Optional[str] = None
    installer: Optional[str] = None
    #: Plan for nodes of this architecture, wherever this runs (``envbuilder lock --platform``).
    arch: Optional[str] = None
    #: Refuse to build unless a lock applies (``create --locked``).
    locked: bool = False
    #: Plan for this partition's nodes (its GPUs and cores) instead of the site's default one.
    partition: Optional[str] = None
    #: The host facts are a compute node's own (edited to describe it after a planned change: ``impact``).
    node_facts: bool = False


def torch_request(recipe: Recipe) -> Optional[TorchRequest]:
    """What the recipe asks of torch, or None when torch comes from the site (torch.install = false)."""
    torch = recipe.torch
    if not torch.install:
        return None
    return TorchRequest(
        version=torch.version,
        variant=torch.variant,
        channel=torch.channel,
        packages=torch.packages,
        torchvision=torch.torchvision,
        torchaudio=torch.torchaudio,
        allow=frozenset(torch.allow),
    )


def build(
    recipe: Recipe,
    host: HostFacts,
    env: Mapping[str, str],
    opts: Optional[Options] = None,
    *,
    matrix: Optional[Matrix] = None,
    lock: Optional[lockfile.Lock] = None,
    index: Optional[IndexFacts] = None,
    table_age: str = "",
) -> Plan:
    """The Plan for ``recipe`` on the machine ``host`` describes, from the shipped table corrected by ``index``
    (what the wheel indexes said; the table alone without it). Raises ResolverErrors on a failed gate, and
    LockError when ``opts.locked`` and ``lock`` does not apply to the target. A container env's plan is
    :func:`build_container`'s (from the image table alone, here)."""
    if kind_info(recipe.env.kind).container:
        return build_container(recipe, host, env, opts, matrix=matrix)
    opts = opts or Options()
    warnings, notes, target = _start(recipe, host, opts)
    kind = recipe.env.kind
    installer = opts.installer or recipe.env.installer
    prefix, prefix_missing = prefix_for(recipe, env, opts.prefix, warnings)
    fs = filesystem_for(recipe, prefix, env, warnings)

    python = interpreter.plan_python(recipe, env, target.python, env_python(recipe, host)[1])
    warnings.extend(interpreter.managed_remarks(recipe))
    python_cmd = python["command"]
    launch_python = f"{prefix}/bin/python" if kind_info(kind).own_python else python_cmd

    if kind_info(kind).conda:  # the recipe's own channel mistake first: it holds whatever the index says
        gates.conda_pytorch_gate(recipe.name, recipe.conda, recipe.torch)
    resolution = _resolve_torch(
        recipe, target, warnings, notes, matrix=matrix, index=index, table_age=table_age
    )
    origins = fact_origins(recipe, host, target)
    warnings.extend(host_fact_warnings(origins, resolution is not None))
    packages = recipe.packages
    requirements = [*(resolution.requirements if resolution else ()), *(p.requirement for p in packages)]
    lock_inputs = lockfit.lock_inputs(kind, target.python, resolution, packages, recipe)
    locked, lock_status = lockfit.applicable_lock(
        recipe.name, lock, lock_inputs, target.arch, locked=opts.locked, warnings=warnings, glibc=target.glibc
    )
    if locked is not None and lock is not None:
        _lock_remarks(recipe.name, lock, locked, warnings, notes)
    channels = _conda_channels(recipe, env, notes)
    steps_, extra_indexes = install_steps(
        NewEnv(kind, installer, python_cmd, prefix, target.python),
        recipe,
        resolution,
        packages,
        warnings,
        locked=locked,
        channels=channels,
    )
    steps_ = _mirrored(steps_, env, notes)
    _module_remarks(recipe, warnings)
    activate = activation_for(recipe)

    launcher_name, launch, interactive, script = _launch(
        recipe,
        target,
        suite.LaunchedEnv(prefix, launch_python, activate, kind_info(kind).own_python),
        opts=opts,
        warnings=warnings,
    )
    steps = steps_in_words(recipe, prefix, [s.display() for s in steps_], activate, launcher_name)
    return Plan(
        recipe=recipe.name,
        site=recipe.site.name,
        status=recipe.site.status,
        kind=kind,
        prefix=prefix,
        python=python,
        module_system=recipe.modules.system,
        module_use=recipe.modules.use,
        modules=recipe.modules.load,
        build_modules=recipe.modules.build_only,
        resolution=resolution,
        extra_index_urls=tuple(extra_indexes),
        requirements=tuple(requirements),
        install_steps=tuple(steps_),
        installer=installer,
        prefix_missing=tuple(prefix_missing),
        system_site_packages=recipe.env.system_site_packages
        or (kind_info(kind).overlay and recipe.env.overlay != "clone"),
        activate=activate,
        launcher=launcher_name,
        launch_command=tuple(launchers.plain(launch)),
        interactive_command=tuple(interactive) if interactive else None,
        batch_script=script,
        target=target,
        warnings=tuple(dict.fromkeys(warnings)),
        notes=tuple(dict.fromkeys(notes)),
        corrections=recipe.corrections,
        filesystem=fs,
        chain=recipe.chain,
        steps=tuple(steps),
        recipe_version=recipe.version,
        lock_inputs=lock_inputs,
        lock=lock_status,
        lock_requirements=locked.requirements_txt() if locked else "",
        lock_pins=locked.pins() if locked else "",
        lock_conda={p.name: p.files[0].sha256 for p in locked.conda} if locked else {},
        locked=locked,
        partition=opts.partition,
        target_facts=origins,
    )


def build_container(
    recipe: Recipe,
    host: HostFacts,
    env: Mapping[str, str],
    opts: Optional[Options] = None,
    *,
    image: Optional[ImageFacts] = None,
    matrix: Optional[Matrix] = None,
) -> Plan:
    """The Plan of a container env (env.kind = "container"): its image from the image table corrected by
    ``image`` (what its registry said of it), checked against the target. Raises RecipeError without an image,
    ResolverErrors on a failed gate."""
    opts = opts or Options()
    warnings, notes, target = _start(recipe, host, opts)
    kind = recipe.env.kind
    prefix, prefix_missing = prefix_for(recipe, env, opts.prefix, warnings)
    fs = filesystem_for(recipe, prefix, env, warnings)
    base = Plan(
        recipe=recipe.name,
        site=recipe.site.name,
        status=recipe.site.status,
        kind=kind,
        prefix=prefix,
        python={"command": "python3", "version": None, "source": "the image"},
        module_system=recipe.modules.system,
        module_use=recipe.modules.use,
        modules=recipe.modules.load,
        build_modules=recipe.modules.build_only,
        resolution=None,
        extra_index_urls=(),
        requirements=(),
        install_steps=(),
        activate=activation_for(recipe),
        launcher=opts.launcher or recipe.launcher.default,
        launch_command=(),
        interactive_command=None,
        batch_script=None,
        target=target,
        warnings=(),
        notes=(),
        corrections=recipe.corrections,
        filesystem=fs,
        chain=recipe.chain,
        recipe_version=recipe.version,
        prefix_missing=tuple(prefix_missing),
        partition=opts.partition,
    )
    return _with_container(base, recipe, env, warnings, notes, image=image, matrix=matrix, opts=opts)


def _with_container(
    base: Plan,
    recipe: Recipe,
    env: Mapping[str, str],
    warnings: list[str],
    notes: list[str],
    *,
    image: Optional[ImageFacts],
    matrix: Optional[Matrix],
    opts: Options,
) -> Plan:
    """A container env's plan: the image checked against the target, how it is fetched and run (the
    validation's ranks inside it, through the runtime, with the env's copy of the payload bound in)."""
    box = container_plan(recipe, base.target, env, base.prefix, warnings, image=image, matrix=matrix)
    wrap = exec_prefix(
        box.to_json(),
        box.file,
        read_only=[f"{base.prefix}/envbuilder/payloads"],
        gpu=suite.device_for(base.target, cpu=False) == "cuda",
    )
    launched = suite.LaunchedEnv(
        base.prefix, box_python(box.to_json()), base.activate, own_python=False, wrap=wrap, mpi=box.mpi
    )
    launcher_name, launch, interactive, script = _launch(
        recipe, base.target, launched, opts=opts, warnings=warnings
    )
    python: RecordedPython = {
        "command": "python3",
        "version": box.pick.facts.python,
        "source": "the image",
        "origin": "image",
        "where": f"the overlay venv's python ({box.python}), on top of the image's own python3, run through the "
        "container runtime"
        if box.overlay
        else "the image's own python3, run through the container runtime",
    }
    return replace(
        base,
        python=python,
        container=box,
        launcher=launcher_name,
        launch_command=tuple(launchers.plain(launch)),
        interactive_command=tuple(interactive) if interactive else None,
        batch_script=script,
        steps=tuple(container_steps(box, base.prefix)),
        target_facts=image_target_facts(box.pick.facts),
        warnings=tuple(dict.fromkeys(warnings)),
        notes=tuple(dict.fromkeys(notes)),
    )


def _start(recipe: Recipe, host: HostFacts, opts: Options) -> tuple[list[str], list[str], HostFacts]:
    """What every plan starts from: the recipe's own remarks, and the target machine's facts (with theirs)."""
    warnings: list[str] = []
    notes: list[str] = []
    _recipe_remarks(recipe, warnings, notes)
    target = target_facts(
        recipe, host, warnings, notes, arch_override=opts.arch, partition=opts.partition, node=opts.node_facts
    )
    return warnings, notes, target


def _recipe_remarks(recipe: Recipe, warnings: list[str], notes: list[str]) -> None:
    """What the recipe itself says about its standing: a retired site, corrections, experimental."""
    if recipe.site.status == "retired":
        warnings.append(
            f"{recipe.site.name} is retired ({recipe.site.retired_on or 'date unknown'}): this recipe plans, but "
            "cannot be validated on the machine it describes"
        )
    for corr in recipe.corrections:
        notes.append(f"corrected: {corr.seed} -> {corr.fix}")
    if recipe.recipe.experimental:
        warnings.append("experimental recipe: it tracks a moving target")
    if recipe.recipe.example:
        warnings.append(
            f"example recipe: written from {recipe.site.name or 'the site'}'s public documentation; its admins "
            "have not published it, and it has not run there"
        )


def _resolve_torch(
    recipe: Recipe,
    target: HostFacts,
    warnings: list[str],
    notes: list[str],
    *,
    matrix: Optional[Matrix],
    index: Optional[IndexFacts],
    table_age: str,
) -> Optional[Resolution]:
    """The torch build for ``target``; None when torch comes from the site."""
    request = torch_request(recipe)
    if request is None:
        notes.append(
            "torch comes from the site's environment (torch.install = false); validation records its version"
        )
        return None
    resolution = resolve(request, target, matrix, index, table_age)
    named = re.search(r"(?<![a-z0-9])(cu\d{3}|cpu)(?![a-z0-9])", recipe.name)
    if named and named.group(1) != resolution.variant:
        # The recipe keeps a name users already type, but installs something else: say so every time.
        warnings.append(
            f"{recipe.name} installs {resolution.variant}, not the {named.group(1)} its name says; "
            "its corrections explain why"
        )
    warnings.extend(resolution.warnings)
    notes.extend(resolution.notes)
    return resolution


def _lock_remarks(
    name: str, lock: lockfile.Lock, locked: lockfile.PlatformLock, warnings: list[str], notes: list[str]
) -> None:
    notes.append(
        f"locked: {len(locked.packages)} packages for {locked.arch} from {lock.path} ({lock.origin}), "
        "installed by version and sha256"
    )
    whole = lock.for_arch(locked.arch)
    for pkg in whole.packages if whole else ():
        if pkg not in locked.packages:
            notes.append(
                f"locked: {pkg.name} {pkg.version} is only for `{pkg.marker}`, not this target: left out"
            )
    if lock.nightly():
        warnings.append(lockfile.nightly_warning(name))


def _conda_channels(recipe: Recipe, env: Mapping[str, str], notes: list[str]) -> list[str]:
    """A conda env's channels, through the mirror rules (none for other kinds)."""
    if not kind_info(recipe.env.kind).conda:
        return []
    channels, channel_notes = mirror.remap_channels(recipe.conda.channels, mirror.from_env(env))
    notes.extend(channel_notes)
    if recipe.conda.engine == AUTO:
        notes.append(
            f"conda engine: the first of {', '.join(CLI_ENGINES)} on PATH once the modules are loaded, "
            "else the embedded py-rattler"
        )
    return channels


def _mirrored(steps: list[InstallStep], env: Mapping[str, str], notes: list[str]) -> list[InstallStep]:
    """The steps with their index URLs through the mirror rules."""
    remapped, mirror_notes = mirror.remap([s.argv for s in steps], mirror.from_env(env))
    notes.extend(mirror_notes)
    return [replace(s, argv=tuple(argv)) for s, argv in zip(steps, remapped)]


def _module_remarks(recipe: Recipe, warnings: list[str]) -> None:
    if recipe.modules.system == "none":
        return
    for mod in recipe.modules.load:
        if "/" not in mod:
            warnings.append(
                f"module {mod!r} has no version: the site default decides (pin it to make builds repeat)"
            )


def _launch(
    recipe: Recipe, target: HostFacts, env: suite.LaunchedEnv, *, opts: Options, warnings: list[str]
) -> tuple[str, list[launchers.Arg], Optional[list[str]], Optional[str]]:
    device = suite.device_for(target, cpu=False)
    payload = suite.Payload(
        checks=suite.checks_for(recipe, None),
        device=device,
    )
    run = suite.launch(
        recipe,
        target,
        env,
        payload,
        # The env's own copy (create writes it): compute nodes see the env, not necessarily envbuilder.
        package_dir=f"{env.prefix}/envbuilder",
        warnings=warnings,
        request=suite.LaunchRequest(
            opts.launcher, opts.nodes, opts.nproc_per_node, opts.account, opts.partition
        ),
    )
    interactive = list(run.interactive) if run.interactive else None
    return run.launcher, list(run.argv), interactive, run.script
