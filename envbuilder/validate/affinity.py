"""Pure: the affinity check's verdict, from every rank's record of where it runs.

Each rank reports its allowed CPUs, the physical core of each (a key its SMT siblings share), their NUMA nodes,
its GPU's NUMA node and nearest CPUs, and OMP_NUM_THREADS (``check_affinity`` in the payload). A binding error
shows only across ranks, so the verdict is made here, per host, from the records alone: it holds where the ranks
could not talk to each other.

FAIL: a rank's CPUs all lie on other NUMA nodes than its GPU's (on a host with several); ranks bound to
different CPU sets share a physical core (a CPU, or its SMT sibling); more ranks share one CPU set than it has
cores. WARN: a rank's CPUs span its GPU's node and others; ranks x OMP threads exceed the CPUs the host's ranks
may use; a rank's OMP threads exceed its own CPUs. Ranks that all have the same CPUs, as many cores as ranks or
more (torchrun's unbound workers), are left to the kernel's scheduler.

Each rank's network device (the one NCCL would likely use, ``nic.pick``: an approximation of NCCL's topology
search) joins the detail; WARN where it sits on another NUMA node than the rank's GPU and an NCCL variable or the
ranks' GPU map could change that (``nic.far``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import field
from itertools import combinations
from typing import Any, Optional

from envbuilder.core.structs import dataclass
from envbuilder.validate import nic

Record = Mapping[str, Any]

_NUMA_HINT = (
    "bind each rank to the CPUs nearest its GPU (/sys/bus/pci/devices/<GPU>/local_cpulist): one rank per NUMA "
    "domain, and the GPU order that matches (Polaris: --depth 8 with the reversed GPU map)"
)
_CORE_HINT = (
    "give each rank cores of its own (a CPU binding whose depth fits the physical cores; SMT siblings are one "
    "core), or leave ranks unbound on at least as many cores as ranks"
)
_OMP_HINT = "set OMP_NUM_THREADS to the cores of each rank: the node's cores divided by the ranks on it"


@dataclass(frozen=True)
class Verdict:
    status: str  # pass | warn | fail
    cause: Optional[str]
    hint: Optional[str]
    #: Where each rank runs, compact: "rank 0: cpus 0-7 numa 0, gpu numa 0, omp 8, nic cxi0 numa 0 (PHB)"
    detail: str
    #: rank -> the network device NCCL would likely use (``nic.Pick.to_json``), for the ranks that recorded one
    nics: Mapping[int, Mapping[str, Any]] = field(default_factory=dict)


def judge(per_rank: Mapping[int, Record]) -> Verdict:
    records = {
        r: rec for r, rec in sorted(per_rank.items()) if rec.get("status") == "pass" and rec.get("cpus")
    }
    failures: list[tuple[str, str]] = []
    warnings: list[tuple[str, str]] = []
    for rank, rec in records.items():
        _gpu_distance(rank, rec, failures, warnings)
        _own_threads(rank, rec, warnings)
    picks: dict[int, nic.Pick] = {}
    for host, ranks in _by_host(records).items():
        failures += [(text, _CORE_HINT) for text in _shared_cores(ranks)]
        warnings += [(text, _OMP_HINT) for text in _oversubscribed(host, ranks)]
        warnings += _far_nics(ranks, picks)
    detail = "; ".join(_detail(rank, rec, picks.get(rank)) for rank, rec in records.items())
    nics = {rank: chosen.to_json() for rank, chosen in sorted(picks.items())}
    for status, found in (("fail", failures), ("warn", warnings)):
        if found:
            return Verdict(status, "; ".join(text for text, _ in found), found[0][1], detail, nics)
    return Verdict("pass", None, None, detail, nics)


def _far_nics(ranks: Mapping[int, Record], picks: dict[int, nic.Pick]) -> list[tuple[str, str]]:
    """Each rank's network device (into ``picks``), and the ranks of one host whose device is far from their GPU."""
    used = {str((rec.get("gpu") or {}).get("bus_id")) for rec in ranks.values()}
    found = []
    for rank, rec in ranks.items():
        chosen = nic.pick(rec)
        if chosen is None:
            continue
        picks[rank] = chosen
        warning = nic.far(rank, rec, chosen, used)
        if warning is not None:
            found.append(warning)
    return found


def _by_host(records: Mapping[int, Record]) -> dict[str, dict[int, Record]]:
    hosts: dict[str, dict[int, Record]] = {}
    for rank, rec in records.items():
        hosts.setdefault(str(rec.get("host")), {})[rank] = rec
    return hosts


def _gpu_distance(
    rank: int, rec: Record, failures: list[tuple[str, str]], warnings: list[tuple[str, str]]
) -> None:
    """The rank's CPUs against its GPU's NUMA node, where the host has several nodes and /sys says both."""
    gpu = rec.get("gpu") or {}
    if gpu.get("numa") is None or not rec.get("numa") or (rec.get("numa_nodes") or 1) < 2:
        return
    where = f"rank {rank}: CPUs {cpu_text(rec['cpus'])} (NUMA {_list(rec['numa'])})"
    near = f"its GPU {gpu.get('bus_id')} is on NUMA {gpu['numa']}"
    if gpu.get("cpus"):
        near += f" (nearest CPUs {cpu_text(gpu['cpus'])})"
    if gpu["numa"] not in rec["numa"]:
        failures.append((f"{where} are all on other NUMA nodes than its GPU: {near}", _NUMA_HINT))
    elif len(rec["numa"]) > 1:
        warnings.append((f"{where} span several NUMA nodes; {near}", _NUMA_HINT))


def _own_threads(rank: int, rec: Record, warnings: list[tuple[str, str]]) -> None:
    omp = rec.get("omp_num_threads")
    if omp is not None and omp > len(rec["cpus"]):
        warnings.append(
            (f"rank {rank}: OMP_NUM_THREADS={omp} exceeds its {len(rec['cpus'])} CPU(s)", _OMP_HINT)
        )


def _cores(rec: Record) -> set[str]:
    """The physical cores of a rank's CPUs; a CPU whose core /sys does not name counts as a core of its own."""
    keys = rec.get("cores") or [None] * len(rec["cpus"])
    return {key or f"cpu {cpu}" for cpu, key in zip(rec["cpus"], keys)}


def _shared_cores(ranks: Mapping[int, Record]) -> list[str]:
    """Ranks of one host that must share a physical core."""
    pools: dict[tuple[int, ...], list[int]] = {}
    for rank, rec in ranks.items():
        pools.setdefault(tuple(rec["cpus"]), []).append(rank)
    cores = {cpus: _cores(ranks[members[0]]) for cpus, members in pools.items()}
    found = []
    for cpus, members in pools.items():
        if len(members) > len(cores[cpus]):
            found.append(
                f"{_ranks(members)} are bound to the same {len(cores[cpus])} core(s) (CPUs {cpu_text(cpus)})"
            )
    for a, b in combinations(pools, 2):
        shared = cores[a] & cores[b]
        if shared:
            how = "the same CPUs" if set(a) & set(b) else "SMT siblings of one core"
            found.append(
                f"{_ranks(pools[a])} (CPUs {cpu_text(a)}) and {_ranks(pools[b])} (CPUs {cpu_text(b)}) share "
                f"{len(shared)} physical core(s): {how}"
            )
    return found


def _oversubscribed(host: str, ranks: Mapping[int, Record]) -> list[str]:
    """More threads than the CPUs the host's ranks may use (a rank without OMP_NUM_THREADS counts as one)."""
    cpus = {cpu for rec in ranks.values() for cpu in rec["cpus"]}
    threads = sum(rec.get("omp_num_threads") or 1 for rec in ranks.values())
    if threads <= len(cpus):
        return []
    return [f"{host}: {len(ranks)} rank(s) x OMP threads = {threads} threads on {len(cpus)} CPU(s)"]


def _detail(rank: int, rec: Record, chosen: Optional[nic.Pick]) -> str:
    text = f"rank {rank}: cpus {cpu_text(rec['cpus'])} numa {_list(rec.get('numa'))}"
    gpu = rec.get("gpu")
    if gpu is not None:
        text += f", gpu numa {_list([gpu['numa']] if gpu.get('numa') is not None else None)}"
    if rec.get("omp_num_threads") is not None:
        text += f", omp {rec['omp_num_threads']}"
    if chosen is not None:
        text += nic.detail(rec, chosen)
    return text


def _list(items: Optional[Sequence[int]]) -> str:
    return ",".join(map(str, items)) if items else "?"


def _ranks(ranks: Sequence[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ",".join(map(str, ranks))


def cpu_text(cpus: Sequence[int]) -> str:
    """CPU numbers as the kernel writes them: [0, 1, 2, 3, 32] -> "0-3,32"."""
    runs: list[list[int]] = []
    for cpu in sorted(cpus):
        if runs and cpu == runs[-1][1] + 1:
            runs[-1][1] = cpu
        else:
            runs.append([cpu, cpu])
    return ",".join(str(lo) if lo == hi else f"{lo}-{hi}" for lo, hi in runs)
