"""Log cleaner (compaction) benchmark: how fast a round cleans, what memory it takes, and what it does
to the event loop.

Logs are built with the storage API in a temporary directory (no broker): a compacted log of
`--batch-records`-record batches whose keys are drawn uniformly from K keys, rolled so every segment
is closed and fsynced; each repetition cleans a fresh copy of it once.

1. Throughput: per scenario (record size x keys x codec x size), a fresh process builds the log and
   times first rounds with `LogCleaner.clean_log` (the round in the calling thread), measuring the
   process's peak RSS growth during the first.
2. Event-loop impact: on a uvloop loop, a ticker appends a small batch to a second log and reads it
   back every `--tick-ms`, first with nothing else running, then while `LogCleaner.clean_logs`
   runs a round of the big log (worker thread, swaps on the loop); tick latency p50/p99/max.

    .venv/bin/python bench/cleaner_bench.py [--scale F] [--repeat 3] [--write-results]
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import gc
import importlib.metadata
import multiprocessing
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TypeVar

import uvloop

import benchlib
from benchlib import REPO, RESULTS, BenchError, fmt, log, percentile
from strom.records.batch import CompressionType
from strom.records.codec import RecordSpec, encode_batch
from strom.storage import CleanerConfig, LogCleaner, LogConfig, UnifiedLog
from strom.storage.cleaner import MAP_ENTRY_OVERHEAD

CLEANER_BEGIN = "<!-- cleaner:begin -->"
CLEANER_END = "<!-- cleaner:end -->"
MIB = 1024 * 1024
SEGMENTS = 12  # segment.bytes is the log's target size / this
VALUE_POOL = 4096  # distinct values the records draw from
SEED = 20261122
WARMUP_S = 0.25  # event-loop ticks before the idle phase

T = TypeVar("T")


@dataclass(frozen=True)
class Scenario:
    """A compacted log to build: `size`-byte values, keys drawn from `keys`, `mib` MiB on disk in
    segments of `segment_mib` MiB (default: `mib` / SEGMENTS)."""

    size: int
    keys: int
    codec: str
    mib: float
    segment_mib: float | None = None

    @classmethod
    def parse(cls, spec: str) -> Scenario:
        """SIZE:KEYS:CODEC:MIB[:SEGMENT_MIB], e.g. 100:10000:none:64."""
        try:
            size, keys, codec, mib, *segment = spec.split(":")
            if len(segment) > 1:
                raise ValueError(spec)
            segment_mib = float(segment[0]) if segment else None
            scenario = cls(int(size), int(keys), codec, float(mib), segment_mib)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"{spec!r} is not SIZE:KEYS:CODEC:MIB[:SEGMENT_MIB]") from exc
        if codec not in CompressionType.NAMES:
            raise argparse.ArgumentTypeError(
                f"codec {codec!r} is not one of {', '.join(CompressionType.NAMES)}"
            )
        if scenario.size < 1 or scenario.keys < 1 or scenario.mib <= 0 or scenario.segment_bytes < 1024:
            raise argparse.ArgumentTypeError(f"{spec!r}: size, keys and MiB must be positive")
        return scenario

    @property
    def label(self) -> str:
        size = f"{self.size // 1024} KiB" if self.size % 1024 == 0 else f"{self.size} B"
        keys = f"{self.keys // 1_000_000}M" if self.keys % 1_000_000 == 0 else f"{self.keys:,}"
        segments = "" if self.segment_mib is None else f" in {self.segment_mib:g} MiB segments"
        return f"{size} x {keys} keys, {self.codec}, {self.mib:g} MiB{segments}"

    @property
    def spec(self) -> str:
        segment = "" if self.segment_mib is None else f":{self.segment_mib:g}"
        return f"{self.size}:{self.keys}:{self.codec}:{self.mib:g}{segment}"

    @property
    def segment_bytes(self) -> int:
        if self.segment_mib is None:
            return int(self.mib * MIB) // SEGMENTS
        return int(self.segment_mib * MIB)

    def scaled(self, factor: float) -> Scenario:
        segment_mib = None if self.segment_mib is None else self.segment_mib * factor
        return replace(self, mib=self.mib * factor, segment_mib=segment_mib)


DEFAULT_SCENARIOS = (
    Scenario(1024, 10_000, "none", 256),
    Scenario(100, 10_000, "none", 64),
    Scenario(100, 1_000_000, "none", 128),  # ~1.1M records, ~650k distinct keys in the map
    Scenario(1024, 10_000, "lz4", 128),
    Scenario(1024, 10_000, "zstd", 128),
)
DEFAULT_LOOP_SCENARIOS = (
    Scenario(100, 10_000, "none", 64),
    Scenario(1024, 10_000, "zstd", 128),
    # Fewer, larger segments: each swap replaces (and deletes) 128 MiB of old segment files.
    Scenario(1024, 10_000, "none", 512, 128),
)


@dataclass(frozen=True)
class BuiltLog:
    records: int
    distinct_keys: int
    segments: int
    size_bytes: int
    seconds: float


def compacted_config(scenario: Scenario) -> LogConfig:
    # min.cleanable.dirty.ratio stays at Kafka's 0.5: a never-cleaned log is 100% dirty.
    return LogConfig(cleanup_policy=("compact",), segment_bytes=scenario.segment_bytes)


def value_pool(size: int, rng: random.Random) -> list[bytes]:
    """Text-like values (words from a 256-word vocabulary) that compress roughly as JSON or logs do."""
    letters = b"abcdefghijklmnopqrstuvwxyz"
    words = [bytes(rng.choice(letters) for _ in range(rng.randint(3, 9))) for _ in range(256)]
    return [b" ".join(rng.choices(words, k=size // 3 + 1))[:size] for _ in range(VALUE_POOL)]


def build_log(path: Path, scenario: Scenario, batch_records: int) -> tuple[UnifiedLog, BuiltLog]:
    """Appends batches until the log holds `scenario.mib` MiB, then rolls so every segment is closed."""
    started = time.monotonic()
    rng = random.Random(SEED)
    values = value_pool(scenario.size, rng)
    width = len(str(scenario.keys - 1))
    keys = [b"key-%0*d" % (width, k) for k in range(scenario.keys)]
    seen = bytearray(scenario.keys)
    codec = CompressionType.NAMES[scenario.codec]
    log_ = UnifiedLog.open(path, compacted_config(scenario))
    target = int(scenario.mib * MIB)
    records = 0
    randrange = rng.randrange
    while log_.size_in_bytes < target:
        specs = []
        for _ in range(batch_records):
            k = randrange(scenario.keys)
            seen[k] = 1
            specs.append(RecordSpec(keys[k], values[randrange(VALUE_POOL)]))
        log_.append_as_leader(encode_batch(specs, compression=codec), 0)
        records += batch_records
    log_.roll()
    built = BuiltLog(
        records, seen.count(1), log_.num_segments - 1, log_.size_in_bytes, time.monotonic() - started
    )
    return log_, built


def sync_files(directory: Path) -> None:
    """fsyncs every file of a log: a broker's closed segments have long been written back, and
    deleting a written-back file costs more than deleting one still in the page cache."""
    for path in directory.iterdir():
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


# --- machine counters --------------------------------------------------------------------------------------


def status_kib(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise BenchError(f"{key} missing from /proc/self/status")


def reset_peak_rss() -> bool:
    """Sets VmHWM back to the current VmRSS (Linux >= 4.0); False if the kernel refuses."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def cpu_pressure_us() -> int | None:
    """Total time some task waited for a CPU (PSI, /proc/pressure/cpu), in microseconds."""
    try:
        some = Path("/proc/pressure/cpu").read_text().split("\n", 1)[0]
    except OSError:
        return None
    return int(some.rsplit("total=", 1)[1])


# --- 1. cleaning throughput ----------------------------------------------------------------------


@dataclass(frozen=True)
class Round:
    seconds: float
    cpu_seconds: float
    cpu_pressure: float | None  # share of the round some task on the machine waited for a CPU


@dataclass(frozen=True)
class ThroughputResult:
    scenario: Scenario
    built: BuiltLog
    rounds: list[Round]
    size_after: int
    records_removed: int
    covered: float  # share of the log the round's offset map covered (1.0 unless the map filled)
    rss_growth_kib: int | None  # in the first repetition, in a fresh process
    map_estimate_bytes: int  # what the cleaner counts against log.cleaner.dedupe.buffer.size

    @property
    def seconds(self) -> float:
        return statistics.median(r.seconds for r in self.rounds)

    @property
    def cpu_seconds(self) -> float:
        return statistics.median(r.cpu_seconds for r in self.rounds)

    # Rates over the part of the log the round's offset map covered (all of it unless the map filled).
    @property
    def mib_per_second(self) -> float:
        return self.built.size_bytes * self.covered / MIB / self.seconds

    @property
    def records_per_second(self) -> float:
        return self.built.records * self.covered / self.seconds


def open_copy(template: Path, copy: Path, scenario: Scenario) -> UnifiedLog:
    """A fresh, fsynced copy of the template log, opened as after a clean shutdown."""
    shutil.copytree(template, copy)
    sync_files(copy)
    return UnifiedLog.open(copy, compacted_config(scenario), had_clean_shutdown=True)


def run_throughput(
    scenario: Scenario, batch_records: int, dedupe_buffer: int, repeat: int
) -> ThroughputResult:
    """One scenario in this (fresh) process: build the log once, clean `repeat` copies of it."""
    tmp = Path(tempfile.mkdtemp(prefix="strom-cleaner-bench-"))
    try:
        template, built = build_log(tmp / "template-0", scenario, batch_records)
        template.close()
        key_bytes = len(b"key-") + len(str(scenario.keys - 1))
        rounds = []
        rss_growth: int | None = None
        for n in range(repeat):
            log_ = open_copy(tmp / "template-0", tmp / f"bench-{n}", scenario)
            cleaner = LogCleaner(CleanerConfig(dedupe_buffer_size=dedupe_buffer))
            gc.collect()
            rss_before = status_kib("VmRSS")
            peak_reset = n == 0 and reset_peak_rss()
            pressure = cpu_pressure_us()
            cpu_started, started = time.process_time(), time.perf_counter()
            stats = cleaner.clean_log(log_)
            seconds, cpu = time.perf_counter() - started, time.process_time() - cpu_started
            if peak_reset:
                rss_growth = status_kib("VmHWM") - rss_before
            pressure_after = cpu_pressure_us()
            share = None
            if pressure is not None and pressure_after is not None:
                share = (pressure_after - pressure) / 1e6 / seconds
            if stats is None:
                raise BenchError(f"{scenario.label}: clean_log ran no round (see the cleaner's log above)")
            kept = stats.records_read - stats.records_removed
            # With the whole log mapped, exactly one record per key must survive.
            if stats.end_offset == built.records and kept != built.distinct_keys:
                raise BenchError(f"{scenario.label}: {kept} records kept for {built.distinct_keys} keys")
            rounds.append(Round(seconds, cpu, share))
            last = stats
            size_after = log_.size_in_bytes
            log_.close()
            shutil.rmtree(log_.dir)
        return ThroughputResult(
            scenario,
            built,
            rounds,
            size_after,
            last.records_removed,
            last.end_offset / built.records,
            rss_growth,
            built.distinct_keys * (key_bytes + MAP_ENTRY_OVERHEAD),
        )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# --- 2. event-loop impact ------------------------------------------------------------------------


@dataclass
class Phase:
    """The ticks of one phase: latency (scheduled time to end of read) and the append + read alone."""

    latency_ms: list[float] = field(default_factory=list)
    work_ms: list[float] = field(default_factory=list)
    seconds: float = 0.0
    # Share of the phase during which some task on the machine waited for a CPU (PSI "some").
    cpu_pressure: float | None = None

    def measure(self) -> Callable[[], None]:
        """Starts timing the phase; call the result when it ends."""
        started, pressure = time.perf_counter(), cpu_pressure_us()

        def done() -> None:
            self.seconds = time.perf_counter() - started
            after = cpu_pressure_us()
            if pressure is not None and after is not None:
                self.cpu_pressure = (after - pressure) / 1e6 / self.seconds

        return done


@dataclass(frozen=True)
class LoopRun:
    idle: Phase
    cleaning: Phase


async def tick_during_round(
    big: UnifiedLog, probe: UnifiedLog, cleaner: LogCleaner, idle_seconds: float, tick_s: float
) -> LoopRun:
    """Ticks every `tick_s` on a fixed schedule: append a one-record batch to `probe` and read it back.
    A tick's latency runs from its scheduled time to the end of its read, so a loop stalled for
    several ticks counts every tick it delayed (no coordinated omission)."""
    batch = encode_batch([RecordSpec(b"probe", b"x" * 100)])
    idle, cleaning = Phase(), Phase()
    phase = Phase()  # warm-up
    stop = False

    async def ticker() -> None:
        scheduled = time.perf_counter()
        while not stop:
            scheduled += tick_s
            # asyncio.sleep(0) when behind: catch up, but let the loop run the cleaner's callbacks.
            await asyncio.sleep(max(0.0, scheduled - time.perf_counter()))
            woke = time.perf_counter()
            info = probe.append_as_leader(batch, 0)
            data = probe.read(info.first_offset, 1 << 20).records
            done = time.perf_counter()
            if len(data) != len(batch):
                raise BenchError(f"read back {len(data)} bytes of a {len(batch)}-byte batch")
            phase.latency_ms.append((done - scheduled) * 1000)
            phase.work_ms.append((done - woke) * 1000)

    task = asyncio.create_task(ticker())
    # The first ticks pay one-off costs (the probe log's first writes); they are not counted.
    await asyncio.sleep(WARMUP_S)
    phase = idle
    end_phase = idle.measure()
    await asyncio.sleep(idle_seconds)
    end_phase()
    phase = cleaning
    end_phase = cleaning.measure()
    cleaned = await cleaner.clean_logs([big])
    end_phase()
    stop = True
    await task
    if len(cleaned) != 1:
        raise BenchError(f"clean_logs cleaned {len(cleaned)} logs, expected the big one")
    return LoopRun(idle, cleaning)


def run_loop_impact(
    scenario: Scenario,
    batch_records: int,
    dedupe_buffer: int,
    repeat: int,
    idle_seconds: float,
    tick_ms: float,
) -> tuple[BuiltLog, list[LoopRun]]:
    """In this (fresh) process: build the big log once, then per repetition clean a copy of it."""
    tmp = Path(tempfile.mkdtemp(prefix="strom-cleaner-bench-"))
    try:
        template, built = build_log(tmp / "template-0", scenario, batch_records)
        template.close()
        runs = []
        for n in range(repeat):
            big = open_copy(tmp / "template-0", tmp / f"big-{n}", scenario)
            probe = UnifiedLog.open(tmp / f"probe-{n}", LogConfig())
            cleaner = LogCleaner(CleanerConfig(dedupe_buffer_size=dedupe_buffer))
            gc.collect()
            with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
                runs.append(runner.run(tick_during_round(big, probe, cleaner, idle_seconds, tick_ms / 1000)))
            big.close()
            probe.close()
            shutil.rmtree(tmp / f"big-{n}")
        return built, runs
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def in_fresh_process(function: Callable[..., T], *args: object) -> T:
    """Runs `function` in a new interpreter, so one scenario's memory does not carry into the next."""
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(function, *args).result()


# --- reporting -----------------------------------------------------------------------------------


def mib(nbytes: float) -> str:
    return fmt(nbytes / MIB, 1)


def pressure_text(share: float | None) -> str:
    return "n/a" if share is None else f"{share:.0%}"


def throughput_table(results: list[ThroughputResult], failures: dict[Scenario, str]) -> list[str]:
    lines = [
        "| scenario | records | keys present | MiB before -> after | records removed | round (s) | "
        "CPU (s) | MiB/s | records/s | rounds (s), each repetition | CPU pressure | map covered | "
        "peak RSS growth (MiB) | map estimate (MiB) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        growth = mib(r.rss_growth_kib * 1024) if r.rss_growth_kib is not None else "n/a"
        lines.append(
            f"| {r.scenario.label} | {r.built.records:,} | {r.built.distinct_keys:,} | "
            f"{mib(r.built.size_bytes)} -> {mib(r.size_after)} | {r.records_removed:,} | "
            f"{r.seconds:.2f} | {r.cpu_seconds:.2f} | {r.mib_per_second:.1f} | "
            f"{r.records_per_second:,.0f} | {' / '.join(f'{x.seconds:.2f}' for x in r.rounds)} | "
            f"{' / '.join(pressure_text(x.cpu_pressure) for x in r.rounds)} | {r.covered:.0%} | "
            f"{growth} | {mib(r.map_estimate_bytes)} |"
        )
    for scenario, failure in failures.items():
        lines.append(f"| {scenario.label} | failed: {failure} |" + " |" * 13)
    return lines


def loop_stats(samples: list[float]) -> tuple[float, float, float]:
    return percentile(samples, 50), percentile(samples, 99), max(samples, default=float("nan"))


def loop_table(
    loop_results: dict[Scenario, tuple[BuiltLog, list[LoopRun]]], failures: dict[Scenario, str]
) -> list[str]:
    lines = [
        "| big log | phase | length (s) | ticks | tick p50 (ms) | tick p99 (ms) | tick max (ms) | "
        "tick max per repetition (ms) | slowest append + read (ms) | CPU pressure |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for scenario, (_, runs) in loop_results.items():
        for name in ("idle", "cleaning"):
            phases: list[Phase] = [getattr(run, name) for run in runs]
            # Each figure is the median over the repetitions.
            p50, p99, worst = (
                statistics.median(column)
                for column in zip(*(loop_stats(p.latency_ms) for p in phases), strict=True)
            )
            seconds = statistics.median(p.seconds for p in phases)
            ticks = statistics.median(len(p.latency_ms) for p in phases)
            work = statistics.median(max(p.work_ms, default=float("nan")) for p in phases)
            per_run = " / ".join(fmt(loop_stats(p.latency_ms)[2], 1) for p in phases)
            pressure = " / ".join(pressure_text(p.cpu_pressure) for p in phases)
            lines.append(
                f"| {scenario.label} | {name} | {seconds:.2f} | {ticks:,.0f} | {fmt(p50, 2)} | "
                f"{fmt(p99, 2)} | {fmt(worst, 2)} | {per_run} | {fmt(work, 2)} | {pressure} |"
            )
    for scenario, failure in failures.items():
        lines.append(f"| {scenario.label} | failed: {failure} |" + " |" * 9)
    return lines


def strom_revision() -> str:
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True, cwd=REPO
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "src/strom"],
            capture_output=True,
            text=True,
            check=True,
            cwd=REPO,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + (" with uncommitted changes under src/strom" if dirty else "")


def render(
    args: argparse.Namespace,
    throughput: list[ThroughputResult],
    throughput_failures: dict[Scenario, str],
    loop_results: dict[Scenario, tuple[BuiltLog, list[LoopRun]]],
    loop_failures: dict[Scenario, str],
    started: datetime.datetime,
    machine: list[str],
    duration: float,
) -> str:
    lines = [
        CLEANER_BEGIN,
        "## Log cleaner (compaction)",
        "",
        f"Written by `bench/cleaner_bench.py --write-results` on {started:%Y-%m-%d %H:%M} UTC "
        f"(run took {duration / 60:.1f} min; Strom {strom_revision()}; "
        f"uvloop {importlib.metadata.version('uvloop')}). How to read the numbers: bench/README.md.",
        *machine,
        "",
        "Each log is built with the storage API in a temporary directory (no broker): "
        f"`cleanup.policy=compact`, `segment.bytes` = size / {SEGMENTS} unless the scenario names a "
        "segment size, other settings Kafka's defaults (`min.cleanable.dirty.ratio` 0.5; a "
        f"never-cleaned log is 100% dirty); batches of {args.batch_records} records whose keys "
        "(`key-NNN`, 8-11 B) are drawn uniformly at random from K keys and whose values are text-like "
        "(words from a 256-word vocabulary) of the scenario's record size. The log is rolled so that "
        "every segment is closed and its files are fsynced (as a broker's old segments are written "
        "back); the round then reads them from the page cache, and its time includes the fsync of "
        "the cleaned segments and the deletion of the replaced ones. "
        f"`log.cleaner.dedupe.buffer.size` = {args.dedupe_buffer_mib:g} MiB.",
    ]
    if throughput or throughput_failures:
        lines += [
            "",
            "### Cleaning throughput",
            "",
            "One scenario per fresh process, which builds the log once and then runs "
            f"{args.repeat} first rounds, each on a fresh, fsynced copy: `LogCleaner.clean_log`, the "
            "whole round in the calling thread, timed by the wall clock; CPU is the process's CPU time "
            "over the round. Round, CPU, MiB/s and records/s are medians over the repetitions; MiB/s "
            "and records/s are the log's size and records before the round (times the map's coverage) "
            "divided by the round's time. CPU pressure: as below, per repetition. Peak RSS growth, "
            "first repetition only: the peak is reset to the current RSS "
            "(`echo 5 > /proc/self/clear_refs`) just before the round; reported is VmHWM after it minus "
            "VmRSS before it (`/proc/self/status`). Map estimate: keys present x (key length + "
            f"{MAP_ENTRY_OVERHEAD} B), what the cleaner counts against the dedupe buffer. Map covered: "
            "the share of the log's offsets the round's offset map reached (below 100% when the dedupe "
            "buffer fills; the next round goes on from there). Every round is checked to keep exactly "
            "one record per key present.",
            "",
            *throughput_table(throughput, throughput_failures),
        ]
    if loop_results or loop_failures:
        loop_built = [
            f"{s.label}: {b.records:,} records in {b.segments} segments" for s, (b, _) in loop_results.items()
        ]
        lines += [
            "",
            "### Event-loop impact",
            "",
            "On a uvloop event loop, a ticker appends a one-record batch (100 B value) to a second, "
            f"uncompacted log and reads it back with `UnifiedLog.read`, every {args.tick_ms:g} ms on a fixed "
            "schedule. A tick's latency is from its scheduled time to the end of its read (a stall "
            "delays every tick scheduled during it); the slowest append + read is the longest a tick "
            "took from waking up to the end of its read (time the loop thread waits for the GIL inside "
            f"them counts). The ticker runs {WARMUP_S:g} s uncounted, then "
            f"{args.idle_seconds:g} s idle (nothing else running), then during cleaning: while "
            "`await LogCleaner.clean_logs([big log])` runs a first round (reads, offset map and writes "
            "on a worker thread of the loop's default executor, segment swaps on the loop). "
            f"{args.repeat} repetitions, each on a fresh, fsynced copy of the big log; the table shows "
            "the median of each figure over them, except the per-repetition columns. CPU pressure: the "
            "share of the phase during which some task on the machine waited for a CPU "
            "(`/proc/pressure/cpu`); the ticker and the cleaner's worker need both cores, so other work "
            "on the machine shows up there. Big logs: " + "; ".join(loop_built) + ".",
            "",
            *loop_table(loop_results, loop_failures),
        ]
    lines.append(CLEANER_END)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--scenario",
        action="append",
        type=Scenario.parse,
        help="throughput scenario SIZE:KEYS:CODEC:MIB (repeatable; replaces the defaults "
        f"{', '.join(s.spec for s in DEFAULT_SCENARIOS)})",
    )
    parser.add_argument(
        "--loop-scenario",
        action="append",
        type=Scenario.parse,
        help="big log for the event-loop test, SIZE:KEYS:CODEC:MIB (repeatable; default "
        f"{', '.join(s.spec for s in DEFAULT_LOOP_SCENARIOS)})",
    )
    parser.add_argument("--scale", type=float, default=1.0, help="multiply every scenario's size")
    parser.add_argument("--batch-records", type=int, default=100, help="records per appended batch")
    parser.add_argument(
        "--dedupe-buffer-mib", type=float, default=128, help="log.cleaner.dedupe.buffer.size in MiB"
    )
    parser.add_argument("--repeat", type=int, default=3, help="rounds per scenario, each on a fresh copy")
    parser.add_argument("--tick-ms", type=float, default=1.0, help="event-loop ticker period")
    parser.add_argument(
        "--idle-seconds", type=float, default=1.0, help="ticker baseline before the round starts"
    )
    parser.add_argument("--skip-throughput", action="store_true")
    parser.add_argument("--skip-loop", action="store_true")
    parser.add_argument(
        "--write-results", action="store_true", help=f"replace or append the section in {RESULTS}"
    )
    args = parser.parse_args(argv)
    if args.scale <= 0 or args.batch_records < 1 or args.repeat < 1 or args.tick_ms <= 0:
        parser.error("--scale, --batch-records, --repeat and --tick-ms must be positive")
    scenarios = [s.scaled(args.scale) for s in args.scenario or DEFAULT_SCENARIOS]
    loop_scenarios = [s.scaled(args.scale) for s in args.loop_scenario or DEFAULT_LOOP_SCENARIOS]
    dedupe_buffer = int(args.dedupe_buffer_mib * MIB)

    started = datetime.datetime.now(datetime.UTC)
    machine = benchlib.machine_description()
    for line in machine:
        log(line)
    clock = time.monotonic()

    throughput: list[ThroughputResult] = []
    throughput_failures: dict[Scenario, str] = {}
    for scenario in [] if args.skip_throughput else scenarios:
        log(f"throughput: {scenario.label}")
        try:
            result = in_fresh_process(
                run_throughput, scenario, args.batch_records, dedupe_buffer, args.repeat
            )
        except BenchError as exc:
            log(f"    FAILED: {exc}")
            throughput_failures[scenario] = str(exc)
            continue
        throughput.append(result)
        growth = f"{result.rss_growth_kib / 1024:.1f} MiB" if result.rss_growth_kib is not None else "n/a"
        rounds = ", ".join(
            f"{r.seconds:.2f} s (CPU pressure {pressure_text(r.cpu_pressure)})" for r in result.rounds
        )
        log(
            f"    built {result.built.records:,} records, {result.built.segments} segments in "
            f"{result.built.seconds:.1f} s; rounds {rounds}; median {result.mib_per_second:.1f} MiB/s, "
            f"{result.records_per_second:,.0f} records/s; {mib(result.built.size_bytes)} -> "
            f"{mib(result.size_after)} MiB, peak RSS +{growth}"
        )

    loop_results: dict[Scenario, tuple[BuiltLog, list[LoopRun]]] = {}
    loop_failures: dict[Scenario, str] = {}
    for scenario in [] if args.skip_loop else loop_scenarios:
        log(f"event loop: {scenario.label}, {args.repeat} repetitions")
        try:
            built, runs = in_fresh_process(
                run_loop_impact,
                scenario,
                args.batch_records,
                dedupe_buffer,
                args.repeat,
                args.idle_seconds,
                args.tick_ms,
            )
        except BenchError as exc:
            log(f"    FAILED: {exc}")
            loop_failures[scenario] = str(exc)
            continue
        loop_results[scenario] = built, runs
        for n, run in enumerate(runs, 1):
            idle, cleaning = loop_stats(run.idle.latency_ms), loop_stats(run.cleaning.latency_ms)
            log(
                f"    [{n}] ticks p50/p99/max idle {'/'.join(fmt(x, 2) for x in idle)} ms, "
                f"cleaning {'/'.join(fmt(x, 2) for x in cleaning)} ms; round {run.cleaning.seconds:.2f} s, "
                f"slowest append + read {fmt(max(run.cleaning.work_ms), 2)} ms, "
                f"CPU pressure {pressure_text(run.cleaning.cpu_pressure)}"
            )
    duration = time.monotonic() - clock

    section = render(
        args, throughput, throughput_failures, loop_results, loop_failures, started, machine, duration
    )
    log("")
    log(section)
    if args.write_results:
        benchlib.write_section("cleaner", section)
        log(f"wrote {RESULTS.relative_to(REPO)}")
    return 1 if throughput_failures or loop_failures else 0


if __name__ == "__main__":
    os.chdir(REPO)
    sys.exit(main())
