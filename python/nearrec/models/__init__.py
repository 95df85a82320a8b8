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

The modules live by concern: :mod:`.layers` (``mlp``, ``linear_shapes``, ``Stages``),
:mod:`.families` (what every model shares, DLRM, WND, MTWND and NCF, and whole-model offload:
``Offloaded``, ``offload``), :mod:`.sequence` (DIN, DIEN and ``SequenceSparse``),
:mod:`.catalog` (``build``), :mod:`.pipeline` (``infer``, ``split``), :mod:`.saving` (``save``,
``load``, ``rebuild``, ``kept``). Everything public is imported from here, ``nearrec.models``.
"""

from __future__ import annotations

from .catalog import build
from .families import DLRM, NCF, OFFLOADABLE, MultiTaskWideAndDeep, Offloaded, WideAndDeep, offload
from .families import _Model as _Model  # for nearrec.cli
from .layers import Stages, linear_shapes, mlp
from .pipeline import InferResult, infer, split
from .saving import CONFIG_ATTACHMENT as CONFIG_ATTACHMENT
from .saving import WEIGHTS_ATTACHMENT as WEIGHTS_ATTACHMENT
from .saving import kept, load, rebuild, save
from .sequence import DIEN, DIN, SequenceSparse

# The public nn.Module classes keep the module they had before this package was cut into
# modules: pickles (a model pickled with its store), reprs and the module stacks that
# torch.export records all name nearrec.models.X, wherever X is defined now. (Functions and
# plain results keep theirs, so that their annotations resolve where they are written.)
for _public in (DIEN, DIN, DLRM, NCF, MultiTaskWideAndDeep, Offloaded, SequenceSparse,
                WideAndDeep, _Model):
    _public.__module__ = __name__
del _public

__all__ = ["DIEN", "DIN", "DLRM", "NCF", "OFFLOADABLE", "InferResult", "MultiTaskWideAndDeep",
           "Offloaded", "SequenceSparse", "Stages", "WideAndDeep", "build", "infer", "kept",
           "linear_shapes", "load", "mlp", "offload", "rebuild", "save", "split"]
