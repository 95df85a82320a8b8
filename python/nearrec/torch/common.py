"""What the torch modules share: argument checks, the device of the input, an answer in the
asked ``out_dtype``, and the refusal of ``torch.jit.trace``."""

from __future__ import annotations

from typing import Any, get_args

import torch
from torch import Tensor, nn

from .._native import round_out
from ..errors import InvalidRequest
from ..request import OutDtypeName
from ..request import out_dtype as _out_name

_TORCH_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


def answer_dtype(value: Any) -> str | None:
    """``out_dtype`` of a module, by name (``None``: float32); an unknown one refused here."""
    name = _out_name(value)
    if name is not None and name not in get_args(OutDtypeName):
        raise InvalidRequest(f'out_dtype "{name}" is not one of \'fp32\', \'fp16\', \'bf16\', '
                             f'\'int8\'')
    return None if name == "fp32" else name


def typed_answer(values: Tensor, dims: list[int], out: str | None, rounded: bool) -> Tensor:
    """A float32 ``[batch, Σ dims]`` answer in ``out``: rounded once as a store rounds its
    answers (unless the store did: ``rounded``), as a float16 / bfloat16 tensor for fp16 / bf16
    (exact once rounded), float32 for int8."""
    if out is None:
        return values
    if out == "int8":
        if rounded:
            return values
        cpu = values.detach().to("cpu", torch.float32).contiguous().numpy().copy()
        round_out(cpu, dims, out)
        return torch.from_numpy(cpu).to(values.device)
    return values.to(_TORCH_DTYPES[out])


def _numpy(t: Any) -> Any:
    if isinstance(t, Tensor):
        if t.requires_grad:
            t = t.detach()
        return t.numpy() if t.device.type == "cpu" else t.cpu().numpy()
    return t


def _table_name(table: Any) -> str:
    if not isinstance(table, str):
        raise InvalidRequest(f"a table name must be a str, not {type(table).__name__} "
                             f"{table!r:.60}")
    return table


def _device_arg(device: Any) -> torch.device | None:
    if device is None:
        return None
    try:
        return torch.device(device)
    except (RuntimeError, TypeError, ValueError) as e:
        raise InvalidRequest(f"device must be a torch device such as 'cpu' or 'cuda', not "
                             f"{device!r:.60}: {e}") from None


def _features_arg(features: Any) -> None:
    if not all(callable(getattr(features, m, None)) for m in ("keys", "values", "lengths")):
        raise InvalidRequest("features must be a KeyedJaggedTensor (keys(), values(), "
                             f"lengths()), not {type(features).__name__} {features!r:.60}")


def _not_traced(module: nn.Module) -> None:
    """``torch.jit.trace`` records the tensors a lookup returns as constants: the traced module
    would answer every later input with this input's embeddings. Refused."""
    if torch.jit.is_tracing():  # type: ignore[attr-defined, no-untyped-call]  # untyped in torch
        raise InvalidRequest(f"torch.jit.trace cannot record a {type(module).__name__}'s "
                             "lookup (it would freeze this input's embeddings as constants); "
                             "run the module eagerly")


def _device_of(*xs: Any) -> torch.device:
    for x in xs:
        if isinstance(x, Tensor):
            return x.device
    return torch.device("cpu")
