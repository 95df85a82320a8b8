"""A collection's tables and features, as its arguments name them: TorchRec's configs checked
against the store, the feature -> table mapping, each table's pooling."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..errors import InvalidRequest, UnknownTable
from ..request import mode_name
from ..store import PoolingModeName


def _check_configs(store: Any, configs: Sequence[Any]) -> None:
    """Each config's dim and rows (a keyed table's keys) are its store table's."""
    for c in configs:
        have = store.table(c.name)
        for what, want, got in (("dim", c.embedding_dim, have.dim),
                                ("rows", c.num_embeddings, have.entries)):
            if want != got:
                raise InvalidRequest(f"table {c.name!r}: its config has {what} {want}, the "
                                     f"store's table {got}", table=c.name)


def _features(tables: list[str], feature_names: Mapping[str, str] | None) -> dict[str, str]:
    """Feature -> table, grouped by table in ``tables``' order (TorchRec's output order); one
    feature per table, named as it, without a mapping. Every table needs a feature."""
    mapping = dict(feature_names) if feature_names else {t: t for t in tables}
    unknown = [t for t in mapping.values() if t not in tables]
    if unknown:
        raise UnknownTable(f"feature_names maps features to tables {unknown} the collection "
                           f"does not have (it has {tables})", table=unknown[0])
    out = {f: t for t in tables for f, ft in mapping.items() if ft == t}
    missing = [t for t in tables if t not in out.values()]
    if missing:
        raise InvalidRequest(f"feature_names maps no feature to tables {missing}",
                             table=missing[0])
    return out


def _is_config(c: Any) -> bool:
    return all(hasattr(c, a) for a in ("name", "embedding_dim", "num_embeddings",
                                       "feature_names"))


def _configs(tables: Sequence[Any], feature_names: Any, pooling: Any = "sum") -> list[Any]:
    """TorchRec ``EmbeddingBagConfig`` s checked: names, features, no second source of what
    they say."""
    for i, c in enumerate(tables):
        if not _is_config(c):
            raise InvalidRequest(f"tables are table names or TorchRec EmbeddingBagConfigs (name, "
                                 f"embedding_dim, num_embeddings, feature_names), not "
                                 f"{type(c).__name__} {c!r:.60} at position {i}", position=i)
        if not isinstance(c.name, str) or isinstance(c.feature_names, str) or not all(
                isinstance(f, str) for f in c.feature_names):
            raise InvalidRequest(f"config {i}: name and feature_names must be str and a list of "
                                 f"str, not {c.name!r:.40} and {c.feature_names!r:.40}",
                                 position=i)
        if not c.feature_names:
            raise InvalidRequest(f"table {c.name!r}: its config names no feature", table=c.name)
    if feature_names is not None:
        raise InvalidRequest("the configs name each table's features: pass feature_names only "
                             "with table names")
    if pooling != "sum":
        raise InvalidRequest("the configs give each table's pooling: pass pooling only with "
                             "table names")
    seen: dict[str, str] = {}
    for c in tables:
        for f in c.feature_names:
            if f in seen:
                raise InvalidRequest(f"feature {f!r} is named by tables {seen[f]!r} and "
                                     f"{c.name!r}: a feature reads one table", table=c.name)
            seen[f] = c.name
    return list(tables)


def _pooling(p: Any, table: str) -> PoolingModeName:
    """``"sum"`` / ``"mean"`` / ``"max"``, or TorchRec's ``PoolingType.SUM`` / ``MEAN``."""
    name = p.name.lower() if hasattr(p, "name") and not isinstance(p, str) else p
    if name == "none":
        raise InvalidRequest(f"table {table!r}: pooling NONE is a sequence embedding, which an "
                             "EmbeddingBagCollection does not pool", table=table)
    return mode_name(name, table, "pooling")
