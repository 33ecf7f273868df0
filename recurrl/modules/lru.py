"""``LRUModule``: an LRU (Linear Recurrent Unit) that reads and writes its state in
TensorDicts."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from tensordict.utils import NestedKey
from torch import nn

from recurrl.modules.mingru import _NativeNetwork
from recurrl.modules.nets.linear import LRU
from recurrl.modules.recurrent import RecurrentModule
from recurrl.modules.registry import register_memory

__all__ = ["LRU", "LRUModule"]


class LRUModule(_NativeNetwork, RecurrentModule):
    """A stacked LRU (Orvieto et al. 2023) on TensorDicts, one step at a time or over whole
    sequences.

    The same contract as :class:`LSTMModule` (keys, the two modes, resets, ``("next", ...)``,
    :meth:`make_tensordict_primer`), with two state keys: ``y`` ``[*B, num_layers, H]``, the
    last output of every layer (as the LSTM's ``h``; the recurrence does not read it), and
    ``h`` ``[*B, num_layers, 2H]``, the complex state stored as ``[Re h | Im h]`` (every
    stored state is real). ``in_keys = [input, y, h, "is_init"]``, ``out_keys = [output,
    ("next", y), ("next", h)]``. Each layer (input ``x``: the module's input, then the
    previous layer's ``y``) is a diagonal complex linear recurrence
    (:class:`~recurrl.functional.recurrent.lru.LRUKind`)::

        lambda = exp(-exp(nu) + i exp(theta)),  gamma = sqrt(1 - |lambda|^2)
        h' = lambda * h + gamma * (B x)
        y' = Re(C h') + D x

    so recurrent mode runs as a reset-aware complex parallel scan (backend ``"assoc"``, what
    ``"auto"`` picks) instead of a loop over time. The network is always recurrl's own
    (:class:`~recurrl.modules.nets.linear.LRU`, python-native torch ops):
    :attr:`python_based` is True, and ``"pad"`` runs that network on the pieces between
    resets. Each layer is linear in its input: put nonlinear layers before and after it.

    Args:
        bias: learn ``bias_ih_l{k}`` (on ``B x`` and ``D x``). Default: True.
        recurrent_backend: ``"auto"`` (``"cpp"`` on CPU where recurrl's C++ kernels build,
            else ``"assoc"``), ``"cpp"`` (fused C++ loop), ``"assoc"`` (parallel scan),
            ``"scan"`` (time loop) or ``"pad"`` (the network on the pieces between
            resets); all give the same numbers. ``"triton"`` refuses the cell.
            Default: "auto".
        recurrent_recompute: ``"none"`` or ``"full"`` (recompute activations in backward;
            ``"pad"`` cannot and raises; ``"auto"`` then picks among the others).
            Default: "none".
        r_min: the smallest initial ``|lambda|`` (the paper's ring initialisation).
            Default: 0.0.
        r_max: the largest initial ``|lambda|``; near 1 for long memories. Default: 1.0.
        max_phase: the largest initial ``arg(lambda)``. Default: 2 pi.

    Keyword Args:
        in_key: the input key; the state keys default to ``"recurrent_state_y"`` and
            ``"recurrent_state_h"``. Exclusive with ``in_keys``.
        in_keys: ``[input, y, h]`` keys (``"is_init"`` is appended). Exclusive with
            ``in_key``.
        out_keys: ``[output, ("next", y), ("next", h)]``. Exclusive with ``out_key``.
        lru: an existing :class:`~recurrl.modules.nets.linear.LRU` to wrap, exclusive
            with the arguments that build one (``r_min``, ``r_max`` and ``max_phase``
            included).

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from recurrl.modules import LRUModule, set_recurrent_mode
        >>> net = LRUModule(input_size=3, hidden_size=8, in_key="obs", out_key="features")
        >>> net.in_keys
        ['obs', 'recurrent_state_y', 'recurrent_state_h', 'is_init']
        >>> step = TensorDict({"obs": torch.randn(4, 3),
        ...                    "is_init": torch.ones(4, 1, dtype=torch.bool)}, batch_size=[4])
        >>> net(step)["next", "recurrent_state_h"].shape
        torch.Size([4, 1, 16])
        >>> seq = TensorDict({"obs": torch.randn(4, 10, 3),
        ...                   "recurrent_state_y": torch.zeros(4, 10, 1, 8),
        ...                   "recurrent_state_h": torch.zeros(4, 10, 1, 16),
        ...                   "is_init": torch.zeros(4, 10, 1, dtype=torch.bool)},
        ...                  batch_size=[4, 10])
        >>> with set_recurrent_mode(True):
        ...     out = net(seq)
        >>> out["features"].shape
        torch.Size([4, 10, 8])
    """

    cell = "lru"
    network_attr = "lru"
    default_state_keys = ("recurrent_state_y", "recurrent_state_h")
    network_class = LRU
    python_network_class = LRU

    def __init__(
        self,
        input_size: int | None = None,
        hidden_size: int | None = None,
        num_layers: int = 1,
        bias: bool = True,
        dropout: float = 0.0,
        recurrent_backend: str = "auto",
        recurrent_recompute: str = "none",
        r_min: float = 0.0,
        r_max: float = 1.0,
        max_phase: float = 2 * math.pi,
        *,
        in_key: NestedKey | None = None,
        in_keys: Sequence[NestedKey] | None = None,
        out_key: NestedKey | None = None,
        out_keys: Sequence[NestedKey] | None = None,
        device: torch.device | str | None = None,
        lru: nn.Module | None = None,
        default_recurrent_mode: bool | None = None,
        n_agents: int | None = None,
        share_params: bool = True,
    ) -> None:
        ring = (r_min, r_max, max_phase)
        if lru is not None and ring != (0.0, 1.0, 2 * math.pi):
            raise ValueError(
                f"{type(self).__name__}: lru= wraps an existing module and is exclusive with "
                f"the arguments that build one; drop r_min, r_max and max_phase (they were "
                f"used when the wrapped LRU was initialised)."
            )
        self._ring = ring  # read by _build_rnn during the base's construction
        super().__init__(
            input_size, hidden_size, num_layers, bias, dropout, python_based=True,
            recurrent_backend=recurrent_backend, recurrent_recompute=recurrent_recompute,
            in_key=in_key, in_keys=in_keys, out_key=out_key, out_keys=out_keys, device=device,
            rnn=lru, default_recurrent_mode=default_recurrent_mode, n_agents=n_agents,
            share_params=share_params,
        )  # fmt: skip

    def _build_rnn(self, rnn, input_size, hidden_size, num_layers, bias, dropout, proj_size,
                   device):  # fmt: skip
        if rnn is None and input_size is not None and hidden_size is not None:
            r_min, r_max, max_phase = self._ring
            return LRU(input_size, hidden_size, num_layers, bias=bias, batch_first=True,
                       dropout=dropout, r_min=r_min, r_max=r_max, max_phase=max_phase,
                       device=device)  # fmt: skip
        return super()._build_rnn(
            rnn, input_size, hidden_size, num_layers, bias, dropout, proj_size, device
        )


register_memory("lru", LRUModule, ("y", "h"))
