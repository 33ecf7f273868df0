"""``LSTMModule``: an LSTM that reads and writes its hidden state in TensorDicts."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from tensordict.utils import NestedKey
from torch import nn

from recurrl.modules.nets.rnn import LSTM
from recurrl.modules.recurrent import RecurrentModule
from recurrl.modules.registry import register_memory

__all__ = ["LSTMModule"]


class LSTMModule(RecurrentModule):
    """A stacked LSTM on TensorDicts, one step at a time or over whole sequences.

    The module reads ``in_keys = [input, h, c, "is_init"]`` and writes ``out_keys =
    [output, ("next", h), ("next", c)]``: two states, ``h`` ``[*B, num_layers, H]``
    (``[*B, num_layers, proj_size]`` with a projection) and ``c`` ``[*B, num_layers, H]``.
    Modes, resets and the ``("next", ...)`` outputs are those of :class:`RecurrentModule`,
    which documents the arguments shared with :class:`GRUModule`.

    Each layer runs torch's ``nn.LSTM`` cell on its input ``x`` (the module's input for the
    first layer, the previous layer's ``h'`` after it)::

        i = sigmoid(W_ii x + b_ii + W_hi h + b_hi)
        f = sigmoid(W_if x + b_if + W_hf h + b_hf)
        g = tanh(W_ig x + b_ig + W_hg h + b_hg)
        o = sigmoid(W_io x + b_io + W_ho h + b_ho)
        c' = f * c + i * g
        h' = o * tanh(c')              (h' = W_hr (o * tanh(c')) with proj_size > 0)

    Args:
        proj_size: LSTM output projection size (0 for none). Default: 0.

    Keyword Args:
        in_key: the input key; the state keys default to ``"recurrent_state_h"`` and
            ``"recurrent_state_c"``. Exclusive with ``in_keys``.
        in_keys: ``[input, h, c]`` keys (``"is_init"`` is appended). Exclusive with ``in_key``.
        out_keys: ``[output, ("next", h), ("next", c)]``. Exclusive with ``out_key``.
        lstm: an existing ``torch.nn.LSTM`` (or recurrl ``LSTM``) to wrap, exclusive with the
            arguments that build one.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from recurrl.modules import LSTMModule, set_recurrent_mode
        >>> lstm = LSTMModule(input_size=3, hidden_size=8, in_key="obs", out_key="features")
        >>> lstm.in_keys
        ['obs', 'recurrent_state_h', 'recurrent_state_c', 'is_init']
        >>> step = TensorDict({"obs": torch.randn(4, 3),
        ...                    "is_init": torch.ones(4, 1, dtype=torch.bool)}, batch_size=[4])
        >>> lstm(step)["next", "recurrent_state_h"].shape
        torch.Size([4, 1, 8])
        >>> seq = TensorDict({"obs": torch.randn(4, 10, 3),
        ...                   "recurrent_state_h": torch.zeros(4, 10, 1, 8),
        ...                   "recurrent_state_c": torch.zeros(4, 10, 1, 8),
        ...                   "is_init": torch.zeros(4, 10, 1, dtype=torch.bool)},
        ...                  batch_size=[4, 10])
        >>> with set_recurrent_mode(True):
        ...     out = lstm(seq)
        >>> out["features"].shape
        torch.Size([4, 10, 8])

        Tensors as keywords (the ``in_keys``) return the ``out_keys`` as a tuple; a state
        may be left out where every row starts an episode:

        >>> y, h, c = lstm(obs=torch.randn(4, 3), is_init=torch.ones(4, 1, dtype=torch.bool))
        >>> y.shape, h.shape
        (torch.Size([4, 8]), torch.Size([4, 1, 8]))
    """

    cell = "lstm"
    network_attr = "lstm"
    default_state_keys = ("recurrent_state_h", "recurrent_state_c")
    network_class = nn.LSTM
    python_network_class = LSTM

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
        proj_size: int = 0,
        *,
        in_key: NestedKey | None = None,
        in_keys: Sequence[NestedKey] | None = None,
        out_key: NestedKey | None = None,
        out_keys: Sequence[NestedKey] | None = None,
        device: torch.device | str | None = None,
        lstm: nn.Module | None = None,
        default_recurrent_mode: bool | None = None,
        batch_first: bool = True,
        bidirectional: bool = False,
        n_agents: int | None = None,
        share_params: bool = True,
    ) -> None:
        super().__init__(
            input_size, hidden_size, num_layers, bias, dropout, python_based,
            recurrent_backend, recurrent_compute_dtype, recurrent_recompute,
            recurrent_matmul_precision, proj_size, in_key=in_key, in_keys=in_keys,
            out_key=out_key, out_keys=out_keys, device=device, rnn=lstm,
            default_recurrent_mode=default_recurrent_mode, batch_first=batch_first,
            bidirectional=bidirectional, n_agents=n_agents,
            share_params=share_params,
        )  # fmt: skip


register_memory("lstm", LSTMModule, ("h", "c"))
