"""The cluster controller on ZooKeeper (Kafka's pre-KRaft KafkaController, without its RPCs).

One broker at a time wins the ephemeral ``/controller`` znode, bumping ``/controller_epoch`` in
the same multi-op. Every write it makes afterwards is a multi-op that starts with
``Check(/controller_epoch, version)``: a controller that another one has replaced fails that check
and resigns, so two controllers never both change the cluster. As in Kafka 4.x there are no
controller-to-broker requests: the controller writes partition state znodes, and brokers watch
them and apply them in epoch order.

All decisions run one at a time on a single event task (Kafka's ControllerEventManager): ZooKeeper
watches only put events on the queue. No decision trusts a cache of partition states -- leaders
change their ISR by conditional writes at any time -- so every change re-reads the state znode and
writes it at the version read, deciding again after a BadVersion.

The parts: ``decisions`` (pure: a partition's state in, the new one out), ``events`` (the queue),
``writer`` (fenced writes, and the znodes it cannot parse), ``duties`` (the Controller: election
and every duty), ``requests`` (what a broker asks of the controller through znodes).
"""

from strom.broker.control_plane.controller.decisions import (
    decide_controlled_shutdown,
    decide_on_membership,
    decide_preferred_leader,
    initial_leader_and_isr,
)
from strom.broker.control_plane.controller.duties import CONFIG_CHANGE_EXPIRATION_MS, Controller
from strom.broker.control_plane.controller.requests import (
    ControlledShutdownReport,
    request_controlled_shutdown,
    request_preferred_leader_election,
)
from strom.broker.control_plane.controller.writer import ControllerMovedError

__all__ = [
    "CONFIG_CHANGE_EXPIRATION_MS",
    "ControlledShutdownReport",
    "Controller",
    "ControllerMovedError",
    "decide_controlled_shutdown",
    "decide_on_membership",
    "decide_preferred_leader",
    "initial_leader_and_isr",
    "request_controlled_shutdown",
    "request_preferred_leader_election",
]
