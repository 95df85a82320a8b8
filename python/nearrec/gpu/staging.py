"""The pinned host buffer that a batch's fetched rows cross PCIe in (``zero_copy``: the kernels
read it in place; ``async_copy``: one copy on a side stream first)."""

from __future__ import annotations

from typing import Any

import torch

from .cache import HostRows
from .config import TransferMode


class Staging:
    """One pinned host buffer for a batch's fetched rows (and, for ``async_copy``, its device
    twin); reused batch after batch once the kernels that read it are done."""

    def __init__(self, device: torch.device, mode: TransferMode):
        self.device = device
        self.mode = mode
        self.cuda = device.type == "cuda"
        self.host = torch.empty(0, dtype=torch.float32)
        self.dev: torch.Tensor | None = None
        self.done: torch.cuda.Event | None = None
        self.side: torch.cuda.Stream | None = None

    def host_rows(self, n: int, dim: int) -> torch.Tensor:
        """A ``[n, dim]`` pinned view to fill (waits until the last batch's kernels are done
        with the buffer)."""
        if self.done is not None:
            self.done.synchronize()
        if self.host.numel() < n * dim:
            cap = max(n * dim, 2 * self.host.numel(), 1 << 18)
            self.host = torch.empty(cap, dtype=torch.float32, pin_memory=self.cuda)
            if self.cuda and self.mode is TransferMode.ASYNC_COPY:
                self.dev = torch.empty(cap, dtype=torch.float32, device=self.device)
        return self.host[:n * dim].view(n, dim)

    def to_device(self, rows: torch.Tensor) -> Any:
        """What kernels read for the filled ``rows``: a device tensor, or the pinned memory
        itself (:class:`HostRows`, zero-copy)."""
        if not self.cuda:
            return rows
        if self.mode is TransferMode.ZERO_COPY:
            return HostRows(rows)
        assert self.dev is not None
        if self.side is None:
            self.side = torch.cuda.Stream(self.device)  # type: ignore[no-untyped-call]
        current = torch.cuda.current_stream(self.device)
        self.side.wait_stream(current)  # earlier kernels may still read the device buffer
        dst = self.dev[:rows.numel()].view(rows.shape)
        with torch.cuda.stream(self.side):
            dst.copy_(rows, non_blocking=True)
        current.wait_stream(self.side)
        return dst

    def release(self) -> None:
        """Marks the point after which the buffer may be refilled."""
        if self.cuda:
            if self.done is None:
                self.done = torch.cuda.Event()  # type: ignore[no-untyped-call]
            self.done.record(torch.cuda.current_stream(self.device))


__all__ = ["Staging"]
