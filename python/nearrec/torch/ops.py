"""The ``nearrec::`` custom ops that ``torch.compile`` and ``torch.export`` see in place of the
collections' reads, each collection found by a handle, and where a traced lookup's features
are among its KeyedJaggedTensor's keys."""

from __future__ import annotations

import itertools
import weakref
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from ..errors import InvalidRequest
from .tensors import KeyedJaggedTensor

# Collections by handle, for the custom ops: an op takes tensors and numbers, not modules.
_collections: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()
_handles = itertools.count(1)


def _register(collection: nn.Module) -> int:
    """A new handle naming ``collection`` for the custom ops."""
    handle = next(_handles)
    _collections[handle] = collection
    return handle


def _by_handle(handle: int, positions: Sequence[int], num_keys: int, values: Tensor,
               lengths: Tensor, weights: Tensor | None = None) -> tuple[Any, Any]:
    """The collection ``handle`` names and the KeyedJaggedTensor an op's tensors make (its
    features at ``positions`` among ``num_keys`` keys)."""
    collection = _collections.get(handle)
    if collection is None:
        raise InvalidRequest(f"no nearrec collection has handle {handle} in this process (the "
                             "program outlived its module, or came from another process)")
    keys = [f"\0unused {k}" for k in range(num_keys)]
    for feature, k in zip(collection.features, positions, strict=True):
        keys[k] = feature
    return collection, KeyedJaggedTensor(keys, values, lengths, weights=weights)


@torch.library.custom_op("nearrec::pooled_lookup", mutates_args=())
def pooled_lookup(handle: int, values: Tensor, lengths: Tensor, weights: Tensor | None,
                  positions: Sequence[int], num_keys: int) -> Tensor:
    """The pooled lookup of the :class:`EmbeddingBagCollection` ``handle`` names, as one op that
    ``torch.compile`` and ``torch.export`` keep whole: a KeyedJaggedTensor's ``values``,
    ``lengths`` and ``weights`` over ``num_keys`` keys, the collection's features at
    ``positions`` among them. Returns ``[batch, Σ dim]``."""
    collection, features = _by_handle(handle, positions, num_keys, values, lengths, weights)
    out: Tensor = collection._eager(features).values().clone()
    return out


@pooled_lookup.register_fake
def _(handle: int, values: Tensor, lengths: Tensor, weights: Tensor | None,
      positions: Sequence[int], num_keys: int) -> Tensor:
    collection = _collections[handle]
    return values.new_empty((lengths.shape[0] // num_keys, sum(collection.dims)),
                            dtype=torch.float32)


@torch.library.custom_op("nearrec::sequence_lookup", mutates_args=())
def sequence_lookup(handle: int, values: Tensor, lengths: Tensor, positions: Sequence[int],
                    num_keys: int) -> list[Tensor]:
    """The rows of the :class:`EmbeddingCollection` ``handle`` names, as one op that
    ``torch.compile`` and ``torch.export`` keep whole: per feature (at ``positions`` among the
    KeyedJaggedTensor's ``num_keys`` keys) ``[its ids, dim]``, each id's row in order."""
    collection, features = _by_handle(handle, positions, num_keys, values, lengths)
    out = collection._eager(features)
    return [out[f].values().clone() for f in collection.features]


@sequence_lookup.register_fake
def _(handle: int, values: Tensor, lengths: Tensor, positions: Sequence[int],
      num_keys: int) -> list[Tensor]:
    # how many ids a feature has is in its lengths' values: a size known only when it runs
    ctx = torch.library.get_ctx()
    return [values.new_empty((ctx.new_dynamic_size(), d), dtype=torch.float32)
            for d in _collections[handle].dims]


def _positions(collection: Any, keys: list[str]) -> list[int]:
    """Where each of the collection's features is among a KJT's ``keys`` (traced lookups, whose
    keys are fixed at tracing); a feature the KJT lacks is a typed error naming its table."""
    missing = [f for f in collection.features if f not in keys]
    if missing:
        table = collection.feature_names[missing[0]]
        raise InvalidRequest(f"features have no key {missing[0]!r} for table {table!r}",
                             table=table)
    return [keys.index(f) for f in collection.features]
