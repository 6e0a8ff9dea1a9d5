"""The JSON shape of a recorded plan (pure types): what ``plan --json`` prints and an env's record keeps. The
planner writes it (``envbuilder.plan``: ``Plan.to_json``, ``Activation.to_json``), and the records
(:mod:`envbuilder.system.state`) keep it and hand it back to the planner's readers as it was written."""

# No ``from __future__ import annotations`` here: a TypedDict compiles each string annotation into a ForwardRef
# as its class is made (54 compiles: this import took 4.4 ms, now 0.9 ms, on the 2-core VM); evaluated ones cost
# nothing. So a class is defined before the classes that name it.
from typing import Any, Optional, TypedDict


class RecordedActivate(TypedDict, total=False):
    """An Activation as a recorded plan holds it (records from older releases may lack keys)."""

    modules: list[str]
    module_use: list[str]
    env: dict[str, str]
    unset: list[str]
    prepend: dict[str, list[str]]
    append: dict[str, list[str]]
    profiles: list[str]
    conda_env: Optional[str]
    #: The modules of ``modules`` that are the env's build modules (absent in records made before activation
    #: loaded them: those load only what ``activate.modules`` named).
    from_build: list[str]


class RecordedManaged(TypedDict, total=False):
    version: str
    dir: str
    mirror: str
    mirror_source: str
    downloads_json: str


class RecordedPython(TypedDict, total=False):
    command: str
    version: Optional[str]
    #: Where the version came from (target.env_python); records written before issue 33 lack it.
    source: str
    #: Where the interpreter comes from (plan.interpreter): ``module``, ``system`` or ``managed``; and in words.
    #: Records written before issue 37 lack both (their python is the site's).
    origin: str
    where: str
    #: A managed python's request: version, uv's install dir, download mirror (empty: uv's default) and why.
    managed: RecordedManaged


class RecordedPlan(TypedDict, total=False):
    """A Plan as JSON (``plan --json``, and what an env's record keeps). Records written by older releases, or
    by hand, may lack keys: readers use ``.get``."""

    recipe: str
    recipe_version: str
    site: Optional[str]
    status: str
    files: list[str]
    kind: str
    installer: str
    prefix: str
    python: RecordedPython
    module_system: str
    module_use: list[str]
    modules: list[str]
    build_modules: list[str]
    torch: Optional[dict[str, Any]]  # Resolution.to_json
    index_url: Optional[str]
    extra_index_urls: list[str]
    requirements: list[str]
    install_commands: list[list[str]]
    activate: RecordedActivate
    launcher: str
    launch_command: list[str]
    interactive_command: Optional[list[str]]
    batch_script: Optional[str]
    target: dict[str, Any]  # HostFacts.to_json
    target_facts: list[dict[str, Any]]  # TargetFact.to_json: where os, glibc and python came from
    filesystem: Optional[dict[str, Any]]  # PrefixFilesystem.to_json
    corrections: list[dict[str, str]]
    steps: list[str]
    lock: Optional[dict[str, Any]]  # applicability.LockStatus.to_json
    lock_inputs: dict[str, Any]
    warnings: list[str]
    notes: list[str]
    partition: Optional[str]
    container: Optional[dict[str, Any]]  # ContainerPlan.to_json: the image, its facts, runtime, file, fetch
