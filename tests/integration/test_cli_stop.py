"""Stopping `strom consume --group` with SIGTERM, as a service manager or `kill` does: the member
commits what it printed and leaves its group at once (no ghost member until the session times out)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from brokerproc import BrokerProcess
from kafka_wire import GroupWire

BROKER_CONFIG = {"group.initial.rebalance.delay.ms": "0"}
STROM = Path(sys.executable).parent / "strom"


def test_sigterm_leaves_the_group_at_once(broker: BrokerProcess) -> None:
    bootstrap = broker.bootstrap
    topic, group = "sigterm-topic", "sigterm-group"
    produce = subprocess.run(
        [str(STROM), "produce", topic, "--bootstrap-server", bootstrap],
        input=b"a\nb\nc\n",
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert produce.returncode == 0, produce.stderr
    consume = subprocess.Popen(
        [str(STROM), "consume", topic, "--group", group, "--from-beginning", "--bootstrap-server", bootstrap],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        assert consume.stdout is not None
        lines = [consume.stdout.readline() for _ in range(3)]
        assert lines == [b"a\n", b"b\n", b"c\n"]
        host, port = bootstrap.split(":")
        with GroupWire(host, int(port)) as wire:
            (described,) = wire.describe_groups(group).groups
            assert (described.group_state, len(described.members)) == ("Stable", 1)
            consume.send_signal(signal.SIGTERM)
            assert consume.wait(timeout=10) in (0, 130)
            (described,) = wire.describe_groups(group).groups
            assert (described.group_state, described.members) == ("Empty", ())
            fetched = wire.offset_fetch({group: {topic: [0]}}).groups[0].topics[0].partitions[0]
            assert fetched.committed_offset == 3
    finally:
        consume.kill()
        consume.wait()
