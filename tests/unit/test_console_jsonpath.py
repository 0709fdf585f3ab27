"""The console's JSON path subset: parsing, matching, and the byte strings a match must contain."""

from __future__ import annotations

import json

import pytest

from strom.console.jsonpath import JsonPathError, parse

DOCUMENT = {
    "user": {"id": 42, "name": "Ada Lovelace", "tags": ["admin", "ops"], "active": True},
    "items": [{"sku": "a-1"}, {"sku": "b-2"}],
    "odd key": None,
}


@pytest.mark.parametrize(
    ("predicate", "expected"),
    [
        ("$.user.id == 42", True),
        ("$.user.id == 42.0", True),
        ("$.user.id != 42", False),
        ('$.user.name == "Ada Lovelace"', True),
        ('$.user.name contains "Love"', True),
        ('$.user.tags contains "ops"', True),
        ('$.user.tags[0] == "admin"', True),
        ('$.user.tags[-1] == "ops"', True),
        ('$.items[1].sku == "b-2"', True),
        ("$.items[2]", False),
        ("$.user.active == true", True),
        ("$.user.active == 1", False),  # JSON's true is not 1
        ('$["odd key"] == null', True),
        ('$["odd key"]', True),
        ("$.missing", False),
        ("$.missing != 1", False),  # != needs the path to exist
        ("$.user", True),
        ('$.user.id contains "4"', False),  # contains is for strings and arrays
    ],
)
def test_matches(predicate: str, expected: bool) -> None:
    assert parse(predicate).matches(DOCUMENT) is expected


def test_a_path_into_a_scalar_does_not_match() -> None:
    assert not parse("$.user.id.x").matches(DOCUMENT)
    assert not parse("$[0]").matches(DOCUMENT)


@pytest.mark.parametrize(
    ("predicate", "message"),
    [
        ("user.id == 1", "starts with \\$"),
        ("$.", "a name must follow"),
        ("$[x]", "expected \\[number\\]"),
        ("$.a = 1", "expected ==, !=, contains"),
        ("$.a == bare", "a JSON value"),
        ('$["a"', "expected \\[number\\]"),
    ],
)
def test_errors_say_what_is_wrong(predicate: str, message: str) -> None:
    with pytest.raises(JsonPathError, match=message):
        parse(predicate)


def test_needles_are_in_every_matching_document() -> None:
    predicate = parse('$.user.name == "Ada Lovelace"')
    assert predicate.needles() == [b'"name"', b'"Ada Lovelace"']
    raw = json.dumps(DOCUMENT).encode()
    assert all(needle in raw for needle in predicate.needles())
    assert parse('$.user.name contains "Love"').needles() == [b'"name"', b"Love"]
    # No literal needle for != (the value is what is absent) or for escaped text.
    assert parse('$.user.name != "x"').needles() == [b'"name"']
    assert parse('$.user.name == "a\\"b"').needles() == [b'"name"']
    assert parse("$.items[0]").needles() == [b'"items"']
