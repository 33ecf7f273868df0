"""A plugin as a user writes one, in one file: a toy cell (an Elman RNN), its module, and a toy
recurrent backend (a plain time loop over the cell's step), each with one registration.

``RECURRL_PLUGINS=tests.trainers.toy_plugin recurrl train --memory toy_elman
--recurrent-backend toy_loop`` trains it (``tests/trainers/test_plugins.py``).
"""

from __future__ import annotations

import torch
from torch import nn

from recurrl.functional.recurrent import (
    RecurrentBackend,
    recurrent_step,
    register_recurrent_backend,
)
from recurrl.functional.recurrent.cell import CellKind, register_cell_kind
from recurrl.modules import RecurrentModule, register_memory


class ToyElmanKind(CellKind):
    """``h' = tanh(W_ih x + b_ih + W_hh h + b_hh)``, torch's ``nn.RNN`` layout."""

    name = "toy_elman"
    gates = 1

    def step_projected(self, cfg, w, xp, state):
        pre = xp + state[0] @ w.weight_hh.t()
        if w.bias_hh is not None:
            pre = pre + w.bias_hh
        return (torch.tanh(pre),)


class ToyElmanModule(RecurrentModule):
    """The toy cell on TensorDicts: class attributes only."""

    cell = "toy_elman"
    network_class = nn.RNN
    default_state_keys = ("recurrent_state_h",)


def _loop_unroll(cfg, flat_weights, x, states, is_init, options, *, training, python_based,
                 runner):  # fmt: skip
    """Every row one step at a time, restarting from the stored state at each ``is_init``;
    returns the states after every step (``per_step_states``)."""
    carried = tuple(s[:, 0] for s in states)
    ys, after = [], []
    for t in range(x.shape[1]):
        restart = is_init[:, t].view(-1, 1, 1)
        now = tuple(torch.where(restart, s[:, t], c) for s, c in zip(states, carried, strict=True))
        y, carried = recurrent_step(cfg, flat_weights, x[:, t], now, training=training,
                                    python_based=python_based)  # fmt: skip
        ys.append(y)
        after.append(carried)
    return torch.stack(ys, 1), tuple(torch.stack(s, 1) for s in zip(*after, strict=True))


register_cell_kind(ToyElmanKind())
register_memory("toy_elman", ToyElmanModule)
TOY_LOOP = RecurrentBackend(
    name="toy_loop", unroll=_loop_unroll, refuses=lambda kind, python_based: None,
    recompute=False, no_recompute_reason="the toy loop keeps its activations.",
)  # fmt: skip
register_recurrent_backend(TOY_LOOP)
