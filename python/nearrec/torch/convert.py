"""``from_torchrec``: a copy of a module whose TorchRec collections are nearrec's, over a store
written from their tables."""

from __future__ import annotations

import copy
import dataclasses
from collections import Counter
from typing import Any

from torch import nn

from ..build import from_numpy
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
    collection's place in ``module``."""
    try:
        from torchrec.modules.embedding_modules import (
            EmbeddingBagCollection as TorchRecCollection,
        )
    except ImportError as e:
        raise InvalidRequest(f"from_torchrec needs torchrec: {e}") from None
    if not isinstance(module, nn.Module):
        raise InvalidRequest(f"from_torchrec takes a torch module, not {type(module).__name__}")
    found = [(name, m) for name, m in module.named_modules()
             if isinstance(m, TorchRecCollection)]
    if not found:
        raise InvalidRequest(f"{type(module).__name__} holds no TorchRec EmbeddingBagCollection")
    counts = Counter(c.name for _, m in found for c in m.embedding_bag_configs())
    arrays: dict[str, Any] = {}
    collections: list[tuple[Any, list[Any]]] = []
    for name, m in found:
        configs = []
        for c in m.embedding_bag_configs():
            table = c.name if counts[c.name] == 1 else f"{name or 'module'}.{c.name}"
            arrays[table] = m.embedding_bags[c.name].weight.detach().cpu().numpy()
            configs.append(dataclasses.replace(c, name=table))
        collections.append((m, configs))
    from_numpy(path, arrays, dtype, overwrite=overwrite)
    store = open_store(path, **open_options)
    # the copy takes nearrec's collection where the module has TorchRec's
    memo: dict[int, Any] = {id(m): EmbeddingBagCollection(store, configs,
                                                          is_weighted=m.is_weighted())
                            for m, configs in collections}
    return copy.deepcopy(module, memo)
