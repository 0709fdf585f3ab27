"""Web-server access logs for the weblog demo, produced to a Strom topic.

Each line is Apache's combined log format followed by the request's service time in
microseconds (``LogFormat "%h %l %u %t \\"%r\\" %>s %b \\"%{Referer}i\\" \\"%{User-agent}i\\" %D"``)::

    81.2.69.160 - - [01/May/2024:12:00:03 +0000] "GET /index.html HTTP/1.1" 200 7421 "https://www.google.com/" "Mozilla/5.0 (...)" 183042

Traffic is a stream of visits: people load a page and then its assets (returning visitors get
``304 Not Modified``), crawlers fetch pages and robots.txt, scanners probe for WordPress, an
uptime monitor sends ``HEAD /index.html`` every 30 seconds. Page load times are log-normal with a
slow tail, drift slowly, and now and then an incident makes the backend slower for a few minutes.
As a server writes them, lines come out in the order requests complete while ``%t`` is when the
request arrived, so event time is slightly out of order (by at most ``MAX_LOAD_SECONDS``).

Everything is a function of ``--seed`` and ``--start``. A finite log ends with one more page load
of index.html ``CLOSING_GAP_SECONDS`` after the last window: it moves a streaming query's
watermark past every real minute, so an append-mode aggregation emits them all.

    python examples/weblog/generator.py --minutes 5 --rate 20            # 5 minutes of traffic, at once
    python examples/weblog/generator.py --realtime --history 10 --minutes 0   # 10 minutes back, then live
"""

from __future__ import annotations

import argparse
import datetime
import heapq
import math
import random
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

TOPIC = "weblog.access_log"
SITE = "https://www.example.com"
MAX_LOAD_SECONDS = 10.0  # the server's timeout: no request takes longer
# The closing event comes this long after the last window ends: past any watermark delay up to it.
CLOSING_GAP_SECONDS = 120
WINDOW_SECONDS = 60

_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")

_BROWSERS = (
    (
        0.34,
        "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) "
        "Chrome/124.0.0.0 Safari/537.36",
    ),
    (
        0.18,
        "Mozilla/5.0 (iPhone; CPU iPhone OS 17_4_1 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) "
        "Version/17.4.1 Mobile/15E148 Safari/604.1",
    ),
    (
        0.14,
        "Mozilla/5.0 (Macintosh; Intel Mac OS X 10_15_7) AppleWebKit/605.1.15 (KHTML, like Gecko) "
        "Version/17.4 Safari/605.1.15",
    ),
    (
        0.12,
        "Mozilla/5.0 (Linux; Android 14; Pixel 8) AppleWebKit/537.36 (KHTML, like Gecko) "
        "Chrome/124.0.6367.82 Mobile Safari/537.36",
    ),
    (0.10, "Mozilla/5.0 (X11; Linux x86_64; rv:125.0) Gecko/20100101 Firefox/125.0"),
    (
        0.08,
        "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) "
        "Chrome/124.0.0.0 Safari/537.36 Edg/124.0.2478.67",
    ),
    (0.04, "curl/8.5.0"),
)
_CRAWLERS = (
    ("66.249.66.", "Mozilla/5.0 (compatible; Googlebot/2.1; +http://www.google.com/bot.html)"),
    ("40.77.167.", "Mozilla/5.0 (compatible; bingbot/2.0; +http://www.bing.com/bingbot.htm)"),
    ("5.255.253.", "Mozilla/5.0 (compatible; YandexBot/3.0; +http://yandex.com/bots)"),
)
_SCANNER_AGENT = "Mozilla/5.0 (Windows NT 6.1; WOW64; rv:34.0) Gecko/20100101 Firefox/34.0"
_MONITOR = ("216.144.250.150", "Mozilla/5.0+(compatible; UptimeRobot/2.0; http://www.uptimerobot.com/)")
_EXTERNAL_REFERERS = (
    (0.40, "-"),
    (0.30, "https://www.google.com/"),
    (0.08, "https://duckduckgo.com/"),
    (0.07, "https://www.bing.com/"),
    (0.06, "https://news.ycombinator.com/"),
    (0.05, "https://t.co/"),
    (0.04, "https://www.reddit.com/"),
)
_FIRST_OCTETS = (24, 31, 37, 45, 62, 73, 77, 81, 86, 92, 98, 104, 109, 151, 176, 185, 188, 203, 212, 217)
_USERS = ("alice", "bob", "carol", "dave", "erin", "frank", "grace", "heidi")

# (path, weight, median service time in ms, size in bytes, 0 = dynamic)
_PAGES = (
    ("/index.html", 0.50, 180.0, 0),
    ("/about.html", 0.08, 60.0, 5120),
    ("/pricing.html", 0.10, 110.0, 0),
    ("/contact.html", 0.05, 55.0, 3980),
    ("/blog/index.html", 0.10, 140.0, 0),
    ("/blog/2024/04/streaming-logs.html", 0.07, 90.0, 18311),
    ("/blog/2024/03/exactly-once.html", 0.05, 90.0, 22690),
    ("/products/42.html", 0.09, 160.0, 0),
    ("/products/1337.html", 0.08, 160.0, 0),
)
_ASSETS = (
    ("/css/site.css", 24511),
    ("/js/app.js", 87340),
    ("/img/logo.svg", 3302),
    ("/img/hero.jpg", 182447),
    ("/favicon.ico", 1150),
)
_INDEX_QUERIES = ("", "", "", "", "", "?utm_source=newsletter", "?ref=producthunt", "?lang=de")


def _choice(rng: random.Random, weighted: tuple[tuple[float, str], ...]) -> str:
    point = rng.random() * sum(w for w, _ in weighted)
    for weight, value in weighted:
        point -= weight
        if point < 0:
            return value
    return weighted[-1][1]


@dataclass(frozen=True)
class Client:
    ip: str
    agent: str
    user: str = "-"
    returning: bool = False  # has the assets cached: they come back 304


@dataclass(order=True)
class _Pending:
    """A request waiting in the order-of-completion heap."""

    completed: float
    sequence: int
    line: str = field(compare=False)


def format_time(seconds: float) -> str:
    """Apache's ``%t``: ``[01/May/2024:12:00:03 +0000]`` (UTC)."""
    moment = datetime.datetime.fromtimestamp(int(seconds), datetime.UTC)
    return (
        f"[{moment.day:02d}/{_MONTHS[moment.month - 1]}/{moment.year}:"
        f"{moment.hour:02d}:{moment.minute:02d}:{moment.second:02d} +0000]"
    )


def format_line(
    client: Client,
    at: float,
    method: str,
    path: str,
    status: int,
    size: int,
    referer: str,
    micros: int,
    *,
    protocol: str = "HTTP/1.1",
    user: str | None = None,
) -> str:
    body = "-" if size == 0 else str(size)
    return (
        f'{client.ip} - {user or client.user} {format_time(at)} "{method} {path} {protocol}" {status} {body} '
        f'"{referer}" "{client.agent}" {micros}'
    )


class AccessLog:
    """An endless, deterministic stream of log lines in order of completion."""

    def __init__(self, seed: int, start: float, rate: float) -> None:
        if rate <= 0:
            raise ValueError("rate must be > 0 requests per second")
        self.seed = seed
        self.start = start
        self.rate = rate
        self._rng = random.Random(seed)
        self._clients = [self._new_client() for _ in range(400)]
        self._sequence = 0

    def _new_client(self) -> Client:
        rng = self._rng
        ip = f"{rng.choice(_FIRST_OCTETS)}.{rng.randrange(256)}.{rng.randrange(256)}.{rng.randrange(1, 255)}"
        return Client(ip, _choice(rng, _BROWSERS), returning=rng.random() < 0.35)

    def slowdown(self, at: float) -> float:
        """How much slower than usual the backend is at a moment: a slow drift over 15 minutes,
        times an incident factor for minutes an incident covers (each minute starts one with
        probability 0.06, lasting 1-3 minutes, 2-4 times slower)."""
        drift = 1.0 + 0.3 * math.sin(2 * math.pi * (at - self.start) / 900.0)
        minute = int(at // 60)
        factor = 1.0
        for begun in range(minute - 2, minute + 1):
            incident = random.Random(self.seed * 1_000_003 + begun)
            if incident.random() < 0.06 and minute - begun < incident.randint(1, 3):
                factor = max(factor, incident.uniform(2.0, 4.0))
        return drift * factor

    def _service_micros(self, median_ms: float, sigma: float, slow_tail: float, at: float) -> int:
        rng = self._rng
        seconds = median_ms / 1000.0 * math.exp(rng.gauss(0.0, sigma)) * self.slowdown(at)
        if rng.random() < slow_tail:
            seconds *= rng.uniform(3.0, 15.0)
        return max(150, int(min(seconds, MAX_LOAD_SECONDS) * 1_000_000))

    def page_load(self, client: Client, at: float, referer: str) -> tuple[float, str]:
        """``GET /index.html``: the request the demo measures. Returns (completion, line)."""
        rng = self._rng
        path = "/index.html" + rng.choice(_INDEX_QUERIES)
        roll = rng.random()
        if roll < 0.006:
            status, size, micros = 500, 531, self._service_micros(900.0, 0.6, 0.2, at)
        elif roll < 0.03 and client.returning:
            status, size, micros = 304, 0, self._service_micros(40.0, 0.5, 0.0, at)
        else:
            status, size = 200, rng.randint(6800, 9400)
            micros = self._service_micros(180.0, 0.45, 0.03, at)
        protocol = "HTTP/2.0" if rng.random() < 0.55 else "HTTP/1.1"
        line = format_line(client, at, "GET", path, status, size, referer, micros, protocol=protocol)
        return at + micros / 1e6, line

    def _visit(self, at: float) -> list[tuple[float, str]]:
        """The requests of one visit that arrives at ``at``, each as (completion, line)."""
        rng = self._rng
        kind = rng.random()
        if kind < 0.07:
            prefix, agent = rng.choice(_CRAWLERS)
            crawler = Client(prefix + str(rng.randrange(1, 255)), agent)
            path, _, median, size = rng.choice(_PAGES)
            requests = [("GET", "/robots.txt", 200, 68, 0.4)] if rng.random() < 0.3 else []
            requests.append(("GET", path, 200, size or rng.randint(6000, 21000), median))
            return self._sequential(crawler, at, requests, "-")
        if kind < 0.10:
            scanner = Client(
                f"{rng.choice((45, 185, 193))}.{rng.randrange(256)}.{rng.randrange(256)}.{rng.randrange(1, 255)}",
                _SCANNER_AGENT,
            )
            probes = [("GET", "/wp-login.php", 404, 196, 1.2), ("POST", "/xmlrpc.php", 404, 196, 1.1)]
            if rng.random() < 0.5:
                probes.append(("GET", "/.env", 404, 196, 0.9))
            return self._sequential(scanner, at, probes, "-")
        client = rng.choice(self._clients)
        if rng.random() < 0.02:  # a visitor is replaced by a new one now and then
            client = self._clients[rng.randrange(len(self._clients))] = self._new_client()
        page = _PAGES[int(_choice(rng, tuple((p[1], str(i)) for i, p in enumerate(_PAGES))))]
        referer = _choice(rng, _EXTERNAL_REFERERS)
        out: list[tuple[float, str]] = []
        if page[0] == "/index.html":
            done, line = self.page_load(client, at, referer)
        else:
            micros = self._service_micros(page[2], 0.5, 0.02, at)
            size = page[3] or rng.randint(7000, 16000)
            done = at + micros / 1e6
            line = format_line(client, at, "GET", page[0], 200, size, referer, micros)
        out.append((done, line))
        # The browser asks for the assets once the page arrived, a few at a time.
        page_url = SITE + page[0]
        for path, size in _ASSETS:
            asked = done + rng.uniform(0.01, 0.25)
            if client.returning and rng.random() < 0.85:
                status, body, micros = 304, 0, self._service_micros(0.8, 0.4, 0.0, asked)
            else:
                status, body = 200, size
                micros = self._service_micros(1.5 + size / 40_000, 0.6, 0.01, asked)
            out.append(
                (
                    asked + micros / 1e6,
                    format_line(client, asked, "GET", path, status, body, page_url, micros),
                )
            )
        roll = rng.random()
        if roll < 0.08:  # a search, answered by the API
            asked = done + rng.uniform(2.0, 20.0)
            micros = self._service_micros(45.0, 0.7, 0.02, asked)
            term = rng.choice(("kafka", "spark", "pricing", "logs", "retention"))
            out.append(
                (
                    asked + micros / 1e6,
                    format_line(
                        client,
                        asked,
                        "GET",
                        f"/api/search?q={term}",
                        200,
                        rng.randint(300, 4000),
                        page_url,
                        micros,
                    ),
                )
            )
        elif roll < 0.12:  # a sign-in
            asked = done + rng.uniform(5.0, 30.0)
            user = rng.choice(_USERS)
            micros = self._service_micros(240.0, 0.4, 0.02, asked)
            out.append(
                (asked + micros / 1e6, format_line(client, asked, "POST", "/login", 302, 0, page_url, micros))
            )
            asked += micros / 1e6 + 0.05
            micros = self._service_micros(130.0, 0.5, 0.02, asked)
            out.append(
                (
                    asked + micros / 1e6,
                    format_line(
                        client,
                        asked,
                        "GET",
                        "/account.html",
                        200,
                        rng.randint(4000, 6000),
                        SITE + "/login",
                        micros,
                        user=user,
                    ),
                )
            )
        return out

    def _sequential(
        self, client: Client, at: float, requests: list[tuple[str, str, int, int, float]], referer: str
    ) -> list[tuple[float, str]]:
        out: list[tuple[float, str]] = []
        for method, path, status, size, median in requests:
            micros = self._service_micros(median, 0.5, 0.0, at)
            out.append(
                (at + micros / 1e6, format_line(client, at, method, path, status, size, referer, micros))
            )
            at += micros / 1e6 + self._rng.uniform(0.2, 2.0)
        return out

    def __iter__(self) -> Iterator[tuple[float, str]]:
        """(completion time, line) in order of completion, forever."""
        pending: list[_Pending] = []
        lines_per_visit = 5.7  # measured mean of _visit's output; sets the visit rate from the line rate
        at = self.start
        next_monitor = self.start + 30.0 - (self.start % 30.0)
        while True:
            at += self._rng.expovariate(self.rate / lines_per_visit)
            while next_monitor <= at:
                micros = self._service_micros(150.0, 0.3, 0.0, next_monitor)
                monitor = Client(*_MONITOR)
                line = format_line(monitor, next_monitor, "HEAD", "/index.html", 200, 0, "-", micros)
                self._push(pending, next_monitor + micros / 1e6, line)
                next_monitor += 30.0
            for completed, line in self._visit(at):
                self._push(pending, completed, line)
            # A request arriving later completes later than `at`: what completed before is final.
            while pending and pending[0].completed <= at:
                item = heapq.heappop(pending)
                yield item.completed, item.line

    def _push(self, pending: list[_Pending], completed: float, line: str) -> None:
        self._sequence += 1
        heapq.heappush(pending, _Pending(completed, self._sequence, line))

    def closing_event(self, last_request: float, after: float) -> tuple[float, str]:
        """A page load of index.html ``CLOSING_GAP_SECONDS`` after the window holding
        ``last_request`` ends, completing no earlier than ``after``."""
        window_end = (math.floor(last_request / WINDOW_SECONDS) + 1) * WINDOW_SECONDS
        at = max(float(window_end + CLOSING_GAP_SECONDS), math.ceil(after))
        client = self._clients[0]
        return self.page_load(client, at, "-")


def request_time(line: str) -> float:
    """The ``%t`` of a line, in seconds since the epoch."""
    stamp = line[line.index("[") + 1 : line.index("]")]
    return datetime.datetime.strptime(stamp, "%d/%b/%Y:%H:%M:%S %z").timestamp()


def generate_lines(
    *, seed: int = 1, start: float, minutes: float = 5.0, rate: float = 20.0, count: int | None = None
) -> list[str]:
    """A finite log: the lines of requests arriving in the first ``minutes`` (at most ``count``
    of them), in order of completion, then the closing page load."""
    log = AccessLog(seed, start, rate)
    end = start + minutes * 60.0
    lines: list[str] = []
    last_request = last_completed = start
    for completed, line in log:
        arrived = request_time(line)
        if arrived >= end or (count is not None and len(lines) >= count):
            break
        lines.append(line)
        last_request, last_completed = max(last_request, arrived), completed
    lines.append(log.closing_event(last_request, last_completed)[1])
    return lines


def produce(
    bootstrap: str,
    topic: str,
    *,
    seed: int,
    start: float,
    minutes: float,
    rate: float,
    count: int | None,
    realtime: bool,
) -> int:
    """Produce the log to ``topic``; with ``realtime``, each line no earlier than its completion
    time (a start in the past sends that history at once). ``minutes`` 0 runs until interrupted.
    Returns the number of lines sent."""
    from strom.client import Producer

    sent = 0
    with Producer({"bootstrap.servers": bootstrap, "linger.ms": 20}) as producer:

        def send(line: str) -> None:
            nonlocal sent
            # Keyed by client address: one client's requests stay in order in one partition.
            producer.send(topic, line.encode(), key=line.split(" ", 1)[0].encode())
            sent += 1

        if not realtime:
            for line in generate_lines(seed=seed, start=start, minutes=minutes, rate=rate, count=count):
                send(line)
            return sent
        log = AccessLog(seed, start, rate)
        end = start + minutes * 60.0 if minutes > 0 else math.inf
        last_request = last_completed = start
        for completed, line in log:
            arrived = request_time(line)
            if arrived >= end or (count is not None and sent >= count):
                break
            wait = completed - time.time()
            if wait > 0:
                producer.flush()
                time.sleep(wait)
            send(line)
            last_request, last_completed = max(last_request, arrived), completed
        closing_at, closing = log.closing_event(last_request, last_completed)
        time.sleep(max(0.0, closing_at - time.time()))
        send(closing)
    return sent


def _start(text: str) -> float:
    moment = datetime.datetime.fromisoformat(text)
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.UTC)
    return moment.timestamp()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Produce web-server access logs to a Strom topic.")
    parser.add_argument("--bootstrap-server", default="127.0.0.1:9092", metavar="HOST:PORT")
    parser.add_argument("--topic", default=TOPIC)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--start", type=_start, help="event time of the first request, ISO-8601 (default: now)"
    )
    parser.add_argument(
        "--history", type=float, default=0.0, metavar="MINUTES", help="start this many minutes before now"
    )
    parser.add_argument(
        "--minutes",
        type=float,
        default=5.0,
        help="minutes of event time (0: until interrupted, with --realtime)",
    )
    parser.add_argument("--rate", type=float, default=20.0, help="requests per second of event time")
    parser.add_argument("--count", type=int, help="stop after this many lines")
    parser.add_argument("--realtime", action="store_true", help="send each line when its request completes")
    parser.add_argument("--print", action="store_true", help="print the lines instead of producing them")
    args = parser.parse_args(argv)
    if args.minutes <= 0 and not args.realtime:
        parser.error("--minutes 0 (run until interrupted) needs --realtime")
    start = args.start if args.start is not None else time.time() - args.history * 60.0
    if args.print:
        lines = generate_lines(
            seed=args.seed, start=start, minutes=args.minutes, rate=args.rate, count=args.count
        )
        sys.stdout.write("\n".join(lines) + "\n")
        return 0
    try:
        sent = produce(
            args.bootstrap_server,
            args.topic,
            seed=args.seed,
            start=start,
            minutes=args.minutes,
            rate=args.rate,
            count=args.count,
            realtime=args.realtime,
        )
    except KeyboardInterrupt:
        return 130
    print(f"{sent} lines produced to {args.topic}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
