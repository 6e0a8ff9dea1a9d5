"""Pure: one validation run as a history record, and the drift alarms that compare a run's figures with the
history of the same env and partition (``validate.history`` reads and writes the records).

A record (version 1) is one JSON object: ``env``, ``recipe``, ``recipe_version``, ``time`` (ISO-8601 UTC),
``partition`` ("" for none), ``nodes``, ``launcher``, ``ranks``, ``device``, ``facts`` (``driver``, ``cuda``,
``torch``, ``glibc``, ``modules`` {name: version}, ``gpus``), ``checks`` (``name``, ``status``, ``seconds``,
``figures`` {name: number}, ``units`` {name: unit}) and the run's ``status``.

A figure drifts when it is worse than the median of its last ``WINDOW`` values on the partition (runs whose check
passed) by ``ALARM`` or more: lower for a rate, higher for a time. The alarm names the facts that changed since
the last run whose figure was still near that median.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Optional

from envbuilder.core.facts import HostFacts
from envbuilder.core.structs import dataclass
from envbuilder.validate.report import FIGURE_WORDS, Report

HISTORY_VERSION = 1
#: The runs a figure is compared with, newest first.
WINDOW = 10
#: Fewer earlier values than this make no median worth comparing with.
MIN_RUNS = 3
#: How much worse than its median a figure must be before the run says so.
ALARM = 0.2
#: Units where a larger figure is worse (report's rule for the slowest rank).
LOWER_IS_BETTER = frozenset({"s", "ms", "us"})
_UNIT_WORDS = {"us": "µs"}


def facts_of(host: HostFacts, result: Report) -> dict[str, Any]:
    """What a run's figures may depend on: the driver and glibc where rank 0 ran (else this host's), this host's
    GPUs, the torch and CUDA build the import check saw, the modules the ranks ran with."""
    first = _first_rank(result, "import")
    return {
        "driver": result.node.get("driver") or host.driver_version or "",
        "cuda": str(first.get("cuda") or ""),
        "torch": str(first.get("torch") or ""),
        "glibc": result.node.get("glibc") or host.glibc or "",
        "modules": module_versions(result.modules),
        "gpus": [g.name for g in host.gpus or ()],
    }


def module_versions(loaded: Sequence[str]) -> dict[str, str]:
    """``cuda/12.8`` -> {"cuda": "12.8"}; a module without a version maps to ""."""
    out = {}
    for item in loaded:
        name, _, version = item.rpartition("/")
        out[name or version] = version if name else ""
    return out


def record_of(
    result: Report, *, recipe: str, recipe_version: str, facts: Mapping[str, Any], at: str
) -> dict[str, Any]:
    """The history record of ``result``, taken at ``at`` (ISO-8601 UTC)."""
    checks = []
    for row in result.rows:
        seconds = [float(r.get("seconds") or 0) for r in row.per_rank.values()]
        numbers = {k: f for k, f in row.figures.items() if isinstance(f.get("value"), (int, float))}
        check: dict[str, Any] = {
            "name": row.check,
            "status": row.status,
            "seconds": round(max(seconds), 3) if seconds else None,
            "figures": {k: f["value"] for k, f in numbers.items()},
            "units": {k: str(f.get("unit") or "") for k, f in numbers.items()},
        }
        check.update(_per_rank(row.per_rank))
        checks.append(check)
    return {
        "version": HISTORY_VERSION,
        "env": result.env,
        "recipe": recipe,
        "recipe_version": recipe_version,
        "time": at,
        "partition": result.partition or "",
        "nodes": sorted(set(result.hosts.values())),
        "launcher": result.launcher,
        "ranks": result.world,
        "device": result.device,
        "facts": dict(facts),
        "checks": checks,
        "status": "pass" if result.ok else "fail",
    }


def _per_rank(per_rank: Mapping[int, Mapping[str, Any]]) -> dict[str, Any]:
    """What the report plots per rank and per message size: each rank's time and numeric figures
    (``per_rank``), and the lowest rank's bus bandwidth sweep (``sweep``: bytes and GB/s), where the check holds
    them."""
    ranks: dict[str, dict[str, float]] = {}
    for rank, res in sorted(per_rank.items()):
        numbers = {
            name: float(fig["value"])
            for name, fig in (res.get("figures") or {}).items()
            if isinstance(fig, Mapping) and isinstance(fig.get("value"), (int, float))
        }
        if isinstance(res.get("seconds"), (int, float)):
            numbers["seconds"] = round(float(res["seconds"]), 3)
        if numbers:
            ranks[str(rank)] = numbers
    out: dict[str, Any] = {"per_rank": ranks} if len(ranks) > 1 else {}
    first = per_rank[min(per_rank)] if per_rank else {}
    sweep = first.get("sweep")
    if isinstance(sweep, list):
        rows = [
            {"bytes": int(r["bytes"]), "busbw": float(r["busbw"])}
            for r in sweep
            if isinstance(r, Mapping)
            and isinstance(r.get("bytes"), int)
            and isinstance(r.get("busbw"), (int, float))
        ]
        if rows:
            out["sweep"] = rows
    return out


@dataclass(frozen=True)
class Drift:
    """A figure well off its history: ``worse`` is the fraction it is worse than ``median`` by."""

    figure: str  # CHECK.FIGURE
    value: float
    unit: str
    median: float
    worse: float
    runs: int
    partition: str
    changes: tuple[str, ...]
    fails: bool
    #: The time of the last run whose figure was still near the median (the changes named are since then).
    since: str = ""

    @property
    def text(self) -> str:
        """``nccl bus bandwidth 211 GB/s, 36% below its median of the last 10 runs on gpu-a100 since driver
        550 -> 570 and module cuda/12.8 appeared``."""
        check, _, name = self.figure.partition(".")
        words = FIGURE_WORDS.get(name, name.replace("_", " "))
        label = words if words.startswith(check) else f"{check} {words}"
        unit = _UNIT_WORDS.get(self.unit, self.unit)
        side = "above" if self.unit in LOWER_IS_BETTER else "below"
        where = f"on {self.partition}" if self.partition else "here"
        since = f" since {' and '.join(self.changes)}" if self.changes else ", with no recorded fact changed"
        return (
            f"{label} {self.value:.3g} {unit}, {self.worse * 100:.0f}% {side} its median of "
            f"{self.median:.3g} {unit} over the last {self.runs} runs {where}{since}"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "figure": self.figure,
            "value": self.value,
            "unit": self.unit,
            "median": self.median,
            "worse": round(self.worse, 4),
            "runs": self.runs,
            "partition": self.partition,
            "changes": list(self.changes),
            "fails": self.fails,
            "since": self.since,
            "text": self.text,
        }


def compare(
    current: Mapping[str, Any], past: Sequence[Mapping[str, Any]], threshold: Optional[float] = None
) -> list[Drift]:
    """The figures of ``current`` (a record) that drifted from the runs in ``past`` (records, oldest first) of the
    same partition; each fails where ``threshold`` is set and it is at least that much worse."""
    level = min(ALARM, threshold) if threshold is not None else ALARM
    same = [r for r in past if r.get("partition", "") == current.get("partition", "")]
    out = []
    for check in current.get("checks") or ():
        if check.get("status") == "skip":
            continue
        for name, value in (check.get("figures") or {}).items():
            unit = str((check.get("units") or {}).get(name, ""))
            found = _history_of(same, str(check["name"]), name)
            if len(found) < MIN_RUNS or not isinstance(value, (int, float)):
                continue
            median = _median([v for _, v in found])
            worse = _worse(float(value), median, unit)
            if worse is None or worse < level:
                continue
            good = next(
                (r for r, v in reversed(found) if (_worse(v, median, unit) or 0.0) < level), found[-1][0]
            )
            out.append(
                Drift(
                    figure=f"{check['name']}.{name}",
                    value=float(value),
                    unit=unit,
                    median=median,
                    worse=worse,
                    runs=len(found),
                    partition=str(current.get("partition") or ""),
                    changes=tuple(changes(good, current)),
                    fails=threshold is not None and worse >= threshold,
                    since=str(good.get("time") or ""),
                )
            )
    return out


def latest_drift(runs: Sequence[Any]) -> list[Drift]:
    """Per partition, the drift of its newest run against the runs before it (``runs`` oldest first): what a
    report shows beside the figures. A record of another shape (another version wrote it) is left out."""
    usable = [r for r in runs if _well_formed(r)]
    newest = {str(r.get("partition") or ""): i for i, r in enumerate(usable)}
    out: list[Drift] = []
    for part in sorted(newest):
        out += compare(usable[newest[part]], usable[: newest[part]])
    return out


def _well_formed(run: Any) -> bool:
    if not isinstance(run, Mapping) or not isinstance(run.get("checks") or [], list):
        return False
    facts = run.get("facts") or {}
    if not isinstance(facts, Mapping) or not isinstance(facts.get("modules") or {}, Mapping):
        return False
    if not all(isinstance(run.get(k) or facts.get(k) or [], list) for k in ("nodes", "gpus")):
        return False
    return all(
        isinstance(c, Mapping)
        and isinstance(c.get("name"), str)
        and isinstance(c.get("figures") or {}, Mapping)
        and isinstance(c.get("units") or {}, Mapping)
        for c in run.get("checks") or []
    )


def _history_of(
    runs: Sequence[Mapping[str, Any]], check: str, figure: str
) -> list[tuple[Mapping[str, Any], float]]:
    """The last WINDOW (run, value) pairs of ``check.figure`` among runs where the check passed, oldest first."""
    found = []
    for run in runs:
        for item in run.get("checks") or ():
            if not isinstance(item, Mapping) or item.get("name") != check or item.get("status") != "pass":
                continue
            value = (item.get("figures") or {}).get(figure)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                found.append((run, float(value)))
    return found[-WINDOW:]


def _median(values: list[float]) -> float:
    """The median, as ``statistics.median`` gives it (whose import, with decimal and fractions, every command that
    reads a history would pay)."""
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def _worse(value: float, median: float, unit: str) -> Optional[float]:
    if median <= 0:
        return None
    return (value - median) / median if unit in LOWER_IS_BETTER else (median - value) / median


_FACT_WORDS = (("driver", "driver"), ("cuda", "CUDA"), ("torch", "torch"), ("glibc", "glibc"))


def changes(before: Mapping[str, Any], after: Mapping[str, Any]) -> list[str]:
    """What differs between two records' facts and nodes, in words: ``driver 550 -> 570``, ``module cuda/12.8
    appeared``, ``module nccl/2.18 is gone``, ``module drifty 1.0 -> 2.0``, ``nodes n1 -> n2``."""
    old, new = before.get("facts") or {}, after.get("facts") or {}
    out = [
        f"{words} {old.get(key) or '?'} -> {new.get(key) or '?'}"
        for key, words in _FACT_WORDS
        if (old.get(key) or "") != (new.get(key) or "")
    ]
    old_mods, new_mods = old.get("modules") or {}, new.get("modules") or {}
    for name in sorted(set(old_mods) | set(new_mods)):
        if name not in old_mods:
            out.append(f"module {_module(name, new_mods[name])} appeared")
        elif name not in new_mods:
            out.append(f"module {_module(name, old_mods[name])} is gone")
        elif old_mods[name] != new_mods[name]:
            out.append(f"module {name} {old_mods[name] or '(default)'} -> {new_mods[name] or '(default)'}")
    if list(old.get("gpus") or ()) != list(new.get("gpus") or ()):
        out.append(f"GPUs {_names(old.get('gpus'))} -> {_names(new.get('gpus'))}")
    if list(before.get("nodes") or ()) != list(after.get("nodes") or ()):
        out.append(f"nodes {_names(before.get('nodes'))} -> {_names(after.get('nodes'))}")
    return out


def _module(name: str, version: str) -> str:
    return f"{name}/{version}" if version else name


def _names(items: Any) -> str:
    return ",".join(map(str, items or ())) or "none"


def _first_rank(result: Report, check: str) -> Mapping[str, Any]:
    row = result.row(check)
    if row is None or not row.per_rank:
        return {}
    return row.per_rank[min(row.per_rank)]
