"""The consumer protocol's subscription layout, read only as far as the broker needs it.

Member metadata is opaque to a classic group coordinator except for one decision:
OffsetDelete refuses to delete offsets of a topic the group's consumers still
subscribe to (GROUP_SUBSCRIBED_TO_TOPIC). Every ConsumerProtocolSubscription
version starts with an int16 version and the array of topic names.
"""

from __future__ import annotations

import struct

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")


def subscription_topics(metadata: bytes) -> set[str] | None:
    """The subscribed topic names, or None when ``metadata`` is not a consumer subscription."""
    try:
        position = 2  # version
        (count,) = _I32.unpack_from(metadata, position)
        position += 4
        if count < 0:
            return None
        topics = set()
        for _ in range(count):
            (size,) = _I16.unpack_from(metadata, position)
            position += 2
            if size < 0 or position + size > len(metadata):
                return None
            topics.add(metadata[position : position + size].decode())
            position += size
        return topics
    except (struct.error, UnicodeDecodeError):
        return None
