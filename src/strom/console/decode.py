"""How the console shows a record's key or value: as UTF-8 text, pretty JSON, hex, or decoded
with a schema pasted into the page (Avro, plain binary or Confluent's wire format; JSON Schema).

``auto`` picks the first that fits: JSON, then UTF-8 text, then hex.
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass
from typing import Any

import fastavro
import jsonschema

MODES = ("auto", "utf8", "json", "hex", "avro", "jsonschema")
# Confluent's wire format: magic byte 0, a 4-byte big-endian schema id, then the Avro body.
CONFLUENT_MAGIC = 0
CONFLUENT_HEADER = 5
# A value larger than this is cut when shown (the export has the whole value).
SHOWN_BYTES = 64 * 1024


class SchemaError(ValueError):
    """A schema pasted into the page does not parse."""


@dataclass(frozen=True, slots=True)
class Decoded:
    """What the page shows: ``text``, as ``kind`` (json, text, hex, null), with a note (an
    error, a schema id, a validation failure) when there is one. ``value`` is what an export writes."""

    text: str
    kind: str
    value: Any
    note: str | None = None


NULL = Decoded("null", "null", None)


def hex_text(data: bytes) -> str:
    return "\n".join(data[i : i + 16].hex(" ") for i in range(0, len(data), 16))


def _json_text(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False, default=_jsonable)


def _jsonable(value: Any) -> Any:
    # Avro's bytes, fixed, decimal, uuid and date types are not JSON types.
    if isinstance(value, bytes):
        return value.hex()
    return str(value)


def as_hex(data: bytes) -> Decoded:
    return Decoded(hex_text(data[:SHOWN_BYTES]), "hex", data.hex())


def as_text(data: bytes) -> Decoded | None:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return None
    return Decoded(text[:SHOWN_BYTES], "text", text)


def as_json(data: bytes) -> Decoded | None:
    try:
        value = json.loads(data)
    except ValueError:
        return None
    return Decoded(_json_text(value), "json", value)


class AvroSchema:
    """A pasted Avro schema; decodes plain Avro binary and Confluent's framing of it."""

    def __init__(self, text: str) -> None:
        try:
            self._schema = fastavro.parse_schema(json.loads(text))
        except (ValueError, TypeError, KeyError, fastavro.schema.SchemaParseException) as error:
            raise SchemaError(f"not an Avro schema: {error}") from error

    def _read(self, data: bytes, start: int) -> Any:
        stream = io.BytesIO(data)
        stream.seek(start)
        value = fastavro.schemaless_reader(stream, self._schema, None)
        if stream.tell() != len(data):
            raise ValueError(f"{len(data) - stream.tell()} bytes left after the record")
        return value

    def decode(self, data: bytes) -> Decoded:
        # A plain Avro body may begin with a 0 byte too: framed first, plain if that fails.
        if len(data) >= CONFLUENT_HEADER and data[0] == CONFLUENT_MAGIC:
            try:
                value = self._read(data, CONFLUENT_HEADER)
            except Exception:
                pass
            else:
                schema_id = int.from_bytes(data[1:CONFLUENT_HEADER], "big")
                return Decoded(_json_text(value), "json", value, f"schema id {schema_id}")
        try:
            value = self._read(data, 0)
        except Exception as error:
            shown = as_hex(data)
            return Decoded(shown.text, "hex", shown.value, f"not Avro of this schema: {error}")
        return Decoded(_json_text(value), "json", value)


class JsonSchema:
    """A pasted JSON Schema; records are shown as JSON with what fails validation."""

    def __init__(self, text: str) -> None:
        try:
            schema = json.loads(text)
            validator_class = jsonschema.validators.validator_for(schema)
            validator_class.check_schema(schema)
        except (ValueError, jsonschema.SchemaError) as error:
            raise SchemaError(f"not a JSON Schema: {error}") from error
        self._validator = validator_class(schema)

    def decode(self, data: bytes) -> Decoded:
        shown = as_json(data)
        if shown is None:
            fallback = as_text(data) or as_hex(data)
            return Decoded(fallback.text, fallback.kind, fallback.value, "not JSON")
        errors = sorted(self._validator.iter_errors(shown.value), key=lambda e: list(e.absolute_path))
        if not errors:
            return Decoded(shown.text, shown.kind, shown.value, "valid")
        first = errors[0]
        where = "$" + "".join(f"[{p!r}]" if isinstance(p, int) else f".{p}" for p in first.absolute_path)
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        return Decoded(shown.text, shown.kind, shown.value, f"invalid at {where}: {first.message}{more}")


class Decoder:
    """One decode mode, with its schema when the mode needs one."""

    def __init__(self, mode: str, schema: str | None = None) -> None:
        if mode not in MODES:
            raise ValueError(f"decode mode is one of {', '.join(MODES)}, not {mode!r}")
        self.mode = mode
        self._schema: AvroSchema | JsonSchema | None = None
        if mode in ("avro", "jsonschema"):
            if not schema or not schema.strip():
                raise SchemaError(f"the {mode} mode needs a schema")
            self._schema = AvroSchema(schema) if mode == "avro" else JsonSchema(schema)

    def decode(self, data: bytes | None) -> Decoded:
        if data is None:
            return NULL
        if self._schema is not None:
            return self._schema.decode(data)
        if self.mode == "hex":
            return as_hex(data)
        if self.mode == "json":
            shown = as_json(data)
            if shown is not None:
                return shown
            fallback = as_text(data) or as_hex(data)
            return Decoded(fallback.text, fallback.kind, fallback.value, "not JSON")
        if self.mode == "utf8":
            shown = as_text(data)
            if shown is not None:
                return shown
            fallback = as_hex(data)
            return Decoded(fallback.text, fallback.kind, fallback.value, "not UTF-8")
        # auto: JSON only for objects and arrays, so "42" or "true" read as the text they are.
        if data[:1] in (b"{", b"["):
            shown = as_json(data)
            if shown is not None:
                return shown
        return as_text(data) or as_hex(data)
