"""Type stubs of the benchmark package's private extension: machine limits and naive baselines
(``crates/nearrec-bench-py``). Each limit is ``{"bytes_per_s", "items_per_s", "seconds"}``."""

from os import PathLike
from typing import Any, Self, final

import numpy as np
import numpy.typing as npt

__version__: str

__all__ = [
    "__version__", "MappedStore", "naive_sls", "stream_read", "gather_rows", "sequential_write",
    "random_read", "read_cost", "kernel_cost", "load_run", "redis_load", "EmbeddedStore",
]

_Path = str | PathLike[str]

def stream_read(bytes: int, passes: int = 3, threads: int = 2) -> dict[str, float]: ...
def gather_rows(
    table_bytes: int, row_bytes: int, gathers: int, passes: int = 3, threads: int = 2
) -> dict[str, float]: ...
def sequential_write(dir: _Path, bytes: int) -> dict[str, float]: ...
def kernel_cost(
    dim: int, dtype: str, rows: int, bags: int, pooling: int, reps: int = 9
) -> tuple[float, float]: ...
def read_cost(
    store: _Path,
    batch: int,
    pooling: int,
    seconds: float,
    device: str = "memory",
    threads: int = 1,
    verify: bool = True,
    seed: int = 11,
) -> dict[str, float]: ...
def random_read(
    paths: list[str], reads: int, queue_depth: int, seed: int = 7
) -> dict[str, float]: ...
def naive_sls(
    store: _Path, indices: list[npt.NDArray[np.int64]], bag_size: int, threads: int
) -> npt.NDArray[np.float32]: ...

@final
class MappedStore:
    def __new__(cls, path: _Path, random: bool = True) -> Self: ...
    def pool(
        self, requests: list[tuple[int, npt.NDArray[np.int64], npt.NDArray[np.int64]]]
    ) -> npt.NDArray[np.float32]: ...
def load_run(
    mode: str,
    batches: list[list[tuple[str, npt.NDArray[np.int64], npt.NDArray[np.int64]]]],
    rate: float,
    seconds: float,
    target: str | None = None,
    store: str | None = None,
    connections: int = 1,
    seed: int = 0,
    cache: dict[str, tuple[npt.NDArray[np.int64], npt.NDArray[np.float32]]] | None = None,
    embedded: EmbeddedStore | None = None,
    dims: dict[str, int] | None = None,
    out_dtype: str = "fp32",
) -> dict[str, Any]: ...
@final
class EmbeddedStore:
    def __new__(cls, path: _Path, config: str, in_flight: int = 8) -> Self: ...

def redis_load(target: str, tables: dict[str, npt.NDArray[np.float32]]) -> None: ...
