"""Activation's list variables (prepend/append): the in-process environment they give, and how a state record
holds them (records from before they existed still load)."""

from __future__ import annotations

from envbuilder.plan.activation import Activation

ACT = Activation(
    env={"A": "1"},
    unset=("NCCL_DEBUG",),
    prepend={"LD_LIBRARY_PATH": ("/soft/ofi/lib", "/soft/hwloc/lib/")},
    append={"LD_LIBRARY_PATH": ("/soft/last",), "CPATH": ("/inc",)},
)


def test_apply_puts_entries_around_the_value_and_never_adds_an_empty_one():
    out = ACT.apply({"LD_LIBRARY_PATH": "/opt/mod/lib", "NCCL_DEBUG": "INFO", "CPATH": "", "KEEP": "k"})
    assert out == {
        "A": "1",
        "KEEP": "k",
        "LD_LIBRARY_PATH": "/soft/ofi/lib:/soft/hwloc/lib/:/opt/mod/lib:/soft/last",
        "CPATH": "/inc",  # empty before: an empty entry would be the current directory
    }
    assert ACT.apply({})["LD_LIBRARY_PATH"] == "/soft/ofi/lib:/soft/hwloc/lib/:/soft/last"


def test_record_round_trip_and_old_records_without_the_keys():
    assert Activation.from_json(ACT.to_json()) == ACT
    assert ACT.to_json()["prepend"] == {"LD_LIBRARY_PATH": ["/soft/ofi/lib", "/soft/hwloc/lib/"]}
    old = Activation.from_json({"modules": ["gcc/15.1.0"], "env": {"A": "1"}, "unset": [], "module_use": []})
    assert old.prepend == {} and old.append == {}
    assert old.apply({"PATH": "/bin"}) == {"PATH": "/bin", "A": "1"}
