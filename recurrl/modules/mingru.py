"""``MinGRUModule``: a minGRU that reads and writes its hidden state in TensorDicts."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from tensordict.utils import NestedKey
from torch import nn

from recurrl.modules.nets.linear import MinGRU
from recurrl.modules.recurrent import RecurrentModule
from recurrl.modules.registry import register_memory

__all__ = ["MinGRU", "MinGRUModule"]


class _NativeNetwork:
    """For modules whose network class is recurrl's own and the only one (MinGRU, LRU):
    nothing to convert (a wrapped network is kept, not copied), always python-native."""

    @staticmethod
    def _convert(rnn: nn.Module, cls: type[nn.Module]) -> nn.Module:
        return rnn

    def _set_rnn(self, rnn: nn.Module, python_based: bool) -> None:
        super()._set_rnn(rnn, True)  # type: ignore[misc]


class MinGRUModule(_NativeNetwork, RecurrentModule):
    """A stacked minGRU on TensorDicts, one step at a time or over whole sequences.

    The same contract as :class:`GRUModule` (keys, the two modes, resets, ``("next", h)``,
    :meth:`make_tensordict_primer`): ``in_keys = [input, h, "is_init"]``, ``out_keys =
    [output, ("next", h)]``, ``h`` ``[*B, num_layers, H]``. Each layer (input ``x``: the
    module's input, then the previous layer's ``h'``) is a linear recurrence
    (:class:`~recurrl.functional.recurrent.linear_cells.MinGRUKind`)::

        z = sigmoid(W_z x + b_z)
        h' = (1 - z) * h + z * (W_h x + b_h)

    so recurrent mode runs as a reset-aware parallel scan (backend ``"assoc"``, what
    ``"auto"`` picks) instead of a loop over time. The network is always recurrl's own
    (:class:`~recurrl.modules.nets.linear.MinGRU`, python-native torch ops):
    :attr:`python_based` is True, and ``"pad"`` runs that network on the pieces between
    resets.

    Args:
        bias: learn ``bias_ih_l{k}`` (``b_z`` and ``b_h``). Default: True.
        recurrent_backend: ``"auto"`` (``"cpp"`` on CPU where recurrl's C++ kernels build,
            else ``"assoc"``), ``"cpp"`` (fused C++ loop), ``"assoc"`` (parallel scan),
            ``"scan"`` (time loop) or ``"pad"`` (the network on the pieces between
            resets); all give the same numbers. ``"triton"`` refuses the cell.
            Default: "auto".
        recurrent_recompute: ``"none"`` or ``"full"`` (recompute activations in backward;
            ``"pad"`` cannot and raises; ``"auto"`` then picks among the others).
            Default: "none".

    Keyword Args:
        in_key: the input key; the state key defaults to ``"recurrent_state"``. Exclusive
            with ``in_keys``.
        in_keys: ``[input, h]`` keys (``"is_init"`` is appended). Exclusive with ``in_key``.
        out_keys: ``[output, ("next", h)]``. Exclusive with ``out_key``.
        mingru: an existing :class:`~recurrl.modules.nets.linear.MinGRU` to
            wrap, exclusive with the arguments that build one.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from recurrl.modules import MinGRUModule, set_recurrent_mode
        >>> net = MinGRUModule(input_size=3, hidden_size=8, in_key="obs", out_key="features")
        >>> net.in_keys
        ['obs', 'recurrent_state', 'is_init']
        >>> step = TensorDict({"obs": torch.randn(4, 3),
        ...                    "is_init": torch.ones(4, 1, dtype=torch.bool)}, batch_size=[4])
        >>> net(step)["next", "recurrent_state"].shape
        torch.Size([4, 1, 8])
        >>> seq = TensorDict({"obs": torch.randn(4, 10, 3),
        ...                   "recurrent_state": torch.zeros(4, 10, 1, 8),
        ...                   "is_init": torch.zeros(4, 10, 1, dtype=torch.bool)},
        ...                  batch_size=[4, 10])
        >>> with set_recurrent_mode(True):
        ...     out = net(seq)
        >>> out["features"].shape
        torch.Size([4, 10, 8])
    """

    cell = "mingru"
    network_attr = "mingru"
    default_state_keys = ("recurrent_state",)
    network_class = MinGRU
    python_network_class = MinGRU

    def __init__(
        self,
        input_size: int | None = None,
        hidden_size: int | None = None,
        num_layers: int = 1,
        bias: bool = True,
        dropout: float = 0.0,
        recurrent_backend: str = "auto",
        recurrent_recompute: str = "none",
        *,
        in_key: NestedKey | None = None,
        in_keys: Sequence[NestedKey] | None = None,
        out_key: NestedKey | None = None,
        out_keys: Sequence[NestedKey] | None = None,
        device: torch.device | str | None = None,
        mingru: nn.Module | None = None,
        default_recurrent_mode: bool | None = None,
        n_agents: int | None = None,
        share_params: bool = True,
    ) -> None:
        super().__init__(
            input_size, hidden_size, num_layers, bias, dropout, python_based=True,
            recurrent_backend=recurrent_backend, recurrent_recompute=recurrent_recompute,
            in_key=in_key, in_keys=in_keys, out_key=out_key, out_keys=out_keys, device=device,
            rnn=mingru, default_recurrent_mode=default_recurrent_mode, n_agents=n_agents,
            share_params=share_params,
        )  # fmt: skip


register_memory("mingru", MinGRUModule, ("h",))
