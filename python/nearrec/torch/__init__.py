"""PyTorch modules over a nearrec store: drop-in ``nn.EmbeddingBag`` and a TorchRec-shaped
``EmbeddingBagCollection`` whose rows live in the store, not in parameters; ``from_torchrec``
serves a TorchRec model's collections from a store.

Requires the ``torch`` extra (``pip install nearrec[torch]``). Lookups run in the nearrec engine
(GIL released); outputs are float32 tensors that share memory with the engine's result (no copy),
moved to the input's device when it is not the CPU. The modules are inference-only: they hold no
parameters and produce no gradients for the rows.

The modules live by concern: :mod:`.bags` (``EmbeddingBag``, ``KeyedEmbeddingBag``),
:mod:`.collection` (``EmbeddingBagCollection``), :mod:`.sequence` (``EmbeddingCollection``),
:mod:`.tensors` (``KeyedJaggedTensor``, ``KeyedTensor``, ``JaggedTensor``), :mod:`.convert`
(``from_torchrec``), :mod:`.ops` (the custom ops ``torch.compile`` / ``torch.export`` see);
:mod:`.configs` reads the tables and features a collection is given, :mod:`.common` holds the
checks they share. Everything public is imported from here, ``nearrec.torch``.
"""

from __future__ import annotations

from .bags import EmbeddingBag, KeyedEmbeddingBag
from .collection import EmbeddingBagCollection
from .common import _features_arg as _features_arg  # for nearrec.capture, nearrec.models
from .convert import from_torchrec
from .ops import _collections as _collections  # for nearrec.capture
from .ops import pooled_lookup
from .ops import sequence_lookup as sequence_lookup
from .sequence import EmbeddingCollection
from .tensors import JaggedTensor, KeyedJaggedTensor, KeyedTensor

# The public classes keep the module they had before this package was cut into modules:
# pickles (a collection pickled with its store), reprs and the module stacks that torch.export
# records all name nearrec.torch.X, wherever X is defined now. (Functions keep theirs, so that
# their annotations resolve where they are written.)
for _public in (EmbeddingBag, EmbeddingBagCollection, EmbeddingCollection, JaggedTensor,
                KeyedEmbeddingBag, KeyedJaggedTensor, KeyedTensor):
    _public.__module__ = __name__
del _public

__all__ = ["EmbeddingBag", "EmbeddingBagCollection", "EmbeddingCollection", "JaggedTensor",
           "KeyedEmbeddingBag", "KeyedJaggedTensor", "KeyedTensor", "from_torchrec",
           "pooled_lookup"]
