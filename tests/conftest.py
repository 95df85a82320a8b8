from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import nearrec

#: (name, rows, dim, dtype): fast-path widths, a run-time width, every dtype
TABLES = [
    ("f32_d32", 300, 32, "fp32"),
    ("f32_d7", 257, 7, "fp32"),
    ("f16_d16", 200, 16, "fp16"),
    ("bf16_d64", 150, 64, "bf16"),
    ("i8_d32", 400, 32, "int8"),
    ("i8_d5", 100, 5, "int8"),
]


def make_store(root: Path, seed: int = 0) -> tuple[Path, dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    path = root / "store"
    arrays = {}
    for name, rows, dim, _dtype in TABLES:
        a = rng.standard_normal((rows, dim), dtype=np.float32)
        arrays[name] = a
    nearrec.from_numpy(path, arrays, dtype={t[0]: t[3] for t in TABLES})
    return path, arrays


@pytest.fixture(scope="session")
def mixed_store(tmp_path_factory: pytest.TempPathFactory) -> nearrec.Store:
    path, _ = make_store(tmp_path_factory.mktemp("mixed"))
    return nearrec.open(path)


class Lookups:
    """A map-style dataset whose items are a collection's pooled output for given batches: what
    a DataLoader worker (forked, or spawned) looks up through a nearrec module."""

    def __init__(self, collection: Any, batches: list[Any]):
        self.collection, self.batches = collection, batches

    def __len__(self) -> int:
        return len(self.batches)

    def __getitem__(self, i: int) -> Any:
        return self.collection(self.batches[i]).values()
