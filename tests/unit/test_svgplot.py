"""The hand-drawn SVG plots (envbuilder.render.svgplot): each drawing parsed back as XML, its axes, ticks and
points read from the elements and compared with the data's scale; every text from a caller escaped; no data, a
single point and values that cannot be drawn give a drawing, never an error."""

from __future__ import annotations

import datetime
import math
import xml.etree.ElementTree as ET

import pytest

from envbuilder.render import svgplot
from envbuilder.render.svgplot import LOG2, TIME, Axis, Cell, Marker, Series, line_chart, status_grid

NS = "{http://www.w3.org/2000/svg}"
HOSTILE = "</title></svg><script>alert(\"x\")</script><img src=x onerror=alert(1)> & 'q'"


def parse(svg: str) -> ET.Element:
    return ET.fromstring(svg)  # noqa: S314 - our own output, parsed to check it is well-formed


def elements(root: ET.Element, tag: str, css: str = "") -> list[ET.Element]:
    return [e for e in root.iter(f"{NS}{tag}") if not css or css in (e.get("class") or "").split()]


def texts(root: ET.Element, css: str) -> list[str]:
    return [e.text or "" for e in elements(root, "text", css)]


def test_axes_ticks_and_scale() -> None:
    root = parse(
        line_chart("t", [Series("a", ((0, 0), (5, 40), (10, 100)))], x=Axis("x"), y=Axis("y"), width=640)
    )
    assert len(elements(root, "line", "axis")) == 2
    labels = texts(root, "tick-label")
    assert {"0", "50", "100"} <= set(labels)  # y from zero, a step of 1, 2 or 5 times a power of ten
    assert {"0", "2", "4", "6", "8", "10"} <= set(labels)
    circles = elements(root, "circle", "point")
    assert len(circles) == 3
    cx = [float(c.get("cx", "nan")) for c in circles]
    cy = [float(c.get("cy", "nan")) for c in circles]
    assert cx[0] == pytest.approx(64) and cx[2] == pytest.approx(
        640 - 40
    )  # the x range fills the plot's width
    assert cx[1] == pytest.approx((cx[0] + cx[2]) / 2)
    assert cy[0] > cy[1] > cy[2]  # higher values are drawn higher (SVG's y grows downwards)
    # y = 0 sits on the x axis; y = 40 at 40% of the way to y = 100.
    axis_y = float(elements(root, "line", "axis")[0].get("y1", "nan"))
    assert cy[0] == pytest.approx(axis_y)
    assert (cy[0] - cy[1]) / (cy[0] - cy[2]) == pytest.approx(0.4, abs=0.002)  # pixels to 0.1
    path = elements(root, "path", "series")
    assert len(path) == 1 and path[0].get("d", "").count("L") == 2


def test_points_are_drawn_in_x_order_and_negative_values_move_the_floor() -> None:
    root = parse(line_chart("t", [Series("a", ((3, -5), (1, 5), (2, 0)))], x=Axis("x"), y=Axis("y")))
    cx = [float(c.get("cx", "nan")) for c in elements(root, "circle", "point")]
    assert cx == sorted(cx)
    assert "-5" in texts(root, "tick-label")


def test_log2_axis_ticks_powers_of_two_and_drops_what_it_cannot_draw() -> None:
    points = ((0, 1.0), (1024, 1.0), (2**20, 50.0), (2**28, 200.0), (4096, math.nan))
    root = parse(line_chart("bw", [Series("s", points)], x=Axis("bytes", LOG2), y=Axis("GB/s")))
    assert len(elements(root, "circle", "point")) == 3  # x = 0 has no logarithm; NaN is no value
    labels = texts(root, "tick-label")
    x_labels = labels[: labels.index("0")]  # the x ticks come first, then the y ticks from 0
    assert x_labels[0] == "1K" and x_labels[-1] == "256M"
    sizes = [int(t[:-1]) * {"K": 2**10, "M": 2**20}[t[-1]] for t in x_labels]
    assert all(s & (s - 1) == 0 for s in sizes)  # powers of two
    cx = [float(c.get("cx", "nan")) for c in elements(root, "circle", "point")]
    # 1 KiB -> 1 MiB is 10 doublings of the 18 from 1 KiB to 256 MiB.
    assert (cx[1] - cx[0]) / (cx[2] - cx[0]) == pytest.approx(10 / 18, abs=0.001)


def test_time_axis_and_markers_inside_the_range_only() -> None:
    day = 86400.0
    start = datetime.datetime(2026, 10, 31, tzinfo=datetime.timezone.utc).timestamp()
    series = [Series("gpu-a100", tuple((start + i * day, 300.0 - 10 * i) for i in range(10)))]
    marks = [
        Marker(start + 5 * day, "driver 550 -> 570"),
        Marker(start - day, "before"),
        Marker(math.inf, "never"),
    ]
    root = parse(line_chart("busbw", series, x=Axis("time", TIME), y=Axis("GB/s"), markers=marks))
    assert len(elements(root, "line", "marker")) == 1
    assert texts(root, "marker-label") == ["driver 550 -> 570"]
    assert "2026-10-31" in texts(root, "tick-label")
    marker_x = float(elements(root, "line", "marker")[0].get("x1", "nan"))
    cx = [float(c.get("cx", "nan")) for c in elements(root, "circle", "point")]
    assert marker_x == pytest.approx(cx[5], abs=0.11)


def test_a_long_marker_label_is_cut_to_the_plot_and_whole_in_its_tooltip() -> None:
    label = "driver 550.54 -> 570.86, cuda 12.4 -> 12.8, +cuda/12.8 (on gpu-a100, gpu-h100)"
    series = [Series("a", ((0, 1), (10, 2)))]
    for at in (2.0, 8.0):  # left half: the label reads rightwards; right half: leftwards
        root = parse(
            line_chart("t", series, x=Axis("x"), y=Axis("y"), markers=[Marker(at, label)], width=400)
        )
        (shown,) = texts(root, "marker-label")
        assert shown.endswith("\u2026") and label.startswith(shown[:-1])
        assert len(shown) * 6 <= 400 - 64 - 40
        assert [e.text for e in elements(root, "line", "marker")[0]] == [label]


def test_every_text_is_escaped() -> None:
    svg = line_chart(
        HOSTILE,
        [Series(HOSTILE, ((1, 1), (2, 2)), (HOSTILE, HOSTILE))],
        x=Axis(HOSTILE),
        y=Axis(HOSTILE),
        markers=[Marker(1.5, HOSTILE)],
    )
    root = parse(svg)  # still one well-formed svg element
    assert root.tag == f"{NS}svg"
    assert not [e for e in root.iter() if e.tag.split("}")[-1] in ("script", "img")]
    assert "<script" not in svg and "<img" not in svg
    shown = [e.text for e in root.iter() if e.text and e.text.strip()]
    assert (
        shown.count(HOSTILE) >= 6
    )  # title x2, axis labels, marker line's tooltip and label, tooltips, legend


def test_no_data_is_a_titled_empty_box() -> None:
    for series in ([], [Series("a", ())], [Series("a", ((math.nan, 1.0), (1.0, math.inf)))]):
        root = parse(line_chart("nothing <here>", series, x=Axis("x"), y=Axis("y")))
        assert "empty" in (root.get("class") or "")
        assert texts(root, "no-data") == ["no data"]
        assert not elements(root, "circle")
        assert texts(root, "plot-title") == ["nothing <here>"]


def test_one_point_or_one_value_still_has_a_scale() -> None:
    root = parse(line_chart("t", [Series("a", ((5, 7),))], x=Axis("x"), y=Axis("y")))
    cx = float(elements(root, "circle", "point")[0].get("cx", "nan"))
    assert 64 < cx < 640 - 40  # x widened around the one value, the point inside the plot
    assert not elements(root, "path", "series")
    root = parse(line_chart("t", [Series("a", ((1, 0), (2, 0)))], x=Axis("x"), y=Axis("y")))
    assert all(math.isfinite(float(c.get("cy", "nan"))) for c in elements(root, "circle", "point"))


def test_a_long_legend_wraps_and_the_drawing_grows() -> None:
    labels = [f"partition-{i}-with-a-long-name (2026-11-14 08:00 UTC)" for i in range(4)]
    series = [Series(label, ((1, i), (2, i + 1))) for i, label in enumerate(labels)]
    root = parse(line_chart("t", series, x=Axis("x"), y=Axis("y"), width=460, height=300))
    assert float(root.get("height", "0")) > 300
    legend_y = {e.get("y") for e in elements(root, "text", "legend")}
    assert len(legend_y) > 1
    assert all(float(e.get("x", "0")) < 460 for e in elements(root, "text", "legend"))


def test_nice_steps() -> None:
    assert [svgplot.nice_step(v) for v in (0.13, 0.7, 3, 4.9, 23, 70, 0, math.nan)] == [
        0.2,
        1,
        5,
        5,
        50,
        100,
        1,
        1,
    ]


def test_status_grid_cells_colours_and_escaping() -> None:
    rows = [
        ("nccl on gpu-a100", [Cell("pass", "t1"), Cell("fail", "t2"), Cell("warn", "t3")]),
        (HOSTILE, [Cell("weird", HOSTILE)]),
    ]
    svg = status_grid("checks", rows)
    root = parse(svg)
    cells = elements(root, "rect", "cell")
    assert [c.get("fill") for c in cells] == [
        svgplot.STATUS_COLOURS["pass"],
        svgplot.STATUS_COLOURS["fail"],
        svgplot.STATUS_COLOURS["warn"],
        "#6e7781",
    ]
    assert texts(root, "row-label") == ["nccl on gpu-a100", HOSTILE]
    assert "<script" not in svg
    assert "empty" in (parse(status_grid("none", [])).get("class") or "")
