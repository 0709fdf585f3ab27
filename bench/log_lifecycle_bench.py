"""Creating and closing many partition logs in one process: the storage part of a broker's start
of 10,000 partitions and of its clean shutdown.

Creates ``--logs`` logs through ``LogManager.open_new_logs`` (as the replica manager does, in steps
of 500), appends one 1 KiB record batch to each, then times ``LogManager.shutdown`` (flush, producer
snapshots, checkpoints, clean-shutdown marker), then restarts (``load_ms``) and times the
shutdown of the now idle logs (``idle_close_ms``). Prints milliseconds and the descriptors open
under the log dir before the first close. Run it with the code to measure first on PYTHONPATH and
alternate builds for A/B numbers (the machine is shared).

    PYTHONPATH=src .venv/bin/python bench/log_lifecycle_bench.py --logs 2000 --dir /work/tmp-bench
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
import uuid
from pathlib import Path

from strom.storage import LogConfig
from strom.storage.log_manager import LogManager, NewLog

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from unit.storage.storage_batches import make_batch

STEP = 500


def fds_under(dir: Path) -> int:
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}").startswith(str(dir)):
                count += 1
        except OSError:
            continue
    return count


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--logs", type=int, default=2000)
    parser.add_argument("--dir", type=Path, required=True)
    args = parser.parse_args()
    shutil.rmtree(args.dir, ignore_errors=True)
    manager = LogManager([args.dir])
    manager.lock_log_dirs()
    manager.startup(lambda _topic: LogConfig())
    config, topic_id = LogConfig(), uuid.uuid4()
    start = time.perf_counter()
    for first in range(0, args.logs, STEP):
        specs = [
            NewLog(args.dir, "bench", p, config, topic_id, 0)
            for p in range(first, min(first + STEP, args.logs))
        ]
        manager.register_logs(manager.open_new_logs(specs))
    create_ms = (time.perf_counter() - start) * 1000
    data = make_batch(value_size=1024)
    for log_ in manager.all_logs():
        log_.append_as_leader(bytearray(data), 0)
    open_fds = fds_under(args.dir)
    start = time.perf_counter()
    manager.shutdown()
    close_ms = (time.perf_counter() - start) * 1000
    # A restart, then a shutdown of the same logs with nothing appended since (idle partitions).
    start = time.perf_counter()
    manager = LogManager([args.dir])
    manager.lock_log_dirs()
    manager.startup(lambda _topic: LogConfig())
    load_ms = (time.perf_counter() - start) * 1000
    start = time.perf_counter()
    manager.shutdown()
    idle_close_ms = (time.perf_counter() - start) * 1000
    print(
        f"logs={args.logs} create_ms={create_ms:.0f} per_log_ms={create_ms / args.logs:.2f} "
        f"close_ms={close_ms:.0f} load_ms={load_ms:.0f} idle_close_ms={idle_close_ms:.0f} "
        f"open_fds_before_close={open_fds} strom={sys.modules['strom'].__file__}"
    )
    shutil.rmtree(args.dir, ignore_errors=True)


if __name__ == "__main__":
    main()
