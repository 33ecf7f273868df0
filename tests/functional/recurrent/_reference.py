"""An independent reference of the recurrent-mode contract, and random problems for it.

The reference splits every row at its restarts and runs each piece, one step at a time,
through torch's cell operators (``torch.lstm_cell``/``torch.gru_cell``) with the weights of a
``torch.nn.LSTM``/``nn.GRU``, from the state stored at the piece's first step: no ``where``,
no padding, no shared code with the backends under test. (Cells rather than the fused
``nn.LSTM`` keep the reference's backward fast on CPU, where oneDNN's is slow per shape.)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from recurrl.functional.recurrent import RNNConfig

TORCH_RNN = {"lstm": nn.LSTM, "gru": nn.GRU}


@dataclass
class Problem:
    cfg: RNNConfig
    rnn: nn.Module
    x: Tensor
    states: tuple[Tensor, ...]
    is_init: Tensor

    @property
    def weights(self) -> list[Tensor]:
        return list(self.rnn._flat_weights)

    def leaves(self) -> list[Tensor]:
        """Fresh leaf copies of the inputs and stored states, requiring grad."""
        return [t.detach().clone().requires_grad_(True) for t in (self.x, *self.states)]


def make_problem(
    mode: str = "lstm",
    *,
    n: int = 3,
    steps: int = 7,
    input_size: int = 3,
    hidden: int = 4,
    num_layers: int = 2,
    bias: bool = True,
    proj_size: int = 0,
    p_init: float = 0.3,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
) -> Problem:
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    extra = {"proj_size": proj_size} if proj_size else {}
    rnn = TORCH_RNN[mode](input_size, hidden, num_layers, bias=bias, batch_first=True, **extra)
    rnn = rnn.to(dtype)
    cfg = RNNConfig(mode, input_size, hidden, num_layers, bias, 0.0, proj_size)
    x = torch.randn(n, steps, input_size, generator=gen, dtype=dtype)
    states = tuple(
        torch.randn(n, steps, num_layers, s, generator=gen, dtype=dtype) for s in cfg.state_sizes
    )
    is_init = torch.rand(n, steps, generator=gen) < p_init
    return Problem(cfg, rnn, x, states, is_init)


def pieces(is_init: Tensor) -> list[tuple[int, int, int]]:
    """``(row, start, stop)`` of every trajectory of a ``[N, T]`` grid."""
    out = []
    n, steps = is_init.shape
    for row in range(n):
        starts = [0, *(t for t in range(1, steps) if is_init[row, t])]
        for a, b in zip(starts, [*starts[1:], steps], strict=True):
            out.append((row, a, b))
    return out


def _run_piece(rnn: nn.Module, x: Tensor, hx: tuple[Tensor, ...]):
    """``rnn`` over ``x [T, F]`` from ``hx`` (each ``[L, S]``): outputs ``[T, O]``, final states."""
    lstm = isinstance(rnn, nn.LSTM)
    layer_in, finals = list(x.unbind(0)), []
    for layer in range(rnn.num_layers):
        w = [
            getattr(rnn, f"{name}_l{layer}", None)
            for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh", "weight_hr")
        ]
        state = tuple(h[layer].unsqueeze(0) for h in hx)
        outs = []
        for x_t in layer_in:
            if lstm and w[4] is not None:  # torch.lstm_cell has no projection
                gates = F.linear(x_t.unsqueeze(0), w[0], w[2]) + F.linear(state[0], w[1], w[3])
                i, f, g, o = gates.chunk(4, dim=-1)
                c = torch.sigmoid(f) * state[1] + torch.sigmoid(i) * torch.tanh(g)
                state = (F.linear(torch.sigmoid(o) * torch.tanh(c), w[4]), c)
            elif lstm:
                state = torch.lstm_cell(x_t.unsqueeze(0), state, *w[:4])
            else:
                state = (torch.gru_cell(x_t.unsqueeze(0), state[0], *w[:4]),)
            outs.append(state[0][0])
        layer_in = outs
        finals.append(state)
    return torch.stack(layer_in), tuple(torch.cat(s) for s in zip(*finals, strict=True))


def reference_unroll(
    rnn: nn.Module, x: Tensor, states: tuple[Tensor, ...], is_init: Tensor
) -> tuple[Tensor, tuple[Tensor, ...]]:
    """``(y [N, T, O], next states [N, T, L, S])``: exact at trajectory ends, zero elsewhere."""
    ys = {}
    nexts: dict[tuple[int, int], tuple[Tensor, ...]] = {}
    for row, a, b in pieces(is_init):
        y, nexts[row, b - 1] = _run_piece(rnn, x[row, a:b], tuple(s[row, a] for s in states))
        for t in range(a, b):
            ys[row, t] = y[t - a]
    n, steps = is_init.shape
    y = torch.stack([torch.stack([ys[r, t] for t in range(steps)]) for r in range(n)])
    new_states = []
    for k, s in enumerate(states):
        zero = torch.zeros_like(s[0, 0])
        rows = [
            torch.stack([nexts[r, t][k] if (r, t) in nexts else zero for t in range(steps)])
            for r in range(n)
        ]
        new_states.append(torch.stack(rows))
    return y, tuple(new_states)


def zero_restarts(p: Problem) -> Problem:
    """``p`` with zero stored states at every restart inside a row (a collector's data)."""
    inside = p.is_init.clone()
    inside[:, 0] = False
    for s in p.states:
        s[inside] = 0.0
    return p


def loss_of(y: Tensor, states: tuple[Tensor, ...], seed: int = 1) -> Tensor:
    """A fixed random linear function of every output."""
    gen = torch.Generator().manual_seed(seed)
    total = (y * torch.randn(y.shape, generator=gen, dtype=y.dtype)).sum()
    for s in states:
        total = total + (s * torch.randn(s.shape, generator=gen, dtype=s.dtype)).sum()
    return total


#: Layouts both fused ``pad`` layouts are checked on (``make_problem`` keyword arguments).
LAYOUT_SPECS = [
    dict(seed=0),
    dict(seed=1, num_layers=1),
    dict(seed=2, bias=False),
    dict(seed=3, proj_size=2),
    dict(seed=4, n=1, steps=12, p_init=0.5),
    dict(seed=5, p_init=1.0),
    dict(seed=6, num_layers=3, n=5, steps=20),
    dict(seed=7, n=6, steps=30, p_init=0.1, hidden=40),
]
