"""Pure: merge the ranks' event files into one validation report, apply performance references, render JUnit.

A rank's file is a list of events (``hello``, ``start``/``result`` per check, ``killed``, ``end``). A ``start``
without a ``result`` is where that rank died or hung; a rank without a file never started. Both become FAILs
that name the rank and the check, with the launcher's exit status and stderr tail as evidence.

References follow ReFrame: a figure's expected ``value`` with ``lower``/``upper`` bounds as fractions of it
(``lower = -0.1`` allows 10 % below; a missing bound is unbounded). Out of bounds is a FAIL showing the reference.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import field, replace
from typing import Any, Callable, Optional

from envbuilder.core.checks import FIRST
from envbuilder.core.structs import dataclass
from envbuilder.validate import affinity

REPORT_VERSION = 1
#: Figures where a larger value is worse: the slowest rank sets them. For the others the smallest value does.
_LOWER_IS_BETTER_UNITS = frozenset({"s", "us", "ms"})


@dataclass(frozen=True)
class Status:
    """Callbacks for the live line: ``status(text)`` replaces it, ``note(text)`` prints a line."""

    status: Callable[[str], None] = lambda text: None
    note: Callable[[str], None] = lambda text: None


#: No live line (a frozen value: one is shared by every call that passes none).
QUIET = Status()


@dataclass(frozen=True)
class Row:
    check: str
    status: str  # pass | warn | fail | skip
    ranks: tuple[int, ...]
    figures: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    cause: Optional[str] = None
    hint: Optional[str] = None
    reason: Optional[str] = None
    references: tuple[Mapping[str, Any], ...] = ()
    per_rank: Mapping[int, Mapping[str, Any]] = field(default_factory=dict)
    #: A line of context for a row that passes or warns (the affinity check: where each rank runs).
    detail: Optional[str] = None

    def to_json(self) -> dict[str, Any]:
        return {
            "check": self.check,
            "status": self.status,
            "ranks": list(self.ranks),
            "figures": {k: dict(v) for k, v in self.figures.items()},
            "cause": self.cause,
            "hint": self.hint,
            "reason": self.reason,
            "detail": self.detail,
            "references": [dict(r) for r in self.references],
            "per_rank": {str(k): v for k, v in sorted(self.per_rank.items())},
        }


@dataclass(frozen=True)
class Report:
    env: str
    launcher: str
    device: str
    world: int
    nodes: int
    command: tuple[str, ...]
    rows: tuple[Row, ...]
    seconds: float
    exit_code: Optional[int]
    where: str  # "here" or the batch job's id
    started: str
    partition: Optional[str] = None
    stderr_tail: str = ""
    #: Each rank's host, as the rank said (:func:`hosts_of`); a rank that never started has none.
    hosts: Mapping[int, str] = field(default_factory=dict)
    #: The modules loaded where rank 0 ran (``name/version``, as the module system lists them).
    modules: tuple[str, ...] = ()
    #: Where rank 0 ran, as it saw it: ``driver`` (the NVIDIA kernel module's version) and ``glibc``.
    node: Mapping[str, str] = field(default_factory=dict)
    #: The drift alarms (historymodel.Drift.to_json): figures well off their history's median.
    drift: tuple[Mapping[str, Any], ...] = ()

    @property
    def layout(self) -> dict[str, tuple[int, ...]]:
        """The ranks on each host, hosts in the order of their lowest rank."""
        return layout_of(self.hosts)

    @property
    def ok(self) -> bool:
        rows_ok = all(r.status != "fail" for r in self.rows) and any(r.status == "pass" for r in self.rows)
        return rows_ok and not self.drift_failed

    @property
    def failed(self) -> list[str]:
        return [r.check for r in self.rows if r.status == "fail"]

    @property
    def drift_failed(self) -> list[str]:
        """The figures whose drift passed the recipe's ``drift_threshold``."""
        return [str(d["figure"]) for d in self.drift if d.get("fails")]

    def row(self, check: str) -> Optional[Row]:
        return next((r for r in self.rows if r.check == check), None)

    def to_json(self) -> dict[str, Any]:
        return {
            "version": REPORT_VERSION,
            "kind": "suite",
            "env": self.env,
            "ok": self.ok,
            "launcher": self.launcher,
            "device": self.device,
            "world": self.world,
            "nodes": self.nodes,
            "hosts": {str(rank): host for rank, host in sorted(self.hosts.items())},
            "layout": {host: list(ranks) for host, ranks in self.layout.items()},
            "partition": self.partition,
            "command": list(self.command),
            "where": self.where,
            "started": self.started,
            "seconds": round(self.seconds, 2),
            "exit_code": self.exit_code,
            "checks": {r.check: r.to_json() for r in self.rows},
            "order": [r.check for r in self.rows],
            "stderr_tail": self.stderr_tail,
            "modules": list(self.modules),
            "node": dict(self.node),
            "drift": [dict(d) for d in self.drift],
        }


def hosts_of(events: Mapping[int, Sequence[Mapping[str, Any]]]) -> dict[int, str]:
    """Each rank's host, from the ``hello`` it wrote first."""
    out = {}
    for rank, evs in events.items():
        host = next((ev.get("host") for ev in evs if ev.get("event") == "hello"), None)
        if isinstance(host, str) and host:
            out[rank] = host
    return out


def modules_of(events: Mapping[int, Sequence[Mapping[str, Any]]]) -> tuple[str, ...]:
    """The modules loaded where the lowest rank that said hello ran (its hello's ``modules``: LOADEDMODULES)."""
    text = _first_hello(events).get("modules")
    return tuple(m for m in text.split(":") if m) if isinstance(text, str) else ()


def node_of(events: Mapping[int, Sequence[Mapping[str, Any]]]) -> dict[str, str]:
    """The NVIDIA driver and glibc versions where the lowest rank that said hello ran (those it knew)."""
    hello = _first_hello(events)
    return {k: hello[k] for k in ("driver", "glibc") if isinstance(hello.get(k), str) and hello[k]}


def _first_hello(events: Mapping[int, Sequence[Mapping[str, Any]]]) -> Mapping[str, Any]:
    for rank in sorted(events):
        for ev in events[rank]:
            if ev.get("event") == "hello":
                return ev
    return {}


def layout_of(hosts: Mapping[int, str]) -> dict[str, tuple[int, ...]]:
    """The ranks on each host, hosts in the order of their lowest rank."""
    out: dict[str, list[int]] = {}
    for rank in sorted(hosts):
        out.setdefault(hosts[rank], []).append(rank)
    return {host: tuple(ranks) for host, ranks in out.items()}


def layout_text(hosts: Mapping[int, str]) -> str:
    """``n1: ranks 0,1; n2: ranks 2,3``."""
    return "; ".join(f"{host}: {_ranks_text(ranks)}" for host, ranks in layout_of(hosts).items())


def parse_events(text: str) -> list[dict[str, Any]]:
    """A rank file's events; a torn last line (the rank was killed mid-write) is dropped."""
    events = []
    for line in text.splitlines():
        try:
            item = json.loads(line)
        except ValueError:
            continue
        if isinstance(item, dict) and "event" in item:
            events.append(item)
    return events


def merge(
    checks: Sequence[str],
    events: Mapping[int, Sequence[Mapping[str, Any]]],
    world: int,
    exit_code: Optional[int],
    timed_out_after: Optional[float] = None,
) -> list[Row]:
    """One row per check, from every rank's events."""
    results: dict[int, dict[str, Mapping[str, Any]]] = {}
    stopped: dict[int, str] = {}  # rank -> check it was in when it stopped
    killed: dict[int, int] = {}
    for rank in range(world):
        evs = events.get(rank, ())
        results[rank] = {}
        current: Optional[str] = None
        entered = False
        for ev in evs:
            if ev["event"] == "start":
                current = ev.get("check")
                entered = False
            elif ev["event"] == "entered":
                entered = True
            elif ev["event"] == "result":
                results[rank][ev["check"]] = ev
                current = None
            elif ev["event"] == "killed":
                killed[rank] = int(ev.get("signal") or 0)
                if current is not None:
                    # Where it was, and how far it got: a rank terminated while the others timed out waiting
                    # is usually the one that hung.
                    results[rank].setdefault(current, {"status": "killed", "progress": ev.get("progress")})
        if current is not None:
            stopped[rank] = current
            # Died without a word: all that is known is whether it had entered a collective.
            results[rank].setdefault(current, {"status": "died", "progress": int(entered)})
    # A rank the launcher terminated because another rank failed did not fail itself: its check is marked
    # interrupted, and the report points at the rank that did fail.
    culprits = {
        r
        for r in range(world)
        if (r in stopped and r not in killed)
        or any(res.get("status") == "fail" for res in results[r].values())
        or not events.get(r)
    }
    interrupted = {r: c for r, c in stopped.items() if r in killed and culprits - {r}}
    ordered = list(dict.fromkeys([FIRST, *checks]))
    ranks = _Ranks(
        results=results,
        stopped={r: c for r, c in stopped.items() if r not in interrupted},
        killed=killed,
        events=events,
        world=world,
        exit_code=exit_code,
        timed_out_after=timed_out_after,
        interrupted=frozenset(interrupted),
        hosts=hosts_of(events),
    )
    rows = []
    for check in ordered:
        row = _row(check, ranks)
        if check == "affinity" and row.status == "pass":
            row = _placement(row)
        cut = sorted(r for r in interrupted if results[r].get(check, {}).get("status") in (None, "killed"))
        if cut and row.status != "fail" and row.per_rank:
            row = replace(
                row,
                status="skip",
                reason=f"{_ranks_text(cut)} stopped by the launcher before finishing, after "
                f"{_ranks_text(sorted(culprits - set(cut)))} failed",
            )
        rows.append(row)
    return rows


def _placement(row: Row) -> Row:
    """The affinity row judged across ranks: each rank only reports where it runs."""
    verdict = affinity.judge(row.per_rank)
    per_rank = {
        r: {**rec, "nic": verdict.nics[r]} if r in verdict.nics else rec for r, rec in row.per_rank.items()
    }
    return replace(
        row,
        status=verdict.status,
        cause=verdict.cause,
        hint=verdict.hint,
        detail=verdict.detail,
        per_rank=per_rank,
    )


@dataclass(frozen=True)
class _Ranks:
    """What the ranks' events say, gathered once for every check's row."""

    results: Mapping[int, Mapping[str, Mapping[str, Any]]]
    #: rank -> the check it stopped in (not the ranks the launcher interrupted)
    stopped: Mapping[int, str]
    #: rank -> the signal the launcher terminated it with
    killed: Mapping[int, int]
    events: Mapping[int, Sequence[Mapping[str, Any]]]
    world: int
    exit_code: Optional[int]
    timed_out_after: Optional[float]
    interrupted: frozenset[int]
    hosts: Mapping[int, str]

    def stop_cause(self, rank: int) -> str:
        return _stop_cause(rank, self.killed.get(rank), self.exit_code, self.timed_out_after)

    def who(self, ranks: Sequence[int]) -> str:
        """``rank 2`` or ``ranks 2,3``; with the host (``ranks 2,3 on n2``) where the ranks span several hosts,
        so a failure names the node as well."""
        text = _ranks_text(ranks)
        if len(set(self.hosts.values())) < 2:
            return text
        where = sorted({self.hosts[r] for r in ranks if r in self.hosts})
        return f"{text} on {', '.join(where)}" if where else text


def _row(check: str, ranks: _Ranks) -> Row:
    per_rank: dict[int, Mapping[str, Any]] = {}
    failures: dict[str, list[int]] = {}
    hints: dict[str, str] = {}
    not_reached: list[int] = []
    stuck = _stuck_ranks(check, ranks.results)
    # Ranks that died in this check without a word (killed, crashed, their node gone) come first: a rank whose
    # collective then failed lost them, and the report says so.
    dead = [
        r for r in range(ranks.world) if _status(ranks, r, check) == "died" and r not in ranks.interrupted
    ]
    for rank in [*dead, *(r for r in range(ranks.world) if r not in dead)]:
        res = ranks.results[rank].get(check)
        if res is None:
            if not ranks.events.get(rank) and check == FIRST:
                failures.setdefault(_never_started(ranks.exit_code, ranks.timed_out_after), []).append(rank)
            elif rank not in ranks.interrupted:
                not_reached.append(rank)
            continue
        if res.get("status") not in ("died", "killed"):
            per_rank[rank] = {k: v for k, v in res.items() if k not in ("event", "t", "check")}
        cause = _failure_cause(rank, res, ranks, stuck)
        if cause is None:
            continue
        if dead and rank not in dead and res.get("status") == "fail" and not res.get("timeout"):
            cause = f"lost {ranks.who(dead)}, which died: {cause}"
        failures.setdefault(cause, []).append(rank)
        if res.get("status") == "fail" and res.get("hint"):
            hints.setdefault(cause, str(res["hint"]))
    if failures:
        return _failed_row(check, ranks, per_rank, failures, hints)
    return _finished_row(check, ranks.stopped, per_rank, not_reached)


def _status(ranks: _Ranks, rank: int, check: str) -> Optional[str]:
    return ranks.results[rank].get(check, {}).get("status")


def _failure_cause(rank: int, res: Mapping[str, Any], ranks: _Ranks, stuck: set[int]) -> Optional[str]:
    """Why ``rank`` failed the check ``res`` is its result of, in words; None where it did not."""
    if res.get("status") in ("died", "killed"):
        return _stopped_cause(rank, res["status"], ranks, stuck)
    if res["status"] != "fail":
        return None
    cause = str(res.get("cause") or "failed")
    if stuck and res.get("timeout"):
        who = _ranks_text(sorted(stuck))
        return f"hung: {cause}" if rank in stuck else f"waited for {who} until it timed out"
    return cause


def _stopped_cause(rank: int, status: str, ranks: _Ranks, stuck: set[int]) -> Optional[str]:
    """A rank that died in the check, or that the launcher terminated there; None when it was terminated only
    because another rank failed."""
    if status == "died":
        if stuck and rank not in stuck:
            return f"waited in a collective for {_ranks_text(sorted(stuck))}, then the launcher ended it"
        return ranks.stop_cause(rank)
    if rank in stuck:
        return "hung: it got least far, and the launcher terminated it after the others timed out"
    return None if rank in ranks.interrupted else ranks.stop_cause(rank)


def _failed_row(
    check: str,
    ranks: _Ranks,
    per_rank: Mapping[int, Mapping[str, Any]],
    failures: Mapping[str, list[int]],
    hints: Mapping[str, str],
) -> Row:
    parts = [cause if ranks.world == 1 else f"{ranks.who(rs)}: {cause}" for cause, rs in failures.items()]
    hint = next(iter(hints.values()), None)
    if hint is None and any(
        r in ranks.stopped or not ranks.events.get(r) for rs in failures.values() for r in rs
    ):
        hint = "see the launcher's output below; rerun with a single check (--checks) to isolate it"
    return Row(
        check,
        "fail",
        tuple(sorted(per_rank)),
        _figures(per_rank),
        "; ".join(parts),
        hint,
        per_rank=per_rank,
    )


def _finished_row(
    check: str, stopped: Mapping[int, str], per_rank: Mapping[int, Mapping[str, Any]], not_reached: list[int]
) -> Row:
    """The row of a check no rank failed: passed, skipped, or not reached by some ranks."""
    if not per_rank:
        where = sorted({stopped[r] for r in stopped}) or ["an earlier check"]
        return Row(check, "skip", (), reason=f"not reached: the ranks stopped during {', '.join(where)}")
    statuses = {v["status"] for v in per_rank.values()}
    if statuses == {"skip"}:
        return Row(check, "skip", tuple(sorted(per_rank)), reason=str(per_rank[min(per_rank)].get("reason")))
    if not_reached:
        cause = f"{_ranks_text(not_reached)} never reached this check"
        return Row(check, "fail", tuple(sorted(per_rank)), _figures(per_rank), cause, per_rank=per_rank)
    return Row(check, "pass", tuple(sorted(per_rank)), _figures(per_rank), per_rank=per_rank)


def _stuck_ranks(check: str, results: Mapping[int, Mapping[str, Mapping[str, Any]]]) -> set[int]:
    """Among ranks that timed out, died or were terminated in ``check``, those that got least far (the others
    waited for them); empty when they all got equally far (then nobody can be singled out)."""
    ends = {rank: res[check] for rank, res in results.items() if "progress" in res.get(check, {})}
    failed = [r for r, end in ends.items() if end.get("status") in ("fail", "died")]
    if len(ends) < 2 or not failed:
        return set()
    # A rank that died leaves only whether it entered a collective: compare everyone at that grain then.
    coarse = any(end.get("status") == "died" for end in ends.values())
    progress = {
        r: min(int(end["progress"] or 0), 1) if coarse else int(end["progress"] or 0)
        for r, end in ends.items()
    }
    if len(set(progress.values())) == 1:
        return set()
    low = min(progress.values())
    return {rank for rank, value in progress.items() if value == low}


def _stop_cause(rank: int, signal: Optional[int], exit_code: Optional[int], after: Optional[float]) -> str:
    if after is not None:
        return f"rank {rank} was still in this check when the run was stopped after {after:.0f} s (hung)"
    if signal:
        return f"rank {rank} was terminated (signal {signal}) by the launcher during this check, after another rank failed"
    code = f" (launcher exit status {exit_code})" if exit_code is not None else ""
    return f"rank {rank} died during this check without a result{code}"


def _never_started(exit_code: Optional[int], after: Optional[float]) -> str:
    if after is not None:
        return f"the rank never started within {after:.0f} s"
    return f"the rank never started (launcher exit status {exit_code})"


def _ranks_text(ranks: Sequence[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ",".join(map(str, ranks))


def _figures(per_rank: Mapping[int, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each figure across ranks: the slowest rank's value (max for times, min for rates)."""
    out: dict[str, dict[str, Any]] = {}
    for rank in sorted(per_rank):
        for name, fig in (per_rank[rank].get("figures") or {}).items():
            if not isinstance(fig, Mapping) or not isinstance(fig.get("value"), (int, float)):
                continue
            if name not in out:
                out[name] = dict(fig)
                continue
            worse = max if fig.get("unit") in _LOWER_IS_BETTER_UNITS else min
            out[name]["value"] = worse(out[name]["value"], fig["value"])
    return out


# --- references -----------------------------------------------------------------------------------------------


def references_for(
    refs: Sequence[Mapping[str, Any]], partition: Optional[str], world: int
) -> dict[str, Mapping[str, Any]]:
    """The recipe's references that hold here: any-partition ones, overridden by the partition's own; a
    reference with ``ranks`` holds only for that many ranks."""
    chosen: dict[str, Mapping[str, Any]] = {}
    for ref in sorted(refs, key=lambda r: r.get("partition") is not None):
        if ref.get("partition") not in (None, partition):
            continue
        if ref.get("ranks") is not None and int(ref["ranks"]) != world:
            continue
        chosen[str(ref["figure"])] = {**ref, "partition": ref.get("partition") or "*"}
    return chosen


def apply_references(rows: Sequence[Row], refs: Mapping[str, Mapping[str, Any]]) -> list[Row]:
    """Rows with each reference evaluated; a passing row with a figure out of bounds becomes a FAIL."""
    out = []
    for row in rows:
        evaluated = []
        breaches = []
        for name, ref in refs.items():
            check, _, figure = name.partition(".")
            if check != row.check:
                continue
            fig = row.figures.get(figure)
            result = {"name": name, **ref}
            if fig is None:
                result["verdict"] = "no figure" if row.status != "skip" else "skipped"
                evaluated.append(result)
                continue
            value = float(fig["value"])
            lo, hi = bounds(ref)
            result["measured"] = value
            result["verdict"] = "ok" if (lo is None or value >= lo) and (hi is None or value <= hi) else "out"
            evaluated.append(result)
            if result["verdict"] == "out":
                breaches.append(_breach_text(figure, value, ref, lo, hi))
        checked = replace(row, references=tuple(evaluated))
        if breaches and row.status == "pass":
            checked = replace(
                checked,
                status="fail",
                cause="; ".join(breaches),
                hint="outside the site's reference: a slow link, a wrong NCCL transport, or a degraded node",
            )
        out.append(checked)
    return out


def bounds(ref: Mapping[str, Any]) -> tuple[Optional[float], Optional[float]]:
    value = float(ref["value"])
    lo = value * (1 + float(ref["lower"])) if ref.get("lower") is not None else None
    hi = value * (1 + float(ref["upper"])) if ref.get("upper") is not None else None
    return lo, hi


def _breach_text(
    figure: str, value: float, ref: Mapping[str, Any], lo: Optional[float], hi: Optional[float]
) -> str:
    unit = ref.get("unit", "")
    where = f"partition {ref['partition']}" if ref.get("partition") not in (None, "*") else "this site"
    if lo is not None and value < lo:
        return f"{figure} {value:.3g} {unit} is below the reference {ref['value']} {unit} {_pct(ref['lower'])} (>= {lo:.3g}) for {where}"
    return f"{figure} {value:.3g} {unit} is above the reference {ref['value']} {unit} +{_pct(ref['upper'])} (<= {hi:.3g}) for {where}"


def _pct(frac: Any) -> str:
    return f"{float(frac) * 100:+.0f}%".replace("+-", "-")


# --- JUnit ----------------------------------------------------------------------------------------------------


# --- for people ---------------------------------------------------------------------------------------------

#: The payload's figures in words. Only the human report uses these: --json, JUnit and references keep the keys.
FIGURE_WORDS = {
    "import_s": "import time",
    "bf16_tflops": "bf16 matmul",
    "busbw": "bus bandwidth",
    "busbw_peak": "peak bus bandwidth",
    "latency_small_us": "small-message latency",
    "p2p_roundtrip_us": "point-to-point round trip",
    "write_mb_s": "write speed",
}
_UNIT_WORDS = {"us": "µs"}


def check_label(check: str, device: str) -> str:
    """A check's name for people: on CPU ranks the nccl check tests gloo, and is called that."""
    return "gloo" if check == "nccl" and device == "cpu" else check


def figure_text(row: Row, marks: Optional[Mapping[str, str]] = None) -> str:
    """The row's figures in words, each one named in ``marks`` (``CHECK.FIGURE``: a drift) with its mark."""
    parts = []
    for name, fig in row.figures.items():
        value = fig["value"]
        text = f"{value:.3g}" if isinstance(value, float) else str(value)
        unit = str(fig.get("unit", ""))
        words = FIGURE_WORDS.get(name, name.replace("_", " "))
        mark = (marks or {}).get(f"{row.check}.{name}")
        parts.append(f"{words} {text} {_UNIT_WORDS.get(unit, unit)}".rstrip() + (f" {mark}" if mark else ""))
    for ref in row.references:
        if ref.get("verdict") in ("ok", "out"):
            unit = str(ref.get("unit", ""))
            parts.append(f"(ref {ref['value']} {_UNIT_WORDS.get(unit, unit)}: {ref['verdict']})")
    return ", ".join(parts)
