"""The LogValidator's cost: the record scanner alone, and UnifiedLog.append_as_leader with it, on 1 MiB batches.

Rates are records per CPU-second of this process (time.process_time), so other work on the
machine moves them less than wall-clock rates; each is the best of --repeat runs. Prints only.

    .venv/bin/python bench/validator_bench.py
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from strom.records import scanner
from strom.records.batch import CompressionType, read_header
from strom.records.builder import RecordBatchBuilder
from strom.storage.log_config import LogConfig
from strom.storage.unified_log import UnifiedLog

BATCH_BYTES = 1 << 20


def batch_of(size: int, codec: int) -> bytes:
    """A producer's 1 MiB batch of ``size``-byte values (text-like, so codecs compress ~3x)."""
    builder = RecordBatchBuilder(BATCH_BYTES)
    now = time.time_ns() // 1_000_000
    words = b"lorem ipsum dolor sit amet consectetur adipiscing elit sed do eiusmod tempor "
    value = (words * (size // len(words) + 1))[:size]
    while builder.try_append(now, None, value, None):
        pass
    return bytes(builder.build(compression=codec))


def scan_rate(size: int, seconds: float) -> float:
    batch = batch_of(size, CompressionType.NONE)
    header = read_header(batch)
    runs = 0
    started = time.process_time()
    while time.process_time() - started < seconds:
        scanner.validate(batch, 61, len(batch), header, 0, 1 << 62, True, False)
        runs += 1
    return runs * header.records_count / (time.process_time() - started)


def append_rate(size: int, codec: int, seconds: float) -> float:
    batch = batch_of(size, codec)
    count = read_header(batch).records_count
    with tempfile.TemporaryDirectory() as tmp:
        log = UnifiedLog.open(Path(tmp) / "bench-0", LogConfig(segment_bytes=1 << 30))
        appends = 0
        started = time.process_time()
        while time.process_time() - started < seconds:
            log.append_as_leader(bytearray(batch), 0)
            appends += 1
        rate = appends * count / (time.process_time() - started)
        log.close()
    return rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=1.5)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    print("| record size | scanner.validate (M records/CPU-s) | append, uncompressed | append, lz4 |")
    print("|---:|---:|---:|---:|")
    for size in (100, 1024):
        scan = max(scan_rate(size, args.seconds) for _ in range(args.repeat))
        plain = max(append_rate(size, CompressionType.NONE, args.seconds) for _ in range(args.repeat))
        lz4 = max(append_rate(size, CompressionType.LZ4, args.seconds) for _ in range(args.repeat))
        print(f"| {size} B | {scan / 1e6:.1f} | {plain / 1e6:.2f} | {lz4 / 1e6:.2f} |")


if __name__ == "__main__":
    main()
