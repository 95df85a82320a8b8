from __future__ import annotations

import re
import signal
import subprocess
import sys
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
    ("i4_d64", 300, 64, "int4"),
    ("i4_d6", 120, 6, "int4"),
    ("i2_d32", 200, 32, "int2"),
    ("f8_d16", 250, 16, "fp8"),
    ("f8_d9", 90, 9, "fp8"),
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


def assert_pools_as_frozen(got: np.ndarray, want: np.ndarray, dtype: str,
                           tol: float = 0.0) -> None:
    """A frozen fixture's pooled outputs, as they were computed when it was frozen: equal (or
    within ``tol``). An int8 table's bags were summed decoded row by decoded row then; since
    format version 6 they are summed as FBGEMM's TBE sums them (``fma(scale, code, acc +
    bias)``, ``docs/format.md`` §4), which moves sums by a few units in the last place."""
    if dtype == "int8":
        tol = max(tol, 1e-5)
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


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


def sigint_default() -> None:
    """A child's SIGINT set back to its default (``Popen``'s ``preexec_fn``), for a test that
    interrupts it: a suite run in the background (``pytest &`` from a script) inherits SIGINT
    ignored and hands that on, and a program started so keeps it ignored (a background job is
    not the terminal's Ctrl-C's to stop)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class Node:
    """`nearrec serve` in a child process; stops it (SIGTERM) on close."""

    def __init__(self, *args: str):
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "nearrec.cli", "serve", *args, "--listen", "127.0.0.1:0",
             "--metrics-listen", "127.0.0.1:0"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        m = re.search(r"listening on (\S+) .*metrics on (\S+)", line)
        if not m:
            self.proc.kill()
            raise AssertionError(f"no address: {line!r} {self.proc.stderr.read()!r}")
        self.address, self.metrics_url = m.group(1), m.group(2)

    def metrics(self) -> dict[str, list[tuple[dict[str, str], float]]]:
        """The node's metrics as Prometheus's own parser reads them: family → samples."""
        return {f.name: [(s.labels, s.value) for s in f.samples] for f in self._families()}

    def histogram(self, family: str, **labels: str) -> dict[str, float]:
        """A histogram's ``count`` and ``sum`` over its series with ``labels``."""
        out = {"count": 0.0, "sum": 0.0}
        for f in self._families():
            for s in f.samples if f.name == family else ():
                kind = s.name.removeprefix(family + "_")
                if kind in out and labels.items() <= s.labels.items():
                    out[kind] += s.value
        return out

    def _families(self) -> list[Any]:
        import urllib.request

        from prometheus_client.parser import text_string_to_metric_families
        with urllib.request.urlopen(self.metrics_url, timeout=10) as r:
            return list(text_string_to_metric_families(r.read().decode()))

    def stop(self, timeout: float = 30.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)


def damage(path: Path, table: str, how: str, at: int) -> None:
    """Flips one bit (an exponent bit of fp32 rows: a NaN or a huge value), or zeroes a 512-byte
    sector, at data-region byte ``at`` of ``table``'s file."""
    t = next(t for t in nearrec.info(path).tables if t.name == table)
    f = path / t.file
    data = bytearray(f.read_bytes())
    if how == "flip":
        data[4096 + at] ^= 0x40
    else:
        lo = 4096 + at // 512 * 512
        data[lo:lo + 512] = bytes(512)
    f.write_bytes(bytes(data))
