"""The eight DeepRecInfra benchmark models (``shared/specs/models.md``) as PyTorch modules whose
sparse part is a :class:`nearrec.torch.EmbeddingBagCollection` over a store built by
:func:`nearrec.build` (tables ``t0``, ``t1``, ...).

``build("rmc1", store, seed=0)`` gives the model with the spec's exact layer shapes, dense layers
initialised from ``seed``; :func:`infer` runs it over a stream of batches with the next batches'
embedding reads overlapping the current batch's MLPs, and says where the time went;
:func:`save` keeps a model's configuration and dense weights with the store's tables and
:func:`load` rebuilds it from there; :func:`offload` runs a model whole in the engine, next to
the embeddings (RM-SSD), so that only its outputs come back.
``forward(dense, features)`` takes the dense features ``[batch, dense_features]`` (``None`` for
models without any) and a ``KeyedJaggedTensor`` whose keys name the tables. Every FC layer uses
ReLU; DLRM (RMC1–3), WND and MTWND end in a sigmoid; NCF, DIN and DIEN use ReLU on every layer,
their last included, as the spec has them.

Where the spec leaves a choice, this module makes it and says so:

- RMC1–3 concatenate (DeepRecInfra's configs) or take DLRM's ``"dot"`` interaction (the strictly
  lower triangle of pairwise dot products of the bottom output and the pooled vectors, then the
  bottom output); with ``dot`` the first top layer takes that width;
- MTWND's task heads are 512-256-128 and then one sigmoid unit each (the spec ends the family in a
  sigmoid); ``tasks`` heads (1, RecSSD 8);
- DIN: table 0 is the profile, the last two the ad and the context, the ones between are
  behaviour tables; its attention unit maps ``[beh, ad, beh + ad]`` (96) to 1 and then to 32, per
  behaviour table, summed;
- DIEN: tables 0–39 are the 40 behaviour steps, then profile, ad and context; two tanh RNN layers,
  and the attention stand-in (FC 64→64 and softmax) added back onto the last hidden state.
"""

from __future__ import annotations

import io
import json
import time
import zipfile
import zlib
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from ._native import NativeModel, model_save
from .capture import Captured, capture
from .errors import InvalidRequest, StoreCorrupted
from .request import TableLookup, count, path_arg
from .specs import ModelSpec, Variant, model_spec
from .store import Store, read_attachment
from .torch import (
    EmbeddingBagCollection,
    EmbeddingCollection,
    JaggedTensor,
    KeyedJaggedTensor,
    KeyedTensor,
)


class Stages:
    """Seconds spent per named stage of models' dense parts, summed over batches (CPU tensors:
    the ops are synchronous, so wall time is theirs)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._t = time.perf_counter()

    def start(self) -> None:
        self._t = time.perf_counter()

    def mark(self, stage: str) -> None:
        """Charges the time since the last mark (or start) to ``stage``."""
        now = time.perf_counter()
        self.seconds[stage] = self.seconds.get(stage, 0.0) + now - self._t
        self._t = now


def _mark(stages: Stages | None, stage: str) -> None:
    if stages is not None:
        stages.mark(stage)


def mlp(sizes: Sequence[int], last: str = "relu") -> nn.Sequential:
    """FC layers ``sizes[0] → sizes[1] → ...``, ReLU between them, ``last`` (``"relu"``,
    ``"sigmoid"`` or ``"none"``) after the last."""
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:], strict=True)):
        layers.append(nn.Linear(a, b))
        is_last = i == len(sizes) - 2
        if not is_last or last == "relu":
            layers.append(nn.ReLU())
        elif last == "sigmoid":
            layers.append(nn.Sigmoid())
    return nn.Sequential(*layers)


def linear_shapes(module: nn.Module) -> list[tuple[int, int]]:
    """``(in, out)`` of every ``nn.Linear`` in ``module``, in order."""
    return [(m.in_features, m.out_features) for m in module.modules() if isinstance(m, nn.Linear)]


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


class SequenceSparse(nn.Module):
    """DIN's and DIEN's sparse part as the models mean it (``build(..., sequence=True)``): the
    behaviour tables read as sequences, each id's own row (an
    :class:`~nearrec.torch.EmbeddingCollection`), the others pooled (an
    :class:`~nearrec.torch.EmbeddingBagCollection`). ``forward(features)`` gives ``{table:
    pooled [batch, dim] | JaggedTensor}``."""

    def __init__(self, store: Store, pooled: Sequence[str],
                 sequences: Sequence[str], **collection: Any):
        super().__init__()
        self.pooled = EmbeddingBagCollection(store, list(pooled), **collection)
        self.sequences = EmbeddingCollection(store, list(sequences))

    def forward(self, features: Any) -> dict[str, Tensor | JaggedTensor]:
        out: dict[str, Tensor | JaggedTensor] = dict(self.pooled(features).to_dict())
        out.update(self.sequences(features))
        return out


class DIN(_Model):
    """DIN: an attention unit per behaviour table, summed, then an MLP to 2 outputs. With its
    behaviour tables read as sequences (``build("din", ..., sequence=True)``), the unit scores
    each behaviour item against the ad and the items' outputs are summed, DIN's weighted sum
    pooling, instead of scoring one sum of the items."""

    def __init__(self, spec: ModelSpec, sparse: nn.Module, tables: Sequence[str], dim: int):
        super().__init__(spec, sparse, tables)
        if len(tables) < 4:
            raise InvalidRequest("DIN needs a profile, behaviour, ad and context table")
        self.attention = mlp((3 * dim, 1, dim))
        self.top = mlp((4 * dim, *spec.top_mlp[1:]))

    def dense_part(self, dense: Tensor | None, pooled: list[Tensor],
                   stages: Stages | None = None) -> Tensor:
        profile, *behaviour, ad, context = pooled
        attn = torch.stack([self._attend(b, ad) for b in behaviour]).sum(dim=0)
        out: Tensor = self.top(torch.cat([profile, attn, ad, context], dim=1))
        _mark(stages, "dense_mlp")
        return out


    def _attend(self, behaviour: Tensor | JaggedTensor, ad: Tensor) -> Tensor:
        if not isinstance(behaviour, JaggedTensor):
            out: Tensor = self.attention(torch.cat([behaviour, ad, behaviour + ad], dim=1))
            return out
        items, mask = behaviour.padded()  # [batch, items, dim]
        ads = ad.unsqueeze(1).expand_as(items)
        scored: Tensor = self.attention(torch.cat([items, ads, items + ads], dim=2))
        return (scored * mask.unsqueeze(2)).sum(dim=1)


class DIEN(_Model):
    """DIEN: two tanh RNN layers over the 40 behaviour steps, the attention stand-in added back
    onto the last hidden state, then an MLP to 2 outputs. With the steps read as a sequence
    (``build("dien", ..., sequence=True)``) each step is one behaviour item (at most one id) and a
    sample's history is its first steps: the RNN runs over those and stops where the history
    ends, instead of running on through empty steps (equal when every step is filled; an empty
    history reads as one zero step)."""

    STEPS = 40

    def __init__(self, spec: ModelSpec, sparse: nn.Module, tables: Sequence[str], dim: int):
        super().__init__(spec, sparse, tables)
        if len(tables) != self.STEPS + 3:
            raise InvalidRequest(f"DIEN needs {self.STEPS} behaviour tables, then profile, ad "
                                 f"and context ({self.STEPS + 3}), not {len(tables)}")
        self.rnn = nn.RNN(dim, 64, num_layers=2, nonlinearity="tanh", batch_first=True)
        self.attention = nn.Linear(64, 64)
        self.top = mlp(spec.top_mlp)

    def dense_part(self, dense: Tensor | None, pooled: list[Tensor],
                   stages: Stages | None = None) -> Tensor:
        profile, ad, context = pooled[self.STEPS:]
        if isinstance(pooled[0], JaggedTensor):
            last = self._history(pooled[:self.STEPS])
        else:
            hidden, _ = self.rnn(torch.stack(pooled[:self.STEPS], dim=1))  # [batch, 40, dim]
            last = hidden[:, -1]
        last = last + torch.softmax(self.attention(last), dim=1)
        out: Tensor = self.top(torch.cat([last, profile, ad, context], dim=1))
        _mark(stages, "dense_mlp")
        return out

    def _history(self, steps: list[Any]) -> Tensor:
        """The RNN's last hidden state over each sample's history: its filled first steps."""
        lengths = torch.stack([s.lengths() for s in steps], dim=1)  # [batch, 40]
        for k, s in enumerate(steps):
            over = torch.nonzero(s.lengths() > 1)
            if len(over):
                table = self.table_names[k]
                raise InvalidRequest(f"behaviour step {table!r} has {int(s.lengths()[over[0]])} "
                                     f"ids for sample {int(over[0])}: a step is one item",
                                     table=table, position=int(over[0]))
        filled = lengths > 0
        history = filled.sum(dim=1)
        gap = torch.nonzero((filled.cumsum(dim=1) < torch.arange(1, self.STEPS + 1)[None, :])
                            & filled)
        if len(gap):
            b, k = (int(x) for x in gap[0])
            raise InvalidRequest(f"sample {b}'s history skips a step before "
                                 f"{self.table_names[k]!r}: a history fills the first steps",
                                 table=self.table_names[k], position=b)
        batch, dim = lengths.shape[0], steps[0].values().shape[1]
        x = steps[0].values().new_zeros((batch, self.STEPS, dim))
        for k, s in enumerate(steps):
            x[filled[:, k], k] = s.values()
        packed = nn.utils.rnn.pack_padded_sequence(x, history.clamp(min=1).cpu(),
                                                   batch_first=True, enforce_sorted=False)
        _, h = self.rnn(packed)
        last: Tensor = h[-1]  # the top layer's state at each sample's last step
        return last


_ACTIVATIONS: dict[type[nn.Module], str] = {nn.ReLU: "relu", nn.Sigmoid: "sigmoid",
                                             nn.Tanh: "tanh"}


def _layers(seq: nn.Module) -> list[tuple[np.ndarray, np.ndarray, str]]:
    """``(weight, bias, activation)`` of each ``nn.Linear`` of a ``Sequential`` of linear layers
    and activations, as the engine takes them."""
    mods = list(seq.children()) if isinstance(seq, nn.Sequential) else [seq]
    out: list[tuple[np.ndarray, np.ndarray, str]] = []
    for i, m in enumerate(mods):
        if isinstance(m, nn.Linear):
            after = mods[i + 1] if i + 1 < len(mods) else None
            bias = m.bias if m.bias is not None else torch.zeros(m.out_features)
            out.append((m.weight.detach().float().cpu().contiguous().numpy(),
                        bias.detach().float().cpu().contiguous().numpy(),
                        "none" if after is None else _ACTIVATIONS.get(type(after), "none")))
        elif type(m) not in _ACTIVATIONS:
            raise InvalidRequest(f"cannot offload a {type(m).__name__} layer (linear layers "
                                 "and ReLU / sigmoid / tanh only)")
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
    naming the operation. Its inputs are its collections' features."""

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
            self.native = _native_model(model, collections[0])
            self.inputs = list(model.table_names)
            self.tables = list(model.table_names)
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
            self.inputs = self.captured.features
            self.tables = self.captured.tables
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

    def requests(self, features: Any) -> list[TableLookup]:
        """The engine's lookups for a batch, in the model's input order: from a
        KeyedJaggedTensor keyed by the inputs (features), or :class:`TableLookup` s matched by
        table name (:meth:`arrange`)."""
        if isinstance(features, Sequence) and not isinstance(features, str | bytes):
            return self.arrange(features)
        return [r for c in self.collections for r in c.lookups(features)]

    def arrange(self, lookups: Sequence[TableLookup]) -> list[TableLookup]:
        """``lookups`` in the order of the model's inputs, matched by table name (not by their
        order in the list): each input table exactly once, no other table."""
        want = list(self.tables)
        if len(set(want)) != len(want):
            raise InvalidRequest(f"the model's inputs {self.inputs} share tables, so lookups "
                                 "named by table cannot say which input they are: give a "
                                 "KeyedJaggedTensor keyed by feature")
        by_name: dict[str, TableLookup] = {}
        for i, r in enumerate(lookups):
            if not isinstance(r, TableLookup) or not isinstance(r.table, str):
                raise InvalidRequest(f"features are TableLookup items naming a table, got "
                                     f"{r!r:.60} at position {i}", position=i)
            if r.table in by_name:
                raise InvalidRequest(f"table {r.table!r} is given twice (position {i})",
                                     table=r.table, position=i)
            by_name[r.table] = r
        missing = [t for t in want if t not in by_name]
        extra = [t for t in by_name if t not in want]
        if missing or extra:
            raise InvalidRequest(
                f"the lookups do not match the model's input tables {want}: "
                + "; ".join(part for part in (f"missing {missing}" if missing else "",
                                              f"not inputs {extra}" if extra else "") if part),
                table=(missing or extra)[0])
        return [by_name[t] for t in want]

    def run(self, dense: Tensor | None, features: Any) -> tuple[Tensor, dict[str, float]]:
        """Outputs and the seconds per part, for one batch."""
        if dense is None and self.native.dense_width:
            raise InvalidRequest("this model needs dense features")
        out, times = self.store._infer(self.native, dense, self.requests(features))
        return torch.from_numpy(out), times


def _check_sparse(sparse: Any) -> EmbeddingBagCollection:
    """A sparse part the engine can run a model next to: a collection over an embedded
    store."""
    if not isinstance(sparse, EmbeddingBagCollection) or sparse.store is None \
            or sparse.keyed or sparse.gpu_tier is not None:
        raise InvalidRequest("whole-model offload needs the model's sparse part to be "
                             "EmbeddingBagCollections over a store, without keyed tables or "
                             "a GPU tier")
    if not sparse.store.embedded:
        raise InvalidRequest("a storage node runs the model kept with its store, not one "
                             "built here: keep it with nearrec.models.save(model, path) and "
                             "call remote.infer(dense, features)")
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


def _native_model(model: _Model, sparse: EmbeddingBagCollection) -> Any:
    dims = [sparse.dims[sparse.tables.index(t)] for t in model.table_names]
    if isinstance(model, DLRM):
        return NativeModel.dlrm(_layers(model.bottom), _layers(model.top),
                                model.interaction, len(model.table_names))
    if isinstance(model, MultiTaskWideAndDeep):
        return NativeModel.wide_and_deep(_layers(model.trunk),
                                         [_layers(h) for h in model.heads], dims)
    if isinstance(model, WideAndDeep):
        return NativeModel.wide_and_deep(_layers(model.top), [], dims)
    if isinstance(model, NCF):
        return NativeModel.ncf(_layers(model.mlp), _layers(model.predict), dims[0])
    raise InvalidRequest(f"{model.spec.name}: whole-model offload covers DLRM (RMC1–3), WND, "
                         "MTWND and NCF; run DIN and DIEN with PyTorch MLPs")


def offload(model: nn.Module, example: tuple[Tensor | None, Any] | None = None) -> Offloaded:
    """``model`` run whole by its store's engine; see :class:`Offloaded`."""
    return Offloaded(model, example)


#: The models :func:`offload` takes.
OFFLOADABLE = ("rmc1", "rmc2", "rmc3", "wnd", "mtwnd", "ncf")


@dataclass
class InferResult:
    """Outputs of :func:`infer`, in order, and where the time went (seconds)."""

    outputs: list[Tensor]
    #: wall time of the whole run
    seconds: float
    #: the caller waiting for pooled vectors (all of the embedding time without overlap)
    embedding_wait: float
    #: the dense part (MLPs, interaction) on the caller's thread
    dense: float
    samples: int
    #: seconds per stage: ``embedding_wait`` and the dense part's stages (see ``dense_part``)
    breakdown: dict[str, float]
    #: per batch (per part with ``sub_batch``): seconds from the start of its reads to its output
    latencies: list[float] = field(default_factory=list)
    #: per batch (per part): when its output was ready, in seconds since the run started
    finished: list[float] = field(default_factory=list)
    #: a module of your own: pooled outputs read ahead that its forward did not take (it
    #: passed its collection another KeyedJaggedTensor than the batch's, and read again)
    unused: int = 0

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.seconds if self.seconds else 0.0


def split(dense: Tensor | None, features: Any, size: int) -> list[tuple[Tensor | None, Any]]:
    """One batch cut into batches of at most ``size`` samples (the last may be smaller):
    ``dense`` by rows, ``features`` (a ``KeyedJaggedTensor``) by bags of every key."""
    size = count(size, "the sub-batch size")
    keys, values, lengths = features.keys(), features.values(), features.lengths()
    batch = lengths.numel() // max(1, len(keys))
    bounds = torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(lengths, 0)])
    out = []
    for lo in range(0, batch, size):
        hi = min(batch, lo + size)
        vals, lens = [], []
        for k in range(len(keys)):
            a, b = k * batch + lo, k * batch + hi
            vals.append(values[int(bounds[a]):int(bounds[b])])
            lens.append(lengths[a:b])
        out.append((None if dense is None else dense[lo:hi],
                    KeyedJaggedTensor(keys, torch.cat(vals), torch.cat(lens))))
    return out


def infer(model: nn.Module, batches: Iterable[tuple[Tensor | None, Any]],
          depth: int = 2, sub_batch: int | None = None) -> InferResult:
    """Runs ``model`` on ``(dense, features)`` batches with the embeddings of the next ``depth``
    batches in flight while the dense part of the current one runs (RecSSD's SLS workers
    feeding NN workers; the engine and PyTorch's kernels both release the GIL). ``depth=0``
    runs each batch's embeddings then its dense part, nothing overlapped: the baseline the
    overlap is measured against. With ``sub_batch``, each batch is cut into sub-batches of that
    many samples that flow through the pipeline (RM-SSD's system-level pipeline: the reads of
    one part of a large request overlap the MLPs of another); outputs come back one per
    batch. An :class:`Offloaded` model runs whole in the engine: the next batches are in
    flight while the caller takes the current one's outputs, and the breakdown gives the
    engine's parts (``engine.*``: ``dense`` and ``blocks`` are thread time overlapping the
    reads; ``route``, ``io_wait`` and ``pool`` split ``embeddings``).

    ``model`` may also be any module whose sparse part is one or more nearrec
    :class:`~nearrec.torch.EmbeddingBagCollection` s (a TorchRec DLRM after
    :func:`nearrec.torch.from_torchrec`, a model of your own), called as ``model(dense,
    features)`` (``model(features)`` where ``dense`` is None): each collection's output for a
    batch is read ahead and handed to the collection's ``forward`` when the model passes it that
    batch's ``features``; the breakdown has ``embedding_wait`` and ``forward`` (the rest of the
    model), and ``unused`` counts outputs the model did not take that way."""
    depth = count(depth, "depth", 0)
    sparse = _sparse_of(model)
    if sub_batch is not None:
        sub_batch = count(sub_batch, "sub_batch")
    owner: list[int] = []  # the batch each flowing part belongs to

    def parts() -> Iterable[tuple[Tensor | None, Any]]:
        for n, (dense, features) in enumerate(batches):
            for part in ([(dense, features)] if sub_batch is None
                         else split(dense, features, sub_batch)):
                owner.append(n)
                yield part

    outputs: list[Tensor] = []
    stages = Stages()
    wait = dense_s = 0.0
    samples = unused = 0
    start = time.perf_counter()
    with torch.inference_mode(), ThreadPoolExecutor(max(1, depth)) as pool:
        queue: deque[tuple[Tensor | None, Callable[[], Any], float]] = deque()
        latencies: list[float] = []
        finished: list[float] = []
        items = iter(parts())

        def fill() -> None:
            while len(queue) < max(1, depth):
                item = next(items, None)
                if item is None:
                    return
                # depth 0: run on this thread when taken (no hand-over to pay for)
                job = partial(_early, model, sparse, *item)
                queue.append((item[0], job if depth == 0 else pool.submit(job).result,
                              time.perf_counter()))

        fill()
        while queue:
            dense, pending, submitted = queue.popleft()
            t = time.perf_counter()
            if depth == 0:
                pooled = pending()
            else:
                fill()  # the next batches' reads start before this batch waits
                pooled = pending()
            t1 = time.perf_counter()
            stages.start()
            if isinstance(model, Offloaded):
                out, times = pooled
                for part, sec in times.items():
                    if part != "total":
                        stages.seconds[f"engine.{part}"] = \
                            stages.seconds.get(f"engine.{part}", 0.0) + sec
            elif isinstance(model, _Model):
                out = model.dense_part(dense, pooled, stages)
            else:
                features = pooled.pop()
                for collection, kt in zip(sparse, pooled, strict=True):
                    collection.ahead(features, kt)
                out = model(features) if dense is None else model(dense, features)
                unused += sum(c.unused() for c in sparse)
                _mark(stages, "forward")
            t2 = time.perf_counter()
            wait += t1 - t
            dense_s += t2 - t1
            outputs.append(out)
            latencies.append(t2 - submitted)
            finished.append(t2 - start)
            samples += out.shape[0]
            if depth == 0:
                fill()
    seconds = time.perf_counter() - start
    if sub_batch is not None:  # one output per batch again
        joined: list[list[Tensor]] = []
        for n, out in zip(owner, outputs, strict=True):
            if n == len(joined):
                joined.append([])
            joined[n].append(out)
        outputs = [torch.cat(o) for o in joined]
    return InferResult(outputs, seconds, wait, dense_s, samples,
                       {"embedding_wait": wait, **stages.seconds}, latencies, finished, unused)


def _sparse_of(model: nn.Module) -> list[EmbeddingBagCollection]:
    """A module of the user's: its nearrec collections, which :func:`infer` reads ahead (none
    for nearrec's models, whose sparse part is read through ``pooled``)."""
    if not isinstance(model, nn.Module):
        raise InvalidRequest(f"infer takes a torch module, not {type(model).__name__}")
    if isinstance(model, _Model | Offloaded):
        return []
    found = [m for m in model.modules() if isinstance(m, EmbeddingBagCollection)]
    if not found:
        raise InvalidRequest(f"{type(model).__name__} holds no nearrec EmbeddingBagCollection "
                             "to read ahead (nearrec.torch.from_torchrec gives a TorchRec "
                             "model one)")
    return found


def _early(model: nn.Module, sparse: list[EmbeddingBagCollection], dense: Tensor | None,
           features: Any) -> Any:
    """What runs ahead on the pipeline's threads: the pooled vectors, for an offloaded model
    the whole batch, for a module of the user's each collection's output (and the features,
    last)."""
    with torch.inference_mode():
        if isinstance(model, Offloaded):
            return model.run(dense, features)
        if isinstance(model, _Model):
            return model.pooled(features)
        return [c._eager(features) for c in sparse] + [features]


#: The attachments :func:`save` writes: the model's configuration and its dense weights.
CONFIG_ATTACHMENT = "model.json"
WEIGHTS_ATTACHMENT = "dense.npz"


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
    if isinstance(model, nn.Module) and not isinstance(model, _Model):
        offloaded = model if isinstance(model, Offloaded) else Offloaded(model, example)
        if offloaded.captured is None:
            model = offloaded.model
        else:
            if Path(offloaded.store.info.path).resolve() != Path(path).resolve():
                raise InvalidRequest(f"the model reads the store at {offloaded.store.info.path}, "
                                     f"not {path}: keep it with the store it reads")
            model_save(str(path), json.dumps(offloaded.captured.config()),
                       list(offloaded.captured.weights.items()))
            return
    if not isinstance(model, _Model):
        raise InvalidRequest(f"save takes a torch module, not {type(model).__name__}")
    dense = [(k, np.ascontiguousarray(v.detach().cpu().float().numpy()))
             for k, v in model.state_dict().items() if not k.startswith("sparse.")]
    config = {"model": model.spec.name, "variant": model.variant,
              "interaction": getattr(model, "interaction", "cat"),
              "tasks": len(getattr(model, "heads", [])) or 1, "tables": list(model.table_names),
              "sequence": isinstance(model.sparse, SequenceSparse)}
    model_save(str(path), json.dumps(config), dense)


def load(store: Store, **collection: Any) -> nn.Module:
    """The model :func:`save` kept with ``store``'s tables, its sparse part over ``store``
    (``collection`` as for :func:`build`): one of nearrec's models, or for a captured model its
    :class:`Offloaded` form, which runs in the engine."""
    if not isinstance(store, Store):
        raise InvalidRequest(f"load takes an open nearrec.Store, not {type(store).__name__}")
    path = store.info.path
    raw = read_attachment(path, CONFIG_ATTACHMENT)
    weights = read_attachment(path, WEIGHTS_ATTACHMENT)
    if raw is None or weights is None:
        raise InvalidRequest(f"the store at {path} keeps no model (save one with "
                             "nearrec.models.save)")
    try:
        config = json.loads(raw)
        name = config["model"]
        if name == "graph":
            features, tables, pooling = config["features"], config["tables"], config["pooling"]
            if not all(isinstance(x, list) and len(x) == len(tables) and
                       all(isinstance(v, str) for v in x) for x in (features, pooling)):
                raise TypeError("features, tables and pooling are lists of one name per input")
        else:
            variant = config["variant"]
            interaction, tasks = config["interaction"], config["tasks"]
            sequence = bool(config.get("sequence", False))
    except (ValueError, TypeError, KeyError) as e:  # JSONDecodeError is a ValueError
        raise StoreCorrupted(f"the store at {path}: its {CONFIG_ATTACHMENT} is not a model "
                             f"configuration: {type(e).__name__}: {e}") from None
    if name == "graph":
        return _load_graph(store, config, _weights(path, weights))
    model = build(name, store, variant=variant, interaction=interaction, tasks=tasks,
                  sequence=sequence, **collection)
    state = {k: torch.from_numpy(v) for k, v in _weights(path, weights).items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if not k.startswith("sparse.")]
    if missing or unexpected:
        raise InvalidRequest(f"the stored weights do not fit {config['model']}: missing "
                             f"{missing[:3]}, unexpected {unexpected[:3]}")
    return model


def _weights(path: Any, raw: bytes) -> dict[str, np.ndarray]:
    """The arrays of a stored ``dense.npz``."""
    try:
        with np.load(io.BytesIO(raw), allow_pickle=False) as f:
            return {k: f[k] for k in f.files}
    except (OSError, ValueError, EOFError, AttributeError, zipfile.BadZipFile, zlib.error) as e:
        raise StoreCorrupted(f"the store at {path}: its {WEIGHTS_ATTACHMENT} is not a weights "
                             f"archive: {type(e).__name__}: {e}") from None


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


__all__ = ["DIEN", "DIN", "DLRM", "NCF", "OFFLOADABLE", "InferResult", "MultiTaskWideAndDeep",
           "Offloaded", "SequenceSparse", "Stages", "WideAndDeep", "build", "infer",
           "linear_shapes", "load", "mlp", "offload", "save", "split"]
