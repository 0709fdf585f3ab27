"""Side-by-side throughput, latency and CPU benchmark of Strom and Tansu.

For every scenario (record size x acks) each broker in turn is started fresh and driven by
rdkafka_performance: produce N records to a one-partition topic, consume them from the beginning,
then a paced latency probe. See bench/README.md for what the numbers mean.

    .venv/bin/python bench/broker_bench.py [--brokers strom,tansu] [--write-results]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import gc
import os
import re
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import benchlib
from benchlib import (
    BROKERS,
    OUT,
    REPO,
    RESULTS,
    BenchError,
    Broker,
    Latency,
    Throughput,
    fmt,
    log,
    percentile,
    ratio,
)

DEFAULT_RECORDS = {100: 1_000_000, 1024: 300_000}
# py-spy for --profile: $PY_SPY if set (a scratch venv's, say), else the repository venv's.
PY_SPY = Path(os.environ.get("PY_SPY") or REPO / ".venv" / "bin" / "py-spy")


@dataclass(frozen=True)
class Scenario:
    size: int
    acks: int
    records: int

    @property
    def label(self) -> str:
        size = "1 KiB" if self.size == 1024 else f"{self.size} B"
        acks = "all (-1)" if self.acks == -1 else str(self.acks)
        return f"{size} records, acks={acks}"

    @property
    def topic(self) -> str:
        return f"bench-{self.size}-acks{'all' if self.acks == -1 else self.acks}"


@dataclass
class Run:
    """One broker's numbers for one scenario (one repetition)."""

    produce: Throughput
    consume: Throughput
    latency: Latency
    peak_rss_kib: int


@dataclass
class Settings:
    timeout: float
    latency_rate: float
    latency_records: int
    profile: bool


def rel(path: Path) -> str:
    try:
        return str(path.relative_to(REPO))
    except ValueError:
        return str(path)


def start_py_spy(pid: int, path: Path, *, threads: bool = False) -> subprocess.Popen[bytes]:
    """py-spy sampling ``pid`` at 200 Hz into ``path`` (raw collapsed stacks) until SIGINT."""
    return subprocess.Popen(
        [
            str(PY_SPY),
            "record",
            "--pid",
            str(pid),
            *(["--threads"] if threads else []),
            "--format",
            "raw",
            "--nonblocking",
            "--rate",
            "200",
            "--output",
            str(path),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
    )


@contextlib.contextmanager
def py_spy(broker: Broker, name: str) -> Iterator[None]:
    """Samples the broker with py-spy while the block runs; writes collapsed stacks (raw format,
    per source line) to bench/out/profile-<name>.txt and prints the top functions by self time."""
    if not PY_SPY.exists():
        raise BenchError(f"{PY_SPY} missing: .venv/bin/pip install py-spy, or set PY_SPY (profiling only)")
    path = OUT / f"profile-{name}.txt"
    spy = start_py_spy(broker.pid, path)
    time.sleep(0.5)  # attach before load starts
    try:
        yield
    finally:
        spy.send_signal(signal.SIGINT)
        try:
            _, err = spy.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            spy.kill()
            _, err = spy.communicate()
        if path.exists():
            log(f"    profile {name} ({rel(path)}), top functions by self time:")
            for line in top_self_time(path, by_line=False):
                log(f"      {line}")
            log("    top lines by self time:")
            for line in top_self_time(path, by_line=True):
                log(f"      {line}")
        else:
            log(f"    py-spy wrote no profile: {err.decode(errors='replace').strip()[-300:]}")


def top_self_time(path: Path, by_line: bool, limit: int = 15) -> list[str]:
    """Aggregates collapsed stacks ('frame;frame;leaf count', frames 'func (file:line)') by leaf frame:
    per source line, or per function with the line number dropped."""
    self_samples: dict[str, int] = {}
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        leaf = stack.rsplit(";", 1)[-1]
        if not by_line:
            leaf = re.sub(r":\d+\)$", ")", leaf)
        self_samples[leaf] = self_samples.get(leaf, 0) + int(count)
        total += int(count)
    ranked = sorted(self_samples.items(), key=lambda item: item[1], reverse=True)[:limit]
    return [f"{100 * n / total:5.1f}%  {leaf}" for leaf, n in ranked] or ["(no samples)"]


def throughput_line(what: str, result: Throughput) -> str:
    rate, mb_s = fmt(result.records_per_second, 0), fmt(result.mb_per_second)
    return f"    {what}  {rate:>11} msg/s {mb_s:>8} MB/s  broker {fmt(result.cpu_seconds_per_gb)} CPU-s/GB"


def ms(samples_us: list[float], pct: float) -> str:
    return fmt(percentile(samples_us, pct) / 1000, 2)


def run_one(name: str, scenario: Scenario, settings: Settings, run_dir: Path) -> Run:
    with benchlib.running_broker(name, run_dir) as broker:
        stem = f"{name}-{scenario.topic}"
        profiling = settings.profile and name == "strom" and scenario.size == 1024 and scenario.acks == 1
        spy: Callable[[str], contextlib.AbstractContextManager[None]] = (
            (lambda what: py_spy(broker, f"{scenario.topic}-{what}"))
            if profiling
            else (lambda what: contextlib.nullcontext())
        )

        # Latency first, on the idle broker, before the throughput runs leave data and dirty pages behind.
        latency_topic = scenario.topic + "-latency"
        benchlib.create_topic(broker.bootstrap, latency_topic)
        latency = benchlib.measure_latency(
            broker.bootstrap,
            latency_topic,
            scenario.size,
            scenario.acks,
            settings.latency_rate,
            settings.latency_records,
            timeout=settings.latency_records / settings.latency_rate * 3 + 30,
        )
        log(
            f"    latency  produce->ack p50/p99 {ms(latency.ack_us, 50)}/{ms(latency.ack_us, 99)} ms, "
            f"end-to-end p50/p99 {ms(latency.e2e_us, 50)}/{ms(latency.e2e_us, 99)} ms"
        )

        benchlib.create_topic(broker.bootstrap, scenario.topic)
        with spy("produce"):
            produce = benchlib.run_rdkafka_performance(
                broker,
                benchlib.produce_args(
                    broker.bootstrap, scenario.topic, scenario.size, scenario.records, scenario.acks
                ),
                scenario.records,
                settings.timeout,
                run_dir / f"{stem}-produce.txt",
            )
        log(throughput_line("produce", produce))
        with spy("consume"):
            consume = benchlib.run_rdkafka_performance(
                broker,
                benchlib.consume_args(broker.bootstrap, scenario.topic, scenario.records),
                scenario.records,
                settings.timeout,
                run_dir / f"{stem}-consume.txt",
            )
        log(throughput_line("consume", consume))

        broker.check_alive()
        return Run(produce, consume, latency, broker.status_kib("VmHWM"))


# --- summarising ------------------------------------------------------------------------------------

Metric = tuple[str, Callable[[Run], float], int]
METRICS: list[Metric] = [
    ("produce msg/s", lambda r: r.produce.records_per_second, 0),
    ("produce MB/s", lambda r: r.produce.mb_per_second, 1),
    ("consume msg/s", lambda r: r.consume.records_per_second, 0),
    ("consume MB/s", lambda r: r.consume.mb_per_second, 1),
    ("produce->ack latency p50 (ms)", lambda r: percentile(r.latency.ack_us, 50) / 1000, 2),
    ("produce->ack latency p99 (ms)", lambda r: percentile(r.latency.ack_us, 99) / 1000, 2),
    ("produce->ack latency p99.9 (ms)", lambda r: percentile(r.latency.ack_us, 99.9) / 1000, 2),
    ("end-to-end latency p50 (ms)", lambda r: percentile(r.latency.e2e_us, 50) / 1000, 2),
    ("end-to-end latency p99 (ms)", lambda r: percentile(r.latency.e2e_us, 99) / 1000, 2),
    ("end-to-end latency p99.9 (ms)", lambda r: percentile(r.latency.e2e_us, 99.9) / 1000, 2),
    ("broker CPU-s per GB produced", lambda r: r.produce.cpu_seconds_per_gb, 2),
    ("broker CPU-s per GB consumed", lambda r: r.consume.cpu_seconds_per_gb, 2),
    ("broker peak RSS (MiB)", lambda r: r.peak_rss_kib / 1024, 0),
]
RATIO_COLUMNS = [
    "produce msg/s",
    "consume msg/s",
    "produce->ack latency p99 (ms)",
    "end-to-end latency p99 (ms)",
    "broker CPU-s per GB produced",
    "broker CPU-s per GB consumed",
]


def median_metric(runs: list[Run], metric: Metric) -> float | None:
    values = [metric[1](run) for run in runs]
    return statistics.median(values) if values else None


def render_results(
    scenarios: list[Scenario],
    brokers: list[str],
    runs: dict[tuple[Scenario, str], list[Run]],
    failures: dict[tuple[Scenario, str], list[str]],
    settings: Settings,
    repeat: int,
    started: datetime.datetime,
    machine: list[str],
    duration: float,
) -> str:
    rdperf = rel(benchlib.RDKAFKA_PERFORMANCE)
    lines = [
        "# Broker benchmark results",
        "",
        f"Written by `bench/broker_bench.py --write-results` on {started:%Y-%m-%d %H:%M} UTC "
        f"(run took {duration / 60:.1f} min). How to read the numbers: bench/README.md.",
        "",
        "## Machine",
        "",
        *machine,
        "- Client and broker share the machine's cores; other work may have been running on it.",
        "",
        "## Commands",
        "",
        "Each broker runs alone (one at a time), freshly started for every scenario:",
        "",
        f"- Strom: `{rel(benchlib.STROM)} serve --override listeners=PLAINTEXT://127.0.0.1:PORT "
        "--override log.dirs=TMPDIR`",
        f"- Tansu: `{rel(benchlib.TANSU)} broker --listener-url tcp://127.0.0.1:PORT "
        "--advertised-listener-url tcp://127.0.0.1:PORT` (in-memory storage)",
        "",
        "The topic is created with confluent-kafka's AdminClient (1 partition, replication factor 1). Then:",
        "",
    ]
    for scenario in scenarios:
        produce = " ".join(
            benchlib.produce_args(
                "127.0.0.1:PORT", scenario.topic, scenario.size, scenario.records, scenario.acks
            )
        )
        consume = " ".join(benchlib.consume_args("127.0.0.1:PORT", scenario.topic, scenario.records))
        lines += [f"- `{rdperf} {produce}`", f"- `{rdperf} {consume}`"]
    lines += [
        "",
        f"Latency probe (bench/benchlib.py `measure_latency`, confluent-kafka): {settings.latency_records:,} "
        f"records at {settings.latency_rate:,.0f} records/s, linger.ms=0, same size and acks as the "
        "scenario, to its own one-partition topic while a consumer assigned to it reads along; it runs "
        "first, while the broker is idle.",
        "",
        f"Repetitions: {repeat} (interleaved, brokers alternating); tables show the median of the "
        "successful ones.",
        "",
        "## Results",
    ]
    for scenario in scenarios:
        lines += ["", f"### {scenario.label} ({scenario.records:,} records)", ""]
        lines += [
            "| metric | "
            + " | ".join(b.capitalize() for b in brokers)
            + " |"
            + (" Strom/Tansu |" if len(brokers) == 2 else ""),
            "|---|" + "---:|" * (len(brokers) + (1 if len(brokers) == 2 else 0)),
        ]
        for metric in METRICS:
            values = [median_metric(runs.get((scenario, b), []), metric) for b in brokers]
            cells = [fmt(v, metric[2]) if v is not None else "failed" for v in values]
            if len(brokers) == 2:
                cells.append(ratio(values[0], values[1]))
            lines.append(f"| {metric[0]} | " + " | ".join(cells) + " |")
        for broker in brokers:
            for failure in failures.get((scenario, broker), []):
                lines.append(f"\n{broker} failed: {failure}")
    if len(brokers) == 2:
        lines += [
            "",
            "## Strom/Tansu ratios",
            "",
            "Throughput ratios below 1 and latency or CPU ratios above 1 mean Strom is behind.",
            "",
            "| scenario | " + " | ".join(RATIO_COLUMNS) + " |",
            "|---|" + "---:|" * len(RATIO_COLUMNS),
        ]
        by_name = {m[0]: m for m in METRICS}
        for scenario in scenarios:
            cells = []
            for column in RATIO_COLUMNS:
                strom, tansu = (median_metric(runs.get((scenario, b), []), by_name[column]) for b in brokers)
                cells.append(ratio(strom, tansu))
            lines.append(f"| {scenario.label} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--brokers", default=",".join(BROKERS), help="comma-separated: strom,tansu")
    parser.add_argument("--sizes", default="100,1024", help="record sizes in bytes")
    parser.add_argument("--acks", default="1,-1", help="acks settings: 1 and/or -1 (all)")
    parser.add_argument(
        "--records",
        type=int,
        help="records per throughput run (default: 1,000,000 "
        "for 100 B, 300,000 for 1 KiB, 300 MB / size otherwise)",
    )
    parser.add_argument("--scale", type=float, default=1.0, help="multiply the default record counts")
    parser.add_argument("--repeat", type=int, default=3, help="repetitions; tables show medians")
    parser.add_argument(
        "--timeout", type=float, default=300, help="seconds allowed per rdkafka_performance run"
    )
    parser.add_argument("--latency-rate", type=float, default=1000, help="latency probe records/s")
    parser.add_argument("--latency-records", type=int, default=5000, help="latency probe records")
    parser.add_argument(
        "--profile",
        action="store_true",
        help="py-spy the Strom broker during the 1 KiB acks=1 produce and consume runs",
    )
    parser.add_argument("--write-results", action="store_true", help=f"overwrite {rel(RESULTS)}")
    args = parser.parse_args(argv)

    brokers = [b.strip() for b in args.brokers.split(",") if b.strip()]
    unknown = set(brokers) - set(BROKERS)
    if unknown or not brokers:
        parser.error(f"--brokers takes strom and/or tansu, not {', '.join(sorted(unknown)) or 'nothing'}")
    brokers.sort(key=BROKERS.index)  # Strom first, so ratios read Strom/Tansu
    acks_values = [int(a) for a in args.acks.split(",")]
    if any(a not in (0, 1, -1) for a in acks_values):
        parser.error("--acks takes 0, 1 and -1")
    scenarios = []
    for size in (int(s) for s in args.sizes.split(",")):
        if size < 8:
            parser.error("record sizes below 8 bytes cannot carry the latency probe's timestamp")
        base = args.records or DEFAULT_RECORDS.get(size, min(1_000_000, 300_000_000 // size))
        scenarios += [Scenario(size, acks, max(1, int(base * args.scale))) for acks in acks_values]

    try:
        benchlib.check_tools()
        if "strom" in brokers and not benchlib.strom_available():
            raise BenchError(
                f"`{rel(benchlib.STROM)} serve --help` fails: Strom's broker is not installed "
                "yet (pip install -e .), or run with --brokers tansu"
            )
    except BenchError as exc:
        print(f"broker_bench: {exc}", file=sys.stderr)
        return 2
    benchlib.raise_nofile_limit()

    started = datetime.datetime.now(datetime.UTC)
    machine = benchlib.machine_description()
    run_dir = OUT / f"broker_bench-{started:%Y%m%d-%H%M%S}"
    run_dir.mkdir(parents=True, exist_ok=True)
    settings = Settings(args.timeout, args.latency_rate, args.latency_records, args.profile)
    log(
        f"broker_bench: {', '.join(brokers)}; {len(scenarios)} scenarios x {args.repeat}; "
        f"logs in {rel(run_dir)}"
    )
    for line in machine:
        log(line)

    runs: dict[tuple[Scenario, str], list[Run]] = {}
    failures: dict[tuple[Scenario, str], list[str]] = {}
    clock = time.monotonic()
    for repetition in range(args.repeat):
        for scenario in scenarios:
            for name in brokers:
                log(
                    f"[{repetition + 1}/{args.repeat}] {name}: {scenario.label}, {scenario.records:,} records"
                )
                try:
                    runs.setdefault((scenario, name), []).append(run_one(name, scenario, settings, run_dir))
                except BenchError as exc:
                    log(f"    FAILED: {exc}")
                    failures.setdefault((scenario, name), []).append(str(exc))
                # Clients of a failed run live on in reference cycles through its traceback; free them
                # now so they stop reconnecting to the dead broker.
                gc.collect()
    duration = time.monotonic() - clock

    report = render_results(
        scenarios, brokers, runs, failures, settings, args.repeat, started, machine, duration
    )
    log("")
    log(report)
    if args.write_results:
        existing = RESULTS.read_text() if RESULTS.exists() else ""
        kept = "".join("\n" + section + "\n" for section in benchlib.other_sections(existing))
        RESULTS.write_text(report + kept)
        log(f"wrote {rel(RESULTS)}")
    return 1 if failures else 0


if __name__ == "__main__":
    os.chdir(REPO)
    sys.exit(main())
