"""Server-rendered SVG charts: series of numbers per time bucket, as geometry a template
draws (``ui/_chart.html``). No JavaScript, no library: a live update re-renders the SVG
like any other part of a page.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

WIDTH, HEIGHT = 720, 140
LEFT, RIGHT, TOP, BOTTOM = 44, 8, 8, 20


@dataclass(frozen=True)
class Dot:
    x: float
    y: float
    label: str


@dataclass(frozen=True)
class Line:
    name: str
    css: str
    segments: list[str]
    """``points`` of each polyline: a gap (no value) splits a series."""
    dots: list[Dot]


@dataclass(frozen=True)
class Chart:
    id: str
    title: str
    unit: str
    lines: list[Line]
    top: float
    """The value at the top of the plot."""
    ticks: list[tuple[float, str]]
    """(y, label) of the horizontal grid lines."""
    times: list[tuple[float, str]]
    """(x, label) under the plot."""
    points: int
    """Buckets with a value other than zero, over every series."""
    summary: str
    total: float
    """The first series' values summed (grows as events are committed in the current bucket)."""
    width: int = WIDTH
    height: int = HEIGHT
    left: int = LEFT

    @property
    def right_edge(self) -> int:
        return self.width - RIGHT


def _nice(value: float) -> float:
    """The smallest of 1, 2, 5 x 10^k at or above ``value``."""
    if value <= 0:
        return 1.0
    scale = 10 ** len(str(int(value))) / 10 if value >= 1 else 1.0
    while scale > value:
        scale /= 10
    for step in (1, 2, 5, 10):
        if step * scale >= value:
            return step * scale
    return 10 * scale


def _fmt(value: float) -> str:
    return f"{value:.0f}" if value >= 10 or value == int(value) else f"{value:.2g}"


def line_chart(
    id: str, title: str, unit: str, start: datetime, bucket_seconds: float,
    series: list[tuple[str, str, list[float | None] | list[float] | list[int]]],
    width: int = WIDTH,
) -> Chart:
    """``series``: (name, css class, a value per bucket or None) drawn over the same
    buckets, the first at ``start``."""
    buckets = max((len(values) for _, _, values in series), default=0) or 1
    values = [v for _, _, vs in series for v in vs if v is not None]
    top = _nice(max(values, default=0.0))
    plot_w, plot_h = width - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def x(i: int) -> float:
        return round(LEFT + plot_w * (i + 0.5) / buckets, 1)

    def y(v: float) -> float:
        return round(TOP + plot_h * (1 - v / top), 1)

    lines, points = [], 0
    for name, css, vs in series:
        segments: list[str] = []
        current: list[str] = []
        dots: list[Dot] = []
        for i, v in enumerate(vs):
            if v is None:
                if current:
                    segments.append(" ".join(current))
                current = []
                continue
            current.append(f"{x(i)},{y(v)}")
            if v:
                points += 1
            if v and not (0 < i < len(vs) - 1 and vs[i - 1] == v == vs[i + 1]):
                # A flat run (a count that holds for an hour) is dotted at its ends only.
                at = start + timedelta(seconds=bucket_seconds * i)
                dots.append(Dot(x(i), y(v), f"{name} {_fmt(v)} {unit} at {at:%H:%M:%S}"))
        if current:
            segments.append(" ".join(current))
        lines.append(Line(name, css, segments, dots))
    ticks = [(y(top * f), _fmt(top * f)) for f in (0, 0.5, 1)]
    end = start + timedelta(seconds=bucket_seconds * buckets)
    shown = "%H:%M" if (end - start).total_seconds() >= 1800 else "%H:%M:%S"
    times = [(LEFT, f"{start:{shown}}"), (LEFT + plot_w / 2,
              f"{start + (end - start) / 2:{shown}}"), (width - RIGHT, f"{end:{shown}}")]
    peaks = ", ".join(f"{name} at most {_fmt(max((v for v in vs if v is not None), default=0))}"
                      for name, _, vs in series)
    summary = f"{title} from {start:%H:%M} to {end:%H:%M} UTC: {peaks} {unit}."
    total = sum(v for v in (series[0][2] if series else []) if v is not None)
    return Chart(id, title, unit, lines, top, ticks, times, points, summary, round(total, 3),
                 width)
