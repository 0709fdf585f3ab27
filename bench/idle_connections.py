"""What idle client connections cost a broker: memory, and produce latency for an active client.

For each broker: start it fresh, measure produce->ack latency, open N TCP connections that each
complete one ApiVersions round trip (as real clients do first) and then stay idle, and measure the
broker's RSS and the produce latency again while they are open.

    .venv/bin/python bench/idle_connections.py [--brokers strom,tansu] [--connections 1000] [--write-results]
"""

from __future__ import annotations

import argparse
import datetime
import os
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import benchlib
from benchlib import BROKERS, IDLE_BEGIN, IDLE_END, OUT, REPO, RESULTS, BenchError, fmt, log, percentile


@dataclass
class IdleResult:
    rss_before_kib: int
    rss_after_kib: int
    connections: int
    still_open: int
    baseline: benchlib.Latency
    loaded: benchlib.Latency

    @property
    def kib_per_connection(self) -> float:
        return (self.rss_after_kib - self.rss_before_kib) / self.connections


def open_idle_connections(bootstrap: str, count: int, timeout: float) -> list[socket.socket]:
    host, port = bootstrap.rsplit(":", 1)
    sockets: list[socket.socket] = []
    deadline = time.monotonic() + timeout
    try:
        for n in range(count):
            if time.monotonic() > deadline:
                raise BenchError(f"opened only {n} of {count} connections in {timeout:.0f} s")
            sock = socket.create_connection((host, int(port)), timeout=10)
            sockets.append(sock)
            try:
                benchlib.api_versions(sock, correlation_id=n + 1)
            except OSError as exc:
                raise BenchError(f"connection {n + 1}: {exc}") from exc
    except BaseException:
        close_all(sockets)
        raise
    return sockets


def count_open(sockets: list[socket.socket]) -> int:
    """Connections the broker has not closed (a closed one reads as EOF without blocking)."""
    alive = 0
    for sock in sockets:
        sock.setblocking(False)
        try:
            alive += sock.recv(1, socket.MSG_PEEK) != b""
        except BlockingIOError:
            alive += 1
        except OSError:
            pass
    return alive


def close_all(sockets: list[socket.socket]) -> None:
    for sock in sockets:
        sock.close()


def run_broker(name: str, args: argparse.Namespace, run_dir: Path) -> IdleResult:
    timeout = args.latency_records / args.latency_rate * 3 + 30
    with benchlib.running_broker(name, run_dir) as broker:
        topic = "bench-idle"
        benchlib.create_topic(broker.bootstrap, topic)

        def latency() -> benchlib.Latency:
            return benchlib.measure_latency(
                broker.bootstrap,
                topic,
                args.size,
                1,
                args.latency_rate,
                args.latency_records,
                timeout,
                end_to_end=False,
            )

        baseline = latency()
        log(f"    no idle connections:   produce->ack p50/p99 {ms(baseline, 50)}/{ms(baseline, 99)} ms")
        time.sleep(1)  # let the client's connections close before reading RSS
        rss_before = broker.status_kib("VmRSS")
        started = time.monotonic()
        sockets = open_idle_connections(broker.bootstrap, args.connections, args.open_timeout)
        try:
            log(f"    opened {len(sockets)} connections in {time.monotonic() - started:.1f} s")
            time.sleep(2)  # let the broker settle (buffers, GC) before reading RSS
            rss_after = broker.status_kib("VmRSS")
            loaded = latency()
            log(
                f"    {len(sockets)} idle connections: "
                f"produce->ack p50/p99 {ms(loaded, 50)}/{ms(loaded, 99)} ms"
            )
            still_open = count_open(sockets)
            broker.check_alive()
        finally:
            close_all(sockets)
        log(
            f"    RSS {rss_before / 1024:.1f} MiB -> {rss_after / 1024:.1f} MiB, "
            f"{(rss_after - rss_before) / len(sockets):.1f} KiB per connection; {still_open} still open"
        )
        return IdleResult(rss_before, rss_after, len(sockets), still_open, baseline, loaded)


def ms(latency: benchlib.Latency, pct: float) -> str:
    return fmt(percentile(latency.ack_us, pct) / 1000, 2)


def render(
    results: dict[str, IdleResult],
    failures: dict[str, str],
    args: argparse.Namespace,
    started: datetime.datetime,
    machine: list[str],
) -> str:
    lines = [
        IDLE_BEGIN,
        "## Idle connections",
        "",
        f"Written by `bench/idle_connections.py --write-results` on {started:%Y-%m-%d %H:%M} UTC.",
        *machine,
        "",
        f"Each broker freshly started; {args.connections:,} TCP connections each complete one ApiVersions v3 "
        "round trip and then stay idle. RSS is VmRSS from /proc/<pid>/status, read before opening them and "
        "2 s after. Produce latency: confluent-kafka producer, "
        f"{args.latency_records:,} records of {args.size} B at {args.latency_rate:,.0f} records/s, acks=1, "
        "linger.ms=0, first without and then with the idle connections open.",
        "",
        "| broker | RSS before (MiB) | RSS with idle conns (MiB) | KiB per conn | still open | "
        "produce p50 / p99 (ms), no idle conns | produce p50 / p99 (ms), idle conns open |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, result in results.items():
        lines.append(
            f"| {name.capitalize()} | {result.rss_before_kib / 1024:.1f} | "
            f"{result.rss_after_kib / 1024:.1f} | "
            f"{result.kib_per_connection:.1f} | {result.still_open:,} / {result.connections:,} | "
            f"{ms(result.baseline, 50)} / {ms(result.baseline, 99)} | "
            f"{ms(result.loaded, 50)} / {ms(result.loaded, 99)} |"
        )
    for name, failure in failures.items():
        lines.append(f"| {name.capitalize()} | failed: {failure} | | | | | |")
    lines.append(IDLE_END)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--brokers", default=",".join(BROKERS), help="comma-separated: strom,tansu")
    parser.add_argument("--connections", type=int, default=1000)
    parser.add_argument("--open-timeout", type=float, default=120, help="seconds allowed to open them all")
    parser.add_argument("--size", type=int, default=1024, help="latency probe record size")
    parser.add_argument("--latency-rate", type=float, default=1000, help="latency probe records/s")
    parser.add_argument("--latency-records", type=int, default=5000, help="latency probe records")
    parser.add_argument(
        "--write-results", action="store_true", help=f"replace or append the section in {RESULTS}"
    )
    args = parser.parse_args(argv)

    brokers = [b.strip() for b in args.brokers.split(",") if b.strip()]
    if not brokers or set(brokers) - set(BROKERS):
        parser.error("--brokers takes strom and/or tansu")
    brokers.sort(key=BROKERS.index)
    try:
        benchlib.check_tools()
        if "strom" in brokers and not benchlib.strom_available():
            raise BenchError(
                "`.venv/bin/strom serve --help` fails: Strom's broker is not installed yet, "
                "or run with --brokers tansu"
            )
    except BenchError as exc:
        print(f"idle_connections: {exc}", file=sys.stderr)
        return 2
    # Client sockets and, inherited by the brokers started below, their accepted sockets.
    limit = benchlib.raise_nofile_limit()
    if limit < args.connections + 200:
        print(
            f"idle_connections: open-files limit {limit} is too low for {args.connections} connections",
            file=sys.stderr,
        )
        return 2

    started = datetime.datetime.now(datetime.UTC)
    machine = benchlib.machine_description()
    run_dir = OUT / f"idle_connections-{started:%Y%m%d-%H%M%S}"
    results: dict[str, IdleResult] = {}
    failures: dict[str, str] = {}
    for name in brokers:
        log(f"{name}: {args.connections} idle connections")
        try:
            results[name] = run_broker(name, args, run_dir)
        except BenchError as exc:
            log(f"    FAILED: {exc}")
            failures[name] = str(exc)
    section = render(results, failures, args, started, machine)
    log("")
    log(section)
    if args.write_results:
        benchlib.write_section("idle-connections", section)
        log(f"wrote {RESULTS.relative_to(REPO)}")
    return 1 if failures else 0


if __name__ == "__main__":
    os.chdir(REPO)
    sys.exit(main())
