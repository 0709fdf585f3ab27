"""Reading a broker's /metrics in tests: one scrape's samples by name and labels, and scraping
until a condition holds (the broker's gauges and lag samples move in the background)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

# The Burrow-style group statuses, one gauge each (strom_consumergroup_status).
STATUSES = ("OK", "WARNING", "STALLED", "STOPPED", "ERROR")


@dataclass(frozen=True)
class Scrape:
    samples: dict[tuple[str, frozenset[tuple[str, str]]], float]

    def get(self, name: str, **labels: str | int) -> float | None:
        """The sample's value; None for a series not exported."""
        return self.samples.get((name, frozenset((k, str(v)) for k, v in labels.items())))

    def get_or_zero(self, name: str, **labels: str | int) -> float:
        """The sample's value; 0 for a series not exported yet (a counter that never moved)."""
        found = self.get(name, **labels)
        return 0.0 if found is None else found

    def has(self, name: str) -> bool:
        return any(sample == name for sample, _ in self.samples)

    def buckets(self, name: str, **labels: str) -> list[tuple[float, float]]:
        """A histogram's (le, cumulative count) pairs, in le order."""
        wanted = set(labels.items())
        found = [
            (float(dict(key)["le"]), value)
            for (sample, key), value in self.samples.items()
            if sample == name + "_bucket" and wanted <= key and len(key) == len(wanted) + 1
        ]
        return sorted(found)

    def status(self, group: str, pipeline: str = "", stage: str = "") -> str | None:
        """The group's one status whose gauge is 1 (None if the group is not exported)."""
        values = {
            s: self.get("strom_consumergroup_status", group=group, pipeline=pipeline, stage=stage, status=s)
            for s in STATUSES
        }
        if any(v is None for v in values.values()):
            return None
        current = [s for s, v in values.items() if v == 1.0]
        assert len(current) == 1 and sum(v or 0 for v in values.values()) == 1.0, values
        return current[0]


@dataclass(frozen=True)
class Metrics:
    """One broker's /metrics endpoint."""

    url: str
    deadline: float = 30.0  # seconds ``until`` waits

    def scrape(self) -> Scrape:
        response = httpx.get(self.url, timeout=10)
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/plain")
        samples: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
        for family in text_string_to_metric_families(response.text):
            for sample in family.samples:
                samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
        return Scrape(samples)

    def until(self, check: Callable[[Scrape], bool], what: str, *, show: str = "") -> Scrape:
        """Scrape until ``check`` holds; failing, name ``what`` (and the samples whose names
        hold ``show``, when given)."""
        deadline = time.monotonic() + self.deadline
        while True:
            current = self.scrape()
            if check(current):
                return current
            if time.monotonic() > deadline:
                shown = {n: v for (n, _), v in current.samples.items() if show and show in n}
                pytest.fail(
                    f"not within {self.deadline:g} s at {self.url}: {what}" + (f" ({shown})" if show else "")
                )
            time.sleep(0.1)
