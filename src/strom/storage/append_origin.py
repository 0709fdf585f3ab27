"""Who an append to a leader's log comes from, which decides how it is checked (Kafka's AppendOrigin)."""

from __future__ import annotations

import enum


class AppendOrigin(enum.Enum):
    # A producer's batches: every record validated, idempotent sequences checked.
    CLIENT = "client"
    # A coordinator's own writes (transactional offset commits, markers): no sequences to check,
    # but producer epochs are, so a fenced producer's commit cannot land.
    COORDINATOR = "coordinator"
