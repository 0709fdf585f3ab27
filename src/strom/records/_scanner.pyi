# The record scanner's C extension (_scanner.c); strom.records.scanner documents it.
from _typeshed import ReadableBuffer as Buffer

class RecordError(ValueError): ...

def validate(
    data: Buffer,
    start: int,
    end: int,
    count: int,
    last_offset_delta: int,
    base_timestamp: int,
    earliest: int,
    latest: int,
    check_timestamps: bool,
    check_keys: bool,
    /,
) -> tuple[int, list[int] | None, list[int] | None]: ...
def decode(
    data: Buffer, start: int, end: int, count: int, last_offset_delta: int, /
) -> list[tuple[int, int, bytes | None, bytes | None, tuple[tuple[str, bytes | None], ...]]]: ...
def layout(
    data: Buffer, start: int, end: int, count: int, last_offset_delta: int, /
) -> list[tuple[int, int, int, int, int, int, bytes | None, bool]]: ...
def read_headers(
    data: Buffer, position: int, end: int, /
) -> tuple[tuple[tuple[str, bytes | None], ...], int]: ...
