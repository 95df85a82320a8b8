"""``from_torchrec``: a copy of a module whose TorchRec collections are nearrec's, over a store
written from their tables."""

from __future__ import annotations

import copy
import dataclasses
from collections import Counter
from typing import Any

from torch import nn

from ..build import _build, _dtypes, _Hash, _managed_slots
from ..errors import InvalidRequest
from ..manifest import StorePath
from ..store import open_store
from .collection import EmbeddingBagCollection


def from_torchrec(module: nn.Module, path: StorePath, *, dtype: str = "fp32",
                  overwrite: bool = False, **open_options: Any) -> nn.Module:
    """A copy of ``module`` — a TorchRec ``EmbeddingBagCollection`` or any module holding them
    (``torchrec.models.dlrm.DLRM``, a model of your own) — whose collections are nearrec's, with
    the same ``forward``: every table is written to a new store at ``path`` (rows stored as
    ``dtype``; ``overwrite`` replaces a store there) and served as ``open_options`` ask
    (``nearrec.open``'s: e.g. ``tier="ssd", dram_budget="1GiB"``). The module itself is left
    as it was; its other parts are copied. A table keeps its config's name unless two
    collections both have one of that name: then it is stored as ``PATH.NAME``, ``PATH`` the
    collection's place in ``module``.

    A ``ManagedCollisionEmbeddingBagCollection`` (TorchRec's managed-collision / ZCH tables,
    ``MCHManagedCollisionModule``) becomes a keyed table per table: its keys the raw ids the
    module has given slots (``_mch_sorted_raw_ids``), each with its slot's row
    (``_mch_remapped_ids_mapping``), and its default row — what TorchRec pools for an id it
    holds no slot for — the table's last slot, served under ``unknown_keys="default"``. The
    copy answers as TorchRec's module does in eval mode (ids hashed first by the module's
    ``input_hash_func``, when it has one); the ids it holds are those of the conversion, and new
    ones come by writing them to the store (a writable store's keyed tables take writes by key).

    A quantised collection (``torchrec.quant.EmbeddingBagCollection``, from
    ``quantize_inference_model`` or ``quantize_embeddings``) keeps its tables' dtypes — int8,
    int4, int2 (and fp16 / fp32 tables beside them) — and its bytes, taken as they are, not
    quantised again (``dtype`` is for float collections); the copy pools as TorchRec's quantised
    forward does, bit for bit on the DRAM tier. Other data types (TorchRec's NFP8, BF16) and
    outputs other than float32 are refused, naming the table.
    """
    try:
        from torchrec.modules.embedding_modules import (
            EmbeddingBagCollection as TorchRecCollection,
        )
        from torchrec.modules.mc_embedding_modules import (
            ManagedCollisionEmbeddingBagCollection as TorchRecManaged,
        )
        from torchrec.quant.embedding_modules import (
            EmbeddingBagCollection as TorchRecQuantized,
        )
    except ImportError as e:
        raise InvalidRequest(f"from_torchrec needs torchrec: {e}") from None
    if not isinstance(module, nn.Module):
        raise InvalidRequest(f"from_torchrec takes a torch module, not {type(module).__name__}")
    managed = [(name, m) for name, m in module.named_modules() if isinstance(m, TorchRecManaged)]
    inner = {id(m._embedding_module) for _, m in managed}
    found = [(name, m) for name, m in module.named_modules()
             if isinstance(m, TorchRecCollection | TorchRecQuantized) and id(m) not in inner]
    if not found and not managed:
        raise InvalidRequest(f"{type(module).__name__} holds no TorchRec EmbeddingBagCollection")
    collections_of = [(n, m) for n, m in found] + [(n, m._embedding_module) for n, m in managed]
    counts = Counter(c.name for _, m in collections_of for c in m.embedding_bag_configs())

    def table_name(name: str, c: Any) -> str:
        return c.name if counts[c.name] == 1 else f"{name or 'module'}.{c.name}"

    #: each table's rows: (encoded, float rows or a quantised collection's bytes)
    arrays: dict[str, tuple[bool, Any]] = {}
    #: the dtypes of a quantised collection's tables, which keep theirs
    kept: dict[str, str] = {}
    #: (the module, its tables' configs, weighted, its features' hashes: None unless managed)
    collections: list[tuple[Any, list[Any], bool, dict[str, _Hash] | None]] = []
    for name, m in found:
        configs = []
        quantized = isinstance(m, TorchRecQuantized)
        if quantized:
            _check_output(m, name)
            state = m.state_dict()
        for c in m.embedding_bag_configs():
            table = table_name(name, c)
            if quantized:
                kept[table], rows = _quantized_rows(state[f"embedding_bags.{c.name}.weight"], c,
                                                    table)
                arrays[table] = (True, rows)
            else:
                arrays[table] = (False, m.embedding_bags[c.name].weight.detach().cpu().numpy())
            configs.append(dataclasses.replace(c, name=table))
        collections.append((m, configs, m.is_weighted(), None))
    keys: dict[str, Any] = {}
    defaults: dict[str, Any] = {}
    #: a managed table's room: as many keys as its module has slots (a live store then takes
    #: the keys the module admits later, as a Publisher's deltas bring them)
    capacity: dict[str, int] = {}
    for name, m in managed:
        configs, hashes = [], {}
        ebc = m._embedding_module
        for c in ebc.embedding_bag_configs():
            table = table_name(name, c)
            weight = ebc.embedding_bags[c.name].weight.detach().cpu().numpy()
            ids, slots, default, hash_ = _managed_slots(m, c.name, table)
            arrays[table] = (False, weight[slots])
            keys[table], defaults[table] = ids, weight[default]
            capacity[table] = max(len(ids), default + 1)
            configs.append(dataclasses.replace(c, name=table, num_embeddings=len(ids)))
            if hash_ is not None:
                hashes.update(dict.fromkeys(c.feature_names, hash_))
        collections.append((m, configs, ebc.is_weighted(), hashes))
    floats = [t for t in arrays if t not in kept]
    _build(path, arrays, {**_dtypes(dtype, floats), **kept}, "torchrec", keys=keys,
           capacity=capacity, default_rows=defaults, overwrite=overwrite)
    if keys:
        by_table = dict(open_options.get("unknown_keys_by_table") or {})
        open_options["unknown_keys_by_table"] = {**dict.fromkeys(keys, "default"), **by_table}
    store = open_store(path, **open_options)
    # the copy takes nearrec's collection where the module has TorchRec's
    memo: dict[int, Any] = {}
    for m, configs, weighted, hashed in collections:
        ebc = EmbeddingBagCollection(store, configs, is_weighted=weighted)
        memo[id(m)] = ebc if hashed is None else ManagedCollisionEmbeddingBagCollection(ebc,
                                                                                         hashed)
    return copy.deepcopy(module, memo)


#: TorchRec's data types of a quantised collection's tables, as nearrec's dtypes
_QUANTIZED = {"INT8": "int8", "INT4": "int4", "INT2": "int2", "FP16": "fp16", "FP32": "fp32"}


def _check_output(module: Any, name: str) -> None:
    """A quantised collection whose outputs nearrec's match: float32 (the default)."""
    import torch

    out = getattr(module, "_output_dtype", torch.float)
    if out != torch.float:
        raise InvalidRequest(f"{name or 'the module'}: a quantised collection pooling to {out} "
                             f"is not served (nearrec pools to float32; quantise with "
                             f"output_dtype=torch.float)")


def _quantized_rows(weight: Any, config: Any, table: str) -> tuple[str, Any]:
    """A table of TorchRec's quantised collection (``torchrec.quant.EmbeddingBagCollection``)
    in nearrec's bytes, taken as they are: its dtype and its rows, uint8 ``[rows, row_bytes]``.

    TorchRec keeps FBGEMM's TBE rows: a row-wise quantised row is an fp16 scale and bias, then
    the codes, then padding to the row alignment; nearrec's rows put the codes first (int8's
    scale and bias as fp32, which holds the fp16 values exactly)."""
    import numpy as np
    import torch

    kind = getattr(config.data_type, "name", str(config.data_type))
    dtype = _QUANTIZED.get(kind)
    if dtype is None:
        raise InvalidRequest(f"table {table!r}: TorchRec's {kind} rows are not served (nearrec "
                             f"takes {', '.join(_QUANTIZED)} quantised collections)", table=table)
    if weight.dtype != torch.uint8:
        raise InvalidRequest(f"table {table!r}: a quantised table's weight is uint8 bytes, not "
                             f"{weight.dtype}", table=table)
    raw = weight.view(torch.uint8).detach().cpu().contiguous().numpy()  # UInt4/UInt2Tensor too
    rows, dim = config.num_embeddings, config.embedding_dim
    bits = {"int8": 8, "int4": 4, "int2": 2}.get(dtype)
    codes = dim * (bits or 8 * {"fp16": 2, "fp32": 4}[dtype]) // 8
    head = 4 if bits else 0  # the fp16 scale and bias before a row-wise row's codes
    if raw.ndim != 2 or raw.shape[0] != rows or raw.shape[1] < head + codes or (
            bits and dim % (8 // bits)):
        raise InvalidRequest(f"table {table!r}: its {kind} weight of shape {tuple(raw.shape)} "
                             f"does not hold {rows} rows of {dim} values ({head} bytes of scale "
                             f"and bias, then {codes} of values, a row)", table=table)
    if not bits:
        return dtype, np.ascontiguousarray(raw[:, :codes])
    scale_bias = raw[:, :head]
    if dtype == "int8":  # fp16 → fp32, exactly
        scale_bias = scale_bias.copy().view(np.float16).astype(np.float32).view(np.uint8)
    out = np.concatenate([raw[:, head:head + codes], scale_bias], axis=1)
    finite = np.isfinite(scale_bias.view(np.float16 if dtype != "int8" else np.float32))
    if not finite.all():
        row = int(np.argmin(finite.all(axis=1)))
        raise InvalidRequest(f"table {table!r}: row {row}'s scale and bias are not finite",
                             table=table, position=row)
    return dtype, out


class ManagedCollisionEmbeddingBagCollection(nn.Module):
    """What :func:`from_torchrec` makes of TorchRec's ``ManagedCollisionEmbeddingBagCollection``:
    its features' raw ids (hashed by the module's ``input_hash_func`` where it had one) looked up
    in keyed tables by ``collection``; ``forward`` answers ``(pooled, None)`` as TorchRec's
    does."""

    def __init__(self, collection: EmbeddingBagCollection, hashes: dict[str, _Hash]):
        super().__init__()
        self.collection = collection
        self._hashes = hashes

    def forward(self, features: Any) -> tuple[Any, None]:
        if self._hashes:
            features = _hashed(features, self._hashes)
        return self.collection(features), None


def _hashed(features: Any, hashes: dict[str, _Hash]) -> Any:
    """``features`` (a TorchRec KJT) with each feature in ``hashes`` hashed by its function."""
    from torchrec.sparse.jagged_tensor import JaggedTensor, KeyedJaggedTensor

    per = features.to_dict()
    out = {}
    for key, jt in per.items():
        fn = hashes.get(key)
        values = jt.values() if fn is None else fn(jt.values())
        out[key] = JaggedTensor(values=values, lengths=jt.lengths(),
                                weights=jt.weights_or_none())
    return KeyedJaggedTensor.from_jt_dict(out)
