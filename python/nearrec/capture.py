"""A model's dense part captured as the program the engine runs, for whole-model offload of
models that are not nearrec's own (a TorchRec DLRM after :func:`nearrec.torch.from_torchrec`, a
model of your own): :func:`capture`.

``torch.export`` traces the model on an example batch; its nearrec collections appear in the
graph as one ``nearrec::pooled_lookup`` op each, and everything after them is read op by op into
``nearrec::model::GraphSpec`` (``crates/nearrec/src/model/``): linear layers (their activation
folded in), ReLU / sigmoid / tanh, concatenation, slicing and splitting of columns, element-wise
sums and products, and DLRM's interaction (a stack of vectors multiplied by its own transpose,
then a fixed set of pairs picked out: pairwise dot products, in whatever order the model picks
them). Anything else is refused with an :class:`~nearrec.errors.InvalidRequest` naming the
operation and where it is. Shapes are followed per sample: a value is ``[batch, width]`` columns
taken from the program's values, or a stack of such vectors ``[batch, n, d]``.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from .errors import InvalidRequest
from .torch import EmbeddingBagCollection, _collections, _features_arg

aten = torch.ops.aten

#: ``[value, start, end)``: columns of one of the program's values (0: the dense features, 1: the
#: pooled inputs side by side, then one per op).
Cols = tuple[int, int, int]


@dataclass(frozen=True)
class Row:
    """A ``[batch, width]`` value: column slices side by side."""

    slices: tuple[Cols, ...]

    @property
    def width(self) -> int:
        return sum(b - a for _, a, b in self.slices)

    def take(self, lo: int, hi: int) -> Row:
        """Columns ``[lo, hi)``."""
        out, at = [], 0
        for v, a, b in self.slices:
            x, y = max(lo, at), min(hi, at + b - a)
            if x < y:
                out.append((v, a + x - at, a + y - at))
            at += b - a
        return Row(tuple(out))

    def spec(self) -> list[list[int]]:
        return [list(s) for s in self.slices]


@dataclass(frozen=True)
class Stack:
    """A ``[batch, n, d]`` value: ``n`` vectors of width ``d``."""

    rows: tuple[Row, ...]


@dataclass(frozen=True)
class Transposed:
    """A stack's ``transpose(1, 2)``: only good for multiplying the stack by."""

    stack: Stack


@dataclass(frozen=True)
class Gram:
    """A stack times its own transpose, ``[batch, n, n]``: only good for picking pairs from."""

    stack: Stack


class Opaque:
    """The features' tensors, and what the model computes from them alone (their sizes, the
    KeyedJaggedTensor's bookkeeping): fine until it meets the dense part."""


OPAQUE = Opaque()


@dataclass
class Captured:
    """A dense part as the engine's program, with its weights and its inputs: one per feature of
    the collections the model reads, in the order their outputs are laid side by side."""

    spec: dict[str, Any]
    weights: dict[str, np.ndarray]
    collections: list[EmbeddingBagCollection]
    features: list[str]
    tables: list[str]
    pooling: list[str]
    dims: list[int]

    def config(self) -> dict[str, Any]:
        """``nearrec::model::ModelConfig`` of the model (``model: "graph"``)."""
        return {"model": "graph", "tables": self.tables, "features": self.features,
                "pooling": self.pooling, "graph": self.spec}


_ACTIVATIONS = {aten.relu.default: "relu", aten.relu_.default: "relu",
                aten.sigmoid.default: "sigmoid", aten.sigmoid_.default: "sigmoid",
                aten.tanh.default: "tanh", aten.tanh_.default: "tanh"}
_IDENTITY = {aten.clone.default, aten.contiguous.default, aten.alias.default,
             aten.detach.default, aten.detach_.default, aten.lift_fresh_copy.default,
             aten._to_copy.default, aten.to.dtype, aten.to.dtype_layout}
_RESHAPE = {aten.view.default, aten.reshape.default, aten._unsafe_view.default}
SUPPORTED = ("linear layers, ReLU / sigmoid / tanh, concatenation, slicing and splitting of "
             "columns, element-wise add and multiply, and DLRM's interaction (pairwise dot "
             "products)")


class _Flat(nn.Module):
    """The model taking the features' tensors, so that export sees plain tensors."""

    def __init__(self, model: nn.Module, kjt: type, keys: list[str], dense: bool,
                 weighted: bool):
        super().__init__()
        self.model, self.kjt, self.keys = model, kjt, keys
        self.dense, self.weighted = dense, weighted

    def forward(self, *args: Tensor) -> Any:
        dense, rest = (args[0], args[1:]) if self.dense else (None, args)
        values, lengths = rest[0], rest[1]
        weights = rest[2] if self.weighted else None
        features = self.kjt(keys=self.keys, values=values, lengths=lengths, weights=weights)
        return self.model(features) if dense is None else self.model(dense, features)


def capture(model: nn.Module, dense: Tensor | None, features: Any) -> Captured:
    """``model``'s dense part as the engine's program, traced on the example batch ``(dense,
    features)`` (``model(dense, features)``, or ``model(features)`` where ``dense`` is None):
    every input of the program is a feature of one of its nearrec collections, over one store."""
    if not isinstance(model, nn.Module):
        raise InvalidRequest(f"capture takes a torch module, not {type(model).__name__}")
    name = type(model).__name__
    if not any(isinstance(m, EmbeddingBagCollection) for m in model.modules()):
        raise InvalidRequest(f"{name} holds no nearrec EmbeddingBagCollection (give a TorchRec "
                             "model to nearrec.torch.from_torchrec first)")
    _features_arg(features)
    keys = list(features.keys())
    weights = features.weights_or_none()
    flat = _Flat(model, type(features), keys, dense is not None, weights is not None)
    args = tuple(t for t in (dense, features.values(), features.lengths(), weights)
                 if t is not None)
    try:
        with torch.no_grad():
            program = torch.export.export(flat, args)
    except InvalidRequest:
        raise
    except Exception as e:  # noqa: BLE001 - whatever export refuses, said in our words
        raise InvalidRequest(f"{name} could not be captured by torch.export: "
                             f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                             ) from e
    return _Reader(program, name, dense).read()


@dataclass
class _Reader:
    """One walk over an exported graph, building the program."""

    program: Any
    name: str
    dense: Tensor | None
    ops: list[dict[str, Any]] = field(default_factory=list)
    widths: list[int] = field(default_factory=list)  # each op's output columns
    weights: dict[str, np.ndarray] = field(default_factory=dict)
    #: The model's parameters and buffers by identity: their names in its ``state_dict()``,
    #: which the kept weights take (a trainer's checkpoint updates them by these names).
    names: dict[int, str] = field(default_factory=dict)
    collections: list[EmbeddingBagCollection] = field(default_factory=list)
    width: int = 0  # the pooled inputs' columns so far

    def read(self) -> Captured:
        sig = self.program.graph_signature
        params = {**sig.inputs_to_parameters, **sig.inputs_to_buffers}
        consts = getattr(sig, "inputs_to_lifted_tensor_constants", {})
        state, constants = self.program.state_dict, self.program.constants
        env: dict[Any, Any] = {}
        user = 0
        out: Any = None
        for node in self.program.graph.nodes:
            if node.op == "placeholder":
                if node.name in params:
                    t = params[node.name]
                    env[node] = state[t] if t in state else constants[t]
                    self.names[id(env[node])] = t.removeprefix("model.")  # _Flat's
                elif node.name in consts:
                    env[node] = constants[consts[node.name]]
                else:
                    first_dense = user == 0 and self.dense is not None
                    env[node] = (Row(((0, 0, self.dense.shape[1]),)) if first_dense  # type: ignore[union-attr]
                                 else OPAQUE)
                    user += 1
            elif node.op == "get_attr":
                env[node] = getattr(self.program.graph_module, node.target)
            elif node.op == "call_function":
                args = _map(node.args, env)
                kwargs = {k: _map(v, env) for k, v in node.kwargs.items()}
                env[node] = self.call(node, args, kwargs)
            elif node.op == "output":
                out = _map(node.args[0], env)
        while isinstance(out, list | tuple) and len(out) == 1:
            out = out[0]
        if not isinstance(out, Row):
            raise InvalidRequest(f"{self.name}'s output is not one [batch, outputs] tensor "
                                 f"computed from its inputs ({type(out).__name__})")
        if not self.collections:
            raise InvalidRequest(f"{self.name}'s output does not read its nearrec collections")
        return self.finish(out)

    def refuse(self, node: Any, why: str = "") -> InvalidRequest:
        return InvalidRequest(f"cannot offload {self.name}: its operation {node.target} (graph "
                              f"node {node.name}){why} is not one the engine runs; it runs "
                              f"{SUPPORTED}")

    def emit(self, op: dict[str, Any], width: int) -> Row:
        self.ops.append(op)
        self.widths.append(width)
        return Row(((len(self.ops) + 1, 0, width),))

    def call(self, node: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        target = node.target
        flat = _leaves((args, kwargs))
        if target is torch.ops.nearrec.pooled_lookup.default:
            return self.lookup(node, args)
        if target is operator.getitem:
            return args[0][args[1]] if isinstance(args[0], list | tuple) else OPAQUE
        if not any(isinstance(x, Row | Stack | Transposed | Gram) for x in flat):
            if any(isinstance(x, Opaque | torch.SymInt) for x in flat) or \
                    "sym" in str(target):
                return OPAQUE  # the features' bookkeeping, or sizes
            try:  # constants only: computed now (e.g. the pairs' indices picked from a buffer)
                with torch.no_grad():
                    return target(*args, **kwargs)
            except Exception:  # noqa: BLE001
                return OPAQUE
        if any(isinstance(x, Opaque) for x in flat if not isinstance(x, int | None)) and \
                target not in _RESHAPE:
            raise self.refuse(node, " mixes the features' own tensors into the dense part")
        x = args[0]
        if target is aten.linear.default:
            return self.linear(node, x, args[1], args[2] if len(args) > 2 else None)
        if target in _ACTIVATIONS and isinstance(x, Row):
            return self.activation(node, x, _ACTIVATIONS[target])
        if target in _IDENTITY:
            return x
        if target is aten.dropout.default:
            if len(args) > 2 and args[2]:
                raise self.refuse(node, " (dropout in training mode: call model.eval())")
            return x
        if target is aten.cat.default:
            return self.cat(node, args[0], args[1] if len(args) > 1 else kwargs.get("dim", 0))
        if target is aten.stack.default and all(isinstance(r, Row) for r in x) and \
                _dim(args[1] if len(args) > 1 else 0, 3) == 1:
            return Stack(tuple(x))
        if target is aten.unsqueeze.default and isinstance(x, Row) and _dim(args[1], 3) == 1:
            return Stack((x,))
        if target in (aten.split.Tensor, aten.split_with_sizes.default) and isinstance(x, Row) \
                and _dim(args[2] if len(args) > 2 else 0, 2) == 1:
            sizes = args[1]
            if isinstance(sizes, int):
                sizes = [min(sizes, x.width - a) for a in range(0, x.width, sizes)]
            bounds = np.cumsum([0, *sizes])
            return [x.take(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
        if target is aten.slice.Tensor:
            return self.slice(node, x, *args[1:])
        if target is aten.narrow.default and all(isinstance(a, int) for a in args[2:4]):
            return self.slice(node, x, args[1], args[2], args[2] + args[3])
        if target in _RESHAPE or target is aten.flatten.using_ints:
            return self.reshape(node, x, args[1] if target in _RESHAPE else None)
        if target is aten.transpose.int and isinstance(x, Stack) and \
                {_dim(args[1], 3), _dim(args[2], 3)} == {1, 2}:
            return Transposed(x)
        if target in (aten.bmm.default, aten.matmul.default) and isinstance(x, Stack) and \
                isinstance(args[1], Transposed) and args[1].stack == x:
            return Gram(x)
        if target is aten.index.Tensor and isinstance(x, Gram):
            return self.pairs(node, x, args[1])
        if target in (aten.add.Tensor, aten.mul.Tensor) and len(args) == 2 and \
                isinstance(x, Row) and isinstance(args[1], Row) and x.width == args[1].width \
                and kwargs.get("alpha", 1) == 1:
            op = "add" if target is aten.add.Tensor else "mul"
            return self.emit({"op": op, "a": x.spec(), "b": args[1].spec()}, x.width)
        raise self.refuse(node)

    def lookup(self, node: Any, args: tuple[Any, ...]) -> Row:
        collection = _collections.get(args[0])
        if collection is None:
            raise self.refuse(node, " (its collection is gone)")
        if any(collection is c for c in self.collections):
            raise self.refuse(node, " (a collection read twice)")
        store = collection.store
        if self.collections and store is not self.collections[0].store:
            raise InvalidRequest(f"cannot offload {self.name}: its collections read different "
                                 "stores; the engine runs a model over one")
        self.collections.append(collection)
        w = sum(collection.dims)
        self.width += w
        return Row(((1, self.width - w, self.width),))

    def linear(self, node: Any, x: Any, weight: Any, bias: Any) -> Row:
        if not isinstance(x, Row) or not isinstance(weight, Tensor) or weight.dim() != 2 or \
                not (bias is None or isinstance(bias, Tensor)):
            raise self.refuse(node, " (a linear layer on a value that is not [batch, "
                                    "features], or with weights computed from the input)")
        k = len(self.ops)
        # a parameter by its name in the model's state_dict; a weight computed by the model
        # (not one a trainer updates) by its layer's number
        wname = self.names.get(id(weight), f"w{k}")
        self.weights[wname] = _array(weight)
        op: dict[str, Any] = {"op": "linear", "input": x.spec(), "weight": wname}
        if bias is not None:
            bname = self.names.get(id(bias), f"b{k}")
            self.weights[bname] = _array(bias)
            op["bias"] = bname
        return self.emit(op, weight.shape[0])

    def activation(self, node: Any, x: Row, name: str) -> Row:
        """Folded into the linear layer before it where that layer feeds nothing else."""
        last = len(self.ops) + 1
        source = node.args[0]
        if self.ops and x.slices == ((last, 0, self.widths[-1]),) and \
                self.ops[-1]["op"] == "linear" and \
                "activation" not in self.ops[-1] and len(source.users) == 1:
            self.ops[-1]["activation"] = name
            return x
        return self.emit({"op": "activation", "input": x.spec(), "activation": name}, x.width)

    def cat(self, node: Any, parts: list[Any], dim: int) -> Row | Stack:
        if all(isinstance(p, Row) for p in parts) and _dim(dim, 2) == 1:
            return Row(tuple(s for p in parts for s in p.slices))
        if all(isinstance(p, Stack) for p in parts) and _dim(dim, 3) == 1:
            return Stack(tuple(r for p in parts for r in p.rows))
        raise self.refuse(node, " (a concatenation along the batch or of mixed shapes)")

    def slice(self, node: Any, x: Any, dim: int = 0, start: Any = None, end: Any = None,
              step: int = 1) -> Any:
        full = start in (None, 0) and (end is None or (isinstance(end, int) and end >= 2**62))
        if _dim(dim, 3 if isinstance(x, Stack | Gram) else 2) == 0 and full and step == 1:
            return x  # every sample
        if isinstance(x, Row) and _dim(dim, 2) == 1 and step == 1 and \
                isinstance(start or 0, int) and (end is None or isinstance(end, int)):
            lo = (start or 0) + (x.width if (start or 0) < 0 else 0)
            hi = x.width if end is None else min(end + (x.width if end < 0 else 0), x.width)
            return x.take(lo, hi)
        raise self.refuse(node, " (a slice across samples or with a step)")

    def reshape(self, node: Any, x: Any, shape: Any) -> Any:
        if isinstance(x, Opaque):
            return x
        if shape is None or len(shape) == 2:  # [batch, -1] / [batch, w] / flatten(1)
            if shape is not None and not (shape[1] == -1 or isinstance(x, Row | Stack)):
                raise self.refuse(node)
            if isinstance(x, Stack):
                return Row(tuple(s for r in x.rows for s in r.slices))
            if isinstance(x, Row):
                return x
        if isinstance(x, Row) and shape is not None and len(shape) == 3:
            n, d = shape[1], shape[2]
            if n == -1 and isinstance(d, int):
                n = x.width // d
            if d == -1 and isinstance(n, int):
                d = x.width // n
            if isinstance(n, int) and isinstance(d, int) and n * d == x.width:
                return Stack(tuple(x.take(i * d, (i + 1) * d) for i in range(n)))
        raise self.refuse(node, " (a reshape that mixes samples)")

    def pairs(self, node: Any, gram: Gram, index: Any) -> Row:
        if len(index) != 3 or index[0] is not None or not all(
                isinstance(t, Tensor) and t.dim() == 1 for t in index[1:]) or \
                index[1].shape != index[2].shape:
            raise self.refuse(node, " (picking from the products other than by pairs)")
        n = len(gram.stack.rows)
        pairs = [[int(i) % n, int(j) % n] for i, j in zip(index[1], index[2], strict=True)]
        vectors = [r.spec() for r in gram.stack.rows]
        return self.emit({"op": "dots", "vectors": vectors, "pairs": pairs}, len(pairs))

    def finish(self, out: Row) -> Captured:
        """The program without ops the output does not need, values renumbered."""
        needed = {v for v, _, _ in out.slices}
        live = [False] * len(self.ops)
        for i in range(len(self.ops) - 1, -1, -1):
            if i + 2 in needed:
                live[i] = True
                needed |= {v for v, _, _ in _op_slices(self.ops[i])}
        number = {0: 0, 1: 1}
        for i, keep in enumerate(live):
            if keep:
                number[i + 2] = len(number)

        def cols(x: list[list[int]]) -> list[list[int]]:
            return [[number[v], a, b] for v, a, b in x]

        def renumber(op: dict[str, Any]) -> dict[str, Any]:
            op = {k: cols(v) if k in ("input", "a", "b") else v for k, v in op.items()}
            if "vectors" in op:
                op["vectors"] = [cols(v) for v in op["vectors"]]
            return op

        ops = [renumber(op) for op, keep in zip(self.ops, live, strict=True) if keep]
        used = {op[k] for op in ops for k in ("weight", "bias") if k in op}
        spec = {"dense": 0 if self.dense is None else int(self.dense.shape[1]), "ops": ops,
                "output": cols(out.spec())}
        feats = [(c, f) for c in self.collections for f in c.features]
        return Captured(spec, {k: v for k, v in self.weights.items() if k in used},
                        self.collections, [f for _, f in feats],
                        [c.feature_names[f] for c, f in feats],
                        [c.pooling[c.feature_names[f]] for c, f in feats],
                        [d for c in self.collections for d in c.dims])


def _op_slices(op: dict[str, Any]) -> list[list[int]]:
    if op["op"] == "dots":
        return [s for v in op["vectors"] for s in v]
    return [s for k in ("input", "a", "b") for s in op.get(k, [])]


def _map(x: Any, env: dict[Any, Any]) -> Any:
    if isinstance(x, torch.fx.Node):
        return env[x]
    if isinstance(x, list | tuple):
        return type(x)(_map(v, env) for v in x)
    if isinstance(x, dict):
        return {k: _map(v, env) for k, v in x.items()}
    return x


def _leaves(x: Any) -> list[Any]:
    if isinstance(x, list | tuple):
        return [y for v in x for y in _leaves(v)]
    if isinstance(x, dict):
        return [y for v in x.values() for y in _leaves(v)]
    return [x]


def _dim(dim: Any, ndim: int) -> int:
    return dim + ndim if isinstance(dim, int) and dim < 0 else dim


def _array(t: Tensor) -> np.ndarray:
    return np.ascontiguousarray(t.detach().float().cpu().numpy())


__all__ = ["Captured", "capture"]
