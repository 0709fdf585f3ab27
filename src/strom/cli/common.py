"""What the ``strom`` client commands share: connection options, client configs, argument
parsers for timestamps, durations and partitions, and plain-text tables."""

from __future__ import annotations

import argparse
import datetime
import re
import sys
import textwrap
from collections.abc import Iterable, Mapping, Sequence
from decimal import Decimal
from pathlib import Path
from typing import Any, NoReturn

from strom.client.admin import AdminClient
from strom.client.config import ADMIN, ConfigKey

DEFAULT_BOOTSTRAP = "127.0.0.1:9092"
# A command-line tool should give up within seconds, not after the Java client's minute,
# when no broker answers; --property / --command-config override these.
CLI_TIMEOUTS = {"default.api.timeout.ms": "15000", "max.block.ms": "15000"}

Subparsers = argparse._SubParsersAction  # the type add_subparsers returns


class CliError(Exception):
    """A failure the command reports as one line on stderr, exiting with ``exit_code``."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class ArgumentParser(argparse.ArgumentParser):
    """argparse with a one-line error (no usage dump): ``strom topics create: error: ...``."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


class HelpFormatter(argparse.HelpFormatter):
    """Fills a description's paragraphs to the terminal's width, but keeps indented lines (examples)
    and short headings such as ``examples:`` as written."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        out: list[str] = []
        paragraph: list[str] = []

        def flush() -> None:
            if paragraph:
                out.append(
                    textwrap.fill(" ".join(paragraph), width, initial_indent=indent, subsequent_indent=indent)
                )
                paragraph.clear()

        for line in text.splitlines():
            heading = line.endswith(":") and len(line) < 30
            if line and not line[0].isspace() and not heading:
                paragraph.append(line.strip())
                continue
            flush()
            out.append(indent + line if line else "")
        flush()
        return "\n".join(out)


def add_parser(
    subparsers: Subparsers[ArgumentParser], name: str, help: str, description: str
) -> ArgumentParser:
    """A subcommand with a one-line ``help`` in its parent's list and a ``description`` in its own --help."""
    parser: ArgumentParser = subparsers.add_parser(
        name, help=help, description=description, formatter_class=HelpFormatter
    )
    return parser


def add_commands(parser: ArgumentParser, dest: str) -> Subparsers[ArgumentParser]:
    return parser.add_subparsers(dest=dest, required=True, metavar="COMMAND", parser_class=ArgumentParser)


def key_value(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected key=value, got {text!r}")
    return key.strip(), value.strip()


def non_negative_int(text: str) -> int:
    value = _int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}")
    return value


def positive_int(text: str) -> int:
    value = _int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}")
    return value


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None


def add_connection_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("connection")
    group.add_argument(
        "--bootstrap-server",
        default=DEFAULT_BOOTSTRAP,
        metavar="HOST:PORT[,...]",
        help=f"broker(s) to connect to first (default {DEFAULT_BOOTSTRAP})",
    )
    group.add_argument(
        "--command-config",
        type=Path,
        metavar="FILE",
        help="a properties file of client configs (Kafka's Java client names)",
    )
    group.add_argument(
        "--property",
        action="append",
        default=[],
        type=key_value,
        metavar="KEY=VALUE",
        help="a client config, overriding --command-config (repeatable); "
        "timeouts default to 15 s (default.api.timeout.ms, max.block.ms)",
    )


def read_properties(path: Path) -> dict[str, str]:
    """A Java-style properties file: ``key=value`` or ``key: value`` lines, ``#``/``!`` comments."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise CliError(f"cannot read {path}: {exc.strerror}") from exc
    properties: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line[0] in "#!":
            continue
        match = re.match(r"([^=:\s]+)\s*[=:\s]\s*(.*)", line)
        if match is None:
            raise CliError(f"{path}:{number}: expected key=value, got {line!r}")
        properties[match.group(1)] = match.group(2)
    return properties


def client_config(
    args: argparse.Namespace,
    definitions: tuple[ConfigKey, ...],
    defaults: Mapping[str, str] | None = None,
    *,
    kind: str = "client",
) -> dict[str, str]:
    """The configs for one client: command defaults, then --command-config, then --property,
    then --bootstrap-server. A key this client does not know is an error, as in Kafka's tools."""
    given: dict[str, str] = {}
    if args.command_config is not None:
        given.update(read_properties(args.command_config))
    given.update(dict(args.property))
    known = {key.name for key in definitions}
    unknown = sorted(set(given) - known)
    if unknown:
        raise CliError(f"{', '.join(unknown)}: not a config of this command's {kind}", exit_code=2)
    config = {k: v for k, v in {**CLI_TIMEOUTS, **(defaults or {})}.items() if k in known}
    config.update(given)
    config["bootstrap.servers"] = args.bootstrap_server
    return config


# -- time ------------------------------------------------------------------------------------


def parse_datetime(text: str) -> int:
    """ISO-8601 (``2024-05-01T12:00:00.000``, ``...Z``, ``...+02:00``, or a date) as ms since the
    epoch; without a zone it is UTC, as in Kafka's tools."""
    try:
        moment = datetime.datetime.fromisoformat(text.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected an ISO-8601 date-time such as 2024-05-01T12:00:00.000Z, got {text!r}"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.UTC)
    return int(moment.timestamp() * 1000)


def parse_timestamp(text: str) -> int:
    """Milliseconds since the epoch, or an ISO-8601 date-time."""
    if text.strip().lstrip("-").isdigit():
        return int(text)
    return parse_datetime(text)


_DURATION = re.compile(
    r"([-+]?)P(?:([-+]?\d+)D)?(?:T(?:([-+]?\d+)H)?(?:([-+]?\d+)M)?(?:([-+]?\d+(?:[.,]\d{1,9})?)S)?)?",
    re.IGNORECASE,
)


def parse_duration(text: str) -> int:
    """An ISO-8601 duration ``PnDTnHnMn.nS`` (as Java's Duration.parse reads it) in milliseconds."""
    match = _DURATION.fullmatch(text.strip())
    if match is None or not any(match.groups()[1:]) or text.strip().upper().endswith("T"):
        raise argparse.ArgumentTypeError(f"expected a duration such as P1DT2H30M or PT15M, got {text!r}")
    sign, days, hours, minutes, seconds = match.groups()
    total = (
        Decimal(days or 0) * 86_400
        + Decimal(hours or 0) * 3600
        + Decimal(minutes or 0) * 60
        + Decimal((seconds or "0").replace(",", "."))
    )
    ms = int(total * 1000)
    return -ms if sign == "-" else ms


def format_timestamp(ms: int) -> str:
    if ms < 0:
        return "-"
    moment = datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{ms % 1000:03d}Z"


# -- topics and partitions -------------------------------------------------------------------


def topic_partitions(text: str) -> tuple[str, list[int] | None]:
    """``topic`` (every partition) or ``topic:0,1,2``."""
    topic, sep, numbers = text.partition(":")
    if not topic:
        raise argparse.ArgumentTypeError(f"expected TOPIC or TOPIC:P[,P...], got {text!r}")
    if not sep:
        return topic, None
    try:
        partitions = [int(p) for p in numbers.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected TOPIC:P[,P...] with partition numbers, got {text!r}"
        ) from None
    if any(p < 0 for p in partitions):
        raise argparse.ArgumentTypeError(f"partition numbers are >= 0, got {text!r}")
    return topic, partitions


# -- output ----------------------------------------------------------------------------------


def print_table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
    """Left-aligned columns two spaces apart, as Kafka's tools print them."""
    cells = [[str(h) for h in headers]] + [["-" if c is None else str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    out = sys.stdout
    for row in cells:
        out.write("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() + "\n")


def write_bytes(data: bytes) -> None:
    """Raw bytes to stdout, after any text already written to it."""
    sys.stdout.flush()
    sys.stdout.buffer.write(data)


def admin_client(args: argparse.Namespace) -> AdminClient:
    return AdminClient(client_config(args, ADMIN, kind="admin client"))
