"""Byte sizes as people write them: ``"16GiB"``, ``"4GB"``, ``512``."""

from __future__ import annotations

import operator
from typing import Any

from ._native import parse_size as native_parse_size
from .errors import InvalidRequest

#: The largest size the engine can hold (sizes are signed 64-bit there).
MAX_SIZE = 2**63 - 1


def parse_size(size: int | str | Any) -> int:
    """``"16GiB"`` → 17179869184; ``"4GB"`` → 4000000000; ints and plain numbers are bytes.
    Anything else (a bool, a float, ``None``, a negative or non-finite number, more than
    ``MAX_SIZE``) is an :class:`~nearrec.errors.InvalidRequest`."""
    if isinstance(size, str):
        return int(native_parse_size(size))
    if isinstance(size, bool) or type(size).__name__ == "bool_":
        raise InvalidRequest(f"not a size: {size!r} (a bool)")
    try:
        n = operator.index(size)
    except TypeError:
        raise InvalidRequest(f"not a size: {size!r} (give bytes as an int, or a string such "
                             "as '512MiB')") from None
    if n < 0:
        raise InvalidRequest(f"a size cannot be negative: {n}")
    if n > MAX_SIZE:
        raise InvalidRequest(f"size {n} is too large (at most {MAX_SIZE} bytes)")
    return n
