"""A live chart of the weblog pipeline's output: index.html load-time percentiles per minute.

It reads ``weblog.pageload_stats`` from the beginning and keeps following it, and serves an HTML page
with an inline SVG chart (no JavaScript, no dependencies) that reloads itself every few seconds.
Load times are drawn on a log scale, so one slow minute's p99 does not flatten p50 and p90.

    python examples/weblog/chart.py --port 8000     # then open http://127.0.0.1:8000/
"""

from __future__ import annotations

import argparse
import datetime
import html
import json
import math
import sys
import threading
from collections.abc import Mapping, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

TOPIC = "weblog.pageload_stats"
SERIES = (("p50", "#1f77b4"), ("p90", "#ff7f0e"), ("p99", "#d62728"))
WIDTH, HEIGHT = 960, 440
LEFT, RIGHT, TOP, BOTTOM = 90, 80, 40, 50


class Windows:
    """The latest record of each window, by window start (a window is written once in append
    mode; a later record for the same window, after a reprocessing, replaces it)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_start: dict[str, dict[str, Any]] = {}

    def add(self, record: Mapping[str, Any]) -> None:
        with self._lock:
            self._by_start[str(record["window_start"])] = dict(record)

    def latest(self, count: int) -> list[dict[str, Any]]:
        with self._lock:
            ordered = sorted(self._by_start.values(), key=lambda r: _moment(r["window_start"]))
        return ordered[-count:]


def follow(bootstrap: str, topic: str, windows: Windows, stop: threading.Event) -> None:
    """Read ``topic`` from the beginning into ``windows`` until ``stop`` is set; start over
    after an error (the broker restarting, say)."""
    from strom.client import KafkaException

    while not stop.is_set():
        try:
            _follow(bootstrap, topic, windows, stop)
        except KafkaException as error:
            print(f"chart: reading {topic}: {error}; retrying", file=sys.stderr, flush=True)
            stop.wait(2.0)


def _follow(bootstrap: str, topic: str, windows: Windows, stop: threading.Event) -> None:
    from strom.client import Consumer, TopicPartition

    config = {"bootstrap.servers": bootstrap, "enable.auto.commit": "false"}
    with Consumer(config) as consumer:
        assigned: set[TopicPartition] = set()
        polls = 0
        while not stop.is_set():
            if polls % 20 == 0:  # the topic may not exist yet, or gain partitions
                partitions = {TopicPartition(topic, p) for p in consumer.partitions_for(topic) or []}
                if partitions != assigned:
                    consumer.assign(sorted(partitions, key=lambda tp: tp.partition))
                    consumer.seek_to_beginning([tp for tp in partitions if tp not in assigned])
                    assigned = partitions
            polls += 1
            if not assigned:
                stop.wait(0.5)
                continue
            for record in consumer.poll(timeout=0.5):
                try:
                    windows.add(json.loads(record.value or b""))
                except (ValueError, KeyError, TypeError):
                    continue  # not a stats record


def _moment(text: str) -> datetime.datetime:
    return datetime.datetime.fromisoformat(text)


def _nice_ceiling(value: float) -> float:
    """1, 2 or 5 times a power of ten, at least ``value``."""
    if value <= 0:
        return 1.0
    power = 10 ** math.floor(math.log10(value))
    for step in (1, 2, 5, 10):
        if step * power >= value:
            return float(step * power)
    return float(10 * power)


def _nice_floor(value: float) -> float:
    """1, 2 or 5 times a power of ten, at most ``value`` (which is > 0)."""
    power = 10 ** math.floor(math.log10(value))
    for step in (5, 2, 1):
        if step * power <= value:
            return float(step * power)
    return float(power)


def _log_ticks(low: float, high: float) -> list[float]:
    """1, 2 and 5 times each power of ten from ``low`` to ``high``."""
    ticks = []
    power = 10 ** math.floor(math.log10(low))
    while power <= high:
        ticks += [step * power for step in (1, 2, 5) if low <= step * power <= high]
        power *= 10
    return ticks


def render_svg(windows: Sequence[Mapping[str, Any]]) -> str:
    """The chart: one line per percentile over the windows' start times, the page loads per
    minute as bars behind them."""
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
        f'viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="12">',
        f'<rect width="{WIDTH}" height="{HEIGHT}" fill="white"/>',
        f'<rect x="{LEFT}" y="{TOP}" width="{plot_w}" height="{plot_h}" fill="#fafafa" stroke="#ccc"/>',
    ]
    if not windows:
        parts.append(
            f'<text x="{WIDTH / 2}" y="{HEIGHT / 2}" text-anchor="middle" fill="#666">waiting for the first '
            "window: one is written when the watermark passes its end</text></svg>"
        )
        return "\n".join(parts)
    starts = [_moment(str(w["window_start"])).timestamp() for w in windows]
    first, last = starts[0], starts[-1]
    span = (last - first) or 60.0
    slot = plot_w / (span / 60.0 + 1)  # one minute's width

    def x(t: float) -> float:
        return LEFT + slot / 2 + (t - first) / span * (plot_w - slot) if last > first else LEFT + plot_w / 2

    # Load times on a log scale (a slow minute's p99 would flatten p50 and p90 on a linear one);
    # page loads per minute on a linear scale of their own, on the right.
    loads = [max(float(w[name]), 0.01) for w in windows for name, _ in SERIES]
    y_min, y_max = _nice_floor(min(loads)), _nice_ceiling(max(loads))
    if y_max <= y_min:
        y_max = _nice_ceiling(y_min * 2)
    count_max = _nice_ceiling(max(int(w["count"]) for w in windows))
    decades = math.log10(y_max) - math.log10(y_min)

    def y(ms: float) -> float:
        return TOP + plot_h - (math.log10(max(ms, y_min)) - math.log10(y_min)) / decades * plot_h

    for value in _log_ticks(y_min, y_max):  # horizontal grid, load time on the left
        parts.append(
            f'<line x1="{LEFT}" x2="{LEFT + plot_w}" y1="{y(value):.1f}" y2="{y(value):.1f}" stroke="#e4e4e4"/>'
        )
        parts.append(f'<text x="{LEFT - 6}" y="{y(value) + 4:.1f}" text-anchor="end">{value:g} ms</text>')
    for i in range(6):
        level = TOP + plot_h - i / 5 * plot_h
        parts.append(f'<text x="{LEFT + plot_w + 6}" y="{level + 4:.1f}" fill="#999">{count_max * i / 5:g}</text>')
    middle = TOP + plot_h / 2
    parts.append(
        f'<text transform="translate({LEFT - 62},{middle:.1f}) rotate(-90)" text-anchor="middle">'
        "load time (ms, log scale)</text>"
    )
    parts.append(
        f'<text transform="translate({LEFT + plot_w + 52},{middle:.1f}) rotate(90)" text-anchor="middle" '
        'fill="#999">page loads per minute (bars)</text>'
    )
    bar = min(40.0, max(1.0, slot * 0.6))
    for t, w in zip(starts, windows, strict=True):
        height = int(w["count"]) / count_max * plot_h
        label = html.escape(f"{_hhmm(w['window_start'])}: {w['count']} page loads")
        parts.append(
            f'<rect x="{x(t) - bar / 2:.1f}" y="{TOP + plot_h - height:.1f}" width="{bar:.1f}" '
            f'height="{height:.1f}" fill="#e0e0e0"><title>{label}</title></rect>'
        )
    every = max(1, math.ceil(len(windows) / 12))
    for i, (t, w) in enumerate(zip(starts, windows, strict=True)):
        if i % every == 0:
            parts.append(
                f'<text x="{x(t):.1f}" y="{TOP + plot_h + 18}" text-anchor="middle">{_hhmm(w["window_start"])}</text>'
            )
    for name, color in SERIES:
        points = " ".join(f"{x(t):.1f},{y(float(w[name])):.1f}" for t, w in zip(starts, windows, strict=True))
        parts.append(f'<polyline points="{points}" fill="none" stroke="{color}" stroke-width="2"/>')
        for t, w in zip(starts, windows, strict=True):
            label = html.escape(
                f"{_hhmm(w['window_start'])} {name}: {float(w[name]):.1f} ms ({w['count']} loads)"
            )
            parts.append(
                f'<circle cx="{x(t):.1f}" cy="{y(float(w[name])):.1f}" r="3" fill="{color}"><title>{label}</title></circle>'
            )
    for i, (name, color) in enumerate(SERIES):
        lx = LEFT + 10 + i * 70
        parts.append(
            f'<line x1="{lx}" x2="{lx + 18}" y1="{TOP - 14}" y2="{TOP - 14}" stroke="{color}" stroke-width="3"/>'
        )
        parts.append(f'<text x="{lx + 22}" y="{TOP - 10}">{name}</text>')
    parts.append(
        f'<text x="{LEFT + 230}" y="{TOP - 10}" fill="#999">bars: page loads per minute (right axis)</text>'
    )
    parts.append(
        f'<text x="{LEFT + plot_w / 2}" y="{HEIGHT - 10}" text-anchor="middle">window start (UTC)</text>'
    )
    parts.append("</svg>")
    return "\n".join(parts)


def _hhmm(text: Any) -> str:
    return _moment(str(text)).astimezone(datetime.UTC).strftime("%H:%M")


def render_page(windows: Sequence[Mapping[str, Any]], *, refresh: int, topic: str = TOPIC) -> str:
    rows = "\n".join(
        f"<tr><td>{html.escape(_hhmm(w['window_start']))}</td><td>{w['count']}</td>"
        + "".join(f"<td>{float(w[name]):.1f}</td>" for name, _ in SERIES)
        + "</tr>"
        for w in reversed(windows[-10:])
    )
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><meta http-equiv="refresh" content="{refresh}">
<title>index.html load time</title>
<style>body {{ font-family: sans-serif; margin: 2em; }} td, th {{ padding: 2px 12px; text-align: right; }}</style>
</head><body>
<h2>index.html load time per minute</h2>
{render_svg(windows)}
<table><tr><th>minute (UTC)</th><th>loads</th>{"".join(f"<th>{n} ms</th>" for n, _ in SERIES)}</tr>
{rows}
</table>
<p style="color:#999">from topic {html.escape(topic)}; this page reloads every {refresh} s</p>
</body></html>
"""


def serve(bootstrap: str, *, host: str, port: int, topic: str, refresh: int, shown: int) -> None:
    windows = Windows()
    stop = threading.Event()
    reader = threading.Thread(target=follow, args=(bootstrap, topic, windows, stop), daemon=True)
    reader.start()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path not in ("/", "/index.html"):
                self.send_error(404)
                return
            body = render_page(windows.latest(shown), refresh=refresh, topic=topic).encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass  # quiet: one line per page reload is noise

    server = ThreadingHTTPServer((host, port), Handler)
    print(f"chart of {topic} at http://{host}:{server.server_address[1]}/", file=sys.stderr, flush=True)
    try:
        server.serve_forever()
    finally:
        stop.set()
        server.server_close()
        reader.join(timeout=5)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Serve a live chart of the weblog pipeline's percentiles.")
    parser.add_argument("--bootstrap-server", default="127.0.0.1:9092", metavar="HOST:PORT")
    parser.add_argument("--topic", default=TOPIC)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--refresh", type=int, default=5, help="seconds between page reloads")
    parser.add_argument("--windows", type=int, default=60, help="how many recent minutes to show")
    args = parser.parse_args(argv)
    try:
        serve(
            args.bootstrap_server,
            host=args.host,
            port=args.port,
            topic=args.topic,
            refresh=args.refresh,
            shown=args.windows,
        )
    except KeyboardInterrupt:
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
