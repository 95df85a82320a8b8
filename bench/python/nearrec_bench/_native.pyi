"""Type stubs of the benchmark package's private extension: machine limits and naive baselines
(``crates/nearrec-bench-py``). Each limit is ``{"bytes_per_s", "items_per_s", "seconds"}``."""

from os import PathLike

import numpy as np
import numpy.typing as npt

__version__: str

_Path = str | PathLike[str]

def stream_read(bytes: int, passes: int = 3, threads: int = 2) -> dict[str, float]: ...
def gather_rows(
    table_bytes: int, row_bytes: int, gathers: int, passes: int = 3, threads: int = 2
) -> dict[str, float]: ...
def sequential_write(dir: _Path, bytes: int) -> dict[str, float]: ...
def random_read(
    paths: list[str], reads: int, queue_depth: int, seed: int = 7
) -> dict[str, float]: ...
def naive_sls(
    store: _Path, indices: list[npt.NDArray[np.int64]], bag_size: int, threads: int
) -> npt.NDArray[np.float32]: ...

class MappedStore:
    def __init__(self, path: _Path, random: bool = True) -> None: ...
    def pool(
        self, requests: list[tuple[int, npt.NDArray[np.int64], npt.NDArray[np.int64]]]
    ) -> npt.NDArray[np.float32]: ...
