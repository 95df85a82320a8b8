"""The models' building blocks: FC stacks (``mlp``), their shapes, and the time spent per stage
of a dense part (``Stages``)."""

from __future__ import annotations

import time
from collections.abc import Sequence

from torch import nn


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
