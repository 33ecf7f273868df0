"""A per-agent GRU policy over ``[*B, n_agents, F]`` for the multi-agent collector tests.

Written here, apart from the library's agent-dimension modules, as an independent
reference: one ``nn.GRUCell`` shared by the agents, reading ``("agents", "is_init")``
(True: that agent ignores its incoming state and starts from zeros) and writing
``("next", "agents", "rs_h")`` ``[*B, n_agents, 1, H]``.
"""

from __future__ import annotations

import torch
from tensordict import TensorDictBase
from tensordict.nn import TensorDictModule as Mod
from tensordict.nn import TensorDictSequential as Seq
from torch import nn

OBS, INIT, STATE = ("agents", "observation"), ("agents", "is_init"), ("agents", "rs_h")


class AgentGRU(nn.Module):
    """Sequential mode only (one step per call); :func:`replay` is its recurrent mode."""

    def __init__(self, n_agents: int, in_features: int, hidden: int) -> None:
        super().__init__()
        self.cell = nn.GRUCell(in_features, hidden)
        self.in_keys = [OBS, INIT, STATE]
        self.out_keys = [("agents", "features"), ("next", *STATE)]
        self.recurrent_state_spec = {STATE: ((n_agents, 1, hidden), torch.float32)}

    def step(self, x: torch.Tensor, init: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        """``[*B, n, F]``, ``[*B, n, 1]``, ``[*B, n, H]`` -> the next ``[*B, n, H]``."""
        h = torch.where(init, torch.zeros_like(h), h)
        lead = x.shape[:-1]
        return self.cell(x.reshape(-1, x.shape[-1]), h.reshape(-1, h.shape[-1])).reshape(*lead, -1)

    def forward(self, td: TensorDictBase) -> TensorDictBase:
        h = self.step(td.get(OBS), td.get(INIT), td.get(STATE)[..., 0, :])
        td.set(("agents", "features"), h)
        td.set(("next", *STATE), h.unsqueeze(-2))
        return td


def make_policy(n_agents: int, in_features: int, hidden: int = 8, seed: int = 0):
    """``(gru, policy)``: the GRU, then a linear head and the argmax action per agent."""
    torch.manual_seed(seed)
    gru = AgentGRU(n_agents, in_features, hidden)
    head = nn.Linear(hidden, 2)
    policy = Seq(
        gru,
        Mod(head, in_keys=[("agents", "features")], out_keys=[("agents", "logits")]),
        Mod(
            lambda x: x.argmax(-1), in_keys=[("agents", "logits")], out_keys=[("agents", "action")]
        ),
    )
    return gru, policy


@torch.no_grad()
def replay(gru: AgentGRU, data: TensorDictBase) -> tuple[torch.Tensor, torch.Tensor]:
    """Recurrent mode over ``data`` ``[B, T]``: each row starts from the state stored at its
    first step, and every agent restarts from the state stored at its own ``is_init``.
    Returns the features ``[B, T, n, H]`` and next states ``[B, T, n, 1, H]``."""
    stored = data.get(STATE)[..., 0, :]
    init = data.get(INIT)
    h = stored[:, 0]
    features = []
    for t in range(data.shape[1]):
        h = torch.where(init[:, t], stored[:, t], h)
        # the stored state at an is_init is the initial one, so no reset inside the step
        h = gru.step(data.get(OBS)[:, t], torch.zeros_like(init[:, t]), h)
        features.append(h)
    out = torch.stack(features, 1)
    return out, out.unsqueeze(-2)
