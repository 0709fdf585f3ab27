"""The controller's decisions on one partition's state: pure functions, the current state and the
cluster's membership in, the new state out (tested without ZooKeeper)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace

from strom.broker.zk import znodes

NO_LEADER = -1


def first(candidates: Iterable[int], preferred_out: set[int]) -> int | None:
    """The first of ``candidates`` not in ``preferred_out``, else the first of them at all."""
    ordered = list(candidates)
    return next((b for b in ordered if b not in preferred_out), ordered[0] if ordered else None)


def initial_leader_and_isr(
    replicas: Sequence[int], live: set[int], controller_epoch: int
) -> znodes.LeaderAndIsr:
    """A new partition: the live replicas in assignment order are the ISR, the first leads. With no
    replica live the partition starts offline with the whole assignment as its ISR (never empty), so
    whichever replica registers first is elected."""
    isr = [b for b in replicas if b in live]
    if not isr:
        return znodes.LeaderAndIsr(NO_LEADER, 0, list(replicas), controller_epoch)
    return znodes.LeaderAndIsr(isr[0], 0, isr, controller_epoch)


def decide_on_membership(
    replicas: Sequence[int],
    state: znodes.LeaderAndIsr,
    live: set[int],
    shutting_down: set[int],
    unclean: bool,
    controller_epoch: int,
) -> znodes.LeaderAndIsr | None:
    """The state after brokers died or (re)joined, or None if nothing changes.

    A live leader keeps leading; dead followers leave the ISR. A dead (or no) leader is replaced by
    the first replica in assignment order that is live and in the ISR; the ISR loses the dead. With
    no such replica the partition goes offline (leader -1) and keeps its ISR, so a member of the last
    ISR is elected when it comes back -- unless unclean election is on, which takes any live replica
    (and makes it the ISR alone). Every change bumps the leader epoch; the ISR is never written empty.
    """
    live_isr = [b for b in state.isr if b in live]
    if state.leader in live:
        if live_isr == state.isr or not live_isr:
            return None
        return replace(
            state, isr=live_isr, leader_epoch=state.leader_epoch + 1, controller_epoch=controller_epoch
        )
    leader = first((b for b in replicas if b in live and b in state.isr), shutting_down)
    if leader is not None:
        return replace(
            state,
            leader=leader,
            isr=live_isr,
            leader_epoch=state.leader_epoch + 1,
            controller_epoch=controller_epoch,
        )
    if unclean:
        leader = first((b for b in replicas if b in live), shutting_down)
        if leader is not None:
            return replace(
                state,
                leader=leader,
                isr=[leader],
                leader_epoch=state.leader_epoch + 1,
                controller_epoch=controller_epoch,
            )
    if state.leader == NO_LEADER:
        return None
    return replace(
        state, leader=NO_LEADER, leader_epoch=state.leader_epoch + 1, controller_epoch=controller_epoch
    )


def decide_controlled_shutdown(
    replicas: Sequence[int],
    state: znodes.LeaderAndIsr,
    broker: int,
    live: set[int],
    shutting_down: set[int],
    controller_epoch: int,
) -> znodes.LeaderAndIsr | None:
    """Kafka's ControlledShutdownLeaderElection: leadership moves from ``broker`` to the first replica
    in assignment order that is live, in the ISR and not shutting down, and ``broker`` leaves the
    ISR; where it only follows, it leaves an ISR that keeps another live member. None: no change
    (nothing to move, or no replica to move leadership to)."""
    if state.leader == broker:
        isr = [b for b in state.isr if b != broker]
        leader = next((b for b in replicas if b in live and b in isr and b not in shutting_down), None)
        if leader is None:
            return None
        return replace(
            state,
            leader=leader,
            isr=isr,
            leader_epoch=state.leader_epoch + 1,
            controller_epoch=controller_epoch,
        )
    if broker in state.isr and state.leader in live and state.leader != NO_LEADER:
        isr = [b for b in state.isr if b != broker]
        return replace(state, isr=isr, leader_epoch=state.leader_epoch + 1, controller_epoch=controller_epoch)
    return None


def decide_preferred_leader(
    replicas: Sequence[int],
    state: znodes.LeaderAndIsr,
    live: set[int],
    shutting_down: set[int],
    controller_epoch: int,
) -> znodes.LeaderAndIsr | None:
    """The preferred replica (first of the assignment) leads again if it is live, in the ISR and not
    shutting down; None if it leads already or cannot."""
    if not replicas:
        return None
    preferred = replicas[0]
    if (
        state.leader == preferred
        or preferred not in live
        or preferred in shutting_down
        or preferred not in state.isr
    ):
        return None
    return replace(
        state, leader=preferred, leader_epoch=state.leader_epoch + 1, controller_epoch=controller_epoch
    )
