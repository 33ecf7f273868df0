"""``GRUModule``: a GRU that reads and writes its hidden state in TensorDicts."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from tensordict.utils import NestedKey
from torch import nn

from recurrl.modules.nets.rnn import GRU
from recurrl.modules.recurrent import RecurrentModule
from recurrl.modules.registry import register_memory

__all__ = ["GRUModule"]


class GRUModule(RecurrentModule):
    """A stacked GRU on TensorDicts, one step at a time or over whole sequences.

    The module reads ``in_keys = [input, h, "is_init"]`` and writes ``out_keys =
    [output, ("next", h)]``: one state, ``h`` ``[*B, num_layers, H]``. Modes, resets and the
    ``("next", h)`` output are those of :class:`RecurrentModule`, which documents the
    arguments shared with :class:`LSTMModule`.

    Each layer runs torch's ``nn.GRU`` cell on its input ``x`` (the module's input for the
    first layer, the previous layer's ``h'`` after it)::

        r = sigmoid(W_ir x + b_ir + W_hr h + b_hr)
        z = sigmoid(W_iz x + b_iz + W_hz h + b_hz)
        n = tanh(W_in x + b_in + r * (W_hn h + b_hn))
        h' = (1 - z) * n + z * h

    Keyword Args:
        in_key: the input key; the state key defaults to ``"recurrent_state"``. Exclusive
            with ``in_keys``.
        in_keys: ``[input, h]`` keys (``"is_init"`` is appended). Exclusive with ``in_key``.
        out_keys: ``[output, ("next", h)]``. Exclusive with ``out_key``.
        gru: an existing ``torch.nn.GRU`` (or recurrl ``GRU``) to wrap, exclusive with the
            arguments that build one.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from recurrl.modules import GRUModule, set_recurrent_mode
        >>> gru = GRUModule(input_size=3, hidden_size=8, in_key="obs", out_key="features")
        >>> gru.in_keys
        ['obs', 'recurrent_state', 'is_init']
        >>> step = TensorDict({"obs": torch.randn(4, 3),
        ...                    "is_init": torch.ones(4, 1, dtype=torch.bool)}, batch_size=[4])
        >>> gru(step)["next", "recurrent_state"].shape
        torch.Size([4, 1, 8])
        >>> seq = TensorDict({"obs": torch.randn(4, 10, 3),
        ...                   "recurrent_state": torch.zeros(4, 10, 1, 8),
        ...                   "is_init": torch.zeros(4, 10, 1, dtype=torch.bool)},
        ...                  batch_size=[4, 10])
        >>> with set_recurrent_mode(True):
        ...     out = gru(seq)
        >>> out["features"].shape
        torch.Size([4, 10, 8])

        Tensors as keywords (the ``in_keys``) return the ``out_keys`` as a tuple; a state
        may be left out where every row starts an episode:

        >>> y, h = gru(obs=torch.randn(4, 3), is_init=torch.ones(4, 1, dtype=torch.bool))
        >>> y.shape, h.shape
        (torch.Size([4, 8]), torch.Size([4, 1, 8]))
    """

    cell = "gru"
    network_attr = "gru"
    default_state_keys = ("recurrent_state",)
    network_class = nn.GRU
    python_network_class = GRU

    def __init__(
        self,
        input_size: int | None = None,
        hidden_size: int | None = None,
        num_layers: int = 1,
        bias: bool = True,
        dropout: float = 0.0,
        python_based: bool = False,
        recurrent_backend: str = "auto",
        recurrent_compute_dtype: torch.dtype = torch.float32,
        recurrent_recompute: str = "none",
        recurrent_matmul_precision: str = "auto",
        *,
        in_key: NestedKey | None = None,
        in_keys: Sequence[NestedKey] | None = None,
        out_key: NestedKey | None = None,
        out_keys: Sequence[NestedKey] | None = None,
        device: torch.device | str | None = None,
        gru: nn.Module | None = None,
        default_recurrent_mode: bool | None = None,
        batch_first: bool = True,
        bidirectional: bool = False,
        n_agents: int | None = None,
        share_params: bool = True,
    ) -> None:
        super().__init__(
            input_size, hidden_size, num_layers, bias, dropout, python_based,
            recurrent_backend, recurrent_compute_dtype, recurrent_recompute,
            recurrent_matmul_precision, in_key=in_key, in_keys=in_keys, out_key=out_key,
            out_keys=out_keys, device=device, rnn=gru,
            default_recurrent_mode=default_recurrent_mode, batch_first=batch_first,
            bidirectional=bidirectional, n_agents=n_agents,
            share_params=share_params,
        )  # fmt: skip


register_memory("gru", GRUModule, ("h",))
