"""Byte sizes as people write them: ``"16GiB"``, ``"4GB"``, ``512``."""

from __future__ import annotations

import math
import operator
import re
from typing import Any

from .errors import InvalidRequest

_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "kib": 2**10, "m": 10**6, "mb": 10**6,
          "mib": 2**20, "g": 10**9, "gb": 10**9, "gib": 2**30, "t": 10**12, "tb": 10**12,
          "tib": 2**40}
#: The largest size the engine can hold (sizes are signed 64-bit there).
MAX_SIZE = 2**63 - 1


def parse_size(size: int | str | Any) -> int:
    """``"16GiB"`` → 17179869184; ``"4GB"`` → 4000000000; ints and plain numbers are bytes.
    Anything else (a bool, a float, ``None``, a negative or non-finite number, more than
    ``MAX_SIZE``) is an :class:`~nearrec.errors.InvalidRequest`."""
    if isinstance(size, str):
        m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([a-zA-Z]*)\s*", size)
        if not m or m.group(2).lower() not in _UNITS:
            raise InvalidRequest(f"not a size: {size!r} (try 512MiB, 16GiB)")
        value = float(m.group(1)) * _UNITS[m.group(2).lower()]
        if not math.isfinite(value) or value > MAX_SIZE:
            raise InvalidRequest(f"size {size!r} is too large (at most {MAX_SIZE} bytes)")
        return int(value)
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
