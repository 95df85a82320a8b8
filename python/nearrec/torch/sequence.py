"""TorchRec's ``EmbeddingCollection`` over a store's tables: sequence (unpooled) embeddings,
each id's own row."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from ..errors import IndexOutOfRange, InvalidRequest
from ..request import jagged
from ..store import Store
from .common import _device_of, _features_arg, _not_traced, _table_name
from .configs import _check_configs, _configs, _features
from .ops import _positions, _register
from .tensors import JaggedTensor, _torchrec_class


class EmbeddingCollection(nn.Module):
    """TorchRec's ``EmbeddingCollection`` over a store's tables: unpooled (sequence) embeddings,
    what DIN / DIEN-style behaviour sequences need. ``forward(features)`` takes a
    KeyedJaggedTensor keyed by feature and returns ``{feature: JaggedTensor}``, each id's row
    in order, read where the store keeps it (either tier; one read per table, its features'
    ids together, duplicates read once).

    Tables and features are named as for :class:`EmbeddingBagCollection`: TorchRec's
    ``EmbeddingConfig`` s (``tables=[...]``), ``feature_names={feature: table}``, or one feature
    per table named as the table. A store on a node (:func:`nearrec.connect`) works too.
    """

    def __init__(self, store: Store, tables: Sequence[Any] | None = None,
                 feature_names: Mapping[str, str] | None = None):
        super().__init__()
        if not isinstance(store, Store):
            raise InvalidRequest(f"store must be a nearrec Store, not "
                                 f"{type(store).__name__}")
        if tables is not None and (isinstance(tables, str | bytes)
                                   or not isinstance(tables, Sequence)):
            raise InvalidRequest(f"tables must be a sequence of table names or "
                                 f"EmbeddingConfigs, not {type(tables).__name__} {tables!r:.60}")
        if feature_names is not None and not (isinstance(feature_names, Mapping) and all(
                isinstance(k, str) and isinstance(v, str) for k, v in feature_names.items())):
            raise InvalidRequest(f"feature_names must map str features to str tables, not "
                                 f"{feature_names!r:.60}")
        self._configs: list[Any] | None = None
        if tables is not None and any(not isinstance(t, str) for t in tables):
            self._configs = _configs(tables, feature_names)
            tables = [c.name for c in self._configs]
            feature_names = {f: c.name for c in self._configs for f in c.feature_names}
        self.store = store
        if tables is not None:
            self.tables = [_table_name(t) for t in tables]
        elif feature_names is not None:
            self.tables = list(dict.fromkeys(feature_names.values()))
        else:
            self.tables = list(store.tables)
        for t in self.tables:
            store.table(t)  # an UnknownTable error if missing
        if len(set(self.tables)) != len(self.tables) or not self.tables:
            raise InvalidRequest(f"the collection needs unique tables, not {self.tables}")
        _check_configs(store, self._configs or ())
        #: feature -> the table it reads, in the output's order
        self.feature_names = _features(self.tables, feature_names)
        self.features = list(self.feature_names)
        self.dims = [store.table(self.feature_names[f]).dim for f in self.features]
        self._handle = _register(self)

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)  # type: ignore[no-untyped-call]  # untyped in torch
        self._handle = _register(self)

    def embedding_configs(self) -> list[Any]:
        """TorchRec's ``EmbeddingConfig`` of each table: the configs given, else made from the
        tables (needs torchrec)."""
        if self._configs is not None:
            return list(self._configs)
        try:
            from torchrec.modules.embedding_configs import EmbeddingConfig
        except ImportError as e:
            raise InvalidRequest(f"embedding_configs() makes TorchRec configs: install "
                                 f"torchrec ({e})") from None
        return [EmbeddingConfig(name=t, embedding_dim=self.store.table(t).dim,
                                num_embeddings=self.store.table(t).rows,
                                feature_names=[f for f in self.features
                                               if self.feature_names[f] == t])
                for t in self.tables]

    def forward(self, features: Any) -> dict[str, Any]:
        """Each feature's rows, as nearrec's :class:`JaggedTensor` s — or TorchRec's own when
        ``features`` is TorchRec's KeyedJaggedTensor."""
        out = self._traced(features) if torch.compiler.is_compiling() else self._eager(features)
        cls = _torchrec_class(features, "JaggedTensor")
        if cls is None:
            return out
        return {f: cls(values=j.values(), lengths=j.lengths()) for f, j in out.items()}

    def _traced(self, features: Any) -> dict[str, JaggedTensor]:
        """Under ``torch.compile`` / ``torch.export``: the rows as one ``nearrec`` op over the
        KJT's tensors (its keys are fixed at tracing)."""
        keys = list(features.keys())
        positions = _positions(self, keys)
        lengths = features.lengths()
        batch = lengths.shape[0] // len(keys)
        rows = torch.ops.nearrec.sequence_lookup(
            self._handle, features.values(), lengths, positions, len(keys))
        return {f: JaggedTensor(r, lengths[k * batch:(k + 1) * batch])
                for f, k, r in zip(self.features, positions, rows, strict=True)}

    def _eager(self, features: Any) -> dict[str, JaggedTensor]:
        _not_traced(self)
        _features_arg(features)
        j = jagged(features)
        position = {k: i for i, k in enumerate(j.keys)}
        spans: dict[str, tuple[int, int, int]] = {}  # feature -> (key position, lo, hi)
        for f in self.features:
            if f not in position:
                raise InvalidRequest(f"features have no key {f!r} for table "
                                     f"{self.feature_names[f]!r}", table=self.feature_names[f])
            k = position[f]
            spans[f] = (k, int(j.bounds[k * j.batch]), int(j.bounds[(k + 1) * j.batch]))
        device = _device_of(features.values())
        out: dict[str, JaggedTensor] = {}
        for table in self.tables:
            mine = [f for f in self.features if self.feature_names[f] == table]
            ids = np.concatenate([j.values[spans[f][1]:spans[f][2]] for f in mine])
            try:
                rows = torch.from_numpy(self.store.read_rows(table, ids))
            except IndexOutOfRange as e:
                raise _at_key(e, table, ids, [(f, *spans[f][1:]) for f in mine]) from None
            if device.type != "cpu":
                rows = rows.to(device)
            at = 0
            for f in mine:
                k, lo, hi = spans[f]
                lengths = torch.from_numpy(np.ascontiguousarray(
                    j.lengths[k * j.batch:(k + 1) * j.batch], dtype=np.int64))
                out[f] = JaggedTensor(rows[at:at + hi - lo], lengths.to(device))
                at += hi - lo
        return {f: out[f] for f in self.features}

    def extra_repr(self) -> str:
        return f"features={self.features}"


def _at_key(e: IndexOutOfRange, table: str, ids: Any,
            spans: list[tuple[str, int, int]]) -> IndexOutOfRange:
    """``e``, raised for ``ids`` (``spans``' features' values back to back), with its position
    among the KeyedJaggedTensor's values and the feature named."""
    at = 0
    for feature, lo, hi in spans:
        if e.position is not None and at <= e.position < at + hi - lo:
            position = lo + e.position - at
            return IndexOutOfRange(f"feature {feature!r} (table {table!r}): id "
                                   f"{ids[e.position]} at position {position} of the "
                                   f"KeyedJaggedTensor's values is out of range ({e.message})",
                                   table=table, position=position)
        at += hi - lo
    return e
