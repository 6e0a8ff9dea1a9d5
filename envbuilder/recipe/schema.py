"""The recipe schema (the strict validator that walks a parsed TOML document against it is recipe.schemacheck).

One schema for every recipe file: a site file usually fills ``site``/``compute``/``scheduler``/``filesystems``,
a variant fills ``recipe``/``env``/``torch``; either may set anything, and ``extends`` merges them.
Its building blocks (``Field``, ``Table``, ``MapOf``, ``ArrayOf``) are recipe.spec's; recipe.schemajson renders it as the
JSON schema shipped for editors (``envbuilder recipes schema``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Optional

from packaging.utils import canonicalize_name

from envbuilder.core import containers, kinds, launchers
from envbuilder.core.errors import did_you_mean
from envbuilder.core.values import (
    CONDA_ENV,
    DIST_NAME,
    IMAGE_REQUIREMENT,
    MAX_CORES_PER_NODE,
    MAX_NODES,
    MODULE_NAME,
    NAME_RE,
    NOT_AN_OPTION,
    PARTITION,
    PATH_ENTRY,
    REQUIREMENT,
    TIME,
    VAR_RE,
    found,
)
from envbuilder.recipe import siteschema
from envbuilder.recipe.spec import ArrayOf, Field, MapOf, Spec, Table, join_key, type_name

SCHEMA_VERSION = 1

#: Where a venv's interpreter comes from (``python.source``): the site's, or a uv-managed CPython.
PYTHON_SOURCES = ("site", "managed")
#: The torch packages ``torch.packages`` may name; any other package goes in ``[[packages]]``.
TORCH_PACKAGES = ("torch", "torchvision", "torchaudio")
#: The resolver's gates a recipe may list in ``torch.allow`` to turn the gate's error into a warning.
GATES = (
    "variant-not-built",
    "aarch64-no-cuda-wheel",
    "python",
    "glibc",
    "driver",
    "gpu-arch",
    "nightly-unpinned",
    "nightly-stream-removed",
    "package-missing",
    "unlisted-release",
    "nightly-pruned",
    "index",
    "platform",
    "yanked",
)


def _package_problem(item: Mapping[str, Any]) -> Optional[tuple[str, str, Optional[str]]]:
    """(key, message, hint) where a [[packages]] entry's spec names another package than its name."""
    name, spec = item.get("name"), item.get("spec")
    if not isinstance(name, str) or not isinstance(spec, str):
        return None
    from packaging.requirements import Requirement  # noqa: PLC0415 - see values.requirement_problem

    declared = Requirement(spec).name  # the field rules have parsed it already
    if canonicalize_name(declared) == canonicalize_name(name):
        return None
    return (
        "spec",
        f"the requirement is for {declared!r}, not for the package's name {name!r}",
        f"set name = {declared!r}, or a spec that names {name}",
    )


def spec_at(dotted: str) -> Optional[Spec]:
    """The spec of a dotted key (any name stands for a free-form table's key), or None where the schema has no
    such key or the path runs through an array or a value."""
    spec: Spec = SCHEMA
    for part in dotted.split("."):
        if isinstance(spec, Table) and part in spec.fields:
            spec = spec.fields[part]
        elif isinstance(spec, MapOf):
            spec = spec.value
        else:
            return None
    return spec


def is_list(spec: Optional[Spec]) -> bool:
    """A key whose value is a list: an array of tables, or an array field."""
    return isinstance(spec, ArrayOf) or (isinstance(spec, Field) and spec.types is list)


def list_keys(spec: Optional[Spec] = None, path: str = "") -> list[str]:
    """The dotted keys of every list ``replace`` may name (``<name>`` for a free-form table's keys)."""
    spec = SCHEMA if spec is None else spec
    if is_list(spec):
        return [] if path == "replace" else [path]
    if isinstance(spec, MapOf):
        return list_keys(spec.value, join_key(path, "<name>"))
    if isinstance(spec, Table):
        return [key for name, sub in spec.fields.items() for key in list_keys(sub, join_key(path, name))]
    return []


def _drift_problem(table: Mapping[str, Any]) -> Optional[tuple[str, str, Optional[str]]]:
    """(key, message, hint) where ``drift_threshold`` is no fraction between 0 and 1."""
    value = table.get("drift_threshold")
    if value is None or (not isinstance(value, bool) and 0 < value < 1):
        return None
    return (
        "drift_threshold",
        f"expected a fraction between 0 and 1 (0.2 fails a figure 20 % worse than its median), found {value!r}",
        "set it to 0.2, say, or leave it unset to report drift without failing",
    )


def _replace_problem(doc: Mapping[str, Any]) -> Optional[tuple[str, str, Optional[str]]]:
    """(key, message, hint) of the first entry of the top-level ``replace`` that names no list this file sets."""
    names = doc.get("replace")
    if names is None:
        return None
    if "extends" not in doc:
        return (
            "replace",
            "replace takes the place of a parent's lists, but this file extends nothing",
            "add extends = PARENT, or remove replace",
        )
    for i, name in enumerate(names):
        spec = spec_at(name) if name != "replace" else None
        if spec is None:
            lists = list_keys()
            return (
                f"replace[{i}]",
                f"expected the dotted key of a list (packages, modules.load, ...), found {found(name)}",
                did_you_mean(name, lists) or f"lists: {', '.join(lists)}",
            )
        if not is_list(spec):
            kind = type_name(spec.types) if isinstance(spec, Field) else "a table"
            return (
                f"replace[{i}]",
                f"expected the dotted key of a list, found {found(name)} ({name} holds {kind})",
                "only lists add up under extends: a child's value of any other key replaces its parent's already",
            )
        if _value_at(doc, name) is None:
            return (
                f"replace[{i}]",
                f"replace names {name}, which this file does not set",
                f"set {name} here (an empty list drops the parent's), or take it out of replace",
            )
    return None


def _value_at(doc: Mapping[str, Any], dotted: str) -> Any:
    node: Any = doc
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return node


SCHEMA = Table(
    {
        "schema_version": Field(int, "recipe language version; this release reads 1", required=True),
        "extends": Field(str, "parent: a path relative to this file (ends in .toml) or a recipe name"),
        "replace": Field(
            list,
            "lists (dotted keys: packages, modules.load) this file sets in place of its parents' instead of "
            "adding to them",
            items=str,
        ),
        "recipe": Table(
            {
                "name": Field(
                    str,
                    "the name users type; must equal the file name without .toml",
                    pattern=NAME_RE,
                    example="vista-venv-cu124",
                ),
                "description": Field(str, "what this recipe is; a child does not inherit it", prose=True),
                "version": Field(str, "recipe version (publishing assigns one if absent)"),
                "experimental": Field(bool, "true for recipes that track moving targets (nightlies)"),
                "example": Field(
                    bool,
                    "true for a recipe written from a site's public documentation that the site's admins have not "
                    "published (nor run) yet",
                ),
            }
        ),
        "corrections": ArrayOf(
            Table(
                {
                    "seed": Field(str, "what the source document says", required=True, prose=True),
                    "fix": Field(str, "what this recipe does instead", required=True, prose=True),
                    "source": Field(str, "evidence for the correction", prose=True),
                }
            ),
            "where a recipe departs from its source document, and why; accumulates along extends; plan prints each",
        ),
        **siteschema.SITE_TABLES,
        "env": Table(
            {
                "kind": Field(str, choices=tuple(kinds.KINDS)),
                "prefix": Field(str, "where the env goes; ${VAR} and {name} expand"),
                "filesystem": Field(str, "the filesystems entry the prefix lives on"),
                "system_site_packages": Field(bool, "see the site python's packages (overlay, Cirrus)"),
                "overlay": Field(
                    str,
                    "overlay envs: a venv on top of the site python (default), or a clone of its env",
                    choices=tuple(kinds.OVERLAYS),
                ),
                "installer": Field(str, choices=kinds.INSTALLER_NAMES),
            }
        ),
        "container": Table(
            {
                "image": Field(
                    str, "the base image: a registry reference or a local image path", rule=containers.IMAGE
                ),
                "runtime": Field(
                    str, "the container runtime that fetches and runs it", choices=tuple(containers.RUNTIMES)
                ),
                "binds": Field(
                    list,
                    "paths bound into the container (default: the [filesystems] entries visible on compute nodes)",
                    items=str,
                    rule=containers.BIND,
                ),
                "gpu": Field(
                    bool, "bring the host's NVIDIA driver in (--nv; default: when the target has GPUs)"
                ),
                "mpi": Field(
                    str, "the ranks' MPI: the host's bound in, or the image's", choices=containers.MPI_MODES
                ),
                "allow": Field(list, "image gates to downgrade to warnings", items=str),
                "packages": Field(
                    list,
                    "PEP 508 requirements installed on top of the image, into an overlay venv beside it that sees "
                    "the image's packages (the image's torch must stay the one seen)",
                    items=str,
                    rule=IMAGE_REQUIREMENT,
                ),
                "index": Field(
                    str,
                    "the package index container.packages come from: pypi (default) or a URL",
                    pattern=r"pypi|https?://[^\s,]+",
                    example="https://example.org/simple",
                ),
            },
            'env.kind = "container": the image the env is, and how it runs',
        ),
        "python": Table(
            {
                "command": Field(
                    str, "interpreter to build from, found on PATH after the modules load", rule=NOT_AN_OPTION
                ),
                "version": Field(
                    str,
                    "its version (major.minor); the resolver checks wheels against it",
                    pattern=r"\d+\.\d+(\.\d+)?",
                    example="3.11",
                ),
                "source": Field(
                    str,
                    "site: python.command on the PATH the modules give; managed: a uv-managed CPython of "
                    "python.version in the envbuilder home (venv envs; a site may forbid it)",
                    choices=PYTHON_SOURCES,
                ),
            }
        ),
        "conda": Table(
            {
                "channels": Field(list, items=str, rule=NOT_AN_OPTION),
                "packages": Field(
                    list, "conda packages besides python and pip", items=str, rule=NOT_AN_OPTION
                ),
                "engine": Field(str, choices=kinds.ENGINES),
            }
        ),
        "torch": Table(
            {
                "install": Field(bool, "false when the site env provides torch (overlay)"),
                "version": Field(str, "latest, a minor (2.7), a release (2.7.1) or a dated nightly"),
                "variant": Field(
                    str,
                    "auto, cpu, cuNNN, rocmX.Y or xpu",
                    pattern=r"auto|cpu|xpu|cu\d+|rocm\d+\.\d+(?:\.\d+)?",
                    example="cu126",
                ),
                "channel": Field(str, choices=("stable", "test", "nightly")),
                "packages": Field(list, "which of torch, torchvision, torchaudio to install", items=str),
                "torchvision": Field(str, "explicit torchvision version"),
                "torchaudio": Field(str, "explicit torchaudio version"),
                "allow": Field(list, "resolver gates to downgrade to warnings", items=str),
            }
        ),
        "packages": ArrayOf(
            Table(
                {
                    "name": Field(str, required=True, rule=DIST_NAME),
                    "spec": Field(
                        str,
                        "one PEP 508 requirement for this package (defaults to the name); a direct reference "
                        "(name @ URL) only to https://, git+https:// or git+ssh://",
                        rule=REQUIREMENT,
                    ),
                    "index": Field(
                        str,
                        "pypi (default), torch (the resolved torch index) or a URL",
                        pattern=r"pypi|torch|(https?|file)://\S+",
                        example="https://example.org/simple",
                    ),
                    "build_env": MapOf(Field(str), key_pattern=VAR_RE),
                    "build_env_prepend": MapOf(
                        Field(list, items=str, rule=PATH_ENTRY),
                        "directories (may use ${VAR}) put before the build environment's value of a colon-separated "
                        "list variable (LIBRARY_PATH), for this package's build",
                        key_pattern=VAR_RE,
                    ),
                    "no_build_isolation": Field(bool),
                    "no_binary": Field(bool, "build from source against the loaded modules (mpi4py)"),
                    "build_modules": Field(
                        list, "modules loaded only for this package's build", items=str, rule=MODULE_NAME
                    ),
                    "note": Field(str, prose=True),
                },
                check=_package_problem,
            ),
            "extra packages, installed after torch with torch's pins as constraints; a child's entry replaces "
            "its parent's entry of the same name",
            key=lambda item: canonicalize_name(item["name"]),
        ),
        "activate": Table(
            {
                "modules": Field(
                    list,
                    "modules activate loads after the build's (modules.load), unloaded on deactivate",
                    items=str,
                    rule=MODULE_NAME,
                ),
                "env": MapOf(Field(str), key_pattern=VAR_RE),
                "profiles": Field(list, "env_profiles applied on activate", items=str),
                "conda_env": Field(
                    str,
                    "the conda env activate runs `conda activate` on once the modules are loaded (a name such as "
                    "base, or an absolute prefix), and deactivate `conda deactivate`; the `conda` shell function "
                    "comes from the modules",
                    rule=CONDA_ENV,
                ),
            }
        ),
        "validation": Table(
            {
                "checks": Field(list, "checks to run after create", items=str),
                "nodes": Field(
                    int,
                    "nodes the checks run on (at most the partition's max_nodes)",
                    minimum=1,
                    maximum=MAX_NODES,
                ),
                "nproc_per_node": Field(
                    int, "ranks per node (default: GPUs per node)", minimum=1, maximum=MAX_CORES_PER_NODE
                ),
                "partition": Field(str, rule=PARTITION.rule),
                "time": Field(str, rule=TIME.rule),
                "launcher": Field(str, choices=tuple(launchers.LAUNCHERS)),
                "timeout": Field(
                    int,
                    "seconds each check may take before it counts as hung",
                    minimum=1,
                    maximum=7 * 24 * 3600,
                ),
                "filesystems": Field(
                    list, "[filesystems] entries every rank writes to (default $SCRATCH)", items=str
                ),
                "references": ArrayOf(
                    Table(
                        {
                            "figure": Field(
                                str,
                                "CHECK.FIGURE the report shows",
                                required=True,
                                pattern=r"[a-z]+\.[a-z0-9_]+",
                                example="nccl.busbw",
                            ),
                            "value": Field((int, float), "the expected figure", required=True),
                            "lower": Field((int, float), "allowed fraction below value (-0.1 = 10 % below)"),
                            "upper": Field((int, float), "allowed fraction above value; unset = unbounded"),
                            "unit": Field(str),
                            "partition": Field(
                                str, "the partition it was measured on (unset: any)", rule=PARTITION.rule
                            ),
                            "ranks": Field(
                                int, "the rank count it holds for (unset: any)", minimum=1, maximum=2**31 - 1
                            ),
                        }
                    ),
                    "performance references, ReFrame style: out of bounds is a FAIL",
                    # One bound per figure, partition and rank count: a child's takes its parent's place.
                    key=lambda ref: (ref["figure"], ref.get("partition"), ref.get("ranks")),
                ),
                "drift_threshold": Field(
                    (int, float),
                    "fail validate when a figure is this fraction worse than its median over the env's last runs "
                    "on the partition (0.2 = 20 %); unset: the drop is reported, the exit status unchanged",
                ),
            },
            check=_drift_problem,
        ),
    },
    check=_replace_problem,
)
