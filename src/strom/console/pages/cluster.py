"""The cluster page: the brokers, the controller and the cluster id, how partitions and their
leaders spread over the brokers, and the partitions that are under-replicated or offline. Its
live part refreshes itself (console.js, ``X-Fragment``)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from strom.client.admin import ClusterDescription, TopicDescription
from strom.console.app import Console, console

NAV: str | None = "Cluster"


@dataclass(frozen=True, slots=True)
class PartitionProblem:
    topic: str
    partition: int
    leader: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    offline: bool


async def describe_all_topics(state: Console) -> dict[str, TopicDescription]:
    names = await state.admin.list_topics(include_internal=True)
    return await state.admin.describe_topics(names) if names else {}


def partition_problems(topics: dict[str, TopicDescription]) -> list[PartitionProblem]:
    """Partitions without a leader (offline) or with fewer in-sync replicas than replicas."""
    found = []
    for name in sorted(topics):
        for p in topics[name].partitions:
            offline = p.leader < 0
            if offline or len(p.isr) < len(p.replicas):
                found.append(PartitionProblem(name, p.partition, p.leader, p.replicas, p.isr, offline))
    return found


async def overview(state: Console) -> dict[str, Any]:
    cluster: ClusterDescription = await state.admin.describe_cluster()
    topics = await describe_all_topics(state)
    leaders: Counter[int] = Counter()
    replicas: Counter[int] = Counter()
    partitions = 0
    for topic in topics.values():
        for p in topic.partitions:
            partitions += 1
            leaders[p.leader] += 1
            replicas.update(p.replicas)
    problems = partition_problems(topics)
    return {
        "cluster": cluster,
        "topic_count": len(topics),
        "partition_count": partitions,
        "leaders": leaders,
        "replicas": replicas,
        "under_replicated": [p for p in problems if not p.offline],
        "offline": [p for p in problems if p.offline],
    }


async def cluster_page(request: Request) -> Response:
    state = console(request)
    context = await overview(state)
    if request.headers.get("x-fragment") == "1":
        return state.render(request, "cluster/_live.html", **context)
    return state.render(request, "cluster/cluster.html", **context)


routes: list[BaseRoute] = [Route("/cluster", cluster_page, name="cluster")]
