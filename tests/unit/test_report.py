"""The report merge, references and JUnit (pure), and the payload's pure helpers (no torch needed)."""

from __future__ import annotations

import dataclasses
import sys
import xml.etree.ElementTree as ET

import pytest
from helpers import REPO

from envbuilder.resolver.matrix import load_matrix
from envbuilder.validate import junit, report

sys.path.insert(0, str(REPO / "envbuilder" / "payloads"))
import envbuilder_facts as facts


def ev(kind, **data):
    return {"event": kind, "t": 0.0, **data}


def passed(check, **data):
    return [ev("start", check=check), ev("result", check=check, status="pass", **data)]


def rank_events(*parts, end=True):
    out = [ev("hello")]
    for part in parts:
        out += part
    if end:
        out.append(ev("end", ok=True))
    return out


CHECKS = ["import", "nccl", "ddp"]


def test_all_pass_merges_figures_from_the_slowest_rank():
    events = {
        0: rank_events(
            passed("import", figures={"import_s": {"value": 1.5, "unit": "s"}}),
            passed("nccl", figures={"busbw": {"value": 300.0, "unit": "GB/s"}}),
            passed("ddp"),
        ),
        1: rank_events(
            passed("import", figures={"import_s": {"value": 2.5, "unit": "s"}}),
            passed("nccl", figures={"busbw": {"value": 280.0, "unit": "GB/s"}}),
            passed("ddp"),
        ),
    }
    rows = {r.check: r for r in report.merge(CHECKS, events, 2, 0)}
    assert [r.status for r in rows.values()] == ["pass", "pass", "pass"]
    assert rows["import"].figures["import_s"]["value"] == 2.5  # a time: the largest
    assert rows["nccl"].figures["busbw"]["value"] == 280.0  # a rate: the smallest
    assert rows["nccl"].ranks == (0, 1)


def test_a_rank_that_died_is_named_and_later_checks_are_not_reached():
    events = {
        0: rank_events(passed("import"), [ev("start", check="nccl")], end=False),
        1: rank_events(passed("import"), [ev("start", check="nccl")], end=False),
    }
    events[0].append(ev("killed", signal=15, check="nccl"))
    rows = {r.check: r for r in report.merge(CHECKS, events, 2, 1)}
    assert rows["nccl"].status == "fail"
    assert (
        rows["nccl"].cause
        == "rank 1: rank 1 died during this check without a result (launcher exit status 1)"
    )
    assert rows["ddp"].status == "skip" and "not reached" in rows["ddp"].reason


def test_a_rank_terminated_by_the_launcher_is_not_blamed():
    # Rank 1 died in nccl while rank 0 was still importing; torchrun then terminated rank 0.
    events = {
        0: rank_events([ev("start", check="import"), ev("killed", signal=15, check="import")], end=False),
        1: rank_events(passed("import"), [ev("start", check="nccl")], end=False),
    }
    rows = {r.check: r for r in report.merge(CHECKS, events, 2, 1)}
    assert rows["import"].status == "skip"
    assert (
        "rank 0 stopped by the launcher" in rows["import"].reason
        and "after rank 1 failed" in rows["import"].reason
    )
    assert rows["nccl"].status == "fail" and "rank 1 died" in rows["nccl"].cause


def test_a_rank_without_a_file_never_started():
    events = {0: rank_events(passed("import"), passed("nccl"), passed("ddp"))}
    rows = {r.check: r for r in report.merge(CHECKS, events, 2, 1)}
    assert rows["import"].status == "fail"
    assert rows["import"].cause == "rank 1: the rank never started (launcher exit status 1)"
    assert rows["nccl"].status == "fail" and "rank 1 never reached" in rows["nccl"].cause


def test_timeouts_single_out_the_rank_that_got_least_far():
    def timed_out(progress):
        return [
            ev("start", check="ddp"),
            ev(
                "result",
                check="ddp",
                status="fail",
                cause="timed out after 15 s",
                timeout=True,
                progress=progress,
            ),
        ]

    events = {0: rank_events(passed("import"), timed_out(1)), 1: rank_events(passed("import"), timed_out(0))}
    row = report.merge(["ddp"], events, 2, 1)[1]
    assert row.cause == "rank 0: waited for rank 1 until it timed out; rank 1: hung: timed out after 15 s"


def test_a_hung_rank_terminated_after_the_other_timed_out_is_blamed():
    # Rank 0 timed out waiting in ddp; torchrun then terminated rank 1, which had not entered a collective.
    events = {
        0: rank_events(
            passed("import"),
            [
                ev("start", check="ddp"),
                ev(
                    "result",
                    check="ddp",
                    status="fail",
                    cause="timed out after 15 s",
                    timeout=True,
                    progress=1,
                ),
            ],
        ),
        1: rank_events(
            passed("import"),
            [ev("start", check="ddp"), ev("killed", signal=15, check="ddp", progress=0)],
            end=False,
        ),
    }
    row = report.merge(["ddp"], events, 2, 1)[1]
    assert row.status == "fail"
    assert "rank 0: waited for rank 1 until it timed out" in row.cause
    assert "rank 1: hung: it got least far" in row.cause


def test_a_rank_killed_while_blocked_in_a_collective_is_not_blamed_for_the_one_that_died():
    # Rank 1 died as nccl started; rank 0 was blocked in the rendezvous, where SIGTERM cannot reach Python, so
    # torchrun had to SIGKILL it: neither wrote a word, but only rank 0 had entered a collective.
    events = {
        0: rank_events(passed("import"), [ev("start", check="nccl"), ev("entered", check="nccl")], end=False),
        1: rank_events(passed("import"), [ev("start", check="nccl")], end=False),
    }
    row = report.merge(["nccl"], events, 2, 1)[1]
    assert row.cause == (
        "rank 0: waited in a collective for rank 1, then the launcher ended it; "
        "rank 1: rank 1 died during this check without a result (launcher exit status 1)"
    )


def test_an_outer_timeout_says_hung():
    events = {0: rank_events(passed("import"), [ev("start", check="nccl")], end=False)}
    row = report.merge(["nccl"], events, 1, None, timed_out_after=300)[1]
    assert row.status == "fail" and "stopped after 300 s (hung)" in row.cause


def test_a_torn_last_line_is_ignored():
    text = '{"event": "hello"}\n{"event": "start", "check": "import"}\n{"event": "resu'
    assert [e["event"] for e in report.parse_events(text)] == ["hello", "start"]


def test_skips_keep_their_reason():
    skip = [
        ev("start", check="mpi"),
        ev("result", check="mpi", status="skip", reason="mpi4py is not installed"),
    ]
    events = {0: rank_events(passed("import"), skip), 1: rank_events(passed("import"), skip)}
    row = report.merge(["mpi"], events, 2, 0)[1]
    assert (row.status, row.reason) == ("skip", "mpi4py is not installed")


REFS = [
    {"figure": "nccl.busbw", "value": 300.0, "lower": -0.1, "unit": "GB/s"},
    {"figure": "nccl.busbw", "value": 400.0, "lower": -0.05, "upper": 0.2, "unit": "GB/s", "partition": "gh"},
    {"figure": "nccl.busbw", "value": 1.0, "unit": "GB/s", "ranks": 16},
]


def _nccl_row(busbw):
    return report.Row("nccl", "pass", (0, 1), {"busbw": {"value": busbw, "unit": "GB/s"}})


def test_reference_for_the_partition_overrides_the_default_and_ranks_must_match():
    chosen = report.references_for(REFS, "gh", 2)
    assert chosen["nccl.busbw"]["value"] == 400.0 and chosen["nccl.busbw"]["partition"] == "gh"
    assert report.references_for(REFS, "other", 2)["nccl.busbw"]["value"] == 300.0
    assert report.references_for(REFS, "other", 16)["nccl.busbw"]["value"] == 1.0


@pytest.mark.parametrize(
    ("busbw", "partition", "status", "verdict"),
    [
        (280.0, None, "pass", "ok"),  # within -10 % of 300
        (269.0, None, "fail", "out"),  # below 270
        (385.0, "gh", "pass", "ok"),
        (379.0, "gh", "fail", "out"),
        (481.0, "gh", "fail", "out"),  # above +20 % of 400: suspicious too
    ],
)
def test_references_bound_the_figure(busbw, partition, status, verdict):
    row = report.apply_references([_nccl_row(busbw)], report.references_for(REFS, partition, 2))[0]
    assert row.status == status
    assert row.references[0]["verdict"] == verdict
    if status == "fail":
        assert "reference" in row.cause and "GB/s" in row.cause


def test_a_failed_row_stays_failed_and_a_missing_figure_is_reported():
    row = report.Row("nccl", "fail", (0,), {}, cause="all_reduce gave a wrong sum")
    out = report.apply_references([row], report.references_for(REFS, None, 2))[0]
    assert out.cause == "all_reduce gave a wrong sum"
    assert out.references[0]["verdict"] == "no figure"


def _report(rows):
    return report.Report(
        env="e1",
        launcher="torchrun",
        device="cpu",
        world=2,
        nodes=1,
        command=("torchrun",),
        rows=tuple(rows),
        seconds=3.2,
        exit_code=1,
        where="here",
        started="2026-11-22T10:00:00+0000",
    )


def test_junit_has_one_case_per_check():
    rows = [
        report.Row("import", "pass", (0, 1), {"import_s": {"value": 1.2, "unit": "s"}}),
        report.Row("nccl", "fail", (0, 1), {}, cause='rank 1 died <here> & "there"', hint="see the log"),
        report.Row("mpi", "skip", (), reason="mpi4py is not installed"),
    ]
    text = junit.junit(_report(rows))
    suite = ET.fromstring(text.split("\n", 1)[1])  # noqa: S314 - our own output
    assert (suite.get("tests"), suite.get("failures"), suite.get("skipped")) == ("3", "1", "1")
    cases = {c.get("name"): c for c in suite.iter("testcase")}
    assert cases["nccl"].find("failure").get("message") == 'rank 1 died <here> & "there"'
    assert "hint: see the log" in cases["nccl"].find("failure").text
    assert cases["mpi"].find("skipped").get("message") == "mpi4py is not installed"
    assert cases["import"].find("system-out").text == "import_s = 1.2 s"


def test_drift_fails_the_report_and_its_junit_only_past_the_threshold():
    rows = [report.Row("nccl", "pass", (0, 1), {"busbw": {"value": 2.0, "unit": "GB/s"}})]
    told = {"figure": "nccl.busbw", "text": "nccl bus bandwidth 2 GB/s, 50% below", "fails": False}
    reported = dataclasses.replace(_report(rows), drift=(told,))
    assert reported.ok and reported.drift_failed == []
    suite = ET.fromstring(junit.junit(reported).split("\n", 1)[1])  # noqa: S314 - our own output
    assert (suite.get("tests"), suite.get("failures")) == ("2", "0")
    case = next(c for c in suite.iter("testcase") if c.get("name") == "drift")
    assert case.find("failure") is None and case.find("system-out").text == told["text"]
    failed = dataclasses.replace(_report(rows), drift=({**told, "fails": True},))
    assert not failed.ok and failed.drift_failed == ["nccl.busbw"]
    suite = ET.fromstring(junit.junit(failed).split("\n", 1)[1])  # noqa: S314 - our own output
    assert (suite.get("tests"), suite.get("failures")) == ("2", "1")
    assert failed.to_json()["drift"] == [{**told, "fails": True}] and failed.to_json()["ok"] is False


def test_report_ok_needs_a_pass_and_no_fail():
    assert _report([report.Row("import", "pass", (0,))]).ok
    assert not _report([report.Row("import", "skip", ())]).ok
    assert not _report([report.Row("import", "pass", (0,)), report.Row("ddp", "fail", (0,))]).ok


# --- payload helpers ------------------------------------------------------------------------------------------


def _sm_list(variant, torch):
    entry = load_matrix().arch_list(variant, "x86_64", torch)
    assert entry is not None
    return [f"sm_{s.replace('.', '')}" for s in entry.sm] + [
        f"compute_{s.replace('.', '')}" for s in entry.ptx
    ]


def test_arch_gap_v100_on_a_cu128_build():
    # torch 2.7's cu128 wheels dropped sm_70: a V100 gets no kernels (the matrix's arch list, from its sources).
    assert facts.arch_gaps(_sm_list("cu128", "2.7.1"), [(7, 0)]) == ["sm_70"]
    assert facts.arch_gaps(_sm_list("cu128", "2.7.1"), [(9, 0), (8, 6)]) == []


def test_arch_gaps_same_major_sass_and_ptx_jit():
    assert facts.arch_gaps(["sm_80"], [(8, 6)]) == []  # sm_80 SASS runs on 8.6
    assert facts.arch_gaps(["sm_86"], [(8, 0)]) == ["sm_80"]  # but not the other way round
    assert facts.arch_gaps(["sm_80", "compute_80"], [(9, 0)]) == []  # PTX JIT-compiles forward
    assert facts.arch_gaps(["sm_90a"], [(9, 0)]) == []


def test_bus_bandwidth_is_nccl_tests_definition():
    algbw, busbw = facts.bus_bandwidth(1 << 30, 0.01, 8)
    assert algbw == pytest.approx((1 << 30) / 0.01 / 1e9)
    assert busbw == pytest.approx(algbw * 2 * 7 / 8)
    assert facts.bus_bandwidth(1024, 1.0, 1)[1] == 0.0


def test_shadowed_compares_real_paths(tmp_path):
    wheel = tmp_path / "site" / "nvidia" / "nccl" / "lib"
    wheel.mkdir(parents=True)
    (wheel / "libnccl.so.2").write_bytes(b"x")
    link = tmp_path / "link.so.2"
    link.symlink_to(wheel / "libnccl.so.2")
    copies = {"libnccl": [str(wheel / "libnccl.so.2")]}
    assert facts.shadowed({"libnccl": [str(link)]}, copies) == {}
    other = "/opt/nccl/lib/libnccl.so.2"
    assert facts.shadowed({"libnccl": [other]}, copies) == {
        "libnccl": {"loaded": other, "wheel": str(wheel / "libnccl.so.2"), "both": False}
    }
    # LD_PRELOAD: the other copy and the wheel's both mapped; symbols bind to the first.
    both = facts.shadowed({"libnccl": [other, str(wheel / "libnccl.so.2")]}, copies)
    assert both["libnccl"]["both"] is True
    assert facts.shadowed({"libcudart": ["/usr/local/cuda/lib64/libcudart.so.12"]}, copies) == {}


@pytest.mark.parametrize(
    ("env", "explicit", "expected"),
    [
        ({"CUDA_VISIBLE_DEVICES": "0,1"}, None, (2, "CUDA_VISIBLE_DEVICES")),
        ({"CUDA_VISIBLE_DEVICES": "0,1"}, 4, (4, "recipe")),
        ({"SLURM_GPUS_ON_NODE": "3"}, None, (3, "SLURM_GPUS_ON_NODE")),
        ({"CUDA_VISIBLE_DEVICES": ""}, None, (None, "nothing")),
        ({}, None, (None, "nothing")),
    ],
)
def test_expected_gpus(monkeypatch, env, explicit, expected):
    for var in ("CUDA_VISIBLE_DEVICES", "SLURM_GPUS_ON_NODE"):
        monkeypatch.delenv(var, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert facts.expected_gpus(explicit) == expected


def _roundtrip(args: tuple[str, int]) -> dict:
    return facts.fs_roundtrip(*args)


@pytest.mark.integration  # a stress test: 16 processes, 40 rounds
def test_filesystem_probe_of_many_ranks_at_once_on_one_directory(tmp_path):
    """Ranks of one node probe the same directory at the same moment (the CI run that found the race: one rank's
    cleanup removed the shared directory between another's mkdir and its check, "File exists"). The old code
    failed here about once in a thousand probes; the probe now has no shared directory."""
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(max_workers=16) as pool:
        for _ in range(40):
            results = list(pool.map(_roundtrip, [(str(tmp_path), rank) for rank in range(16)]))
            assert [r.get("error") for r in results] == [None] * 16
            assert all(r["write_mb_s"] > 0 for r in results)
    assert list(tmp_path.iterdir()) == []


def test_figures_are_shown_in_words_with_units_and_gloo_by_its_name():
    row = report.Row(
        "nccl",
        "pass",
        (0, 1),
        {
            "busbw": {"value": 12.5, "unit": "GB/s"},
            "latency_small_us": {"value": 35.2, "unit": "us"},
            "new_figure": {"value": 3, "unit": ""},
        },
    )
    assert report.figure_text(row) == "bus bandwidth 12.5 GB/s, small-message latency 35.2 µs, new figure 3"
    assert report.check_label("nccl", "cpu") == "gloo"
    assert report.check_label("nccl", "cuda") == "nccl"
    assert report.check_label("ddp", "cpu") == "ddp"


def _on(host, *parts, end=True):
    events = rank_events(*parts, end=end)
    events[0] = ev("hello", host=host)
    return events


def test_the_report_says_where_each_rank_ran():
    events = {rank: _on(host, passed("import")) for rank, host in enumerate(["n2", "n2", "n1", "n1"])}
    hosts = report.hosts_of(events)
    assert hosts == {0: "n2", 1: "n2", 2: "n1", 3: "n1"}
    assert report.layout_of(hosts) == {"n2": (0, 1), "n1": (2, 3)}  # in the order of their lowest rank
    assert report.layout_text(hosts) == "n2: ranks 0,1; n1: ranks 2,3"
    result = report.Report(
        env="e",
        launcher="srun",
        device="cpu",
        world=4,
        nodes=2,
        command=(),
        rows=tuple(report.merge(["import"], events, 4, 0)),
        seconds=1.0,
        exit_code=0,
        where="here",
        started="now",
        hosts=hosts,
    )
    data = result.to_json()
    assert data["hosts"] == {"0": "n2", "1": "n2", "2": "n1", "3": "n1"}
    assert data["layout"] == {"n2": [0, 1], "n1": [2, 3]}
    # A rank that never started has no host.
    assert report.hosts_of({0: _on("n1", passed("import")), 1: []}) == {0: "n1"}


def test_a_failure_across_nodes_names_the_node_of_each_rank():
    events = {
        0: _on(
            "n1",
            passed("import"),
            [
                ev("start", check="nccl"),
                ev("result", check="nccl", status="fail", cause="Connection closed by peer"),
            ],
        ),
        1: _on("n2", passed("import"), [ev("start", check="nccl")], end=False),
    }
    rows = {r.check: r for r in report.merge(CHECKS, events, 2, 137)}
    # The rank that died comes first; the one whose collective then failed lost it.
    assert rows["nccl"].cause == (
        "rank 1 on n2: rank 1 died during this check without a result (launcher exit status 137); "
        "rank 0 on n1: lost rank 1 on n2, which died: Connection closed by peer"
    )
    # On one host the node is not worth naming.
    events[1][0] = ev("hello", host="n1")
    rows = {r.check: r for r in report.merge(CHECKS, events, 2, 137)}
    assert rows["nccl"].cause.startswith("rank 1: rank 1 died during this check")
    assert rows["nccl"].cause.endswith("; rank 0: lost rank 1, which died: Connection closed by peer")
