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

import logging

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



def _quiet_fx_tracing_notice() -> None:
    """PyTorch logs once per process ``is_fx_tracing will return true for both fx.symbolic_trace
    and torch.export ...`` the first time anything asks ``is_fx_tracing()`` — which TorchRec
    does on its own, building a ``KeyedJaggedTensor`` (``make demo``'s first screen showed it).
    It speaks of PyTorch's internals, not of anything a caller does: it is taken here, once,
    unprinted, so that a user of nearrec with TorchRec sees nearrec's output only."""
    try:
        from torch.fx import _symbolic_trace
    except ImportError:  # a PyTorch without it: nothing to take
        return
    notice = getattr(_symbolic_trace, "is_fx_tracing_warning", None)
    log = logging.getLogger(_symbolic_trace.__name__)
    if notice is None:
        return

    def not_that_line(record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("is_fx_tracing will return true")

    log.addFilter(not_that_line)
    try:
        notice()
    finally:
        log.removeFilter(not_that_line)


_quiet_fx_tracing_notice()

__all__ = ["EmbeddingBag", "EmbeddingBagCollection", "EmbeddingCollection", "JaggedTensor",
           "KeyedEmbeddingBag", "KeyedJaggedTensor", "KeyedTensor", "from_torchrec",
           "pooled_lookup"]
