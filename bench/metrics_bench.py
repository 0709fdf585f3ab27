"""What the metrics endpoint costs: broker throughput and produce p99 with /metrics scraped every
second versus not scraped, in one run on one broker, and how long a scrape of many partitions takes.

One Strom broker with ``metrics.listener`` set (the request path counts either way: the difference
measured is that of serving scrapes). A topic of ``--partitions`` partitions gives every scrape the
per-partition families a loaded broker has. Then ``--rounds`` rounds, each running both modes in
alternating order (scraped/unscraped, then unscraped/scraped, ...), each mode:

* throughput: rdkafka_performance produces ``--records`` 100-byte records, acks=1, to a partition;
* latency: a paced producer (1,000 records/s, linger.ms=0, acks=1) measures produce -> ack;

while, in the scraped mode, a child process GETs /metrics every second. Reported: the median of the
rounds per mode and their difference (goal: under 3%), and the scrapes' durations. Last, with
``--scrape-partitions``, a topic that brings the broker to that many partitions is created and
scraped a few times: the scrape's duration and the broker's worst event-loop lag meanwhile.

    .venv/bin/python bench/metrics_bench.py [--rounds 5] [--records 1000000] [--write-results]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

import benchlib
from benchlib import OUT, BenchError, Broker, fmt, log, percentile

SECTION = "metrics"
SIZE = 100
LATENCY_RATE = 1000.0
LATENCY_RECORDS = 5000
GOAL_PCT = 3.0


@contextlib.contextmanager
def strom_with_metrics(out_dir: Path, start_timeout: float = 60.0) -> Iterator[tuple[Broker, str]]:
    """A fresh Strom broker with metrics.listener on a free port; (broker, its /metrics URL)."""
    port, metrics_port = benchlib.free_port(), benchlib.free_port()
    data_dir = Path(tempfile.mkdtemp(prefix="bench-metrics-"))
    out_dir.mkdir(parents=True, exist_ok=True)
    log_path = out_dir / f"strom-{port}.log"
    command = [
        *benchlib.broker_command("strom", port, data_dir),
        "--override",
        f"metrics.listener=http://127.0.0.1:{metrics_port}",
    ]
    with open(log_path, "wb") as log_file:
        proc = subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    broker = Broker("strom", port, proc, log_path)
    try:
        deadline = time.monotonic() + start_timeout
        while True:
            broker.check_alive()
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=2) as sock:
                    benchlib.api_versions(sock, correlation_id=1)
                break
            except OSError as exc:
                if time.monotonic() > deadline:
                    raise BenchError(f"strom did not answer within {start_timeout:.0f} s") from exc
                time.sleep(0.05)
        yield broker, f"http://127.0.0.1:{metrics_port}/metrics"
    finally:
        benchlib.stop_process(proc)
        shutil.rmtree(data_dir, ignore_errors=True)


def get(url: str) -> tuple[float, bytes]:
    """One scrape: (seconds it took, the body)."""
    started = time.perf_counter()
    with urllib.request.urlopen(url, timeout=60) as response:
        body: bytes = response.read()
    return time.perf_counter() - started, body


# The scraper runs in a process of its own: in this one, its thread would compete for the GIL with
# the latency probe's threads and show as produce latency that is the client's, not the broker's.
SCRAPER = """
import sys, time, urllib.request
url, next_due = sys.argv[1], time.monotonic()
while True:
    started = time.perf_counter()
    with urllib.request.urlopen(url, timeout=60) as response:
        size = len(response.read())
    print(time.perf_counter() - started, size, flush=True)
    next_due += 1.0
    time.sleep(max(0.0, next_due - time.monotonic()))
"""


@dataclass
class Scraper:
    """GETs /metrics every second, from a child process, while running."""

    url: str
    durations: list[float] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        proc = subprocess.Popen(
            [sys.executable, "-c", SCRAPER, self.url],
            stdout=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
        )
        try:
            yield
        finally:
            proc.terminate()
            output, _ = proc.communicate(timeout=60)
            for line in output.splitlines():
                seconds, size = line.split()
                self.durations.append(float(seconds))
                self.sizes.append(int(size))


@dataclass
class Round:
    records_per_second: float
    p99_ms: float
    p50_ms: float


def one_mode(broker: Broker, topic: str, partition: int, records: int, run_dir: Path, name: str) -> Round:
    args = benchlib.produce_args(broker.bootstrap, topic, SIZE, records, 1, partition)
    throughput = benchlib.run_rdkafka_performance(broker, args, records, 600, run_dir / f"{name}.txt")
    # The latency probe writes to partition 0 of its own topic.
    latency = benchlib.measure_latency(
        broker.bootstrap, f"{topic}-latency", SIZE, 1, LATENCY_RATE, LATENCY_RECORDS, 120, end_to_end=False
    )
    return Round(
        throughput.records_per_second,
        percentile(latency.ack_us, 99) / 1000,
        percentile(latency.ack_us, 50) / 1000,
    )


def loop_lag_buckets(body: bytes) -> dict[float, float]:
    """strom_eventloop_lag_seconds' cumulative buckets by upper bound."""
    buckets: dict[float, float] = {}
    for family in text_string_to_metric_families(body.decode()):
        if family.name == "strom_eventloop_lag_seconds":
            for sample in family.samples:
                if sample.name.endswith("_bucket"):
                    buckets[float(sample.labels["le"])] = sample.value
    return buckets


def worst_lag_bound(before: dict[float, float], after: dict[float, float]) -> float:
    """The upper bound of the highest bucket that gained an observation between two scrapes."""
    worst = 0.0
    previous_gain = 0.0
    for bound in sorted(after):
        gain = after[bound] - before.get(bound, 0.0)
        if gain > previous_gain:
            worst = bound
        previous_gain = gain
    return worst


def large_scrape(
    broker: Broker, url: str, partitions: int, existing: int
) -> tuple[list[float], float, float, int]:
    """Bring the broker to ``partitions`` partitions, let it settle, then watch its event-loop lag
    for 6 s unscraped and 6 s scraped every second; the scrapes' durations, the worst lag of each
    window (bucket bound, s), the text's size."""
    extra = partitions - existing
    if extra > 0:
        benchlib.create_topic(broker.bootstrap, "metrics-bench-many", timeout=600, partitions=extra)
    time.sleep(10)  # the creation's checkpoints and heap freezes are over
    _, body = get(url)
    quiet_start = loop_lag_buckets(body)
    time.sleep(6)
    _, body = get(url)
    quiet_end = loop_lag_buckets(body)
    durations = []
    for _ in range(6):
        seconds, body = get(url)
        durations.append(seconds)
        time.sleep(1)
    return (
        durations,
        worst_lag_bound(quiet_start, quiet_end),
        worst_lag_bound(quiet_end, loop_lag_buckets(body)),
        len(body),
    )


def pct(a: float, b: float) -> float:
    return (a - b) / b * 100


def render(
    rounds: list[tuple[str, Round]],
    scrapes: list[float],
    scrape_size: int,
    large: tuple[int, list[float], float, float, int] | None,
    args: argparse.Namespace,
    started: str,
) -> str:
    by_mode = {mode: [r for m, r in rounds if m == mode] for mode in ("scraped", "unscraped")}
    tput = {m: statistics.median(r.records_per_second for r in rs) for m, rs in by_mode.items()}
    p99 = {m: statistics.median(r.p99_ms for r in rs) for m, rs in by_mode.items()}
    p50 = {m: statistics.median(r.p50_ms for r in rs) for m, rs in by_mode.items()}
    lines = [
        f"<!-- {SECTION}:begin -->",
        "## Metrics endpoint cost (`metrics_bench.py`)",
        "",
        f"Run {started} UTC on a shared machine (other work ran meanwhile: read the spread, not the "
        f"last digit). One Strom broker with `metrics.listener` set and a topic of {args.partitions} "
        f"partitions; {args.rounds} rounds, each running both modes in alternating order. Throughput: "
        f"rdkafka_performance, {args.records:,} records of {SIZE} B, acks=1, one partition. Produce "
        f"latency: {LATENCY_RECORDS:,} records at {LATENCY_RATE:,.0f}/s, linger.ms=0, acks=1. Scraped: "
        "GET /metrics every second throughout.",
        "",
        *benchlib.machine_description(),
        "",
        "| | not scraped | scraped every 1 s | difference |",
        "|---|---:|---:|---:|",
        f"| throughput (records/s, median) | {fmt(tput['unscraped'], 0)} | {fmt(tput['scraped'], 0)} | "
        f"{pct(tput['scraped'], tput['unscraped']):+.1f}% |",
        f"| produce p99 (ms, median) | {fmt(p99['unscraped'], 2)} | {fmt(p99['scraped'], 2)} | "
        f"{pct(p99['scraped'], p99['unscraped']):+.1f}% |",
        f"| produce p50 (ms, median) | {fmt(p50['unscraped'], 2)} | {fmt(p50['scraped'], 2)} | "
        f"{pct(p50['scraped'], p50['unscraped']):+.1f}% |",
        "",
        "Each round (mode: records/s, p50 / p99 ms): "
        + "; ".join(f"{m}: {r.records_per_second:,.0f}, {r.p50_ms:.2f} / {r.p99_ms:.2f}" for m, r in rounds)
        + ".",
        "",
        f"Scrapes during the runs: {len(scrapes)}, {scrape_size / 1024:,.0f} KiB each; duration p50 "
        f"{percentile(scrapes, 50) * 1000:.1f} ms, max {max(scrapes) * 1000:.1f} ms.",
    ]
    if large is not None:
        partitions, durations, quiet_lag, scraped_lag, size = large
        lines += [
            "",
            f"A scrape of a broker with {partitions:,} partitions ({size / 1048576:.1f} MiB of text): "
            f"{', '.join(f'{d * 1000:,.0f}' for d in durations)} ms. The broker's worst event-loop lag "
            f"(`strom_eventloop_lag_seconds`, bucket bound) over 6 s unscraped: {quiet_lag * 1000:g} ms; "
            f"over 6 s scraped every second: {scraped_lag * 1000:g} ms. The "
            "text is written on the loop, a family or 10 partitions at a time, the loop served in between.",
        ]
    lines.append(f"<!-- {SECTION}:end -->")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=1000, help="of the topic every scrape walks")
    parser.add_argument("--scrape-partitions", type=int, default=10_000, help="0: skip the large scrape")
    parser.add_argument("--write-results", action="store_true")
    args = parser.parse_args(argv)
    benchlib.check_tools()
    benchlib.raise_nofile_limit()
    started = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M")
    run_dir = OUT / f"metrics-{int(time.time())}"
    run_dir.mkdir(parents=True, exist_ok=True)
    rounds: list[tuple[str, Round]] = []
    large: tuple[int, list[float], float, float, int] | None = None
    with strom_with_metrics(run_dir) as (broker, url):
        topic = "metrics-bench"
        benchlib.create_topic(broker.bootstrap, topic, timeout=300, partitions=args.partitions)
        benchlib.create_topic(broker.bootstrap, f"{topic}-latency")
        scraper = Scraper(url)
        for index in range(args.rounds):
            order = ("scraped", "unscraped") if index % 2 == 0 else ("unscraped", "scraped")
            for mode in order:
                with scraper.running() if mode == "scraped" else contextlib.nullcontext():
                    result = one_mode(
                        broker, topic, index % args.partitions, args.records, run_dir, f"{index}-{mode}"
                    )
                rounds.append((mode, result))
                log(
                    f"round {index + 1} {mode}: {result.records_per_second:,.0f} records/s, "
                    f"p50 {result.p50_ms:.2f} ms, p99 {result.p99_ms:.2f} ms"
                )
        if args.scrape_partitions > 0:
            durations, quiet, scraped, size = large_scrape(
                broker, url, args.scrape_partitions, args.partitions + 1
            )
            large = (args.scrape_partitions, durations, quiet, scraped, size)
    section = render(rounds, scraper.durations, max(scraper.sizes, default=0), large, args, started)
    log(section)
    if args.write_results:
        benchlib.write_section(SECTION, section)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BenchError as exc:
        log(f"metrics_bench: {exc}")
        sys.exit(1)
