""":func:`build`: a benchmark model by its spec's name, over a store's tables."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..errors import InvalidRequest
from ..request import count
from ..specs import Variant, model_spec
from ..store import Store
from ..torch import EmbeddingBagCollection
from .families import DLRM, NCF, MultiTaskWideAndDeep, WideAndDeep, _Model
from .sequence import DIEN, DIN, SequenceSparse


def build(name: str, store: Store | None, seed: int = 0,
          variant: Variant = "deeprecsys",
          interaction: str = "cat", tasks: int = 1, sparse: nn.Module | None = None,
          sequence: bool = False, **collection: Any) -> _Model:
    """Model ``name`` over ``store``'s tables ``t0``, ``t1``, ... (as :func:`nearrec.build` makes
    them), dense layers initialised from ``seed``. ``sparse`` replaces the sparse part (any module
    mapping a ``KeyedJaggedTensor`` to a ``KeyedTensor``); ``collection`` goes to
    :class:`~nearrec.torch.EmbeddingBagCollection` (``device``, ``hbm_budget``, ...).
    ``sequence=True`` (DIN, DIEN) reads the behaviour tables as sequences
    (:class:`SequenceSparse`) rather than sum-pooled as DeepRecInfra's spec has them."""
    spec = model_spec(name)
    if variant not in ("deeprecsys", "recssd"):
        raise InvalidRequest(f"variant must be 'deeprecsys' or 'recssd', not {variant!r}")
    if interaction not in ("cat", "dot"):
        raise InvalidRequest(f"interaction must be 'cat' or 'dot', not {interaction!r}")
    seed = count(seed, "seed", 0, 2**63 - 1)
    tasks = count(tasks, "tasks")
    if sequence and spec.name not in ("din", "dien"):
        raise InvalidRequest(f"{spec.name} has no behaviour sequences (sequence=True is for "
                             "DIN and DIEN)")
    dim = spec.table_dim(variant)
    tables = [f"t{i}" for i in range(len(spec.table_rows(variant)))]
    if sparse is None:
        if store is None:
            raise InvalidRequest("give a store or a sparse module")
        if not isinstance(store, Store):
            raise InvalidRequest(f"store is an open nearrec.Store, not "
                                 f"{type(store).__name__}")
        missing = [t for t in tables if t not in store.tables]
        if missing:
            raise InvalidRequest(f"the store lacks {spec.name}'s tables {missing[:3]}... (build "
                                 f"it with nearrec.build(path, {spec.name!r}))")
        wrong = [t for t in tables if store.table(t).dim != dim]
        if wrong:
            raise InvalidRequest(f"{spec.name} needs dim {dim}; table {wrong[0]!r} has "
                                 f"{store.table(wrong[0]).dim}", table=wrong[0])
        if sequence:
            behaviour = tables[1:-2] if spec.name == "din" else tables[:DIEN.STEPS]
            sparse = SequenceSparse(store, [t for t in tables if t not in behaviour], behaviour,
                                    **collection)
        else:
            sparse = EmbeddingBagCollection(store, tables, **collection)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model: _Model
        if spec.name in ("rmc1", "rmc2", "rmc3"):
            bottom = (128, 64, 64) if spec.name == "rmc2" and variant == "recssd" else None
            model = DLRM(spec, sparse, tables, interaction, bottom)
        elif spec.name == "wnd":
            model = WideAndDeep(spec, sparse, tables)
        elif spec.name == "mtwnd":
            model = MultiTaskWideAndDeep(spec, sparse, tables, tasks)
        elif spec.name == "ncf":
            model = NCF(spec, sparse, tables, dim)
        elif spec.name == "din":
            model = DIN(spec, sparse, tables, dim)
        else:
            model = DIEN(spec, sparse, tables, dim)
    model.variant = variant
    return model.eval()
