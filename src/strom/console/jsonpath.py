"""The console's JSON path predicates, a small subset of JSONPath for searching record values.

Grammar::

    predicate := path [op literal]
    path      := "$" step*
    step      := "." name | "[" integer "]" | "[" json-string "]"
    op        := "==" | "!=" | "contains"
    literal   := a JSON value: "text", 42, -1.5, true, false, null

``$.user.id == 42`` matches values whose ``user.id`` is 42; ``$.tags[0] != "x"`` needs the
path to exist; ``$.name contains "ab"`` is a substring test on strings (and membership for
arrays); a path alone (``$.error``) matches when it exists. Names in ``.name`` steps are
letters, digits, ``_`` and ``-``; other names go in brackets: ``$["a b"]``. Negative
indexes count from the end. No wildcards, filters or recursive descent.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

OPERATORS = ("==", "!=", "contains")
_NAME = re.compile(r"[A-Za-z0-9_-]+")
_INDEX = re.compile(r"\[\s*(-?\d+)\s*\]")
_OPERATOR = re.compile(r"\s*(==|!=|contains\b)\s*")
_MISSING = object()


class JsonPathError(ValueError):
    """A predicate outside the subset; the message says where."""


@dataclass(frozen=True, slots=True)
class JsonPredicate:
    steps: tuple[str | int, ...]
    op: str | None
    literal: Any

    def matches(self, document: Any) -> bool:
        found = self.select(document)
        if found is _MISSING:
            return False
        if self.op is None:
            return True
        if self.op == "==":
            return _equal(found, self.literal)
        if self.op == "!=":
            return not _equal(found, self.literal)
        if isinstance(found, str) and isinstance(self.literal, str):
            return self.literal in found
        if isinstance(found, list):
            return any(_equal(item, self.literal) for item in found)
        return False

    def select(self, document: Any) -> Any:
        current = document
        for step in self.steps:
            if isinstance(step, int):
                if not isinstance(current, list) or not -len(current) <= step < len(current):
                    return _MISSING
                current = current[step]
            else:
                if not isinstance(current, dict) or step not in current:
                    return _MISSING
                current = current[step]
        return current

    def needles(self) -> list[bytes]:
        """Byte strings every matching value's raw JSON contains (as JSON writers put them,
        without needless escapes): the search checks them before parsing any JSON."""
        found: list[bytes] = []
        names = [s for s in self.steps if isinstance(s, str)]
        if names and names[-1].isascii() and names[-1].isprintable() and '"' not in names[-1]:
            found.append(json.dumps(names[-1]).encode())
        literal = self.literal
        if self.op in ("==", "contains") and isinstance(literal, str) and literal.isascii():
            # A string's JSON form, quotes dropped for contains (the value may hold more).
            encoded = json.dumps(literal)
            if "\\" not in encoded:
                found.append((encoded if self.op == "==" else encoded[1:-1]).encode())
        return [n for n in found if n]


def _equal(a: Any, b: Any) -> bool:
    # JSON's true is not 1 (Python's bool is an int).
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    return bool(a == b)


def parse(text: str) -> JsonPredicate:
    source = text.strip()
    if not source.startswith("$"):
        raise JsonPathError("a JSON path starts with $")
    at = 1
    steps: list[str | int] = []
    decoder = json.JSONDecoder()
    while at < len(source) and source[at] in ".[":
        if source[at] == ".":
            name = _NAME.match(source, at + 1)
            if name is None:
                raise JsonPathError(f"a name must follow '.' at column {at + 1}")
            steps.append(name.group())
            at = name.end()
            continue
        index = _INDEX.match(source, at)
        if index is not None:
            steps.append(int(index.group(1)))
            at = index.end()
            continue
        try:
            key, end = decoder.raw_decode(source, at + 1)
        except ValueError:
            key, end = None, at
        if not isinstance(key, str) or not source.startswith("]", end):
            raise JsonPathError(f'expected [number] or ["name"] at column {at + 1}')
        steps.append(key)
        at = end + 1
    rest = source[at:]
    if not rest.strip():
        return JsonPredicate(tuple(steps), None, None)
    operator = _OPERATOR.match(rest)
    if operator is None:
        raise JsonPathError(f"expected {', '.join(OPERATORS)} at column {at + 1}: {rest.strip()!r}")
    literal_text = rest[operator.end() :].strip()
    try:
        literal = json.loads(literal_text)
    except ValueError:
        raise JsonPathError(
            f"the value after {operator.group(1)} is a JSON value (strings in double quotes): {literal_text!r}"
        ) from None
    return JsonPredicate(tuple(steps), operator.group(1), literal)
