"""The recipe schema, and the strict validator that walks a parsed TOML document against it.

One schema for every recipe file: a site file usually fills ``site``/``compute``/``scheduler``/``filesystems``,
a variant fills ``recipe``/``env``/``torch``; either may set anything, and ``extends`` merges them.
The same spec renders the JSON schema shipped for editors (``envbuilder recipes schema``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Callable, Optional, Union

from envbuilder.errors import RecipeError, did_you_mean

SCHEMA_VERSION = 1

ENV_KINDS = ("venv", "conda", "user-prefix", "overlay")
INSTALLERS = ("uv", "pip", "virtualenv")
LAUNCHERS = ("local", "torchrun", "srun", "ibrun", "mpiexec", "mpirun")
SCHEDULERS = ("slurm", "pbs", "none")
MODULE_SYSTEMS = ("lmod", "environment-modules", "none")
GPU_REQUEST_STYLES = ("gpus-per-node", "gres", "gpus", "none", "pbs-ngpus")
GPU_AFFINITY = ("none", "local-rank", "reverse-local-rank")
STATUSES = ("active", "retired")
CHECKS = ("import", "gpu", "arch", "cuda", "libraries", "nccl", "ddp", "mpi", "filesystem", "horovod")

NAME_RE = r"[a-z0-9][a-z0-9._-]*"


@dataclass(frozen=True)
class Field:
    types: Union[type, tuple[type, ...]]
    doc: str = ""
    choices: tuple[str, ...] = ()
    pattern: Optional[str] = None
    items: Optional[type] = None  # for lists: the element type
    required: bool = False
    example: str = ""  # shown when a value does not match ``pattern``


@dataclass(frozen=True)
class Table:
    fields: Mapping[str, Union[Field, Table, MapOf, ArrayOf]]
    doc: str = ""
    required: bool = False


@dataclass(frozen=True)
class MapOf:
    """A table whose keys are free-form names (partitions, file systems, profiles) and whose values share a spec."""

    value: Union[Field, Table]
    doc: str = ""
    key_pattern: Optional[str] = None
    required: bool = False


@dataclass(frozen=True)
class ArrayOf:
    """An array of tables ([[packages]])."""

    item: Table
    doc: str = ""
    required: bool = False


Spec = Union[Field, Table, MapOf, ArrayOf]

SCHEMA = Table(
    {
        "schema_version": Field(int, "recipe language version; this release reads 1", required=True),
        "extends": Field(str, "parent: a path relative to this file (ends in .toml) or a recipe name"),
        "recipe": Table(
            {
                "name": Field(
                    str,
                    "the name users type; must equal the file name without .toml",
                    pattern=NAME_RE,
                    example="vista-venv-cu124",
                ),
                "description": Field(str),
                "version": Field(str, "recipe version (publishing assigns one if absent)"),
                "experimental": Field(bool, "true for recipes that track moving targets (nightlies)"),
            }
        ),
        "corrections": ArrayOf(
            Table(
                {
                    "seed": Field(str, "what the source document says", required=True),
                    "fix": Field(str, "what this recipe does instead", required=True),
                    "source": Field(str, "evidence for the correction"),
                }
            ),
            "where a recipe departs from its source document, and why; accumulates along extends; plan prints each",
        ),
        "site": Table(
            {
                "name": Field(str, pattern=NAME_RE, example="vista-venv-cu124"),
                "center": Field(str),
                "title": Field(str),
                "status": Field(str, choices=STATUSES),
                "retired_on": Field(str, pattern=r"\d{4}-\d{2}-\d{2}", example="2025-12-08"),
                "validatable": Field(bool, "false where the machine no longer exists"),
                "document": Field(str, "source document (URL or seed file)"),
                "document_date": Field(str, pattern=r"\d{4}-\d{2}(-\d{2})?", example="2024-09-18"),
                "notes": Field(str),
            }
        ),
        "compute": Table(
            {
                "arch": Field(str, choices=("x86_64", "aarch64")),
                "gpus_per_node": Field(int),
                "gpu": Field(str, "GPU model as the driver names it"),
                "compute_capability": Field(str, pattern=r"\d+\.\d+", example="9.0"),
                "driver_version": Field(str, pattern=r"\d+\.\d+(\.\d+)?", example="550.54.15"),
                "max_cuda": Field(
                    str, "highest CUDA the driver supports", pattern=r"\d+\.\d+", example="12.9"
                ),
                "glibc": Field(str, pattern=r"\d+\.\d+", example="2.28"),
                "cores_per_node": Field(int),
                "memory_gb": Field(int),
                "interconnect": Field(str),
            },
            "facts of the compute partition the env is built for (not of the login node)",
        ),
        "scheduler": Table(
            {
                "type": Field(str, choices=SCHEDULERS),
                "interactive": Field(list, "argv template of the interactive allocation", items=str),
                "batch": Field(str, "batch submit command (sbatch, qsub)"),
                "gpu_request": Field(str, "how a job asks for GPUs", choices=GPU_REQUEST_STYLES),
                "forbidden_flags": Field(list, "flags the site rejects", items=str),
                "allowed_flags": Field(list, "if set, the only flags a batch script may carry", items=str),
                "required_flags": Field(list, "flags every job must carry", items=str),
                "partition": Field(str, "default partition/queue for validation jobs"),
                "exclusive_nodes": Field(bool, "jobs get whole nodes (no --cpus-per-task needed)"),
                "time": Field(
                    str, "default walltime (HH:MM:SS)", pattern=r"\d+:\d{2}:\d{2}", example="01:30:00"
                ),
                "account_required": Field(bool),
                "partitions": MapOf(
                    Table(
                        {
                            "gpus_per_node": Field(int),
                            "max_nodes": Field(int),
                            "max_time": Field(str, pattern=r"\d+:\d{2}:\d{2}", example="01:30:00"),
                            "dev": Field(bool, "a short-turnaround debug queue"),
                            "gpu": Field(str),
                            "cores_per_node": Field(int),
                            "notes": Field(str),
                        }
                    )
                ),
            }
        ),
        "modules": Table(
            {
                "system": Field(str, choices=MODULE_SYSTEMS),
                "use": Field(list, "paths for `module use`, in order", items=str),
                "load": Field(list, "modules loaded for the build, in order", items=str),
                "build_only": Field(list, "modules loaded only while building (cmake)", items=str),
            }
        ),
        "filesystems": MapOf(
            Table(
                {
                    "path": Field(str, "path, may use ${VAR}", required=True),
                    "purge_days": Field(int, "files unread this many days may be purged"),
                    "touch_allowed": Field(
                        bool,
                        "the site permits refreshing access times to hold off the purge (envbuilder touch)",
                    ),
                    "quota": Field(str),
                    "files_quota": Field(str),
                    "backed_up": Field(bool),
                    "visible_on_compute": Field(bool),
                    "notes": Field(str),
                }
            ),
            "named file systems (scratch, work, home)",
            key_pattern=NAME_RE,
        ),
        "env_profiles": MapOf(
            Table(
                {
                    "description": Field(str),
                    "set": MapOf(Field(str), key_pattern=r"[A-Za-z_][A-Za-z0-9_]*"),
                    "unset": Field(list, items=str),
                }
            ),
            "named groups of environment variables (OMP, NCCL, HOROVOD); activate.profiles picks them",
            key_pattern=NAME_RE,
        ),
        "launcher": Table(
            {
                "default": Field(str, choices=LAUNCHERS),
                "mpi": Field(str, "srun --mpi plugin (pmi2, pmix)"),
                "cpu_bind": Field(str, "mpiexec --cpu-bind value"),
                "depth": Field(int, "mpiexec --depth (cores per rank)"),
                "gpu_affinity": Field(str, choices=GPU_AFFINITY),
                "port": Field(int, "rendezvous port shared by all nodes"),
            }
        ),
        "env": Table(
            {
                "kind": Field(str, choices=ENV_KINDS),
                "prefix": Field(str, "where the env goes; ${VAR} and {name} expand"),
                "filesystem": Field(str, "the filesystems entry the prefix lives on"),
                "system_site_packages": Field(bool, "see the site python's packages (overlay, Cirrus)"),
                "overlay": Field(
                    str,
                    "overlay envs: a venv on top of the site python (default), or a clone of its env",
                    choices=("venv", "clone"),
                ),
                "installer": Field(str, choices=INSTALLERS),
            }
        ),
        "python": Table(
            {
                "command": Field(str, "interpreter to build from, found on PATH after the modules load"),
                "version": Field(
                    str,
                    "its version (major.minor); the resolver checks wheels against it",
                    pattern=r"\d+\.\d+(\.\d+)?",
                    example="3.11",
                ),
            }
        ),
        "conda": Table(
            {
                "channels": Field(list, items=str),
                "packages": Field(list, "conda packages besides python and pip", items=str),
                "engine": Field(str, choices=("auto", "conda", "mamba", "micromamba", "rattler")),
            }
        ),
        "torch": Table(
            {
                "install": Field(bool, "false when the site env provides torch (overlay)"),
                "version": Field(str, "latest, a minor (2.7), a release (2.7.1) or a dated nightly"),
                "variant": Field(str, "auto, cpu or cuNNN", pattern=r"auto|cpu|cu\d+", example="cu126"),
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
                    "name": Field(str, required=True),
                    "spec": Field(str, "requirement as pip reads it (defaults to the name)"),
                    "index": Field(str, "pypi (default), torch (the resolved torch index) or a URL"),
                    "build_env": MapOf(Field(str), key_pattern=r"[A-Za-z_][A-Za-z0-9_]*"),
                    "no_build_isolation": Field(bool),
                    "no_binary": Field(bool, "build from source against the loaded modules (mpi4py)"),
                    "build_modules": Field(list, "modules loaded only for this package's build", items=str),
                    "note": Field(str),
                }
            ),
            "extra packages, installed after torch with torch's pins as constraints",
        ),
        "activate": Table(
            {
                "modules": Field(list, "modules loaded on activate, unloaded on deactivate", items=str),
                "env": MapOf(Field(str), key_pattern=r"[A-Za-z_][A-Za-z0-9_]*"),
                "profiles": Field(list, "env_profiles applied on activate", items=str),
            }
        ),
        "validation": Table(
            {
                "checks": Field(list, "checks to run after create", items=str),
                "nodes": Field(int),
                "nproc_per_node": Field(int, "ranks per node (default: GPUs per node)"),
                "partition": Field(str),
                "time": Field(str, pattern=r"\d+:\d{2}:\d{2}", example="01:30:00"),
                "launcher": Field(str, choices=LAUNCHERS),
                "timeout": Field(int, "seconds each check may take before it counts as hung"),
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
                            "partition": Field(str, "the partition it was measured on (unset: any)"),
                            "ranks": Field(int, "the rank count it holds for (unset: any)"),
                        }
                    ),
                    "performance references, ReFrame style: out of bounds is a FAIL",
                ),
            }
        ),
    }
)


_TYPE_NAMES = {
    str: "a string",
    int: "an integer",
    bool: "a boolean",
    float: "a number",
    list: "an array",
    dict: "a table",
}


def _type_name(t: Union[type, tuple[type, ...]]) -> str:
    if isinstance(t, tuple):
        return " or ".join(_TYPE_NAMES.get(x, x.__name__) for x in t)
    return _TYPE_NAMES.get(t, t.__name__)


def _found(value: Any) -> str:
    kind = {
        str: "string",
        bool: "boolean",
        int: "integer",
        float: "number",
        list: "array",
        dict: "table",
    }.get(type(value), type(value).__name__)
    shown = repr(value)
    if len(shown) > 60:
        shown = shown[:57] + "..."
    return f"{kind} {shown}"


def validate(doc: Mapping[str, Any], file: str) -> None:
    """Raise RecipeError for the first problem in one file: unknown key, wrong type, bad choice.

    Required keys of tables are checked on the merged recipe (:func:`check_required`), because a variant may
    add to a table its parent started; required keys of array items ([[packages]]) are checked here.
    """
    version = doc.get("schema_version")
    if version is None:
        raise RecipeError(
            "missing schema_version",
            file=file,
            key="schema_version",
            hint=f"every recipe file starts with schema_version = {SCHEMA_VERSION}",
        )
    if not isinstance(version, int) or isinstance(version, bool):
        raise RecipeError(f"expected an integer, found {_found(version)}", file=file, key="schema_version")
    if version != SCHEMA_VERSION:
        raise RecipeError(
            f"this envbuilder reads schema_version {SCHEMA_VERSION}, found {version!r}",
            file=file,
            key="schema_version",
            hint="upgrade envbuilder" if isinstance(version, int) and version > SCHEMA_VERSION else None,
        )
    # The version is checked first: a newer recipe's new keys must say "upgrade", not "unknown key".
    _walk(SCHEMA, doc, file, "", required=False)


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def check_required(doc: Mapping[str, Any], source_of: Callable[[str], str]) -> None:
    """Required keys on a merged recipe; ``source_of(table path)`` names the file to blame."""
    _walk(SCHEMA, doc, "", "", required=True, source_of=source_of)


def _walk(
    spec: Spec,
    value: Any,
    file: str,
    path: str,
    required: bool,
    source_of: Optional[Callable[[str], str]] = None,
) -> None:
    if isinstance(spec, Table):
        if not isinstance(value, dict):
            raise RecipeError(
                f"expected a table, found {_found(value)}", file=file, key=path or "(top level)"
            )
        for key, sub in value.items():
            if key not in spec.fields:
                raise RecipeError(
                    f"unknown key {key!r}" + (f" in [{path}]" if path else ""),
                    file=file,
                    key=_join(path, key),
                    hint=did_you_mean(key, spec.fields) or f"known keys here: {', '.join(spec.fields)}",
                )
            _walk(spec.fields[key], sub, file, _join(path, key), required, source_of)
        for key, sub_spec in spec.fields.items():
            if required and getattr(sub_spec, "required", False) and key not in value:
                expected = f"expected {_type_name(sub_spec.types)}" if isinstance(sub_spec, Field) else ""
                doc = f" ({sub_spec.doc})" if sub_spec.doc else ""
                raise RecipeError(
                    f"missing required key: {expected}{doc}",
                    file=source_of(path) if source_of else file,
                    key=_join(path, key),
                )
        return
    if isinstance(spec, MapOf):
        if not isinstance(value, dict):
            raise RecipeError(f"expected a table, found {_found(value)}", file=file, key=path)
        for key, sub in value.items():
            if spec.key_pattern and not re.fullmatch(spec.key_pattern, key):
                raise RecipeError(
                    f"invalid name {key!r} (expected to match {spec.key_pattern})",
                    file=file,
                    key=_join(path, key),
                )
            _walk(spec.value, sub, file, _join(path, key), required, source_of)
        return
    if isinstance(spec, ArrayOf):
        if not isinstance(value, list):
            raise RecipeError(f"expected an array of tables, found {_found(value)}", file=file, key=path)
        for i, item in enumerate(value):
            _walk(spec.item, item, file, f"{path}[{i}]", True, source_of)
        return
    _check_field(spec, value, file, path)


def _check_field(spec: Field, value: Any, file: str, path: str) -> None:
    types = spec.types if isinstance(spec.types, tuple) else (spec.types,)
    # bool is an int subclass in Python; TOML keeps them apart, so do we.
    ok = isinstance(value, types) and not (isinstance(value, bool) and bool not in types)
    if not ok:
        raise RecipeError(f"expected {_type_name(spec.types)}, found {_found(value)}", file=file, key=path)
    if spec.items is not None:
        for i, item in enumerate(value):
            if not isinstance(item, spec.items) or isinstance(item, bool):
                raise RecipeError(
                    f"expected {_type_name(spec.items)}, found {_found(item)}", file=file, key=f"{path}[{i}]"
                )
    if spec.choices and value not in spec.choices:
        raise RecipeError(
            f"expected one of {', '.join(spec.choices)}, found {_found(value)}",
            file=file,
            key=path,
            hint=did_you_mean(str(value), spec.choices),
        )
    if spec.pattern and isinstance(value, str) and not re.fullmatch(spec.pattern, value):
        like = f"a value like {spec.example!r}" if spec.example else f"a value matching {spec.pattern}"
        raise RecipeError(f"expected {like}, found {_found(value)}", file=file, key=path)


# ---------------------------------------------------------------------------------------------------------------
# JSON schema for editors


def json_schema() -> dict[str, Any]:
    out = _json(SCHEMA)
    out["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    out["title"] = "envbuilder recipe"
    out["required"] = ["schema_version"]
    return out


def _json(spec: Spec, in_array: bool = False) -> dict[str, Any]:
    # Like validate(): one file may hold part of a table its parent started, so only array items require keys.
    if isinstance(spec, Table):
        out: dict[str, Any] = {
            "type": "object",
            "additionalProperties": False,
            "properties": {k: _json(v) for k, v in spec.fields.items()},
        }
        required = [k for k, v in spec.fields.items() if getattr(v, "required", False)]
        if required and in_array:
            out["required"] = required
    elif isinstance(spec, MapOf):
        out = {"type": "object", "additionalProperties": _json(spec.value)}
        if spec.key_pattern:
            out["propertyNames"] = {"pattern": f"^({spec.key_pattern})$"}
    elif isinstance(spec, ArrayOf):
        out = {"type": "array", "items": _json(spec.item, in_array=True)}
    else:
        out = _json_field(spec)
    if spec.doc:
        out["description"] = spec.doc
    return out


_JSON_TYPES = {str: "string", int: "integer", bool: "boolean", float: "number", list: "array", dict: "object"}


def _json_field(spec: Field) -> dict[str, Any]:
    types = spec.types if isinstance(spec.types, tuple) else (spec.types,)
    names = [_JSON_TYPES[t] for t in types]
    out: dict[str, Any] = {"type": names[0] if len(names) == 1 else names}
    if spec.items is not None:
        out["items"] = {"type": _JSON_TYPES[spec.items]}
    if spec.choices:
        out["enum"] = list(spec.choices)
    if spec.pattern:
        out["pattern"] = f"^({spec.pattern})$"
    return out
