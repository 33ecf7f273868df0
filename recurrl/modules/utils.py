"""Helpers that look through a policy for its recurrent parts."""

from __future__ import annotations

from torch import nn

__all__ = ["get_primers_from_module"]


def get_primers_from_module(module: nn.Module):
    """The primers every recurrent submodule of ``module`` needs, in module order.

    Returns ``None`` when ``module`` holds no recurrent module, the single
    ``TensorDictPrimer`` when it holds one, and a ``Compose`` of them otherwise.

    Examples:
        >>> from tensordict.nn import TensorDictSequential as Seq
        >>> from recurrl.modules import GRUModule, LSTMModule
        >>> policy = Seq(
        ...     LSTMModule(3, 8, in_key="obs", out_key="a"),
        ...     GRUModule(8, 4, in_keys=["a", "gru_h"], out_keys=["b", ("next", "gru_h")]),
        ... )
        >>> type(get_primers_from_module(policy)).__name__
        'Compose'
        >>> get_primers_from_module(nn.Linear(2, 2)) is None
        True
    """
    primers = [
        sub.make_tensordict_primer()
        for sub in module.modules()
        if callable(getattr(sub, "make_tensordict_primer", None))
    ]
    if not primers:
        return None
    if len(primers) == 1:
        return primers[0]
    from recurrl.envs.transforms import Compose

    return Compose(*primers)
