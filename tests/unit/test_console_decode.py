"""The console's record decoders: text, JSON, hex, Avro (plain and Confluent-framed), JSON Schema."""

from __future__ import annotations

import io
import json

import fastavro
import pytest

from strom.console.decode import Decoder, SchemaError, hex_text

ORDER_SCHEMA = {
    "type": "record",
    "name": "Order",
    "fields": [{"name": "id", "type": "long"}, {"name": "item", "type": "string"}],
}


def avro_body(record: dict[str, object]) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(ORDER_SCHEMA), record)
    return out.getvalue()


def test_auto_picks_json_then_text_then_hex() -> None:
    auto = Decoder("auto")
    shown = auto.decode(b'{"a": {"b": [1, 2]}}')
    assert shown.kind == "json"
    assert shown.text == '{\n  "a": {\n    "b": [\n      1,\n      2\n    ]\n  }\n}'
    assert shown.value == {"a": {"b": [1, 2]}}
    # A bare JSON scalar is shown as the text it is.
    assert auto.decode(b"42").kind == "text"
    assert auto.decode("héllo".encode()).text == "héllo"
    assert auto.decode(b"\xff\x00").kind == "hex"
    assert auto.decode(None).kind == "null"


def test_hex_groups_sixteen_bytes_a_line() -> None:
    shown = Decoder("hex").decode(bytes(range(18)))
    assert shown.text == hex_text(bytes(range(18)))
    assert shown.text.splitlines() == ["00 01 02 03 04 05 06 07 08 09 0a 0b 0c 0d 0e 0f", "10 11"]
    assert shown.value == bytes(range(18)).hex()


def test_json_and_utf8_modes_say_when_they_do_not_fit() -> None:
    assert Decoder("json").decode(b"not json").note == "not JSON"
    assert Decoder("json").decode(b"not json").kind == "text"
    assert Decoder("utf8").decode(b"\xc3").note == "not UTF-8"
    assert Decoder("utf8").decode(b"\xc3").kind == "hex"


def test_avro_plain_and_confluent_framed() -> None:
    decoder = Decoder("avro", json.dumps(ORDER_SCHEMA))
    body = avro_body({"id": 7, "item": "tea"})
    plain = decoder.decode(body)
    assert plain.value == {"id": 7, "item": "tea"}
    assert plain.note is None
    framed = decoder.decode(b"\x00" + (1234).to_bytes(4, "big") + body)
    assert framed.value == {"id": 7, "item": "tea"}
    assert framed.note == "schema id 1234"


def test_avro_that_does_not_fit_the_schema_is_shown_as_hex() -> None:
    shown = Decoder("avro", json.dumps(ORDER_SCHEMA)).decode(b"\x02")
    assert shown.kind == "hex"
    assert shown.note is not None and shown.note.startswith("not Avro of this schema")


def test_a_plain_avro_body_starting_with_zero_is_not_taken_for_framing() -> None:
    # id 0 encodes as the byte 0: five bytes or more starting with 0, yet plain Avro.
    body = avro_body({"id": 0, "item": "long enough"})
    assert body[0] == 0
    assert Decoder("avro", json.dumps(ORDER_SCHEMA)).decode(body).value == {"id": 0, "item": "long enough"}


def test_json_schema_validation_notes() -> None:
    schema = {"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"]}
    decoder = Decoder("jsonschema", json.dumps(schema))
    assert decoder.decode(b'{"id": 3}').note == "valid"
    invalid = decoder.decode(b'{"id": "x"}')
    assert invalid.kind == "json"
    assert invalid.note is not None and invalid.note.startswith("invalid at $.id:")
    assert decoder.decode(b"oops").note == "not JSON"


@pytest.mark.parametrize(
    ("mode", "schema"),
    [
        ("avro", None),
        ("avro", '{"type": "nope"}'),
        ("jsonschema", "{not json"),
        ("jsonschema", '{"type": 5}'),
    ],
)
def test_bad_or_missing_schemas_are_refused(mode: str, schema: str | None) -> None:
    with pytest.raises(SchemaError):
        Decoder(mode, schema)


def test_unknown_mode_is_refused() -> None:
    with pytest.raises(ValueError, match="decode mode"):
        Decoder("base64")
