"""A model kept with its store's tables (:func:`save`) and read back from them (:func:`load`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from .._native import model_save
from ..capture import Captured
from ..errors import InvalidRequest
from ..request import path_arg
from ..store import Store
from ..torch import EmbeddingBagCollection
from .catalog import build
from .families import Offloaded, _Model

#: The attachments :func:`save` writes: the model's configuration and its dense weights.
CONFIG_ATTACHMENT = "model.json"
WEIGHTS_ATTACHMENT = "dense.npz"


def kept(model: nn.Module, example: tuple[Tensor | None, Any] | None = None
         ) -> tuple[dict[str, Any], dict[str, np.ndarray], int]:
    """What :func:`save` keeps of ``model`` — its configuration and dense weights — and its
    dense features per sample: what :func:`rebuild` makes the model again from, over any store
    of the same tables (``nearrec.ray.serve_model`` sends it to its replicas). ``model`` is one
    of nearrec's models, or any model :func:`offload` takes (its :class:`Offloaded` form, or
    the module and ``example`` to capture it on: a TorchRec DLRM after ``from_torchrec``, a
    model of your own)."""
    if isinstance(model, nn.Module) and not isinstance(model, _Model):
        offloaded = model if isinstance(model, Offloaded) else Offloaded(model, example)
        if offloaded.captured is not None:
            return (offloaded.captured.config(), dict(offloaded.captured.weights),
                    int(offloaded.native.dense_width))
        model = offloaded.model
    if not isinstance(model, _Model):
        raise InvalidRequest(f"a kept model is a torch module, not {type(model).__name__}")
    return model.kept_config(), dict(model.dense_weights()), int(model.dense_features)


def save(model: nn.Module, store: str | Path | Store,
         example: tuple[Tensor | None, Any] | None = None) -> None:
    """Keeps ``model``'s configuration and dense weights with the store's tables (two
    attachments, written atomically and checksummed by the engine; see :func:`nearrec.attach`),
    so :func:`load` rebuilds it from the store alone and :meth:`nearrec.Store.infer` runs it
    with no Python model at all. Weights go as a numpy ``.npz`` (no pickle).

    ``model`` is one of nearrec's models, or any model :func:`offload` takes (its
    :class:`Offloaded` form, or the module and ``example`` to capture it on): then the captured
    program is kept, and ``store.infer(dense, features)`` takes features keyed by the model's
    features."""
    path = store.info.path if isinstance(store, Store) else Path(path_arg(store, "the store"))
    if not isinstance(model, nn.Module):
        raise InvalidRequest(f"save takes a torch module, not {type(model).__name__}")
    if not isinstance(model, _Model | Offloaded):
        model = Offloaded(model, example)
    if isinstance(model, Offloaded) and model.captured is not None and \
            Path(model.store.info.path).resolve() != Path(path).resolve():
        raise InvalidRequest(f"the model reads the store at {model.store.info.path}, not "
                             f"{path}: keep it with the store it reads")
    config, weights, _ = kept(model)
    model_save(str(path), json.dumps(config), list(weights.items()))


def load(store: Store, **collection: Any) -> nn.Module:
    """The model :func:`save` kept with ``store``'s tables, its sparse part over ``store``
    (``collection`` as for :func:`build`): one of nearrec's models, or for a captured model its
    :class:`Offloaded` form, which runs in the engine. ``store`` is any store: embedded, a
    node's (``nearrec.connect``) or a sharded one (the model read from a shard). The
    attachments are read and checked by the engine (``nearrec::SavedModel``): a store that
    keeps none is an :class:`~nearrec.errors.InvalidRequest` (a sharded store whose shards keep
    none, :class:`~nearrec.errors.Unsupported`), damaged ones a
    :class:`~nearrec.errors.StoreCorrupted`."""
    if not isinstance(store, Store):
        raise InvalidRequest(f"load takes an open nearrec.Store, not {type(store).__name__}")
    raw, arrays = store._native.saved_model()
    return rebuild(store, json.loads(raw), dict(arrays), **collection)


def rebuild(store: Store, config: dict[str, Any], weights: dict[str, np.ndarray],
            **collection: Any) -> nn.Module:
    """The model of ``config`` (a model's ``kept_config()``, or what :func:`save` kept) with its
    dense ``weights``, its sparse part over ``store``: a model moved to another store of the
    same tables (a Ray Serve replica's, over a sharded store: ``nearrec.ray.serve_model``)."""
    if config["model"] == "graph":
        return _load_graph(store, config, weights)
    model = build(config["model"], store, variant=config["variant"],
                  interaction=config["interaction"], tasks=config["tasks"],
                  sequence=config.get("sequence", False), **collection)
    state = {k: torch.from_numpy(v) for k, v in weights.items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if not k.startswith("sparse.")]
    if missing or unexpected:
        raise InvalidRequest(f"the stored weights do not fit {config['model']}: missing "
                             f"{missing[:3]}, unexpected {unexpected[:3]}")
    return model


def _load_graph(store: Store, config: dict[str, Any], weights: dict[str, np.ndarray]
                ) -> Offloaded:
    """A captured model kept with ``store``: collections over it, one per run of features
    grouped by table as a collection groups them, and the program."""
    features, tables, pooling = config["features"], config["tables"], config["pooling"]
    groups: list[list[int]] = []
    for i, t in enumerate(tables):
        seen = [tables[j] for j in groups[-1]] if groups else []
        if not groups or (t in seen and seen[-1] != t):
            groups.append([])
        groups[-1].append(i)
    collections = [EmbeddingBagCollection(
        store, list(dict.fromkeys(tables[i] for i in g)),
        feature_names={features[i]: tables[i] for i in g},
        pooling={tables[i]: pooling[i] for i in g}) for g in groups]
    captured = Captured(config["graph"], weights, collections, features, tables, pooling,
                        [d for c in collections for d in c.dims])
    return Offloaded(nn.ModuleList(collections), captured=captured)
