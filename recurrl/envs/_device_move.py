"""Moving what an env holds to another device (:meth:`recurrl.envs.EnvBase.to`)."""

from __future__ import annotations

from typing import Any

import torch
from tensordict import TensorDictBase
from torch import nn

__all__ = ["move_module"]

# nn.Module's own bookkeeping (moved by _apply, or holding no data) and the env's specs
_NOT_DATA = frozenset({"_parameters", "_buffers", "_modules", "_specs"})


def move_module(module: nn.Module, device: torch.device) -> None:
    """Move ``module``'s parameters, buffers and tensor attributes to ``device``, then its
    children: sub-envs through their own :meth:`EnvBase.to`, other modules the same way."""
    nn.Module._apply(module, lambda t: t.to(device), recurse=False)
    for name, value in list(vars(module).items()):
        if name in _NOT_DATA:
            continue
        moved = _moved(value, device)
        if moved is not value:
            object.__setattr__(module, name, moved)
    for child in module.children():
        if callable(getattr(child, "_move_to", None)):  # a sub-env: its own EnvBase.to
            child.to(device)
        else:
            move_module(child, device)


def _moved(value: Any, device: torch.device) -> Any:
    """``value`` on ``device``: a tensor / TensorDict, a generator (re-seeded from its own
    stream, as its state cannot cross devices), or a list, tuple or dict of them (``value``
    itself when it holds none)."""
    if isinstance(value, (torch.Tensor, TensorDictBase)):
        return value.to(device)
    if isinstance(value, torch.Generator):
        if value.device == device:
            return value
        seed = int(torch.randint(0, 2**62, (1,), generator=value, device=value.device))
        return torch.Generator(device=device).manual_seed(seed)
    if isinstance(value, (list, tuple)) and any(
        isinstance(v, (torch.Tensor, TensorDictBase)) for v in value
    ):
        return type(value)(_moved(v, device) for v in value)
    if isinstance(value, dict) and any(
        isinstance(v, (torch.Tensor, TensorDictBase)) for v in value.values()
    ):
        return {k: _moved(v, device) for k, v in value.items()}
    return value
