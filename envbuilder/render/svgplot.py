"""Plots as inline SVG text, drawn by hand: a line chart (points joined in x order, with labelled vertical markers
for events such as an upgrade) and a status grid (one coloured cell per run). Pure string work: what a report
embeds in its page needs no library, no script and no network. Every text that reaches the SVG (titles, labels,
tooltips) is escaped here, so a caller may hand over names read from records as they are."""

from __future__ import annotations

import datetime
import html
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Optional

#: Series colours, in order (the palette of a colour-blind-safe set; cycled past its end).
PALETTE = ("#0072b2", "#e69f00", "#009e73", "#cc79a7", "#56b4e9", "#d55e00", "#000000")

#: Status cell colours; any other status is drawn grey and named in its tooltip.
STATUS_COLOURS = {
    "pass": "#2e9e4f",
    "warn": "#e0a800",
    "fail": "#d1242f",
    "error": "#8b1a1a",
    "skip": "#b0b7bf",
}
_OTHER = "#6e7781"

LINEAR = "linear"
LOG2 = "log2"
TIME = "time"

_MARGIN_LEFT, _MARGIN_RIGHT, _MARGIN_TOP, _MARGIN_BOTTOM = 64, 40, 36, 62
#: Room above the highest point, for the markers' labels (a fraction of the value range).
_HEADROOM = 0.15


@dataclass(frozen=True)
class Series:
    label: str
    #: (x, y) pairs; a pair with a value that is not finite (or x <= 0 on a log axis) is left out.
    points: tuple[tuple[float, float], ...]
    #: A tooltip per point (the same order), or none.
    tips: tuple[str, ...] = ()


@dataclass(frozen=True)
class Marker:
    """A vertical line at ``x`` with its label (an upgrade on a time axis)."""

    x: float
    label: str


@dataclass(frozen=True)
class Axis:
    label: str
    kind: str = LINEAR


@dataclass(frozen=True)
class Cell:
    status: str
    tip: str


def esc(text: object) -> str:
    """Text and attribute values for HTML and SVG alike: ``& < > " '`` escaped."""
    return html.escape(str(text), quote=True)


class _Scale:
    """Maps data values in [lo, hi] (log2 of them on a log axis) to pixels in [a, b]."""

    def __init__(self, lo: float, hi: float, a: float, b: float, kind: str) -> None:
        self.kind = kind
        lo, hi = (math.log2(lo), math.log2(hi)) if kind == LOG2 else (lo, hi)
        if hi - lo <= 0:
            pad = abs(lo) * 0.1 or 1.0
            lo, hi = lo - pad, hi + pad
        self.lo, self.hi, self.a, self.b = lo, hi, a, b

    def __call__(self, value: float) -> float:
        v = math.log2(value) if self.kind == LOG2 else value
        return self.a + (v - self.lo) / (self.hi - self.lo) * (self.b - self.a)

    def ticks(self) -> list[float]:
        if self.kind == LOG2:
            first, last = math.ceil(self.lo), math.floor(self.hi)
            every = max(1, math.ceil((last - first + 1) / 8))
            return [2.0**e for e in range(first, last + 1, every)]
        step = nice_step((self.hi - self.lo) / 5)
        start = math.ceil(self.lo / step) * step
        count = math.floor((self.hi - start) / step + 1e-9) + 1
        return [start + i * step for i in range(max(count, 0))]


def nice_step(raw: float) -> float:
    """The tick step near ``raw`` that a person reads easily: 1, 2 or 5 times a power of ten."""
    if raw <= 0 or not math.isfinite(raw):
        return 1.0
    power = 10.0 ** math.floor(math.log10(raw))
    for factor in (1, 2, 5, 10):
        if raw <= factor * power:
            return factor * power
    return 10 * power  # pragma: no cover - the loop ends at 10


def tick_text(value: float, kind: str, span: float = 0.0) -> str:
    if kind == TIME:
        when = datetime.datetime.fromtimestamp(value, tz=datetime.timezone.utc)
        return when.strftime("%m-%d %H:%M" if span < 3 * 86400 else "%Y-%m-%d")
    if kind == LOG2:
        for unit, size in (("G", 2**30), ("M", 2**20), ("K", 2**10)):
            if value >= size:
                return f"{value / size:g}{unit}"
    return f"{value:.4g}"


def _kept(series: Series, x_kind: str) -> list[tuple[float, float, str]]:
    tips = series.tips if len(series.tips) == len(series.points) else ("",) * len(series.points)
    kept = [
        (float(x), float(y), tip)
        for (x, y), tip in zip(series.points, tips)
        if math.isfinite(x) and math.isfinite(y) and (x_kind != LOG2 or x > 0)
    ]
    return sorted(kept, key=lambda p: p[0])


def _open(width: int, height: int, title: str, css: str) -> list[str]:
    return [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="{css}" role="img" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="11">',
        f"<title>{esc(title)}</title>",
        f'<text class="plot-title" x="{_MARGIN_LEFT}" y="18" font-size="13" font-weight="bold">{esc(title)}</text>',
    ]


def _empty(title: str, width: int, height: int) -> str:
    parts = _open(width, height, title, "plot empty")
    parts.append(
        f'<text class="no-data" x="{width / 2:.0f}" y="{height / 2:.0f}" text-anchor="middle">no data</text>'
    )
    return "\n".join([*parts, "</svg>"])


def line_chart(
    title: str,
    series: Sequence[Series],
    *,
    x: Axis,
    y: Axis,
    markers: Sequence[Marker] = (),
    width: int = 640,
    height: int = 300,
) -> str:
    """A line chart: one path and one circle per point for each series (each circle with its tooltip), axes with
    ticks, the y axis from zero where every value is positive, ``markers`` as dashed vertical lines with their
    labels, a legend below. Without a single point to draw, a titled "no data" box."""
    kept = [(s, _kept(s, x.kind)) for s in series]
    xs = [p[0] for _, pts in kept for p in pts]
    ys = [p[1] for _, pts in kept for p in pts]
    if not xs:
        return _empty(title, width, height)
    shown = [m for m in markers if math.isfinite(m.x) and min(xs) <= m.x <= max(xs)]
    left, right = _MARGIN_LEFT, width - _MARGIN_RIGHT
    top, bottom = _MARGIN_TOP, height - _MARGIN_BOTTOM
    sx = _Scale(min(xs), max(xs), left, right, x.kind)
    y_lo = 0.0 if min(ys) >= 0 else min(ys)
    y_hi = max(ys) + (max(ys) - y_lo) * _HEADROOM
    sy = _Scale(y_lo, y_hi, bottom, top, LINEAR)
    legend = _legend([s.label for s in series], left, width, height)
    parts = _open(width, height + 14 * (len(legend) - 1), title, "plot")
    parts += _axes(sx, sy, x, y, (left, right, top, bottom), span=max(xs) - min(xs))
    for marker in shown:
        px = sx(marker.x)
        parts.append(
            f'<line class="marker" x1="{px:.1f}" y1="{top}" x2="{px:.1f}" y2="{bottom}" stroke="#6e7781" '
            f'stroke-dasharray="4 3"><title>{esc(marker.label)}</title></line>'
        )
        # A label reads rightwards from its line in the left half, leftwards in the right half: never off the edge.
        anchor, dx, room = ("start", 3, right - px) if px < (left + right) / 2 else ("end", -3, px - left)
        parts.append(
            f'<text class="marker-label" x="{px + dx:.1f}" y="{top + 10}" text-anchor="{anchor}" fill="#57606a">'
            f"{esc(clipped(marker.label, room))}</text>"
        )
    for index, (one, pts) in enumerate(kept):
        colour = PALETTE[index % len(PALETTE)]
        if len(pts) > 1:
            d = " ".join(
                f"{'M' if i == 0 else 'L'}{sx(px):.1f},{sy(py):.1f}" for i, (px, py, _) in enumerate(pts)
            )
            parts.append(f'<path class="series" d="{d}" fill="none" stroke="{colour}" stroke-width="1.5"/>')
        for px, py, tip in pts:
            parts.append(
                f'<circle class="point" cx="{sx(px):.1f}" cy="{sy(py):.1f}" r="3" fill="{colour}">'
                f"<title>{esc(tip or f'{one.label}: {py:.4g}')}</title></circle>"
            )
    parts += [part for row in legend for part in row]
    return "\n".join([*parts, "</svg>"])


def clipped(label: str, room: float) -> str:
    """``label`` cut to the characters that fit in ``room`` pixels (about 6 a character at 11 px), with an
    ellipsis; the whole label stays in the marker line's tooltip."""
    fits = max(int(room / 6), 4)
    return label if len(label) <= fits else label[: fits - 1] + "\u2026"


def _axes(
    sx: _Scale, sy: _Scale, x: Axis, y: Axis, box: tuple[float, float, float, float], *, span: float
) -> list[str]:
    left, right, top, bottom = box
    parts = [
        f'<line class="axis" x1="{left}" y1="{bottom}" x2="{right}" y2="{bottom}" stroke="#24292f"/>',
        f'<line class="axis" x1="{left}" y1="{top}" x2="{left}" y2="{bottom}" stroke="#24292f"/>',
    ]
    x_ticks = sx.ticks() if x.kind != TIME else [sx.lo + (sx.hi - sx.lo) * i / 4 for i in range(5)]
    for value in x_ticks:
        px = sx(value)
        parts.append(
            f'<line class="tick" x1="{px:.1f}" y1="{bottom}" x2="{px:.1f}" y2="{bottom + 4}" stroke="#24292f"/>'
        )
        parts.append(
            f'<text class="tick-label" x="{px:.1f}" y="{bottom + 16}" text-anchor="middle">'
            f"{esc(tick_text(value, x.kind, span))}</text>"
        )
    for value in sy.ticks():
        py = sy(value)
        parts.append(
            f'<line class="grid" x1="{left}" y1="{py:.1f}" x2="{right}" y2="{py:.1f}" stroke="#eaeef2"/>'
        )
        parts.append(
            f'<text class="tick-label" x="{left - 6}" y="{py + 4:.1f}" text-anchor="end">'
            f"{esc(tick_text(value, LINEAR))}</text>"
        )
    parts.append(
        f'<text class="axis-label" x="{(left + right) / 2:.0f}" y="{bottom + 32}" text-anchor="middle">'
        f"{esc(x.label)}</text>"
    )
    parts.append(
        f'<text class="axis-label" x="14" y="{(top + bottom) / 2:.0f}" text-anchor="middle" '
        f'transform="rotate(-90 14 {(top + bottom) / 2:.0f})">{esc(y.label)}</text>'
    )
    return parts


def _legend(labels: Sequence[str], left: float, width: int, height: int) -> list[list[str]]:
    """The legend's rows below the plot: a key and a label per series, a new row where one would overflow."""
    rows: list[list[str]] = [[]]
    at, baseline = left, height - 8
    for index, label in enumerate(labels):
        needed = 24 + 7 * len(label)
        if rows[-1] and at + needed > width:
            rows.append([])
            at, baseline = left, baseline + 14
        colour = PALETTE[index % len(PALETTE)]
        rows[-1].append(
            f'<rect class="legend-key" x="{at:.0f}" y="{baseline - 9}" width="10" height="10" fill="{colour}"/>'
        )
        rows[-1].append(f'<text class="legend" x="{at + 14:.0f}" y="{baseline}">{esc(label)}</text>')
        at += needed
    return rows


def status_grid(
    title: str,
    rows: Sequence[tuple[str, Sequence[Cell]]],
    *,
    cell: int = 14,
    label_width: Optional[int] = None,
) -> str:
    """One row per label (a check on a partition), one square per run, oldest first, coloured by its status,
    each with its tooltip. Without rows, a titled "no data" box."""
    if not rows or not any(cells for _, cells in rows):
        return _empty(title, 640, 80)
    label_w = label_width or min(320, 16 + 7 * max(len(label) for label, _ in rows))
    columns = max(len(cells) for _, cells in rows)
    width = label_w + columns * (cell + 2) + 16
    height = _MARGIN_TOP + len(rows) * (cell + 4) + 28
    parts = _open(width, height, title, "plot grid")
    for r, (label, cells) in enumerate(rows):
        y = _MARGIN_TOP + r * (cell + 4)
        parts.append(f'<text class="row-label" x="8" y="{y + cell - 3}">{esc(label)}</text>')
        for c, one in enumerate(cells):
            colour = STATUS_COLOURS.get(one.status, _OTHER)
            parts.append(
                f'<rect class="cell" x="{label_w + c * (cell + 2)}" y="{y}" width="{cell}" height="{cell}" '
                f'fill="{colour}"><title>{esc(one.tip)}</title></rect>'
            )
    legend_y = height - 10
    at = 8
    for status, colour in STATUS_COLOURS.items():
        parts.append(f'<rect x="{at}" y="{legend_y - 9}" width="10" height="10" fill="{colour}"/>')
        parts.append(f'<text class="legend" x="{at + 14}" y="{legend_y}">{status}</text>')
        at += 60
    return "\n".join([*parts, "</svg>"])
