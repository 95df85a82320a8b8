"""TorchRec's data types as nearrec's modules take and give them: the ``KeyedJaggedTensor`` a
collection reads, the ``KeyedTensor`` it pools into, the ``JaggedTensor`` s of sequence
embeddings; and TorchRec's own types, given back where the input is TorchRec's."""

from __future__ import annotations

import itertools
import sys
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from ..errors import InvalidRequest, UnknownTable


class KeyedJaggedTensor:
    """A minimal TorchRec ``KeyedJaggedTensor``: per key (feature) a jagged batch of ids, stored
    key-major: ``values`` concatenates every key's bags; ``lengths`` has ``len(keys) * batch``
    entries (or ``offsets`` one more). ``torchrec.KeyedJaggedTensor`` is accepted wherever this
    is."""

    def __init__(self, keys: Sequence[str], values: Tensor, lengths: Tensor | None = None,
                 offsets: Tensor | None = None, weights: Tensor | None = None):
        if (lengths is None) == (offsets is None):
            raise InvalidRequest("KeyedJaggedTensor needs lengths or offsets (exactly one)")
        if isinstance(keys, str) or not isinstance(keys, Sequence) \
                or not all(isinstance(k, str) for k in keys):
            raise InvalidRequest(f"KeyedJaggedTensor keys are a sequence of str, not {keys!r:.60}")
        for what, t in (("values", values), ("lengths", lengths), ("offsets", offsets)):
            if t is not None and not (isinstance(t, Tensor) and t.dim() == 1
                                      and not t.is_floating_point() and t.dtype != torch.bool):
                raise InvalidRequest(f"KeyedJaggedTensor {what} must be a 1-D integer tensor, not "
                                     f"{type(t).__name__} {t!r:.60}")
        bags = (lengths.numel() if lengths is not None
                else offsets.numel() - 1 if offsets is not None else 0)
        if keys and (bags < 0 or bags % len(keys)):
            raise InvalidRequest(f"KeyedJaggedTensor has {bags} bags for {len(keys)} keys: every "
                                 "key needs the same number (one per sample)")
        if weights is not None and not (isinstance(weights, Tensor)
                                        and weights.shape == values.shape):
            raise InvalidRequest("KeyedJaggedTensor weights must be a tensor shaped like values")
        self._keys = list(keys)
        self._values = values
        self._lengths = lengths
        self._offsets = offsets
        self._weights = weights

    def keys(self) -> list[str]:
        return self._keys

    def values(self) -> Tensor:
        return self._values

    def weights_or_none(self) -> Tensor | None:
        return self._weights

    def lengths(self) -> Tensor:
        if self._lengths is None:
            assert self._offsets is not None
            self._lengths = self._offsets[1:] - self._offsets[:-1]
        return self._lengths

    def offsets(self) -> Tensor:
        if self._offsets is None:
            lengths = self.lengths()
            self._offsets = torch.cat([lengths.new_zeros(1), torch.cumsum(lengths, 0)])
        return self._offsets

    def stride(self) -> int:
        n = len(self._keys)
        return self.lengths().numel() // n if n else 0


class KeyedTensor:
    """Pooled output of an :class:`EmbeddingBagCollection`, shaped like TorchRec's KeyedTensor:
    ``values()`` is ``[batch, Σ dim]``; ``kt[key]`` / ``to_dict()`` give per-table views."""

    def __init__(self, keys: Sequence[str], length_per_key: Sequence[int], values: Tensor):
        self._keys = list(keys)
        self._lengths = list(length_per_key)
        self._values = values
        self._offsets: list[int] | None = None  # made when asked for: forward does not need it

    def keys(self) -> list[str]:
        return self._keys

    def values(self) -> Tensor:
        return self._values

    def length_per_key(self) -> list[int]:
        return self._lengths

    def offset_per_key(self) -> list[int]:
        if self._offsets is None:
            self._offsets = [0, *itertools.accumulate(self._lengths)]
        return self._offsets

    def __getitem__(self, key: str) -> Tensor:
        try:
            i = self._keys.index(key)
        except ValueError:
            raise UnknownTable(f"the KeyedTensor has no key {key!r}; it has {self._keys}",
                               table=key if isinstance(key, str) else None) from None
        at = self.offset_per_key()
        return self._values[:, at[i]:at[i + 1]]

    def to_dict(self) -> dict[str, Tensor]:
        return {k: self[k] for k in self._keys}


class JaggedTensor:
    """TorchRec's ``JaggedTensor``, as :class:`EmbeddingCollection` returns it: ``values()`` is
    ``[N, dim]``, the rows of every sample's ids back to back; ``lengths()`` the ids per sample.
    ``to_dense()`` gives each sample's ``[length, dim]`` rows, ``to_padded_dense()`` one
    ``[batch, length, dim]`` tensor."""

    def __init__(self, values: Tensor, lengths: Tensor):
        self._values = values
        self._lengths = lengths

    def values(self) -> Tensor:
        return self._values

    def lengths(self) -> Tensor:
        return self._lengths

    def offsets(self) -> Tensor:
        return torch.cat([self._lengths.new_zeros(1), torch.cumsum(self._lengths, 0)])

    def weights_or_none(self) -> Tensor | None:
        return None

    def to_dense(self) -> list[Tensor]:
        return list(torch.split(self._values, self._lengths.tolist()))

    def to_padded_dense(self, desired_length: int | None = None,
                        padding_value: float = 0.0) -> Tensor:
        """``[batch, desired_length, dim]`` (the longest sample's length by default): longer
        samples cut, shorter ones padded with ``padding_value``."""
        return self.padded(desired_length, padding_value)[0]

    def padded(self, desired_length: int | None = None,
               padding_value: float = 0.0) -> tuple[Tensor, Tensor]:
        """:meth:`to_padded_dense` and its mask, ``[batch, length]``: True where a sample has a
        row (what attention over a sequence sums over)."""
        lengths = self._lengths.to(torch.int64)
        values = self._values
        batch, total, dim = lengths.numel(), values.shape[0], values.shape[1]
        n = desired_length if desired_length is not None else \
            int(lengths.max()) if batch else 0
        starts = torch.cumsum(lengths, 0) - lengths
        sample = torch.repeat_interleave(torch.arange(batch, device=lengths.device), lengths,
                                         output_size=total)
        at = torch.arange(total, device=lengths.device) - starts[sample]
        # rows past the length go to one slot beyond the output, dropped (no data-dependent
        # shapes: this traces under torch.compile)
        slot = torch.where(at < n, sample * n + at, batch * n)
        out = values.new_full((batch * n + 1, dim), padding_value)
        out.index_copy_(0, slot, values)
        out = out[:batch * n].view(batch, n, dim)
        mask = torch.arange(n, device=lengths.device)[None, :] < lengths[:, None]
        return out, mask


def _torchrec_class(features: Any, name: str) -> Any:
    """TorchRec's class ``name`` (``KeyedTensor``, ``JaggedTensor``) when ``features`` is
    TorchRec's KeyedJaggedTensor — the types its own collections answer it with — else None."""
    module = type(features).__module__
    return getattr(sys.modules.get(module), name, None) if module.startswith("torchrec.") \
        else None


def _keyed_like(features: Any, out: KeyedTensor) -> Any:
    cls = _torchrec_class(features, "KeyedTensor")
    if cls is None:
        return out
    return cls(keys=out.keys(), length_per_key=out.length_per_key(), values=out.values())
