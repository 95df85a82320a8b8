"""DIN and DIEN, whose behaviour tables may be read as sequences (:class:`SequenceSparse`), and
which the engine has no twin of."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from ..errors import InvalidRequest
from ..specs import ModelSpec
from ..store import Store
from ..torch import EmbeddingBagCollection, EmbeddingCollection, JaggedTensor
from .families import _Model
from .layers import Stages, _mark, mlp


class SequenceSparse(nn.Module):
    """DIN's and DIEN's sparse part as the models mean it (``build(..., sequence=True)``): the
    behaviour tables read as sequences, each id's own row (an
    :class:`~nearrec.torch.EmbeddingCollection`), the others pooled (an
    :class:`~nearrec.torch.EmbeddingBagCollection`). ``forward(features)`` gives ``{table:
    pooled [batch, dim] | JaggedTensor}``."""

    reads_sequences = True

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
