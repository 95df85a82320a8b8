"""What every model shares (``_Model``), the families the engine can also run whole (DLRM for
RMC1–3, WND, MTWND, NCF), and whole-model offload (:class:`Offloaded`, :func:`offload`).

They share a module because each needs the other: ``_Model.offload()`` makes an
:class:`Offloaded`, and an :class:`Offloaded` tells nearrec's models (``_Model``) from the user's
and builds the engine's twin of DLRM, WND, MTWND or NCF. Modules of a package import one another
without cycles (``[tool.importlinter]``)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from .._native import NativeModel
from ..capture import Captured, capture
from ..errors import InvalidRequest
from ..request import TableLookup
from ..specs import ModelSpec, Variant
from ..store import Store, dense_features
from ..torch import EmbeddingBagCollection, KeyedTensor, _features_arg
from .layers import Stages, _mark, mlp


class _Model(nn.Module):
    """What every model shares: its spec, its sparse part, and the pooled vectors by table."""

    def __init__(self, spec: ModelSpec, sparse: nn.Module, tables: Sequence[str]):
        super().__init__()
        self.spec = spec
        self.variant: Variant = "deeprecsys"
        self.sparse = sparse
        self.table_names = list(tables)
        #: dense features per sample (0: none)
        self.dense_features = spec.dense_features

    def offload(self) -> Offloaded:
        """This model run whole by its store's engine (:func:`offload`)."""
        return Offloaded(self)

    def kept_config(self) -> dict[str, Any]:
        """``nearrec::model::ModelConfig`` of this model: what :func:`save` keeps with the
        store, and what the engine builds its dense part from."""
        return {"model": self.spec.name, "variant": self.variant,
                "interaction": getattr(self, "interaction", "cat"),
                "tasks": len(getattr(self, "heads", [])) or 1, "tables": list(self.table_names),
                "sequence": bool(getattr(self.sparse, "reads_sequences", False))}

    def dense_weights(self) -> list[tuple[str, np.ndarray]]:
        """The ``state_dict`` without the sparse part, as float32 arrays."""
        return [(k, np.ascontiguousarray(v.detach().cpu().float().numpy()))
                for k, v in self.state_dict().items() if not k.startswith("sparse.")]

    def pooled(self, features: Any) -> list[Tensor]:
        """The sparse part: each table's pooled vectors."""
        out: KeyedTensor = self.sparse(features)
        return [out[t] for t in self.table_names]

    def forward(self, dense: Tensor | None, features: Any) -> Tensor:
        return self.dense_part(dense, self.pooled(features))

    def dense_part(self, dense: Tensor | None, pooled: list[Tensor],
                   stages: Stages | None = None) -> Tensor:
        """Everything after the embeddings, from the pooled vectors; with ``stages``, the time
        of each stage (DLRM: ``bottom_mlp``, ``interaction``, ``top_mlp``; the others:
        ``dense_mlp``) is added there."""
        raise NotImplementedError


def _need(dense: Tensor | None) -> Tensor:
    if dense is None:
        raise InvalidRequest("this model needs dense features")
    return dense


class DLRM(_Model):
    """RMC1 / RMC2 / RMC3: bottom MLP over the dense features, interaction with the pooled
    vectors, top MLP to one sigmoid unit."""

    lower: Tensor  # the (row, column) pairs of the strictly lower triangle, for "dot"

    def __init__(self, spec: ModelSpec, sparse: nn.Module, tables: Sequence[str],
                 interaction: str = "cat", bottom: Sequence[int] | None = None):
        super().__init__(spec, sparse, tables)
        if interaction not in ("cat", "dot"):
            raise InvalidRequest(f"interaction must be 'cat' or 'dot', not {interaction!r}")
        self.interaction = interaction
        bottom = tuple(bottom or spec.bottom_mlp)
        self.dense_features = bottom[0]
        self.bottom = mlp(bottom)
        n = len(tables) + 1
        top_in = n * bottom[-1] if interaction == "cat" else bottom[-1] + n * (n - 1) // 2
        self.top = mlp((top_in, *spec.top_mlp[1:]), last="sigmoid")
        self.register_buffer("lower", torch.tril_indices(n, n, offset=-1), persistent=False)

    def dense_part(self, dense: Tensor | None, pooled: list[Tensor],
                   stages: Stages | None = None) -> Tensor:
        x = self.bottom(_need(dense))
        _mark(stages, "bottom_mlp")
        vectors = [x, *pooled]
        if self.interaction == "cat":
            z = torch.cat(vectors, dim=1)
        else:
            t = torch.stack(vectors, dim=1)  # [batch, n, dim]
            dots = torch.bmm(t, t.transpose(1, 2))
            z = torch.cat([x, dots[:, self.lower[0], self.lower[1]]], dim=1)
        _mark(stages, "interaction")
        out: Tensor = self.top(z)
        _mark(stages, "top_mlp")
        return out


class WideAndDeep(_Model):
    """WND: the pooled vectors and the dense features concatenated, one MLP to a sigmoid."""

    def __init__(self, spec: ModelSpec, sparse: nn.Module, tables: Sequence[str]):
        super().__init__(spec, sparse, tables)
        self.top = mlp(spec.top_mlp, last="sigmoid")

    def dense_part(self, dense: Tensor | None, pooled: list[Tensor],
                   stages: Stages | None = None) -> Tensor:
        out: Tensor = self.top(torch.cat([*pooled, _need(dense)], dim=1))
        _mark(stages, "dense_mlp")
        return out


class MultiTaskWideAndDeep(_Model):
    """MTWND: a shared 1888-1024-512 trunk, then per task a 512-256-128 head and a sigmoid unit;
    returns ``[batch, tasks]``."""

    def __init__(self, spec: ModelSpec, sparse: nn.Module, tables: Sequence[str], tasks: int = 1):
        super().__init__(spec, sparse, tables)
        if tasks < 1:
            raise InvalidRequest(f"tasks must be at least 1, not {tasks}")
        self.trunk = mlp(spec.top_mlp)
        self.heads = nn.ModuleList(mlp((spec.top_mlp[-1], 256, 128, 1), last="sigmoid")
                                   for _ in range(tasks))

    def dense_part(self, dense: Tensor | None, pooled: list[Tensor],
                   stages: Stages | None = None) -> Tensor:
        h = self.trunk(torch.cat([*pooled, _need(dense)], dim=1))
        out = torch.cat([head(h) for head in self.heads], dim=1)
        _mark(stages, "dense_mlp")
        return out


class NCF(_Model):
    """NCF: matrix factorisation of tables 0 and 1 (summed element-wise) beside an MLP over tables
    2 and 3, joined by one FC layer; returns ``[batch, 64]``."""

    def __init__(self, spec: ModelSpec, sparse: nn.Module, tables: Sequence[str], dim: int):
        super().__init__(spec, sparse, tables)
        self.mlp = mlp((2 * dim, *spec.top_mlp))
        self.predict = mlp((dim + spec.top_mlp[-1], 64))

    def dense_part(self, dense: Tensor | None, pooled: list[Tensor],
                   stages: Stages | None = None) -> Tensor:
        u, i, a, b = pooled
        out: Tensor = self.predict(torch.cat([u + i, self.mlp(torch.cat([a, b], dim=1))], dim=1))
        _mark(stages, "dense_mlp")
        return out


class Offloaded(nn.Module):
    """A model run whole by its store's engine (RM-SSD's whole-model offload): the same
    ``forward(dense, features)`` as the PyTorch model, equal within fp32 rounding, but the
    bottom MLP, the interaction and the top MLP run next to the embeddings and only the
    outputs come back. Each table's slice of the first top layer is multiplied as soon as its
    rows are in, while other tables' reads are out. ``last_times`` holds the seconds per part of
    the last call (``total``, ``embeddings``, ``dense``, ``blocks``, ``finish``, and the
    embeddings' ``route``, ``io_wait`` and ``pool``; see ``nearrec_engine::InferTimes``). The
    weights are copied at construction: offload again after changing them.

    nearrec's DLRM (RMC1–3, cat and dot), WND, MTWND and NCF run as the engine's own families;
    DIN's per-table attention and DIEN's RNN have no engine twin yet. Any other module whose
    sparse part is nearrec's collections over one store (a TorchRec DLRM after
    :func:`nearrec.torch.from_torchrec`, a model of your own) is captured by ``torch.export`` on
    ``example`` (a ``(dense, features)`` batch; a TorchRec DLRM needs none) into the operations
    the engine runs (:mod:`nearrec.capture`: linear layers, activations, concatenation, sums and
    products, DLRM's interaction); anything else is an :class:`~nearrec.errors.InvalidRequest`
    naming the operation. Its inputs are its collections' features.

    Over a node or a sharded store the vectors are pooled there and the engine's dense part
    runs here, on them (``nearrec::StoreApi::infer_model``); to run it on the nodes, keep it
    with the store (:func:`save`) and call ``store.infer(dense, features)``."""

    def __init__(self, model: nn.Module, example: tuple[Tensor | None, Any] | None = None, *,
                 captured: Captured | None = None):
        """``captured``: the program already captured (a model :func:`load` read back)."""
        super().__init__()
        if isinstance(model, Offloaded) or not isinstance(model, nn.Module):
            raise InvalidRequest(f"offload takes a torch module, not {type(model).__name__}")
        self.model = model
        self.captured: Captured | None = None
        collections: list[EmbeddingBagCollection]
        if isinstance(model, _Model):
            collections = [_check_sparse(model.sparse)]
            dims = [collections[0].dims[collections[0].tables.index(t)]
                    for t in model.table_names]
            self.native = NativeModel.from_config(json.dumps(model.kept_config()),
                                                  model.dense_weights(), dims)
        else:
            for c in model.modules():
                if isinstance(c, EmbeddingBagCollection):
                    _check_sparse(c)
            if captured is None:
                dense, features = _example(model) if example is None else example
                captured = capture(model, dense, features)
            self.captured = captured
            collections = self.captured.collections
            self.native = NativeModel.from_config(
                json.dumps(self.captured.config()), list(self.captured.weights.items()),
                self.captured.dims)
        #: the inputs' names (features, or tables) and the table each reads, in input order
        self.inputs: list[str] = self.native.inputs
        self.tables: list[str] = self.native.tables
        self.collections: list[EmbeddingBagCollection] = collections
        self.sparse = collections[0]
        self.store: Store = self.sparse.store  # type: ignore[assignment]  # checked above
        self.last_times: dict[str, float] = {}

    @property
    def spec(self) -> ModelSpec | None:
        """The benchmark model's spec; None for a captured model."""
        return self.model.spec if isinstance(self.model, _Model) else None

    def forward(self, dense: Tensor | None, features: Any) -> Tensor:
        out, self.last_times = self.run(dense, features)
        return out

    def requests(self, features: Any) -> tuple[list[TableLookup], bool]:
        """The engine's lookups for a batch and whether they are in the model's input order:
        a KeyedJaggedTensor keyed by the inputs gives them in order; a list of
        :class:`TableLookup` is matched to the inputs by name by the engine
        (``nearrec::StoredModel::arrange``: each input exactly once, nothing else)."""
        if isinstance(features, Sequence) and not isinstance(features, str | bytes):
            return list(features), False
        return [r for c in self.collections for r in c.lookups(features)], True

    def run(self, dense: Tensor | None, features: Any) -> tuple[Tensor, dict[str, float]]:
        """Outputs and the seconds per part, for one batch."""
        if dense is None and self.native.dense_width:
            raise InvalidRequest("this model needs dense features")
        native = self.sparse._native if len(self.collections) == 1 else None
        if native is not None and not isinstance(features, Sequence | str | bytes):
            # a KeyedJaggedTensor read in one native call from its own buffers, as the
            # collection's forward reads it (a TableLookup per table cost more than the
            # engine's whole batch at batch 16)
            try:
                out, times = native.infer(self.native, dense_features(dense), features)
            except AttributeError:
                _features_arg(features)
                raise
            return torch.from_numpy(out), dict(times)
        out, times = self.store._infer(self.native, dense, *self.requests(features))
        return torch.from_numpy(out), times


def _check_sparse(sparse: Any) -> EmbeddingBagCollection:
    """A sparse part the engine can run a model over: a collection over a store (embedded:
    next to its reads; a node or a sharded store: on the vectors it pools)."""
    if not isinstance(sparse, EmbeddingBagCollection) or sparse.store is None \
            or sparse.keyed or sparse.gpu_tier is not None:
        raise InvalidRequest("whole-model offload needs the model's sparse part to be "
                             "EmbeddingBagCollections over a store, without keyed tables or "
                             "a GPU tier")
    return sparse


def _example(model: nn.Module) -> tuple[Tensor, Any]:
    """A batch of two samples for capturing a TorchRec DLRM (its dense width from its dense
    arch, one id 0 per feature); other models must give theirs."""
    arch = getattr(model, "dense_arch", None)
    first = next((m for m in arch.modules() if isinstance(m, nn.Linear)), None) \
        if isinstance(arch, nn.Module) else None
    if not type(model).__module__.startswith("torchrec.models") or first is None:
        raise InvalidRequest(f"give an example batch to capture {type(model).__name__} on: "
                             "offload(model, example=(dense, features))")
    keys = [f for c in model.modules() if isinstance(c, EmbeddingBagCollection)
            for f in c.features]
    from torchrec import KeyedJaggedTensor as TorchRecKJT

    features = TorchRecKJT(keys=keys, values=torch.zeros(2 * len(keys), dtype=torch.int64),
                           lengths=torch.ones(2 * len(keys), dtype=torch.int64))
    return torch.zeros(2, first.in_features), features


def offload(model: nn.Module, example: tuple[Tensor | None, Any] | None = None) -> Offloaded:
    """``model`` run whole by its store's engine; see :class:`Offloaded`."""
    return Offloaded(model, example)


#: The models :func:`offload` takes.
OFFLOADABLE = ("rmc1", "rmc2", "rmc3", "wnd", "mtwnd", "ncf")
