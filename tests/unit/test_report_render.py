"""The history report's pure parts: what is taken from records (envbuilder.render.reportdata), the HTML page
(report_html) and the Markdown tables (report_md). Records are written as the store holds them; a hostile env,
check, partition or module name must come out as text, never as markup; a record of the wrong shape is left out."""

from __future__ import annotations

import html.parser
import math
from typing import Any

from envbuilder.render import report_html, report_md, reportdata

HOSTILE = '<script>alert("x")</script><img src=x onerror=alert(1)>|**bold**'


def run(time: str, **fields: Any) -> dict[str, Any]:
    record: dict[str, Any] = {
        "version": 1,
        "env": "e",
        "time": time,
        "partition": "gpu",
        "facts": {
            "driver": "550.54",
            "cuda": "12.4",
            "torch": "2.5.1",
            "glibc": "2.34",
            "modules": {"gcc": "12"},
        },
        "checks": [{"name": "nccl", "status": "pass", "seconds": 1.0, "figures": {"busbw": 300.0}}],
        "status": "pass",
    }
    record.update(fields)
    return record


class Tags(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.attrs: list[str] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        self.attrs += [name for name, _ in attrs]

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def parsed(page: str) -> Tags:
    tags = Tags()
    tags.feed(page)
    tags.close()
    return tags


def test_fact_changes_name_what_changed_between_runs() -> None:
    runs = reportdata.timed(
        [
            run("2026-11-01T08:00:00Z"),
            run("2026-11-02T08:00:00Z"),
            run(
                "2026-11-03T08:00:00+00:00",
                facts={
                    "driver": "570.86",
                    "cuda": "12.4",
                    "torch": "2.5.1",
                    "glibc": "2.34",
                    "modules": {"gcc": "13", "cuda": "12.8"},
                },
            ),
            run(
                "2026-11-04T08:00:00",
                facts={"driver": "570.86", "torch": "2.5.1", "glibc": "2.34", "modules": {}},
            ),
        ]
    )
    changes = reportdata.fact_changes(runs)
    assert [c.label for c in changes] == [
        "driver 550.54 -> 570.86, +cuda/12.8, gcc/12 -> 13",
        "cuda 12.4 -> ?, -cuda/12.8, -gcc/13",
    ]
    assert changes[0].time == runs[2][0]


def test_fact_changes_are_per_partition_and_one_upgrade_names_its_partitions() -> None:
    def on(part: str, day: int, driver: str) -> dict[str, Any]:
        return run(f"2026-11-0{day}T08:0{len(part) % 10}:00Z", partition=part, facts={"driver": driver})

    # Two partitions on different drivers all along: no change, however their runs interleave.
    runs = reportdata.timed(
        [on("a100", 1, "550"), on("h100x", 1, "570"), on("a100", 2, "550"), on("h100x", 2, "570")]
    )
    assert reportdata.fact_changes(runs) == []
    # The same upgrade on both within a day is one change naming both; on one of them later, another change.
    runs = reportdata.timed(
        [
            on("a100", 1, "550"),
            on("h100x", 1, "550"),
            on("a100", 2, "570"),
            on("h100x", 2, "570"),
            on("a100", 4, "575"),
        ]
    )
    assert [c.label for c in reportdata.fact_changes(runs)] == [
        "driver 550 -> 570 (on a100, h100x)",
        "driver 570 -> 575 (on a100)",
    ]


def test_records_of_the_wrong_shape_are_left_out() -> None:
    runs = reportdata.timed(
        [
            "not a record",
            run("yesterday"),
            run("2026-11-01T08:00:00Z", checks="nope", facts=[]),
            run(
                "2026-11-02T08:00:00Z",
                checks=[
                    {
                        "name": "nccl",
                        "status": "pass",
                        "figures": {"busbw": True, "lat": "3", "nan": math.nan, "ok": 2},
                    },
                    {"status": "pass"},
                    "x",
                    {
                        "name": "import",
                        "per_rank": {"0": {"import_s": 1.0}, "x": {"import_s": 2.0}, "1": "no"},
                        "sweep": [{"bytes": 1024, "busbw": 1.0}, {"bytes": "big"}, 3],
                    },
                ],
            ),
        ]
    )
    assert len(runs) == 2  # no time, no run; a time without a zone is UTC
    assert reportdata.fact_changes(runs) == []
    assert list(reportdata.figure_series(runs)) == ["nccl ok"]
    assert [s.points for s in reportdata.sweep_series(runs)] == [((1024.0, 1.0),)]
    assert [s.points for s in reportdata.rank_series(runs)["import_s"]] == [((0.0, 1.0),)]
    assert [label for label, _ in reportdata.status_rows(runs)] == ["import on gpu", "nccl on gpu"]
    assert parsed(report_html.render([("e", [r for _, r in runs])], "now")).tags.count("svg") == 4


def test_status_rows_per_check_and_partition_oldest_first() -> None:
    runs = reportdata.timed(
        [
            run("2026-11-02T08:00:00Z", checks=[{"name": "nccl", "status": "fail"}]),
            run("2026-11-01T08:00:00Z"),
            run("2026-11-01T09:00:00Z", partition="", checks=[{"name": "nccl", "status": "warn"}]),
        ]
    )
    rows = dict(reportdata.status_rows(runs))
    assert [c.status for c in rows["nccl on gpu"]] == ["pass", "fail"]
    assert [c.status for c in rows["nccl on (no partition)"]] == ["warn"]


def test_html_page_is_self_contained_and_escapes_every_record_text() -> None:
    hostile = run(
        "2026-11-02T08:00:00Z",
        env=HOSTILE,
        partition=HOSTILE,
        nodes=[HOSTILE],
        facts={"driver": HOSTILE, "modules": {HOSTILE: HOSTILE}, "gpus": [HOSTILE]},
        checks=[
            {
                "name": HOSTILE,
                "status": HOSTILE,
                "figures": {HOSTILE: 1.0},
                "per_rank": {"0": {HOSTILE: 1.0}},
                "sweep": [{"bytes": 1024, "busbw": 2.0}],
            }
        ],
        status=HOSTILE,
    )
    page = report_html.render([(HOSTILE, [run("2026-11-01T08:00:00Z", partition=HOSTILE), hostile])], HOSTILE)
    tags = parsed(page)
    assert "script" not in tags.tags and "img" not in tags.tags
    assert not {"src", "href", "onerror", "onload"} & set(tags.attrs)
    for outside in ("http://", "https://", "url(", "@import", "<link", "//"):
        assert outside not in page.replace('xmlns="http://www.w3.org/2000/svg"', "")
    shown = "".join(tags.text)
    assert shown.count(HOSTILE) >= 10  # the name, facts, module, node, check, status... each shown as text
    assert f"driver 550.54 -> {HOSTILE}" in shown


def test_html_page_holds_a_plot_per_figure_and_the_sweep() -> None:
    runs = [run(f"2026-11-0{d}T08:00:00Z") for d in range(1, 4)]
    runs[-1]["checks"][0]["sweep"] = [{"bytes": 2**k, "busbw": float(k)} for k in range(10, 20)]
    page = report_html.render([("e", runs), ("empty", [])], "now")
    tags = parsed(page)
    assert tags.tags.count("svg") == 3  # the check grid, the sweep, busbw over time
    assert tags.tags.count("circle") == 10 + 3
    assert "No validation recorded for this env." in "".join(tags.text)


def test_markdown_tables_escape_record_text() -> None:
    hostile = run(
        "2026-11-02T08:00:00Z",
        partition=HOSTILE,
        facts={"driver": "570", "modules": {HOSTILE: "1|2"}},
        checks=[{"name": HOSTILE, "status": "fail", "figures": {"x|y": 2.0}}],
    )
    text = report_md.render([(HOSTILE, [run("2026-11-01T08:00:00Z", partition=HOSTILE), hostile])], "now")
    assert "<script" not in text and "<img" not in text
    assert "&lt;script&gt;" not in text  # only & and < need escaping: > opens nothing
    assert "&lt;script>" in text
    header_widths: dict[str, int] = {}
    table = ""
    for line in text.splitlines():
        if not line.startswith("|"):
            table = ""
            continue
        count = len(line.strip("|").replace("\\|", "").split("|"))
        table = table or line
        header_widths.setdefault(table, count)
        assert count == header_widths[table], line  # an escaped pipe splits no cell
    assert "\\*\\*bold\\*\\*" in text
    assert "driver 550.54 -> 570" in text
    assert f"| nccl busbw |   | {report_md.cell(HOSTILE)} | 300 | 300 | 300 | 300 | 1 |" in text


def test_a_record_as_the_history_writer_makes_it() -> None:
    """The shape validate.history's writer gives a run (a time with microseconds and an offset, each check's
    ``units``), twice with a module upgraded between."""

    def record(time: str, cuda: str, busbw: float) -> dict[str, Any]:
        return {
            "version": 1,
            "env": "e",
            "recipe": "r",
            "recipe_version": "",
            "time": time,
            "partition": "",
            "nodes": ["n1"],
            "launcher": "torchrun",
            "ranks": 2,
            "device": "cpu",
            "facts": {
                "driver": "",
                "cuda": "",
                "torch": "2.5.1+cpu",
                "glibc": "2.36",
                "modules": {"cuda": cuda},
                "gpus": [],
            },
            "checks": [
                {
                    "name": "nccl",
                    "status": "pass",
                    "seconds": 1.5,
                    "figures": {"busbw": busbw},
                    "units": {"busbw": "GB/s"},
                }
            ],
            "status": "pass",
        }

    runs = [
        record("2026-11-28T11:05:25.123456+00:00", "12.4", 3.0),
        record("2026-11-28T12:05:25.5+00:00", "12.8", 2.0),
    ]
    tags = parsed(report_html.render([("e", runs)], "now"))
    shown = " ".join("".join(tags.text).split())
    assert "2 run(s) from 2026-11-28 11:05 UTC to 2026-11-28 12:05 UTC" in shown
    assert "cuda/12.4 -> 12.8" in shown
    assert "nccl busbw (GB/s)" in shown
    assert tags.tags.count("circle") == 2
    assert "| nccl busbw | GB/s | (no partition) | 2 | 2.5 | 2 | 3 | 2 |" in report_md.render(
        [("e", runs)], "now"
    )
