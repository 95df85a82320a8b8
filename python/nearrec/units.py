"""Byte sizes as people write them: ``"16GiB"``, ``"4GB"``, ``512``."""

from __future__ import annotations

import re

from .errors import InvalidRequest

_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "kib": 2**10, "m": 10**6, "mb": 10**6,
          "mib": 2**20, "g": 10**9, "gb": 10**9, "gib": 2**30, "t": 10**12, "tb": 10**12,
          "tib": 2**40}


def parse_size(size: int | str) -> int:
    """``"16GiB"`` → 17179869184; ``"4GB"`` → 4000000000; ints and plain numbers are bytes."""
    if isinstance(size, int):
        if size < 0:
            raise InvalidRequest(f"a size cannot be negative: {size}")
        return size
    m = re.fullmatch(r"\s*([0-9.]+)\s*([a-zA-Z]*)\s*", size)
    if not m or m.group(2).lower() not in _UNITS:
        raise InvalidRequest(f"not a size: {size!r} (try 512MiB, 16GiB)")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])
