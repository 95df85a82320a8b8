""":func:`infer`, the pipeline that reads the next batches' embeddings while the current batch's
dense part runs, and :func:`split`, one batch cut into sub-batches."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import torch
from torch import Tensor, nn

from ..errors import InvalidRequest
from ..request import count
from ..torch import EmbeddingBagCollection, KeyedJaggedTensor
from .families import Offloaded, _Model
from .layers import Stages, _mark


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
