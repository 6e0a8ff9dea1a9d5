"""What a history report shows, taken from an env's history records (one JSON object per validation run, oldest
first, as ``validate`` keeps them in the
history store: ``validate.history``): each check's status per partition
over time, every figure over time, the fact changes between runs (driver, CUDA, torch, glibc, modules), the NCCL
sweep (bus bandwidth against message size) and import time per rank where a run holds them. Pure: records in,
plain values out. A record written by another version may lack a field or hold the wrong type: that part is left
out, never an error."""

from __future__ import annotations

import datetime
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Optional

from envbuilder.render.svgplot import Cell, Marker, Series

#: The facts whose change between two runs is marked on the time plots, in the order they are named.
FACT_KEYS = ("driver", "cuda", "torch", "glibc")

#: Runs of one env a report draws at most (the newest; the store keeps 200).
MAX_RUNS = 200


@dataclass(frozen=True)
class Change:
    time: float
    label: str
    #: The partitions it happened on.
    partitions: tuple[str, ...] = ()


def text(value: Any) -> str:
    return value if isinstance(value, str) else "" if value is None else str(value)


def number(value: Any) -> Optional[float]:
    """A finite number, or None (a bool, a string, NaN and infinity are not figures)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def checks(run: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    found = run.get("checks")
    return (
        [c for c in found if isinstance(c, Mapping) and text(c.get("name"))]
        if isinstance(found, list)
        else []
    )


_FRACTION = re.compile(r"(?<=\d\d:\d\d:\d\d)(\.\d+)")


def parse_time(value: Any) -> Optional[float]:
    """An ISO-8601 time as seconds since the epoch (a time without a zone is UTC), or None."""
    if not isinstance(value, str) or not value:
        return None
    text = value[:-1] + "+00:00" if value.endswith("Z") else value
    # Python 3.9's parser takes a fraction of exactly 3 or 6 digits only: any other length made 6.
    text = _FRACTION.sub(lambda m: m.group(1)[:7].ljust(7, "0"), text, count=1)
    try:
        when = datetime.datetime.fromisoformat(text)
    except ValueError:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.timezone.utc)
    return when.timestamp()


def timed(runs: Sequence[Any]) -> list[tuple[float, Mapping[str, Any]]]:
    """The runs that are records with a readable time, oldest first, the newest MAX_RUNS."""
    out = [
        (t, r) for r in runs if isinstance(r, Mapping) for t in [parse_time(r.get("time"))] if t is not None
    ]
    return sorted(out, key=lambda p: p[0])[-MAX_RUNS:]


def partition(run: Mapping[str, Any]) -> str:
    return text(run.get("partition")) or "(no partition)"


def fact_changes(runs: Sequence[tuple[float, Mapping[str, Any]]]) -> list[Change]:
    """Each run whose facts differ from those of the run before it on the same partition (nodes of another
    partition may run another driver all along), with what changed: ``driver 550.54 -> 570.86``, ``+cuda/12.8``,
    ``-gcc/12.2``, ``cuda/12.4 -> 12.8``. The same change on several partitions within a day is one change that
    names them; a run without facts changes nothing."""
    last: dict[str, Mapping[str, Any]] = {}
    merged: list[tuple[float, list[str], str]] = []
    for when, run in runs:
        facts, part = mapping(run.get("facts")), partition(run)
        if not facts:
            continue
        words = _changed(last[part], facts) if part in last else []
        last[part] = facts
        if not words:
            continue
        label = ", ".join(words)
        same = next((m for m in merged if m[2] == label and when - m[0] <= _ONE_CHANGE_S), None)
        if same:
            same[1].append(part)
        else:
            merged.append((when, [part], label))
    if len(last) < 2:
        return [Change(when, label, tuple(parts)) for when, parts, label in merged]
    return [Change(when, f"{label} (on {', '.join(parts)})", tuple(parts)) for when, parts, label in merged]


def drift_links(
    drift: Sequence[Any], runs: Sequence[tuple[float, Mapping[str, Any]]], changes: Sequence[Change]
) -> list[tuple[Mapping[str, Any], list[int]]]:
    """Each drift alarm (``historymodel.Drift.to_json``: a newest run's figure well off its median) with the
    indexes of the fact changes it names: those on its partition after the last run near the median (its
    ``since``) up to the newest run there; for an alarm without ``since``, the newest change before that run."""
    out = []
    for alarm in drift:
        if not isinstance(alarm, Mapping):
            continue
        part = text(alarm.get("partition")) or partition({})
        since = parse_time(alarm.get("since"))
        newest = max((when for when, run in runs if partition(run) == part), default=math.inf)
        found = [
            i
            for i, change in enumerate(changes)
            if part in change.partitions and change.time <= newest and (since is None or change.time > since)
        ]
        out.append((alarm, found if since is not None else found[-1:]))
    return out


#: Changes of the same facts on several partitions this close together are one upgrade.
_ONE_CHANGE_S = 86400.0


def _changed(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    words = [
        f"{key} {text(old.get(key)) or '?'} -> {text(new.get(key)) or '?'}"
        for key in FACT_KEYS
        if text(old.get(key)) != text(new.get(key))
    ]
    old_mods, new_mods = mapping(old.get("modules")), mapping(new.get("modules"))
    for name in sorted(set(old_mods) | set(new_mods)):
        if name not in old_mods:
            words.append(f"+{name}/{text(new_mods[name])}")
        elif name not in new_mods:
            words.append(f"-{name}/{text(old_mods[name])}")
        elif text(old_mods[name]) != text(new_mods[name]):
            words.append(f"{name}/{text(old_mods[name])} -> {text(new_mods[name])}")
    return words


def markers(changes: Sequence[Change]) -> list[Marker]:
    return [Marker(c.time, c.label) for c in changes]


def stamp(when: float) -> str:
    return datetime.datetime.fromtimestamp(when, tz=datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def status_rows(runs: Sequence[tuple[float, Mapping[str, Any]]]) -> list[tuple[str, list[Cell]]]:
    """Per check and partition (``nccl on gpu-a100``), one cell per run on that partition that ran the check."""
    rows: dict[str, list[Cell]] = {}
    for when, run in runs:
        for check in checks(run):
            label = f"{text(check['name'])} on {partition(run)}"
            status = text(check.get("status")) or "?"
            rows.setdefault(label, []).append(Cell(status, f"{label}, {stamp(when)}: {status}"))
    return sorted(rows.items())


def figure_series(runs: Sequence[tuple[float, Mapping[str, Any]]]) -> dict[str, list[Series]]:
    """Per figure (``nccl busbw``), one series per partition: its value at each run's time."""
    found: dict[str, dict[str, list[tuple[float, float, str]]]] = {}
    for when, run in runs:
        part = partition(run)
        for check in checks(run):
            for name, value in mapping(check.get("figures")).items():
                got = number(value)
                if got is None:
                    continue
                key = f"{text(check['name'])} {name}"
                tip = f"{key} on {part}, {stamp(when)}: {got:.4g}"
                found.setdefault(key, {}).setdefault(part, []).append((when, got, tip))
    return {
        key: [_series(part, points) for part, points in sorted(parts.items())]
        for key, parts in sorted(found.items())
    }


def figure_units(runs: Sequence[tuple[float, Mapping[str, Any]]]) -> dict[str, str]:
    """Per figure (``nccl busbw``), its unit as the newest run that names one gives it (a check's ``units``:
    ``{"busbw": "GB/s"}``)."""
    out: dict[str, str] = {}
    for _, run in runs:
        for check in checks(run):
            for name, unit in mapping(check.get("units")).items():
                if text(unit):
                    out[f"{text(check['name'])} {name}"] = text(unit)
    return out


def _series(label: str, points: Sequence[tuple[float, float, str]]) -> Series:
    return Series(label, tuple((x, y) for x, y, _ in points), tuple(t for _, _, t in points))


def _newest_check(
    runs: Sequence[tuple[float, Mapping[str, Any]]], field: str
) -> list[tuple[float, Mapping[str, Any], Any]]:
    """Per partition, the newest run whose checks hold ``field`` (a list or mapping): (time, run, that field)."""
    newest: dict[str, tuple[float, Mapping[str, Any], Any]] = {}
    for when, run in runs:
        for check in checks(run):
            value = check.get(field)
            if isinstance(value, (list, Mapping)) and value:
                newest[partition(run)] = (when, run, value)
    return [newest[p] for p in sorted(newest)]


def sweep_series(runs: Sequence[tuple[float, Mapping[str, Any]]]) -> list[Series]:
    """Bus bandwidth (GB/s) against message size (bytes): per partition, the newest run's NCCL sweep (a check's
    ``sweep``: ``[{"bytes": n, "busbw": GB/s}, ...]``)."""
    out = []
    for when, run, sweep in _newest_check(runs, "sweep"):
        points = [
            (b, bw, f"{partition(run)}, {int(b)} bytes: {bw:.4g} GB/s")
            for row in (sweep if isinstance(sweep, list) else [])
            for b, bw in [(number(mapping(row).get("bytes")), number(mapping(row).get("busbw")))]
            if b is not None and bw is not None
        ]
        out.append(_series(f"{partition(run)} ({stamp(when)})", points))
    return out


def rank_series(runs: Sequence[tuple[float, Mapping[str, Any]]]) -> dict[str, list[Series]]:
    """Per figure held per rank (a check's ``per_rank``: ``{"0": {"import_s": 1.2}, ...}``), one series per
    partition from its newest such run: the value against the rank."""
    found: dict[str, list[Series]] = {}
    for when, run, per_rank in _newest_check(runs, "per_rank"):
        by_figure: dict[str, list[tuple[float, float, str]]] = {}
        for rank, figures in per_rank.items() if isinstance(per_rank, Mapping) else ():
            if not text(rank).isdigit():
                continue
            for name, value in mapping(figures).items():
                got = number(value)
                if got is not None:
                    by_figure.setdefault(name, []).append((int(rank), got, f"rank {rank}: {got:.4g}"))
        for name, points in by_figure.items():
            found.setdefault(name, []).append(_series(f"{partition(run)} ({stamp(when)})", points))
    return dict(sorted(found.items()))


def rank_label(figure: str, units: Mapping[str, str]) -> str:
    """A per-rank figure's axis label with its unit: a rank's ``seconds`` are seconds; another figure has the
    unit its check gives the figure of that name (``figure_units``: ``import import_s`` -> ``s``)."""
    unit = "s" if figure == "seconds" else next((u for k, u in units.items() if k.endswith(f" {figure}")), "")
    return f"{figure} ({unit})" if unit else figure


def latest_facts(run: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The newest run's facts as (name, value) rows: the facts, the GPUs, the modules, the nodes."""
    facts = mapping(run.get("facts"))
    rows = [(key, text(facts.get(key))) for key in FACT_KEYS if text(facts.get(key))]
    gpus = facts.get("gpus")
    if isinstance(gpus, list) and gpus:
        rows.append(("gpus", ", ".join(text(g) for g in gpus)))
    modules = mapping(facts.get("modules"))
    if modules:
        rows.append(("modules", " ".join(f"{text(k)}/{text(v)}" for k, v in sorted(modules.items()))))
    nodes = run.get("nodes")
    if isinstance(nodes, list) and nodes:
        rows.append(("nodes", ", ".join(text(n) for n in nodes)))
    for key in ("launcher", "ranks", "recipe", "recipe_version"):
        if text(run.get(key)):
            rows.append((key, text(run.get(key))))
    return rows
