"""Building version-specific kio entities from one code path per API.

kio generates a dataclass per API version. Handlers describe a response once, with
every field any version has; ``build`` keeps the fields the requested version
defines, so a field added in v7 simply disappears from a v5 response.
"""

from __future__ import annotations

import dataclasses
import datetime
import uuid
from typing import Any

ZERO_THROTTLE = datetime.timedelta(0)
_ONE_MS = datetime.timedelta(milliseconds=1)
# Kafka's "no topic id" and "authorized operations not requested" sentinels.
ZERO_UUID = uuid.UUID(int=0)
AUTHORIZED_OPERATIONS_OMITTED = -(2**31)


_FIELD_NAMES: dict[type[Any], frozenset[str]] = {}


def field_names(entity_type: type[Any]) -> frozenset[str]:
    names = _FIELD_NAMES.get(entity_type)
    if names is None:
        names = _FIELD_NAMES[entity_type] = frozenset(f.name for f in dataclasses.fields(entity_type))
    return names


def build(entity_type: type[Any], /, **values: Any) -> Any:
    """Instantiate ``entity_type`` from the subset of ``values`` it defines."""
    names = field_names(entity_type)
    kwargs = {name: value for name, value in values.items() if name in names}
    if "throttle_time" in names and "throttle_time" not in kwargs:
        kwargs["throttle_time"] = ZERO_THROTTLE
    return entity_type(**kwargs)


def has_field(entity_type: type[Any], name: str) -> bool:
    return name in field_names(entity_type)


def to_ms(value: datetime.timedelta) -> int:
    """A duration field (kio decodes Kafka's *_ms fields as timedeltas) in whole milliseconds."""
    return int(value / _ONE_MS)
