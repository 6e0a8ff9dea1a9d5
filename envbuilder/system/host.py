"""Host facts, live: probe the running host, or read a saved facts file (``--facts``).

Every fact may be unknown (None). The probe never fails because a tool is missing, and never runs at import. The
facts themselves and their JSON form live in the pure :mod:`envbuilder.core.facts`.
"""

from __future__ import annotations

import contextlib
import functools
import os
import platform
import re
import shutil
import socket
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Optional

from envbuilder.core import schedulers
from envbuilder.core.errors import CommandFailed, HostProbeError
from envbuilder.core.facts import ARCH_ALIASES, Gpu, HostFacts, facts_from_text
from envbuilder.core.structs import dataclass
from envbuilder.system import gpuprobe, proc, textfile

#: A facts file is a few hundred bytes; anything near this is not one.
MAX_FACTS_BYTES = 1024 * 1024


def load_facts_file(path: str) -> HostFacts:
    """Facts from a file: what ``envbuilder probe --json`` prints (the envelope), its ``data``, or a facts object
    written by hand. Only a regular UTF-8 file is read, and only up to MAX_FACTS_BYTES."""
    try:
        text = textfile.read_text(Path(path), MAX_FACTS_BYTES, "facts file")
    except textfile.UnreadableFile as exc:
        raise HostProbeError(f"facts file {path}: {exc.reason}") from None
    return facts_from_text(text, path)


def facts_for(facts_file: Optional[str]) -> HostFacts:
    """The facts a command works from: those saved in ``facts_file`` (``--facts``), else this machine's, probed."""
    return load_facts_file(facts_file) if facts_file else probe()


# ---------------------------------------------------------------------------------------------------------------
# Probing this machine


def probe(env: Optional[Mapping[str, str]] = None, root: str = "/") -> HostFacts:
    """Probe the running host. ``root`` lets tests point /proc reads at a fake tree; ``env`` at a fake PATH."""
    env = dict(os.environ if env is None else env)
    gpus, driver, max_cuda = _probe_nvidia(env, Path(root))
    amdgpu: Optional[str] = None
    level_zero: Optional[str] = None
    if not gpus:  # no NVIDIA GPU: an AMD or an Intel one, where sysfs or the vendor's tool says so
        amd, amdgpu = gpuprobe.probe_amd(env, Path(root))
        intel, level_zero = gpuprobe.probe_intel(Path(root)) if not amd else (None, None)
        gpus = amd or intel or gpus
    return HostFacts(
        arch=ARCH_ALIASES.get(platform.machine(), platform.machine()) or None,
        glibc=_glibc_version(),
        python=platform.python_version(),
        driver_version=driver,
        max_cuda=max_cuda,
        gpus=gpus,
        amdgpu_version=amdgpu,
        level_zero=level_zero,
        hostname=socket.gethostname() or None,
        module_system=_module_system(env),
        scheduler=_scheduler(env),
        allocation={k: env[k] for k in (*schedulers.allocation_vars(), "CUDA_VISIBLE_DEVICES") if k in env},
        filesystems={k: env[k] for k in ("HOME", "WORK", "SCRATCH") if env.get(k)},
        source="probe",
    )


def usable_cpus() -> int:
    """The CPUs this process may run on: its affinity mask (a job step's or a cpuset's share of the node), else
    the machine's count."""
    if hasattr(os, "sched_getaffinity"):  # Linux
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def _glibc_version() -> Optional[str]:
    try:
        text = os.confstr("CS_GNU_LIBC_VERSION")
    except (ValueError, OSError, AttributeError):
        text = None
    if text and text.startswith("glibc "):
        return text.split()[1]
    name, version = platform.libc_ver()
    return version if name == "glibc" and version else None


def _module_system(env: Mapping[str, str]) -> Optional[str]:
    if env.get("LMOD_CMD") or env.get("LMOD_VERSION"):
        return "lmod"
    if env.get("MODULESHOME") or shutil.which("modulecmd", path=env.get("PATH")):
        return "environment-modules"
    return None


def _scheduler(env: Mapping[str, str]) -> Optional[str]:
    """The scheduler of the job this runs in, else the one whose submit command is on PATH."""
    adapters = schedulers.SCHEDULERS.values()
    for adapter in adapters:
        if adapter.job_id_var in env:
            return adapter.name
    for adapter in adapters:
        if shutil.which(adapter.submit_tool, path=env.get("PATH")):
            return adapter.name
    return None


_DRIVER_RE = re.compile(r"Kernel Module\s+(?:for\s+\S+\s+)?(\d+\.\d+(?:\.\d+)?)")
#: "CUDA Version: 13.0" in the table's header; "CUDA Version        : 13.0" in ``nvidia-smi --version``.
_CUDA_HEADER_RE = re.compile(r"CUDA Version\s*:\s*(\d+\.\d+)")


#: What a probe asks nvidia-smi of each GPU (without compute_cap where the driver predates it).
_QUERY_FIELDS = "name,compute_cap,driver_version,memory.total"
_OLD_QUERY_FIELDS = "name,driver_version,memory.total"


def _query_argv(smi: str, fields: str) -> list[str]:
    return [smi, f"--query-gpu={fields}", "--format=csv,noheader,nounits"]


@dataclass(frozen=True)
class _Asked:
    """nvidia-smi's two questions, started by :func:`asked_early` for the first probe that asks them so."""

    smi: str
    env: dict[str, str]
    query: proc.Background
    version: proc.Background


_early: list[_Asked] = []


@contextlib.contextmanager
def asked_early(env: Mapping[str, str]) -> Iterator[None]:
    """Start a probe's nvidia-smi questions now, while the command loads its modules and reads its recipe (each
    answer takes 25 ms or more on a GPU node, more where the GPUs sleep): the first :func:`probe` inside the block
    that would ask the same nvidia-smi with the same environment takes their answers instead; any other asks
    afresh. Leaving the block ends what is still running."""
    smi = shutil.which("nvidia-smi", path=env.get("PATH"))
    if smi is None:
        yield
        return
    env = dict(env)
    with contextlib.ExitStack() as started:
        try:
            query = started.enter_context(proc.background(_query_argv(smi, _QUERY_FIELDS), env=env))
            version = started.enter_context(proc.background([smi, "--version"], env=env))
            _early.append(_Asked(smi, env, query, version))
        except OSError:  # it does not start: the probe asks again, and finds out on its own
            started.close()
        try:
            yield
        finally:
            _early.clear()


def _take_early(smi: str, env: Mapping[str, str]) -> Optional[_Asked]:
    """The answers :func:`asked_early` started for this nvidia-smi and environment, once."""
    if _early and _early[0].smi == smi and _early[0].env == env:
        return _early.pop()
    return None


def _probe_nvidia(
    env: Mapping[str, str], root: Path
) -> tuple[Optional[tuple[Gpu, ...]], Optional[str], Optional[str]]:
    """GPUs, driver version and max CUDA: nvidia-smi first, then /proc/driver/nvidia."""
    gpus: Optional[tuple[Gpu, ...]] = None
    driver: Optional[str] = None
    max_cuda: Optional[str] = None
    smi = shutil.which("nvidia-smi", path=env.get("PATH"))
    if smi:
        # The two questions at once: each nvidia-smi start costs 25 ms or more on a GPU node (more where the GPUs
        # sleep), and every create, restore and validate asks them. Where the command asked them at its start
        # (asked_early), their answers are taken.
        early = _take_early(smi, env)
        try:
            with contextlib.ExitStack() as started:
                version = (
                    early.version
                    if early
                    else started.enter_context(proc.background([smi, "--version"], env=env))
                )
                gpus, driver = _smi_query(smi, env, early.query if early else None)
                max_cuda = _smi_cuda_version(smi, env, version)
        except OSError:  # it does not start (a broken install): as if there were none, /proc says what it can
            smi, gpus, driver, max_cuda = None, None, None, None
    proc_dir = root / "proc" / "driver" / "nvidia"
    if driver is None:
        try:
            match = _DRIVER_RE.search((proc_dir / "version").read_text(encoding="utf-8", errors="replace"))
            driver = match.group(1) if match else None
        except OSError:
            pass
    if gpus is None:
        gpus = _proc_gpus(proc_dir)
    if gpus is None and driver is None and not smi and not (root / "proc" / "driver").is_dir():
        return None, None, None  # nothing to say: unknown, not "no GPU"
    if gpus is None and driver is None:
        gpus = ()  # /proc is readable and has no NVIDIA driver: this host has no NVIDIA GPU
    return gpus, driver, max_cuda


def _smi_query(
    smi: str, env: Mapping[str, str], started: Optional[proc.Background] = None
) -> tuple[Optional[tuple[Gpu, ...]], Optional[str]]:
    """The GPUs and the driver, from the query ``started`` already where given."""
    fields = _QUERY_FIELDS
    try:
        if started is not None:
            res = started.result(timeout=20)
        else:
            res = proc.run(_query_argv(smi, fields), env=env, timeout=20, check=True)
    except (CommandFailed, OSError):
        # Old drivers lack compute_cap; retry without it rather than losing the GPU list.
        fields = _OLD_QUERY_FIELDS
        try:
            res = proc.run(_query_argv(smi, fields), env=env, timeout=20, check=True)
        except (CommandFailed, OSError):
            return None, None
    names = fields.split(",")
    gpus = []
    driver = None
    for line in res.stdout.splitlines():
        cols = [c.strip() for c in line.split(",")]
        if len(cols) != len(names):
            continue
        row = dict(zip(names, cols))
        driver = row.get("driver_version") or driver
        mem = row.get("memory.total", "")
        cc = row.get("compute_cap")
        gpus.append(
            Gpu(
                name=row["name"],
                compute_capability=cc if cc and re.fullmatch(r"\d+\.\d+", cc) else None,
                memory_mib=int(mem) if mem.isdigit() else None,
            )
        )
    return tuple(gpus), driver


def _smi_cuda_version(smi: str, env: Mapping[str, str], version: proc.Background) -> Optional[str]:
    """The highest CUDA the driver supports: ``nvidia-smi --version`` (``version``, started already) says it
    without querying a GPU (R535 and later); else the header of the full table, which queries every GPU (a second
    or more on a node whose GPUs sleep between jobs)."""
    answers: list[Callable[[], proc.Result]] = [
        functools.partial(version.result, timeout=20),
        functools.partial(proc.run, [smi], env=env, timeout=20, check=True),
    ]
    for ask in answers:
        try:
            res = ask()
        except (CommandFailed, OSError):
            continue
        match = _CUDA_HEADER_RE.search(res.stdout)
        if match:
            return match.group(1)
    return None


def _proc_gpus(proc_dir: Path) -> Optional[tuple[Gpu, ...]]:
    gpus_dir = proc_dir / "gpus"
    if not gpus_dir.is_dir():
        return None
    gpus = []
    for info in sorted(gpus_dir.glob("*/information")):
        try:
            text = info.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        match = re.search(r"^Model:\s*(.+)$", text, re.MULTILINE)
        if match:
            gpus.append(Gpu(name=match.group(1).strip()))
    return tuple(gpus)
