"""Controller benchmark: the controller's share of the cluster's big events, against a real ZooKeeper.

Two controller processes (``strom.broker.control_plane.controller.Controller`` on ZooKeeper, nothing else
of a broker) and three brokers played by ZooKeeper sessions that hold /brokers/ids/N (this script
also plays the partition leaders where a duty waits for one). With ``--partitions`` N, RF 3:

- create: a topic znode of N partitions written -> every partition state created (ctime of the last);
- failover: the active controller SIGKILLed; from the next one's election (at the session expiry)
  to its duties running (a topic created without an id meanwhile gets one from its topic watch);
- failure: broker 3's session closed (as at its expiry) -> every partition under a live leader
  (mtime of the last state written);
- controlled shutdown: broker 1 asks (``request_controlled_shutdown``) -> the answer "done";
- preferred election: every ISR made whole again, then an election of every partition -> the
  request znode deleted;
- deletion: the topic's deletion requested -> the request znode deleted.

Times are ZooKeeper's (ctime/mtime of the znodes written) against this host's clock, so polling
never competes with the controller. ``--profile`` runs py-spy on the active controller.

    PYTHONPATH=src .venv/bin/python bench/controller_bench.py --partitions 10000
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from dataclasses import replace
from pathlib import Path

from kazoo.client import KazooClient

from strom.broker.zk import znodes
from strom.broker.zk.client import AsyncZooKeeper
from strom.cli.local_cluster import ZooKeeperServer

CONTROLLER_MAIN = textwrap.dedent(
    """
    import asyncio, logging, sys
    from strom.broker.control_plane.controller import Controller
    from strom.broker.config import KafkaConfig
    from strom.broker.zk.client import AsyncZooKeeper

    async def main() -> None:
        zk = AsyncZooKeeper(sys.argv[1], 4000, 10000)
        await zk.start()
        config = KafkaConfig.from_sources(
            {"zookeeper.connect": sys.argv[1], "broker.id": sys.argv[2],
             "auto.leader.rebalance.enable": "false"})
        await Controller(zk, int(sys.argv[2]), config).start()
        await asyncio.Event().wait()

    from strom.cli.logs import configure
    configure("INFO")
    logging.getLogger("kazoo").setLevel(logging.WARNING)
    asyncio.run(main())
    """
)

TOPIC = "bench"
POLL_S = 1.0


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


class Bench:
    def __init__(self, folder: Path, partitions: int, timeout: float, profile: Path | None) -> None:
        self.folder = folder
        self.partitions = partitions
        self.timeout = timeout
        self.profile = profile
        self.zk_server = ZooKeeperServer(folder / "zk")
        self.controllers: dict[int, subprocess.Popen[bytes]] = {}
        self.brokers: dict[int, KazooClient] = {}
        self.admin: KazooClient | None = None
        self.py_spy: subprocess.Popen[bytes] | None = None

    # -- parts ---------------------------------------------------------------------------------

    @property
    def zk(self) -> KazooClient:
        assert self.admin is not None
        return self.admin

    def start_controller(self, broker_id: int) -> None:
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        out = (self.folder / f"controller-{broker_id}.log").open("ab")
        self.controllers[broker_id] = subprocess.Popen(
            [sys.executable, "-c", CONTROLLER_MAIN, self.zk_server.connect, str(broker_id)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )

    def broker_up(self, broker_id: int) -> None:
        session = KazooClient(hosts=self.zk_server.connect, timeout=4.0)
        session.start()
        registration = znodes.BrokerRegistration(
            broker_id, (f"PLAINTEXT://127.0.0.{10 + broker_id}:9092",), {"PLAINTEXT": "PLAINTEXT"}
        )
        session.create(znodes.broker_path(broker_id), registration.encode(), ephemeral=True)
        self.brokers[broker_id] = session

    def broker_down(self, broker_id: int) -> float:
        """Close the broker's session (its registration goes as at an expiry); the time it went."""
        session = self.brokers.pop(broker_id)
        session.stop()
        gone = time.time()
        session.close()
        return gone

    def states(self, topic: str = TOPIC) -> dict[int, tuple[znodes.LeaderAndIsr, object]]:
        """Every partition state of ``topic`` that exists, read pipelined."""
        pending = [
            (p, self.zk.get_async(znodes.partition_state_path(topic, p))) for p in range(self.partitions)
        ]
        result = {}
        for p, async_result in pending:
            with contextlib.suppress(Exception):
                data, stat = async_result.get()
                result[p] = (znodes.LeaderAndIsr.decode(data), stat)
        return result

    def wait(self, what: str, condition: object) -> None:
        deadline = time.monotonic() + self.timeout
        while not condition():  # type: ignore[operator]
            if time.monotonic() > deadline:
                raise TimeoutError(what)
            time.sleep(POLL_S)

    def controller_id(self) -> int | None:
        with contextlib.suppress(Exception):
            return znodes.ControllerZNode.decode(self.zk.get(znodes.CONTROLLER)[0]).broker_id
        return None

    def start_profile(self, pid: int, name: str) -> None:
        py_spy = shutil.which("py-spy") or "/tmp/spy-ctl/bin/py-spy"
        if self.profile is None or not Path(py_spy).exists():
            return
        self.stop_profile()
        self.py_spy = subprocess.Popen(
            [py_spy, "record", "-r", "50", "-o", str(self.profile / f"{name}.svg"), "--pid", str(pid)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(1.0)

    def stop_profile(self) -> None:
        if self.py_spy is not None:
            self.py_spy.send_signal(signal.SIGINT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.py_spy.wait(30)
            self.py_spy = None

    # -- scenarios -----------------------------------------------------------------------------

    def run(self) -> dict[str, float]:
        results: dict[str, float] = {}
        self.zk_server.start()
        self.admin = KazooClient(hosts=self.zk_server.connect, timeout=10.0)
        self.zk.start()
        for path in znodes.PERSISTENT_PATHS:
            self.zk.ensure_path(path)
        for broker in (1, 2, 3):
            self.broker_up(broker)
        self.start_controller(101)
        self.wait("controller", lambda: self.controller_id() == 101)
        self.start_controller(102)
        time.sleep(3.0)  # the standby is up and watching

        self.start_profile(self.controllers[101].pid, "create")
        assignment = {p: [(p + i) % 3 + 1 for i in range(3)] for p in range(self.partitions)}
        written = time.time()
        self.zk.create(znodes.topic_path(TOPIC), znodes.TopicZNode(None, assignment).encode())
        self.wait("states created", lambda: len(self.states()) == self.partitions)
        results["create"] = max(s.ctime for _, s in self.states().values()) / 1000 - written
        log(f"create: {results['create']:.2f} s")

        time.sleep(2.0)
        self.start_profile(self.controllers[102].pid, "failover")
        results["failover"] = self._kill_controller(101)
        log(f"failover: {results['failover']:.2f} s")

        time.sleep(2.0)
        self.start_profile(self.controllers[102].pid, "failure")
        led = sum(1 for s, _ in self.states().values() if s.leader == 3)
        gone = self.broker_down(3)
        self.wait(
            "failover of broker 3's partitions",
            lambda: all(s.leader in (1, 2) and 3 not in s.isr for s, _ in self.states().values()),
        )
        results["failure"] = max(s.mtime for _, s in self.states().values()) / 1000 - gone
        log(f"failure: {results['failure']:.2f} s ({led} partitions led by the dead broker)")

        time.sleep(2.0)
        self.start_profile(self.controllers[102].pid, "controlled-shutdown")
        led = sum(1 for s, _ in self.states().values() if s.leader == 1)
        try:
            results["controlled_shutdown"] = asyncio.run(self._controlled_shutdown(1))
        except TimeoutError:
            results["controlled_shutdown"] = float("inf")
        log(f"controlled shutdown: {results['controlled_shutdown']:.2f} s ({led} partitions led)")

        time.sleep(2.0)
        # The partition leaders' part: every replica back in every ISR.
        self.broker_down(1)
        self.broker_up(1)
        self.broker_up(3)

        def whole_isrs() -> bool:
            partial = 0
            for p, (state, stat) in self.states().items():
                if len(state.isr) < 3:
                    partial += 1
                    whole = replace(state, isr=assignment[p])
                    self.zk.set_async(znodes.partition_state_path(TOPIC, p), whole.encode(), stat.version)
            return partial == 0

        self.wait("whole ISRs", whole_isrs)
        self.start_profile(self.controllers[102].pid, "preferred-election")
        requested = time.time()
        self.zk.create(
            znodes.PREFERRED_REPLICA_ELECTION,
            znodes.encode_partition_list([(TOPIC, p) for p in range(self.partitions)]),
        )
        self.wait("preferred election", lambda: self.zk.exists(znodes.PREFERRED_REPLICA_ELECTION) is None)
        results["preferred_election"] = time.time() - requested
        moved = sum(1 for p, (s, _) in self.states().items() if s.leader == assignment[p][0])
        log(f"preferred election: {results['preferred_election']:.2f} s ({moved} preferred leaders)")

        time.sleep(2.0)
        self.start_profile(self.controllers[102].pid, "deletion")
        requested = time.time()
        self.zk.create(znodes.delete_topic_path(TOPIC))
        try:
            self.wait("deletion", lambda: self.zk.exists(znodes.delete_topic_path(TOPIC)) is None)
            results["deletion"] = time.time() - requested
        except TimeoutError:
            results["deletion"] = float("inf")
        log(f"deletion: {results['deletion']:.2f} s")
        self.stop_profile()
        return results

    def _kill_controller(self, broker_id: int) -> float:
        """SIGKILL the active controller and create a topic without an id, which only the next
        controller can give one, and only from its topic watch -- armed once it has loaded the
        cluster and brought every partition in line: from its election (its /controller ctime, at
        the dead one's session expiry) to that write (the topic znode's mtime), it failed over."""
        self.controllers.pop(broker_id).kill()
        path = znodes.topic_path("canary")
        self.zk.create(path, znodes.TopicZNode(None, {0: [1, 2, 3]}).encode())
        self.wait("new controller", lambda: self.zk.get(path)[1].version > 0)
        elected = self.zk.exists(znodes.CONTROLLER)
        assert elected is not None
        return (self.zk.get(path)[1].mtime - elected.ctime) / 1000

    async def _controlled_shutdown(self, broker_id: int) -> float:
        from strom.broker.control_plane.controller import request_controlled_shutdown

        zk = AsyncZooKeeper(self.zk_server.connect, 10000, 10000)
        await zk.start()
        started = time.monotonic()
        done = await request_controlled_shutdown(zk, broker_id, self.timeout)
        took = time.monotonic() - started
        await zk.stop()
        if not done:
            raise TimeoutError("controlled shutdown")
        return took

    def stop(self) -> None:
        self.stop_profile()
        for process in self.controllers.values():
            process.kill()
            process.wait()
        for session in self.brokers.values():
            with contextlib.suppress(Exception):
                session.stop()
                session.close()
        if self.admin is not None:
            with contextlib.suppress(Exception):
                self.admin.stop()
                self.admin.close()
        self.zk_server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--partitions", type=int, default=10_000)
    parser.add_argument("--timeout", type=float, default=600.0, help="per scenario (s)")
    parser.add_argument("--profile", type=Path, help="folder for py-spy flame graphs of each scenario")
    parser.add_argument("--keep", action="store_true", help="keep the work folder (logs)")
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="controller-bench-"))
    if args.profile is not None:
        args.profile.mkdir(parents=True, exist_ok=True)
    bench = Bench(folder, args.partitions, args.timeout, args.profile)
    try:
        results = bench.run()
    finally:
        bench.stop()
        if not args.keep:
            shutil.rmtree(folder, ignore_errors=True)
        else:
            log(f"logs in {folder}")
    print(" ".join(f"{k}={v:.2f}s" for k, v in results.items()))


if __name__ == "__main__":
    main()
