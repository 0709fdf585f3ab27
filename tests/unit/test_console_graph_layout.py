"""The pipeline graph (``strom.console.graph``): columns by depth, order by data flow, cycles,
and names escaped in the SVG."""

from __future__ import annotations

from strom.console.graph import GraphStage, layout, pipeline_graph, stage_order


def test_columns_follow_the_data_from_source_topics_to_sinks() -> None:
    stages = [
        GraphStage("stats", ("words", "extra"), ("stats",)),
        GraphStage("split", ("lines",), ("words",)),
    ]
    placed = layout(stages)
    assert placed.columns == [
        [("topic", "extra"), ("topic", "lines")],
        [("stage", "split")],
        [("topic", "words")],
        [("stage", "stats")],
        [("topic", "stats")],
    ]
    assert stage_order(stages) == ["split", "stats"]
    xs = [placed.position[column[0]][0] for column in placed.columns]
    assert xs == sorted(xs) and len(set(xs)) == len(xs)
    # Every node lies inside the drawing.
    assert all(0 <= x < placed.width and 0 <= y < placed.height for x, y in placed.position.values())


def test_a_stage_that_writes_what_it_reads_does_not_loop() -> None:
    placed = layout([GraphStage("echo", ("t",), ("t",))])
    assert sorted(n for column in placed.columns for n in column) == [("stage", "echo"), ("topic", "t")]


def test_the_svg_has_a_node_per_topic_and_stage_an_edge_per_arrow_and_escapes_names() -> None:
    svg = pipeline_graph(
        [GraphStage("a<b", ("in",), ("out", "audit"), lines=("1.0 rows/s", "lag 3"), status="warning")]
    )
    assert svg.count('class="node topic"') == 3
    assert svg.count('class="node stage warning"') == 1
    assert svg.count('class="edge"') == 3
    assert "a&lt;b" in svg and "a<b" not in svg
    assert '<text class="metric" data-line="1"' in svg and "lag 3" in svg
    assert pipeline_graph([]) == ""
