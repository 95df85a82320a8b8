"""``torch.nn.EmbeddingBag`` over one table of a store, or over a keyed table."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from ..errors import InvalidRequest
from ..keyed import KeyedTable
from ..request import OutDtypeName, TableLookup, as_array, flag, mode_name, padding
from ..store import PoolingModeName, Store, Synced
from .common import _device_of, _not_traced, _numpy, _table_name, answer_dtype, typed_answer


class EmbeddingBag(nn.Module):
    """``torch.nn.EmbeddingBag`` over one table of a store.

    ``forward(input, offsets=None, per_sample_weights=None)`` behaves like
    ``nn.EmbeddingBag.forward``: 1-D ``input`` with ``offsets`` (``include_last_offset`` as in
    PyTorch), or 2-D ``[batch, bag_size]`` input without; empty bags give zeros; ``padding_idx``
    rows are skipped and not counted for mean; ``per_sample_weights`` only with ``mode="sum"``.
    ``out_dtype`` (``"fp16"``, ``"bf16"``, ``"int8"`` or a torch dtype) is the output's, as
    :meth:`nearrec.Store.lookup_many` gives it.
    """

    def __init__(self, store: Store, table: str, mode: PoolingModeName = "sum",
                 include_last_offset: bool = False, padding_idx: int | None = None,
                 out_dtype: OutDtypeName | Any = None):
        super().__init__()
        self.out_dtype = answer_dtype(out_dtype)
        info = store.table(_table_name(table))
        mode = mode_name(mode, table)
        include_last_offset = flag(include_last_offset, "include_last_offset")
        padding_idx = padding(padding_idx, table)
        if padding_idx is not None and not -info.rows <= padding_idx < info.rows:
            raise InvalidRequest(
                f"table {table!r}: padding_idx {padding_idx} is out of range for {info.rows} rows",
                table=table,
            )
        self.store = store
        self.table = table
        self.mode: PoolingModeName = mode
        self.include_last_offset = include_last_offset
        self.padding_idx = padding_idx if padding_idx is None or padding_idx >= 0 \
            else padding_idx + info.rows
        self.num_embeddings = info.rows
        self.embedding_dim = info.dim

    def sync_from(self, source: Any, *, tolerance: float = 0.0) -> Synced:
        """A training feed: writes the rows of this table that differ from ``source`` — an
        ``nn.EmbeddingBag`` / ``nn.Embedding`` being trained, or its weight tensor — by more
        than ``tolerance`` into the (writable) store. See :meth:`nearrec.Store.sync_table`."""
        weight = getattr(source, "weight", source)
        if not isinstance(weight, Tensor):
            raise InvalidRequest(f"sync_from takes an embedding module or its weight tensor, not "
                                 f"{type(source).__name__}", table=self.table)
        return self.store.sync_table(self.table, weight.detach().cpu().numpy(),
                                     tolerance=tolerance)

    def forward(self, input: Tensor, offsets: Tensor | None = None,
                per_sample_weights: Tensor | None = None) -> Tensor:
        _not_traced(self)
        req = TableLookup(self.table, _numpy(input), _numpy(offsets), None,
                          _numpy(per_sample_weights), self.mode, self.include_last_offset,
                          self.padding_idx)
        # float32 as the store rounded it, then the asked dtype (exact)
        out = self.store._native.lookup([req], None, self.out_dtype)
        result = typed_answer(torch.from_numpy(out), [self.embedding_dim], self.out_dtype, True)
        device = _device_of(input)
        return result if device.type == "cpu" else result.to(device)

    def extra_repr(self) -> str:
        return (f"{self.table!r}, {self.num_embeddings}, {self.embedding_dim}, mode={self.mode!r}"
                + (f", padding_idx={self.padding_idx}" if self.padding_idx is not None else ""))


class KeyedEmbeddingBag(nn.Module):
    """``torch.nn.EmbeddingBag`` over a :class:`~nearrec.keyed.KeyedTable`: ``input`` holds
    64-bit feature ids instead of row numbers (1-D with ``offsets``, or 2-D ``[batch, bag]``);
    unknown ids follow the table's policy."""

    def __init__(self, table: KeyedTable, mode: PoolingModeName = "sum",
                 include_last_offset: bool = False):
        super().__init__()
        if not isinstance(table, KeyedTable):
            raise InvalidRequest(f"KeyedEmbeddingBag takes a KeyedTable, not "
                                 f"{type(table).__name__} {table!r:.60}")
        mode = mode_name(mode, table.name)
        include_last_offset = flag(include_last_offset, "include_last_offset")
        self.keyed = table
        self.mode: PoolingModeName = mode
        self.include_last_offset = include_last_offset
        self.embedding_dim = table.dim

    def forward(self, input: Tensor, offsets: Tensor | None = None,
                per_sample_weights: Tensor | None = None) -> Tensor:
        name = self.keyed.name
        if input is None:
            raise InvalidRequest(f"table {name!r}: input must be a tensor of ids, not None",
                                 table=name)
        keys = as_array(input, "input", name)
        if keys.ndim not in (1, 2):
            raise InvalidRequest(f"table {name!r}: input must be 1-D (with offsets) or 2-D, got "
                                 f"{keys.ndim}-D", table=name)
        last = self.include_last_offset and keys.ndim == 1
        if keys.ndim == 2:
            if offsets is not None:
                raise InvalidRequest("2-D input takes no offsets", table=self.keyed.name)
            starts = np.arange(0, keys.size, max(1, keys.shape[1]), dtype=np.int64)[
                :keys.shape[0]]
            keys = keys.reshape(-1)
        elif offsets is None:
            raise InvalidRequest("1-D input needs offsets", table=self.keyed.name)
        else:
            starts = as_array(offsets, "offsets", name)
        weights = None if per_sample_weights is None else \
            as_array(per_sample_weights, "per_sample_weights", name).reshape(-1)
        out = self.keyed.lookup(keys, offsets=starts, mode=self.mode,
                                per_sample_weights=weights, include_last_offset=last)
        result = torch.from_numpy(out)
        device = _device_of(input)
        return result if device.type == "cpu" else result.to(device)

    def extra_repr(self) -> str:
        return f"{self.keyed!r}, mode={self.mode!r}"
