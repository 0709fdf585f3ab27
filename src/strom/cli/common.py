"""What the ``strom`` client commands share: connection options, client profiles and configs, the
check that the cluster answers, argument parsers for timestamps, durations and partitions (and the
``--topic``/``--group`` spellings of positional arguments), and plain-text tables."""

from __future__ import annotations

import argparse
import asyncio
import datetime
import difflib
import os
import re
import socket
import sys
import textwrap
from collections.abc import Iterable, Mapping, Sequence
from decimal import Decimal
from pathlib import Path
from typing import Any, NoReturn

from strom import __version__
from strom.client.admin import AdminClient
from strom.client.config import ADMIN, ConfigKey
from strom.network.connection import BrokerConnection, KafkaConnectionError
from strom.network.pool import Node, parse_bootstrap

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
    """argparse with a one-line error (no usage dump): ``strom topics create: error: ...``.

    After parsing, ``args.command_prog`` names the subcommand that runs (``strom groups delete``),
    so that its failures carry the same prefix as its argument errors."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Positional arguments that an option may give instead: (dest, how the error names it).
        self.required_either: list[tuple[str, str]] = []

    def error(self, message: str) -> NoReturn:
        hint = "" if "--help" in message else " (see --help)"
        self.exit(2, f"{self.prog}: error: {message}{hint}\n")

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        parsed, extras = super().parse_known_args(args, namespace)
        if extras:
            # Refused here, by the innermost parser that saw them, so that the error names that
            # command and the options it does take (argparse would refuse them at the top, as `strom`).
            self.error(f"unrecognized arguments: {' '.join(extras)}{self._suggestion(extras)}")
        for dest, names in self.required_either:
            if getattr(parsed, dest, None) in (None, []):
                self.error(f"the following arguments are required: {names}")
        # A subcommand's parser finishes before its parents: the innermost one names the command.
        if getattr(parsed, "command_prog", None) is None:
            parsed.command_prog = self.prog
        return parsed, extras

    def _suggestion(self, extras: Sequence[str]) -> str:
        """`` (did you mean --from-beginning?)`` for the first unknown option close to one taken."""
        for word in extras:
            if word.startswith("-"):
                option = word.split("=", 1)[0]
                close = difflib.get_close_matches(option, list(self._option_string_actions), n=1, cutoff=0.7)
                if close:
                    return f" (did you mean {close[0]}?)"
        return ""


class _EitherSpelling(argparse.Action):
    """A value that may be given as a positional argument or as an option (``orders`` or
    ``--topic orders``, as Kafka's tools spell it): both store into one dest. For a list both
    add to it; for a single value giving two different ones is an error."""

    def __init__(self, *args: Any, many: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.many = many

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        if values is None or values == []:
            return  # the positional was left out; the option may have given the value
        current = getattr(namespace, self.dest, None)
        if self.many:
            added = values if isinstance(values, list) else [values]
            setattr(namespace, self.dest, [*(current or []), *added])
            return
        if current is not None and current != values:
            parser.error(f"two different values for {self.metavar}: {current!r} and {values!r}")
        setattr(namespace, self.dest, values)


def add_either(
    parser: ArgumentParser,
    name: str,
    *,
    help: str,
    many: bool = False,
    required: bool = True,
    short: str | None = None,
) -> None:
    """A positional ``name`` (``many``: one or more, stored as ``names``) that ``--name`` may give
    instead, as Kafka's tools take ``--topic`` and ``--group`` (and ``short``, such as kcat's ``-t``)."""
    dest = f"{name}s" if many else name
    metavar = name.upper()
    option = f"--{name}"
    parser.add_argument(
        dest, nargs="*" if many else "?", action=_EitherSpelling, many=many, metavar=metavar, help=help
    )
    parser.add_argument(
        option,
        *([short] if short else []),
        dest=dest,
        action=_EitherSpelling,
        many=many,
        metavar=metavar,
        help=f"the same as {metavar}{' (repeatable)' if many else ''}",
    )
    if required:
        parser.required_either.append((dest, f"{metavar} (or {option})"))


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


def property_pair(text: str) -> tuple[str, str]:
    """``key=value`` of --property: the value as given, since a separator may be a space or a tab
    (client configs' values are stripped where they are read)."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected key=value, got {text!r}")
    return key.strip(), value


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


PROFILE_HELP = (
    "Without --bootstrap-server the brokers come from bootstrap.servers in --property or "
    "--command-config, else $STROM_BOOTSTRAP_SERVERS, else the client profile, else "
    f"{DEFAULT_BOOTSTRAP}. A profile is a properties file of client configs (Kafka's Java client "
    "names, e.g. bootstrap.servers=broker1:9092,broker2:9092 and client.id=me) at "
    "~/.config/strom/NAME.properties ($XDG_CONFIG_HOME/strom if set): --profile NAME or "
    "$STROM_PROFILE picks one; default.properties is used when it exists. A profile's keys that a "
    "command's client does not know are ignored."
)


def add_connection_options(parser: argparse.ArgumentParser, bootstrap_aliases: Sequence[str] = ()) -> None:
    """``bootstrap_aliases``: other spellings of --bootstrap-server, such as kcat's ``-b``."""
    group = parser.add_argument_group("connection", PROFILE_HELP)
    group.add_argument(
        "--bootstrap-server",
        *bootstrap_aliases,
        dest="bootstrap_server",
        metavar="HOST:PORT[,...]",
        help=f"broker(s) to connect to first (default: see above, finally {DEFAULT_BOOTSTRAP})",
    )
    group.add_argument("--profile", metavar="NAME", help="the client profile to use (see above)")
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
        type=property_pair,
        metavar="KEY=VALUE",
        help="a client config, overriding --command-config (repeatable); "
        "timeouts default to 15 s (default.api.timeout.ms, max.block.ms)",
    )


def profile_dir() -> Path:
    config_home = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(config_home) / "strom"


def read_profile(name: str | None) -> dict[str, str]:
    """The named profile's configs (a missing one is an error), else default.properties if it exists."""
    name = name or os.environ.get("STROM_PROFILE") or None
    path = profile_dir() / f"{name or 'default'}.properties"
    if name is None and not path.is_file():
        return {}
    if not path.is_file():
        raise CliError(f"no client profile '{name}': {path} does not exist", exit_code=2)
    return read_properties(path)


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
    formatter: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The configs for one client: command defaults, then the profile, then --command-config, then
    --property; bootstrap.servers as bootstrap_servers() finds it. A key this client does not know
    is an error in --command-config and --property, as in Kafka's tools; a profile serves every
    command, so there such keys are ignored. ``formatter``: the --property keys the command itself
    takes (print.key=true, ...), which are not the client's; the error for an unknown key names them."""
    known = {key.name for key in definitions}
    profile = read_profile(getattr(args, "profile", None))
    given = {k: v for k, v in _given(args).items() if k not in (formatter or {})}
    unknown = sorted(set(given) - known)
    if unknown:
        message = f"{', '.join(unknown)}: not a config of this command's {kind}"
        if formatter:
            message += f" nor one of its --property keys ({', '.join(formatter)})"
        close = difflib.get_close_matches(unknown[0], [*known, *(formatter or {})], n=1)
        if close:
            message += f"; did you mean {close[0]}?"
        raise CliError(message, exit_code=2)
    config = {k: v for k, v in {**CLI_TIMEOUTS, **(defaults or {})}.items() if k in known}
    config.update({k: v for k, v in profile.items() if k in known})
    config.update(given)
    config["bootstrap.servers"] = _bootstrap(args, given, profile)
    return config


def _given(args: argparse.Namespace) -> dict[str, str]:
    given: dict[str, str] = {}
    if args.command_config is not None:
        given.update(read_properties(args.command_config))
    given.update({key: value.strip() for key, value in args.property})
    return given


def _bootstrap(args: argparse.Namespace, given: Mapping[str, str], profile: Mapping[str, str]) -> str:
    for candidate in (
        args.bootstrap_server,
        given.get("bootstrap.servers"),
        os.environ.get("STROM_BOOTSTRAP_SERVERS"),
        profile.get("bootstrap.servers"),
    ):
        if candidate and candidate.strip():
            return candidate.strip()
    return DEFAULT_BOOTSTRAP


def bootstrap_servers(args: argparse.Namespace) -> str:
    """The brokers a command connects to first: --bootstrap-server, else bootstrap.servers from
    --property/--command-config, else $STROM_BOOTSTRAP_SERVERS, else the profile's, else the default."""
    return _bootstrap(args, _given(args), read_profile(getattr(args, "profile", None)))


# -- is anyone there? ------------------------------------------------------------------------

# Long enough for a loaded broker to answer ApiVersions, short enough that a typo in an address
# is reported within a few seconds, by every command alike.
PROBE_TIMEOUT = 3.0


def check_cluster(bootstrap: str, timeout: float = PROBE_TIMEOUT) -> None:
    """Raise CliError unless some bootstrap broker accepts a connection and answers ApiVersions
    within ``timeout``. Without this, each client would discover it its own way: the producer
    only after max.block.ms, blaming metadata."""
    try:
        nodes = parse_bootstrap(bootstrap)
    except ValueError as exc:
        raise CliError(str(exc), exit_code=2) from exc
    failures = asyncio.run(_probe(nodes, timeout))
    if failures is not None:
        reasons = (
            failures[nodes[0]]
            if len(nodes) == 1
            else "; ".join(f"{node.address}: {failures[node]}" for node in nodes)
        )
        raise CliError(
            f"cannot reach the cluster at {bootstrap} ({reasons}): is a broker running there? "
            "(the address comes from --bootstrap-server, $STROM_BOOTSTRAP_SERVERS or a profile: see --help)"
        )


async def _probe(nodes: list[Node], timeout: float) -> dict[Node, str] | None:
    """None once any node answers; else why each failed."""

    async def attempt(node: Node) -> None:
        connection = await BrokerConnection.open(
            node.host, node.port, client_id="strom-cli", timeout=timeout, software_version=__version__
        )
        connection.close()

    pending = {asyncio.ensure_future(attempt(node)): node for node in nodes}
    failures: dict[Node, str] = {}
    try:
        while pending:
            done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                node = pending.pop(task)
                error = task.exception()
                if error is None:
                    return None
                failures[node] = _reason(error)
    finally:
        for task in pending:
            task.cancel()
    return failures


def _reason(error: BaseException) -> str:
    cause = error.__cause__ if isinstance(error, KafkaConnectionError) else error
    if isinstance(cause, TimeoutError):
        return "no answer in time"
    if isinstance(cause, socket.gaierror):
        return f"cannot resolve the host name: {cause.strerror}"
    if isinstance(cause, OSError) and cause.errno:
        return os.strerror(cause.errno).lower()
    return f"not a Kafka broker? {cause or error}"


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
