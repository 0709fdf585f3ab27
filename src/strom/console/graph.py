"""A pipeline as a server-rendered SVG graph: topics and stages as two kinds of node, arrows from
each source topic to its stage and from the stage to its sink topics, laid out in columns by
depth (the longest path from a topic nothing writes), so data flows left to right."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from markupsafe import Markup, escape

TOPIC_W, TOPIC_H = 168, 34
STAGE_W, STAGE_H = 208, 84
COLUMN_GAP = 64
ROW_GAP = 22
MARGIN = 12
LINE_H = 16
MAX_LINES = 3
MAX_LABEL = 24


@dataclass(frozen=True, slots=True)
class GraphStage:
    name: str
    sources: tuple[str, ...]
    sinks: tuple[str, ...]
    lines: tuple[str, ...] = ()  # up to MAX_LINES under its name (rows/s, lag, last batch)
    status: str = ""  # a CSS class: ok, active, warning
    title: str = ""  # the node's tooltip


Node = tuple[str, str]  # ("topic" | "stage", name)


@dataclass
class Layout:
    columns: list[list[Node]]
    position: dict[Node, tuple[float, float]] = field(default_factory=dict)  # top-left corner
    width: float = 0
    height: float = 0


def _size(node: Node) -> tuple[int, int]:
    return (TOPIC_W, TOPIC_H) if node[0] == "topic" else (STAGE_W, STAGE_H)


def edges_of(stages: Sequence[GraphStage]) -> list[tuple[Node, Node]]:
    edges: list[tuple[Node, Node]] = []
    for stage in stages:
        edges += [(("topic", t), ("stage", stage.name)) for t in stage.sources]
        edges += [(("stage", stage.name), ("topic", t)) for t in stage.sinks]
    return list(dict.fromkeys(edges))


def layout(stages: Sequence[GraphStage]) -> Layout:
    edges = edges_of(stages)
    nodes: list[Node] = list(
        dict.fromkeys([("stage", s.name) for s in stages] + [n for e in edges for n in e])
    )
    preds: dict[Node, list[Node]] = {n: [] for n in nodes}
    for a, b in edges:
        preds[b].append(a)
    # Longest path by relaxation; a cycle (a stage writing what it reads) stops growing at the
    # node count instead of looping.
    depth = dict.fromkeys(nodes, 0)
    for _ in range(len(nodes)):
        changed = False
        for node in nodes:
            wanted = min(max((depth[p] + 1 for p in preds[node]), default=0), len(nodes))
            if wanted > depth[node]:
                depth[node], changed = wanted, True
        if not changed:
            break
    columns: list[list[Node]] = [[] for _ in range(max(depth.values(), default=-1) + 1)]
    for node in nodes:
        columns[depth[node]].append(node)
    columns = [c for c in columns if c]  # a cycle's capped depths can leave gaps
    # Order each column by where its predecessors sit (fewer crossings), else by name.
    rank: dict[Node, float] = {}
    for column in columns:
        column.sort(
            key=lambda n: (
                sum(rank[p] for p in preds[n] if p in rank) / max(1, sum(1 for p in preds[n] if p in rank)),
                n[1],
            )
        )
        for i, node in enumerate(column):
            rank[node] = i
    result = Layout(columns)
    heights = [sum(_size(n)[1] for n in c) + ROW_GAP * (len(c) - 1) for c in columns]
    result.height = max(heights, default=0) + 2 * MARGIN
    x = float(MARGIN)
    for column, height in zip(columns, heights, strict=True):
        width = max(_size(n)[0] for n in column)
        y = MARGIN + (result.height - 2 * MARGIN - height) / 2
        for node in column:
            w, h = _size(node)
            result.position[node] = (x + (width - w) / 2, y)
            y += h + ROW_GAP
        x += width + COLUMN_GAP
    result.width = x - COLUMN_GAP + MARGIN
    return result


def stage_order(stages: Sequence[GraphStage]) -> list[str]:
    """The stages' names in the order the graph shows them: by column (data flow), then row."""
    return [name for column in layout(stages).columns for kind, name in column if kind == "stage"]


def _label(text: str) -> str:
    return text if len(text) <= MAX_LABEL else text[: MAX_LABEL - 1] + "…"


def pipeline_graph(stages: Sequence[GraphStage], *, label: str = "pipeline") -> Markup:
    if not stages:
        return Markup("")
    placed = layout(stages)
    by_name = {s.name: s for s in stages}
    parts = [
        f'<svg class="graph" viewBox="0 0 {placed.width:.0f} {placed.height:.0f}" '
        f'style="max-width: {placed.width:.0f}px" width="100%" role="img" aria-label="{escape(label)}" '
        'xmlns="http://www.w3.org/2000/svg">',
        '<defs><marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7" '
        'orient="auto-start-reverse"><path d="M 0 0 L 10 5 L 0 10 z" class="arrowhead"/></marker></defs>',
    ]
    for a, b in edges_of(stages):
        (ax, ay), (bx, by) = placed.position[a], placed.position[b]
        aw, ah = _size(a)
        bh = _size(b)[1]
        x1, y1, x2, y2 = ax + aw, ay + ah / 2, bx - 2, by + bh / 2
        bend = max(24.0, abs(x2 - x1) / 2)
        parts.append(
            f'<path class="edge" d="M {x1:.1f} {y1:.1f} C {x1 + bend:.1f} {y1:.1f}, {x2 - bend:.1f} {y2:.1f}, '
            f'{x2:.1f} {y2:.1f}" marker-end="url(#arrow)"/>'
        )
    for node, (x, y) in placed.position.items():
        kind, name = node
        w, h = _size(node)
        if kind == "topic":
            parts.append(
                f'<g class="node topic" data-topic="{escape(name)}"><title>topic {escape(name)}</title>'
                f'<rect x="{x:.1f}" y="{y:.1f}" width="{w}" height="{h}" rx="17"/>'
                f'<text x="{x + w / 2:.1f}" y="{y + h / 2 + 4:.1f}" text-anchor="middle">{escape(_label(name))}</text></g>'
            )
            continue
        stage = by_name[name]
        parts.append(
            f'<g class="node stage {escape(stage.status)}" data-stage="{escape(name)}">'
            f"<title>{escape(stage.title or name)}</title>"
            f'<rect x="{x:.1f}" y="{y:.1f}" width="{w}" height="{h}" rx="6"/>'
            f'<text class="name" x="{x + 10:.1f}" y="{y + 20:.1f}">{escape(_label(name))}</text>'
        )
        for i, line in enumerate(stage.lines[:MAX_LINES]):
            parts.append(
                f'<text class="metric" data-line="{i}" x="{x + 10:.1f}" y="{y + 40 + i * LINE_H:.1f}">{escape(line)}</text>'
            )
        parts.append("</g>")
    parts.append("</svg>")
    return Markup("".join(parts))
