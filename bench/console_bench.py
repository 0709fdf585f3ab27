"""The console's search rate: records scanned per second by a search started through the
console's HTTP API, on one Strom broker.

confluent-kafka writes N records of 1 KiB to a one-partition topic; only the last holds the text
searched for. Two searches, each ``--rounds`` times, medians reported:

- value contains the text (the usual search): batches whose bytes lack the text are skipped
  undecoded, so this is mostly fetching;
- key contains text that every batch's values hold (the worst case): every batch passes the
  byte check, so every record is decoded and its key tested.

The rate is the search's records scanned over its own elapsed time (from the job's start to its
end, as ``GET /searches/<id>`` reports it).

    .venv/bin/python bench/console_bench.py [--records 200000] [--rounds 3] [--write-results]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import time

import httpx
from confluent_kafka import Producer

import benchlib
from benchlib import OUT, STROM, BenchError, fmt, log

SIZE = 1024
TOPIC = "console-bench"
NEEDLE = b"console-bench-needle"


def produce(bootstrap: str, records: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.size": 1_000_000})
    filler = b"f" * SIZE
    for n in range(records - 1):
        while True:
            try:
                producer.produce(TOPIC, filler, key=b"k%d" % n)
                break
            except BufferError:
                producer.poll(0.05)
    last = (NEEDLE + filler)[:SIZE]
    producer.produce(TOPIC, last, key=b"last-f")
    if producer.flush(120) != 0:
        raise BenchError("records left unsent")


def start_console(bootstrap: str) -> tuple[subprocess.Popen[bytes], str]:
    port = benchlib.free_port()
    log_file = open(OUT / f"console-{port}.log", "wb")  # noqa: SIM115 - the process writes it until stopped
    proc = subprocess.Popen(
        [str(STROM), "console", "--bootstrap-server", bootstrap, "--port", str(port)],
        stdout=log_file,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/static/console.css", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            time.sleep(0.1)
    benchlib.stop_process(proc)
    raise BenchError("the console did not start")


def search(url: str, field: str, text: str) -> dict[str, float]:
    with httpx.Client(base_url=url, timeout=30, headers={"accept": "application/json"}) as client:
        started = client.post(f"/topics/{TOPIC}/search", data={"field": field, "text": text})
        started.raise_for_status()
        job = started.json()["id"]
        while True:
            progress = client.get(f"/searches/{job}").json()
            if progress["state"] not in ("starting", "running"):
                break
            time.sleep(0.05)
    if progress["state"] != "done" or progress["matches"] != 1:
        raise BenchError(f"search ended {progress['state']} with {progress['matches']} matches: {progress}")
    return progress


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--write-results", action="store_true", help="replace its section of bench/RESULTS.md"
    )
    args = parser.parse_args()
    searches = {
        "value contains (byte check skips batches)": ("value", NEEDLE.decode()),
        # "f" is in every value, so every batch passes the byte check; only the last key has it.
        "key contains (every record decoded)": ("key", "f"),
    }
    rates: dict[str, list[float]] = {name: [] for name in searches}
    with benchlib.running_broker("strom", OUT) as broker:
        log(f"producing {args.records:,} records of {SIZE} B")
        produce(broker.bootstrap, args.records)
        proc, url = start_console(broker.bootstrap)
        try:
            for round_ in range(args.rounds):
                for name, (field, text) in searches.items():
                    progress = search(url, field, text)
                    if progress["scanned"] != args.records:
                        raise BenchError(f"scanned {progress['scanned']} of {args.records}")
                    rates[name].append(progress["scanned"] / progress["elapsed_seconds"])
                    log(f"round {round_ + 1}, {name}: {fmt(rates[name][-1], 0)} records/s")
        finally:
            benchlib.stop_process(proc)
    lines = [
        "<!-- console_bench:begin -->",
        "## Console search (`bench/console_bench.py`)",
        "",
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {args.records:,} records of 1 KiB in one "
        "partition, the only match in the last record; searches started through the console's HTTP API, "
        f"medians of {args.rounds}. " + "; ".join(benchlib.machine_description()),
        "",
        "| search | records/s | MB/s |",
        "|---|---|---|",
        *(
            f"| {name} | {fmt(statistics.median(r), 0)} | {fmt(statistics.median(r) * SIZE / 1e6)} |"
            for name, r in rates.items()
        ),
        "<!-- console_bench:end -->",
    ]
    section = "\n".join(lines)
    print(section)
    if args.write_results:
        benchlib.write_section("console_bench", section)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
