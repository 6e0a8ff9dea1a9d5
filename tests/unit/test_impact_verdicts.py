"""The pure half of `envbuilder impact`: a module the node no longer offers, and each verdict from the two sides."""

from __future__ import annotations

from envbuilder.core.facts import HostFacts
from envbuilder.plan import impact


def test_a_module_is_missing_only_where_the_node_lists_its_modules():
    load = ["cuda/12.4", "gcc", "python3/3.11.8"]
    assert impact.missing_modules(load, HostFacts()) == []  # unknown: nothing is judged
    node = HostFacts(modules=("cuda/12.8", "gcc/13.2.0", "python3/3.11.8"))
    [gone] = impact.missing_modules(load, node)
    # An unversioned name (the site default) is there while any version of it is.
    assert gone == impact.Reason(
        "module", "module cuda/12.4 is not among the node's modules (it offers cuda/12.8)"
    )
    assert impact.missing_modules(["nccl"], node)[0].message == "module nccl is not among the node's modules"


def test_each_verdict_from_before_and_after():
    ok = impact.Outcome("torch 2.9.1 cu126")
    other = impact.Outcome("torch 2.9.1 cu130")
    bad = impact.Outcome(None, (impact.Reason("driver floor", "too old"),))
    cases = [
        (ok, ok, impact.UNAFFECTED, "torch 2.9.1 cu126"),
        (ok, other, impact.CHANGES, "torch 2.9.1 cu126 -> torch 2.9.1 cu130"),
        (ok, bad, impact.BREAKS, "driver floor: too old"),
        (bad, bad, impact.BROKEN, "driver floor: too old"),
        (bad, ok, impact.FIXED, "torch 2.9.1 cu126 (before: driver floor)"),
    ]
    for before, after, status, why in cases:
        v = impact.verdict("recipe", "r@1", before, after)
        assert (v.status, v.why) == (status, why)
    report = impact.Impact("now", "new", tuple(impact.verdict("recipe", "r", *c[:2]) for c in cases))
    assert report.breaks and report.counts[impact.BREAKS] == 1
    assert [v.status for v in impact.sorted_verdicts(report.verdicts)] == list(impact.STATUSES)
