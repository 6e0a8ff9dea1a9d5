"""Host facts (pure): what machine a plan targets, and how a facts JSON document becomes one.

Every fact may be unknown (None). Nothing here probes, reads a file or runs a command: ``host`` probes the running
machine and reads ``--facts`` files, and hands the decoded text here. Keeping this module free of ``proc`` lets the
resolver, the gates and the plan name the target without pulling in the subprocess seam
(tests/unit/test_purity.py enforces it).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import asdict, field
from typing import Any, Optional

from envbuilder.core.errors import HostProbeError, did_you_mean
from envbuilder.core.structs import dataclass

FACTS_VERSION = 1


@dataclass(frozen=True)
class Gpu:
    name: str
    compute_capability: Optional[str] = None
    memory_mib: Optional[int] = None
    #: "nvidia", "amd" or "intel"; None: not said (a GPU of an older facts file is NVIDIA's).
    vendor: Optional[str] = None
    #: The GPU's code target where it is not a compute capability: an AMD ``gfx90a``, an Intel device family
    #: (``pvc``, ``bmg``, ...).
    arch: Optional[str] = None


@dataclass(frozen=True)
class HostFacts:
    arch: Optional[str] = None
    glibc: Optional[str] = None
    python: Optional[str] = None
    driver_version: Optional[str] = None
    #: Highest CUDA version the driver supports ("CUDA Version" in nvidia-smi's header).
    max_cuda: Optional[str] = None
    #: None: unknown. Empty: known to have no NVIDIA GPU.
    gpus: Optional[tuple[Gpu, ...]] = None
    #: The AMD kernel driver's version (``/sys/module/amdgpu/version``, amd-smi's DRIVER VERSION); None: unknown
    #: or no AMD GPU.
    amdgpu_version: Optional[str] = None
    #: The Level Zero GPU runtime an Intel GPU node has (the compute runtime's version); "" known absent.
    level_zero: Optional[str] = None
    hostname: Optional[str] = None
    module_system: Optional[str] = None
    scheduler: Optional[str] = None
    allocation: Mapping[str, str] = field(default_factory=dict)
    filesystems: Mapping[str, str] = field(default_factory=dict)
    #: The modules the node offers, as ``name/version`` (written into a facts file by hand, e.g. for
    #: ``envbuilder impact``; ``probe --modules`` lists them). None: unknown.
    modules: Optional[tuple[str, ...]] = None
    source: str = "probe"

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["gpus"] = None if self.gpus is None else [_gpu_json(g) for g in self.gpus]
        for key in _VENDOR_KEYS:  # NVIDIA-only documents stay as they were
            if data[key] is None:
                del data[key]
        data["allocation"] = dict(self.allocation)
        data["filesystems"] = dict(self.filesystems)
        if self.modules is None:
            del data["modules"]  # the probe's document stays as it was
        else:
            data["modules"] = list(self.modules)
        data["facts_version"] = FACTS_VERSION
        return data

    @property
    def gpu_vendor(self) -> Optional[str]:
        """The vendor of the target's GPUs, None without a known GPU. A GPU that does not say (a facts file written
        before vendors were recorded, a site's GPU name) is AMD's or Intel's by its name, else NVIDIA's."""
        if not self.gpus:
            return None
        gpu = self.gpus[0]
        if gpu.vendor:
            return gpu.vendor
        return next((v for v, pattern in _VENDOR_NAMES if re.search(pattern, gpu.name)), "nvidia")

    @property
    def python_minor(self) -> Optional[str]:
        if not self.python:
            return None
        parts = self.python.split(".")
        return ".".join(parts[:2]) if len(parts) >= 2 else None


def _gpu_json(gpu: Gpu) -> dict[str, Any]:
    data = asdict(gpu)
    for key in ("vendor", "arch"):
        if data[key] is None:
            del data[key]
    return data


# ---------------------------------------------------------------------------------------------------------------
# Reading facts from JSON (a --facts file, or a site's compute table)

_STR_KEYS = (
    "arch",
    "glibc",
    "python",
    "driver_version",
    "max_cuda",
    "hostname",
    "module_system",
    "scheduler",
    "amdgpu_version",
    "level_zero",
)
_VENDOR_KEYS = ("amdgpu_version", "level_zero")
_KNOWN_KEYS = (*_STR_KEYS, "gpus", "allocation", "filesystems", "modules", "source", "facts_version")
_GPU_KEYS = ("name", "compute_capability", "memory_mib", "vendor", "arch")
GPU_VENDORS = ("nvidia", "amd", "intel")
#: How a GPU's name tells its vendor where the facts do not say.
_VENDOR_NAMES = (("amd", r"\bAMD\b|Instinct|Radeon"), ("intel", r"\bIntel\b"))
#: Other spellings of an architecture (``platform.machine()`` on some systems, hand-written facts) -> ours.
ARCH_ALIASES = {"amd64": "x86_64", "x64": "x86_64", "arm64": "aarch64"}


def facts_from_json(data: Any, source: str) -> HostFacts:
    """Build HostFacts from a decoded JSON object; missing keys are unknown, wrong ones are errors."""
    if not isinstance(data, dict):
        raise HostProbeError(f"{source}: expected a JSON object, found {type(data).__name__}")
    for key in data:
        if key not in _KNOWN_KEYS:
            raise HostProbeError(f"{source}: unknown key {key!r}", hint=did_you_mean(key, _KNOWN_KEYS))
    values: dict[str, Any] = {}
    for key in _STR_KEYS:
        value = data.get(key)
        if value is not None and not isinstance(value, str):
            raise HostProbeError(f"{source}: {key}: expected a string, found {value!r}")
        values[key] = value
    if values["arch"]:
        values["arch"] = ARCH_ALIASES.get(values["arch"], values["arch"])
    gpus = data.get("gpus")
    if gpus is not None:
        if not isinstance(gpus, list):
            raise HostProbeError(f"{source}: gpus: expected a list, found {gpus!r}")
        values["gpus"] = tuple(_gpu_from_json(gpu, f"{source}: gpus[{i}]") for i, gpu in enumerate(gpus))
    for key in ("allocation", "filesystems"):
        table = data.get(key, {})
        if not isinstance(table, dict) or not all(isinstance(v, str) for v in table.values()):
            raise HostProbeError(f"{source}: {key}: expected an object of strings")
        values[key] = dict(table)
    modules = data.get("modules")
    if modules is not None:
        if not isinstance(modules, list) or not all(isinstance(m, str) and m.strip() for m in modules):
            raise HostProbeError(
                f'{source}: modules: expected a list of module names like "cuda/12.8", found {modules!r}'
            )
        values["modules"] = tuple(m.strip() for m in modules)
    return HostFacts(source=source, **values)


def _gpu_from_json(gpu: Any, where: str) -> Gpu:
    if not isinstance(gpu, dict) or not isinstance(gpu.get("name"), str):
        raise HostProbeError(f"{where}: expected an object with a string 'name'")
    for key in gpu:
        if key not in _GPU_KEYS:
            raise HostProbeError(f"{where}: unknown key {key!r}", hint=did_you_mean(key, _GPU_KEYS))
    cc = gpu.get("compute_capability")
    if cc is not None and not (isinstance(cc, str) and re.fullmatch(r"\d+\.\d+", cc)):
        raise HostProbeError(f'{where}.compute_capability: expected a string like "9.0", found {cc!r}')
    mem = gpu.get("memory_mib")
    if mem is not None and (not isinstance(mem, int) or isinstance(mem, bool) or mem < 0):
        raise HostProbeError(f"{where}.memory_mib: expected an integer, found {mem!r}")
    vendor = gpu.get("vendor")
    if vendor is not None and vendor not in GPU_VENDORS:
        raise HostProbeError(f"{where}.vendor: expected one of {', '.join(GPU_VENDORS)}, found {vendor!r}")
    arch = gpu.get("arch")
    if arch is not None and not (isinstance(arch, str) and re.fullmatch(r"[a-z][a-z0-9_-]*", arch)):
        raise HostProbeError(f'{where}.arch: expected a string like "gfx90a" or "pvc", found {arch!r}')
    return Gpu(gpu["name"], cc, mem, vendor, arch)


def facts_from_text(text: str, source: str) -> HostFacts:
    """Facts from the text of a facts document: what ``envbuilder probe --json`` prints (the envelope), its
    ``data``, or a facts object written by hand. ``source`` names the document in errors and in the facts."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise HostProbeError(f"{source}: not valid JSON: {exc.msg} (line {exc.lineno})") from None
    except RecursionError:
        raise HostProbeError(f"{source}: not valid JSON: nested too deeply") from None
    return facts_from_json(unwrap_envelope(data, source), source)


_ENVELOPE_KEYS = ("envbuilder_result_version", "command", "status", "data", "errors")


def unwrap_envelope(data: Any, source: str) -> Any:
    """The facts inside a ``probe --json`` envelope; anything that is not an envelope as it is."""
    if not isinstance(data, dict) or "envbuilder_result_version" not in data:
        return data
    version = data.get("envbuilder_result_version")
    command = data.get("command")
    if version != 1 or isinstance(version, bool):
        raise HostProbeError(
            f"{source}: envbuilder_result_version {version!r}: this envbuilder reads version 1",
            hint="save the facts with this envbuilder's `envbuilder probe --json`",
        )
    unknown = [k for k in data if k not in _ENVELOPE_KEYS]
    if unknown:
        raise HostProbeError(
            f"{source}: unknown key {unknown[0]!r} in a result envelope",
            hint=did_you_mean(unknown[0], _ENVELOPE_KEYS),
        )
    if command != "probe":
        raise HostProbeError(
            f"{source}: this is the output of `envbuilder {command} --json`, not of `envbuilder probe --json`",
            hint="save a node's facts with `envbuilder probe --json > node.json` on that node",
        )
    if data.get("status") != "ok" or not isinstance(data.get("data"), dict):
        raise HostProbeError(f"{source}: the probe it holds did not succeed (status {data.get('status')!r})")
    return data["data"]


#: The facts an import of torch depends on: where all of them are the same, an env whose bytes are the ones that
#: imported before imports again (restore's rule for skipping its import check).
IMPORT_FACTS = ("arch", "glibc", "driver_version", "max_cuda")


def differences(recorded: Mapping[str, Any], node: HostFacts) -> list[str]:
    """What differs between the facts an env was created under (its record's ``facts``) and ``node``'s, in words
    ("glibc 2.28 -> 2.34", "GPUs (none) -> 4x NVIDIA A100 (8.0)"); an unknown fact on either side is a
    difference."""
    out = []
    now = node.to_json()
    before_gpus, after_gpus = _gpu_words(recorded.get("gpus")), _gpu_words(now.get("gpus"))
    # On nodes known to have no GPU on both sides, no driver is the same fact twice, not two unknowns.
    no_gpus = before_gpus == after_gpus == "(none)"
    for key in IMPORT_FACTS:
        before, after = recorded.get(key), now.get(key)
        if before is None and after is None and no_gpus and key in ("driver_version", "max_cuda"):
            continue
        if before is None or after is None or str(before) != str(after):
            out.append(f"{key.replace('_', ' ')} {before or '(unknown)'} -> {after or '(unknown)'}")
    if before_gpus is None or after_gpus is None or before_gpus != after_gpus:
        out.append(f"GPUs {before_gpus or '(unknown)'} -> {after_gpus or '(unknown)'}")
    return out


def _gpu_words(gpus: Any) -> Optional[str]:
    if gpus is None or not isinstance(gpus, list):
        return None
    if not gpus:
        return "(none)"
    names = [f"{g.get('name')} ({g.get('compute_capability')})" for g in gpus if isinstance(g, Mapping)]
    return ", ".join(f"{names.count(n)}x {n}" for n in sorted(set(names)))
