"""A small server-rendered SVG line chart (a group's lag over time): no front-end library."""

from __future__ import annotations

import datetime
import math
from collections.abc import Sequence

from markupsafe import Markup, escape

from strom.console.lag_history import Sample


def nice_ceiling(value: float) -> float:
    """The smallest of 1, 2, 2.5, 5 times a power of ten at or above ``value`` (an axis top)."""
    if value <= 0:
        return 1.0
    power = 10.0 ** math.floor(math.log10(value))
    for step in (1, 2, 2.5, 5, 10):
        if step * power >= value:
            return step * power
    return 10 * power


def compact(number: float) -> str:
    """1234 -> 1.2k, 5000000 -> 5M: axis labels."""
    for limit, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(number) >= limit:
            return f"{number / limit:.3g}{suffix}"
    return f"{number:.3g}" if number != int(number) else str(int(number))


def _clock(at: float) -> str:
    return datetime.datetime.fromtimestamp(at, datetime.UTC).strftime("%H:%M:%S")


def lag_chart(
    samples: Sequence[Sample], *, width: int = 720, height: int = 200, label: str = "lag"
) -> Markup:
    """Total lag over time as an SVG: a filled line, a y axis from 0 to a round top, and the
    first and last sample's times (UTC) under the x axis."""
    left, right, top, bottom = 52, 12, 12, 26
    inner_w, inner_h = width - left - right, height - top - bottom
    parts = [
        f'<svg class="chart" viewBox="0 0 {width} {height}" width="100%" role="img" '
        f'aria-label="{escape(label)} over time" xmlns="http://www.w3.org/2000/svg">'
    ]
    # At least 4, so that the five grid lines fall on whole records.
    peak = max(nice_ceiling(max((s.lag for s in samples), default=0)), 4.0)
    for i in range(5):
        value = peak * i / 4
        y = top + inner_h - inner_h * i / 4
        parts.append(f'<line class="grid" x1="{left}" x2="{width - right}" y1="{y:.1f}" y2="{y:.1f}"/>')
        parts.append(
            f'<text class="axis" x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">{compact(value)}</text>'
        )
    if len(samples) < 2:
        parts.append(
            f'<text class="axis" x="{left + inner_w / 2}" y="{top + inner_h / 2}" text-anchor="middle">'
            "collecting samples…</text>"
        )
    else:
        first, last = samples[0].at, samples[-1].at
        span = max(last - first, 1e-9)

        def point(s: Sample) -> str:
            return (
                f"{left + inner_w * (s.at - first) / span:.1f},{top + inner_h - inner_h * s.lag / peak:.1f}"
            )

        line = " ".join(point(s) for s in samples)
        base = top + inner_h
        parts.append(f'<polygon class="area" points="{left},{base} {line} {width - right},{base}"/>')
        parts.append(f'<polyline class="line" points="{line}"/>')
        end_x, end_y = point(samples[-1]).split(",")
        parts.append(
            f'<circle class="dot" cx="{end_x}" cy="{end_y}" r="3"><title>{samples[-1].lag}</title></circle>'
        )
        parts.append(f'<text class="axis" x="{left}" y="{height - 8}">{_clock(first)}</text>')
        parts.append(
            f'<text class="axis" x="{width - right}" y="{height - 8}" text-anchor="end">{_clock(last)} UTC</text>'
        )
    parts.append("</svg>")
    return Markup("".join(parts))
