"""``LSTMNet``: an MLP embedding followed by an LSTM and a linear read-out, on tensors."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from recurrl.modules.mlp import MLP
from recurrl.modules.nets.rnn import LSTM

__all__ = ["LSTMNet"]

_BACKENDS = {"torch": nn.LSTM, "recurrl": LSTM}


class LSTMNet(nn.Module):
    """MLP -> LSTM -> Linear, returning the hidden states the way a TensorDict stores them.

    Args:
        out_features: features of the output.
        lstm_kwargs: keyword arguments of the LSTM (``input_size``, ``hidden_size``,
            ``num_layers``, ...); it always runs batch-first.
        mlp_kwargs: keyword arguments of the :class:`MLP` embedding (its ``out_features``
            must equal the LSTM's ``input_size``).
        device: device of the parameters.

    Keyword Args:
        lstm_backend: ``"torch"`` (``torch.nn.LSTM``, default) or ``"recurrl"`` (the
            python-native LSTM, which works under ``torch.vmap``/``torch.compile``).

    ``forward(input, hidden0_in=None, hidden1_in=None)`` takes ``input`` ``[B, F]`` (one step)
    or ``[B, T, F]`` (a sequence; more leading dims are flattened into ``B``) and initial states
    ``[B, L, H]`` (``[B, T, L, H]`` is accepted: its first step is used), zeros when None. It
    returns ``(y, hidden0_in, hidden1_in, hidden0_out, hidden1_out)``. For a sequence,
    ``y`` is ``[B, T, out]`` and the four states are ``[B, T, L, H]``: the inputs hold the
    initial state at ``t = 0`` and the outputs the final state at ``t = T-1``, zero elsewhere
    (an LSTM kernel only returns the last state). For one step every tensor loses ``T``.

    Examples:
        >>> import torch
        >>> net = LSTMNet(10, {"input_size": 5, "hidden_size": 5}, {"out_features": 5})
        >>> y, h0, c0, h1, c1 = net(torch.randn(7, 6, 4))
        >>> y.shape, h1.shape
        (torch.Size([7, 6, 10]), torch.Size([7, 6, 1, 5]))
        >>> y, h0, c0, h1, c1 = net(torch.randn(7, 4))
        >>> y.shape, h1.shape
        (torch.Size([7, 10]), torch.Size([7, 1, 5]))
    """

    def __init__(
        self,
        out_features: int,
        lstm_kwargs: dict[str, Any],
        mlp_kwargs: dict[str, Any],
        device: torch.device | str | None = None,
        *,
        lstm_backend: str | None = None,
    ) -> None:
        super().__init__()
        backend = lstm_backend or "torch"
        if backend not in _BACKENDS:
            raise ValueError(
                f"LSTMNet: lstm_backend must be one of {sorted(_BACKENDS)}, got {lstm_backend!r}."
            )
        lstm_kwargs = dict(lstm_kwargs)
        if not lstm_kwargs.pop("batch_first", True):
            raise ValueError("LSTMNet: the LSTM always runs batch-first; drop batch_first=False.")
        self.mlp = MLP(**mlp_kwargs, device=device)
        self.lstm = _BACKENDS[backend](**lstm_kwargs, batch_first=True, device=device)
        self.linear = nn.LazyLinear(out_features, device=device)

    def forward(
        self, input: Tensor, hidden0_in: Tensor | None = None, hidden1_in: Tensor | None = None
    ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        single_step = input.dim() == 2
        x = input.unsqueeze(1) if single_step else input.reshape(-1, *input.shape[-2:])
        emb = self.mlp(x)
        batch, steps = emb.shape[:2]
        lstm = self.lstm
        h_size = getattr(lstm, "proj_size", 0) or lstm.hidden_size
        h0 = self._initial(hidden0_in, batch, lstm.num_layers, h_size, emb)
        c0 = self._initial(hidden1_in, batch, lstm.num_layers, lstm.hidden_size, emb)
        hx = (h0.transpose(0, 1).contiguous(), c0.transpose(0, 1).contiguous())
        out, (h1, c1) = lstm(emb, hx)
        y = self.linear(out)
        h1, c1 = h1.transpose(0, 1), c1.transpose(0, 1)
        if single_step:
            return y.squeeze(1), h0, c0, h1, c1
        lead = input.shape[:-2]

        def spread(state: Tensor, at: int) -> Tensor:
            full = state.new_zeros(batch, steps, *state.shape[1:])
            full[:, at] = state
            return full.reshape(*lead, steps, *state.shape[1:])

        y = y.reshape(*lead, steps, y.shape[-1])
        return y, spread(h0, 0), spread(c0, 0), spread(h1, -1), spread(c1, -1)

    @staticmethod
    def _initial(state: Tensor | None, batch: int, layers: int, size: int, like: Tensor):
        if state is None:
            return like.new_zeros(batch, layers, size)
        if state.dim() >= 4:
            state = state.reshape(-1, *state.shape[-3:])[:, 0]
        if state.shape != (batch, layers, size):
            raise ValueError(
                f"LSTMNet: hidden state must have shape [B, num_layers, H] = "
                f"{[batch, layers, size]} (or [B, T, num_layers, H]), got {list(state.shape)}."
            )
        return state
