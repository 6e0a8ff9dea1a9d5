"""What a site's report shows (``envbuilder report --site``), taken from the site's history store: per published
recipe, the envs every user runs from it, where it passes (per partition: the envs passing at their newest run,
the runs passed), each env's newest run, the figures' drift and the fact changes across the envs. Pure: the
records and the drift alarms (``validate.historymodel.Drift.to_json``, which the command works out) in, plain
values out; a field of the wrong type is left out, never an error (``reportdata``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Optional

from envbuilder.render import reportdata as data

#: Fact changes of several envs this close together are one upgrade of the site.
_ONE_CHANGE_S = 86400.0


@dataclass(frozen=True)
class SiteEnv:
    """One env of the site's store: whose, from which recipe, its runs (records) and its newest runs' drift."""

    user: str
    recipe: str
    env: str
    runs: tuple[Mapping[str, Any], ...]
    drift: tuple[Mapping[str, Any], ...] = ()

    @property
    def label(self) -> str:
        return f"{self.user}/{self.env}"


def by_recipe(envs: Sequence[SiteEnv]) -> list[tuple[str, list[SiteEnv]]]:
    """The envs grouped per recipe, recipes sorted, envs in the order given."""
    out: dict[str, list[SiteEnv]] = {}
    for one in envs:
        out.setdefault(one.recipe, []).append(one)
    return sorted(out.items())


def combined(envs: Sequence[SiteEnv]) -> list[tuple[float, Mapping[str, Any]]]:
    """Every run of the envs, oldest first (each env's newest ``MAX_RUNS``)."""
    return sorted((pair for one in envs for pair in data.timed(one.runs)), key=lambda p: p[0])


def per_env(envs: Sequence[SiteEnv]) -> list[tuple[float, Mapping[str, Any]]]:
    """:func:`combined`, each run's partition named with its env (``gpu-a100, alice/e1``): the checks and the
    figures over time are drawn per env and partition, a series per env, not one zigzag across them."""
    return sorted(
        (
            (when, {**run, "partition": f"{data.partition(run)}, {one.label}"})
            for one in envs
            for when, run in data.timed(one.runs)
        ),
        key=lambda p: p[0],
    )


#: The columns of :func:`where_rows` and :func:`env_rows`, as both pages head them.
WHERE_HEADER = ("partition", "envs passing now", "runs passed", "recipe versions", "newest run")
ENV_HEADER = ("user", "env", "partition", "version", "status", "runs passed", "newest run", "driver")


def where_rows(envs: Sequence[SiteEnv]) -> list[tuple[str, ...]]:
    """Per partition: (partition, envs passing at their newest run there ``2/3``, runs passed ``25/28``, the
    recipe versions run, the newest run's time)."""
    parts: dict[str, dict[str, list[tuple[float, str, str]]]] = {}
    for one in envs:
        for when, run in data.timed(one.runs):
            status, version = data.text(run.get("status")), data.text(run.get("recipe_version"))
            parts.setdefault(data.partition(run), {}).setdefault(one.label, []).append(
                (when, status, version)
            )
    rows: list[tuple[str, ...]] = []
    for part, per_env in sorted(parts.items()):
        runs = [r for env_runs in per_env.values() for r in env_runs]
        now = sum(env_runs[-1][1] == "pass" for env_runs in per_env.values())
        passed = sum(status == "pass" for _, status, _ in runs)
        versions = sorted({v for _, _, v in runs if v}, key=_version_key)
        rows.append(
            (
                part,
                f"{now}/{len(per_env)}",
                f"{passed}/{len(runs)}",
                ", ".join(versions) or "?",
                data.stamp(max(when for when, _, _ in runs)),
            )
        )
    return rows


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(p) if p.isdigit() else -1 for p in version.split("."))


def env_rows(envs: Sequence[SiteEnv]) -> list[tuple[str, ...]]:
    """Per env and partition, its newest run: (user, env, partition, recipe version, status, runs passed, time,
    driver)."""
    rows: list[tuple[str, ...]] = []
    for one in envs:
        newest: dict[str, list[tuple[float, Mapping[str, Any]]]] = {}
        for when, run in data.timed(one.runs):
            newest.setdefault(data.partition(run), []).append((when, run))
        for part, runs in sorted(newest.items()):
            when, run = runs[-1]
            passed = sum(data.text(r.get("status")) == "pass" for _, r in runs)
            rows.append(
                (
                    one.user,
                    one.env,
                    part,
                    data.text(run.get("recipe_version")) or "?",
                    data.text(run.get("status")) or "?",
                    f"{passed}/{len(runs)}",
                    data.stamp(when),
                    data.text(data.mapping(run.get("facts")).get("driver")) or "?",
                )
            )
    return rows


def changes(envs: Sequence[SiteEnv]) -> list[data.Change]:
    """The fact changes of each env (``reportdata.fact_changes``), the same change of several envs within a day
    made one that names them: ``driver 550.54 -> 570.86 (alice/e1, bob/e2)``."""
    return [data.Change(when, f"{label} ({', '.join(who)})") for when, label, who in _merged(envs)]


def _merged(envs: Sequence[SiteEnv]) -> list[tuple[float, str, list[str]]]:
    merged: list[tuple[float, str, list[str]]] = []
    for one in envs:
        for change in data.fact_changes(data.timed(one.runs)):
            same = _same(merged, change)
            if same is None:
                merged.append((change.time, change.label, [one.label]))
            elif one.label not in same[2]:
                same[2].append(one.label)
    return sorted(merged)


def _same(
    merged: Sequence[tuple[float, str, list[str]]], change: data.Change
) -> Optional[tuple[float, str, list[str]]]:
    return next(
        (m for m in merged if m[1] == change.label and abs(change.time - m[0]) <= _ONE_CHANGE_S), None
    )


def drift_links(envs: Sequence[SiteEnv]) -> list[tuple[str, str, str, list[int]]]:
    """Each drift alarm of the envs' newest runs: (env ``user/env``, partition, the alarm in words, which names
    the facts that changed, and the indexes in :func:`changes` of the fact changes it names)."""
    merged = _merged(envs)
    out = []
    for one in envs:
        runs = data.timed(one.runs)
        own = data.fact_changes(runs)
        for alarm, found in data.drift_links(one.drift, runs, own):
            indexes = [
                i
                for i, (when, label, who) in enumerate(merged)
                if one.label in who
                and any(own[j].label == label and abs(own[j].time - when) <= _ONE_CHANGE_S for j in found)
            ]
            part = data.text(alarm.get("partition")) or data.partition({})
            out.append((one.label, part, data.text(alarm.get("text")), indexes))
    return out


def drift_rows(envs: Sequence[SiteEnv]) -> list[tuple[str, str, str, str]]:
    """:func:`drift_links` as table rows: the fact changes named by their times."""
    found = changes(envs)
    return [
        (who, part, text, ", ".join(data.stamp(found[i].time) for i in indexes) or "none recorded")
        for who, part, text, indexes in drift_links(envs)
    ]
